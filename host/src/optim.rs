//! AdamW, gradient-norm clipping and the linear learning-rate schedule, written out so that
//! their state can be checkpointed and resumed exactly (tch's optimizers expose no state).
//!
//! The arithmetic follows `torch.optim.AdamW` (single-tensor path) and
//! `torch.nn.utils.clip_grad_norm_` operation by operation.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use tch::Tensor;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

pub struct AdamW {
    config: AdamWConfig,
    params: Vec<(String, Tensor)>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Optimizer steps taken so far.
    pub step: usize,
}

impl AdamW {
    pub fn new(params: Vec<(String, Tensor)>, config: AdamWConfig) -> Self {
        let zeros = |p: &Vec<(String, Tensor)>| p.iter().map(|(_, t)| t.zeros_like().detach()).collect();
        Self { config, exp_avg: zeros(&params), exp_avg_sq: zeros(&params), params, step: 0 }
    }

    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    pub fn zero_grad(&mut self) {
        for (_, p) in &mut self.params {
            p.zero_grad();
        }
    }

    /// The gradient of each parameter; a parameter that received none (all of its rows were
    /// routed away) gets zeros, so it is still stepped with its running moments.
    fn grads(&self) -> Vec<Tensor> {
        self.params
            .iter()
            .map(|(_, p)| {
                let g = p.grad();
                if g.defined() { g } else { p.zeros_like().detach() }
            })
            .collect()
    }

    /// Scales gradients so their global 2-norm is at most `max_norm`; returns the norm before
    /// clipping (what TRL logs as `grad_norm`).
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        let _guard = tch::no_grad_guard();
        let grads = self.grads();
        let norms: Vec<Tensor> = grads.iter().map(|g| g.norm()).collect();
        let total = Tensor::stack(&norms, 0).norm();
        let coef = (max_norm / (&total + 1e-6)).clamp_max(1.0);
        for (_, p) in &self.params {
            let mut g = p.grad();
            if g.defined() {
                g *= &coef;
            }
        }
        total.double_value(&[])
    }

    /// One AdamW step at learning rate `lr`.
    pub fn step(&mut self, lr: f64) {
        let _guard = tch::no_grad_guard();
        let grads = self.grads();
        self.step += 1;
        let c = self.config;
        let bias_correction1 = 1.0 - c.beta1.powi(self.step as i32);
        let bias_correction2_sqrt = (1.0 - c.beta2.powi(self.step as i32)).sqrt();
        let step_size = lr / bias_correction1;
        for (i, (_, param)) in self.params.iter_mut().enumerate() {
            let grad = &grads[i];
            if c.weight_decay != 0.0 {
                *param *= 1.0 - lr * c.weight_decay;
            }
            let _ = self.exp_avg[i].lerp_(grad, 1.0 - c.beta1);
            self.exp_avg_sq[i] *= c.beta2;
            let _ = self.exp_avg_sq[i].addcmul_(grad, &(grad * (1.0 - c.beta2)));
            let denom = self.exp_avg_sq[i].sqrt() / bias_correction2_sqrt + c.eps;
            *param -= &self.exp_avg[i] / denom * step_size;
        }
    }

    /// Moments under `exp_avg.<name>` / `exp_avg_sq.<name>`, for checkpoints.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.push((format!("exp_avg.{name}"), self.exp_avg[i].shallow_clone()));
            out.push((format!("exp_avg_sq.{name}"), self.exp_avg_sq[i].shallow_clone()));
        }
        out
    }

    pub fn load_state(&mut self, stored: &BTreeMap<String, Tensor>, step: usize, source: &str) -> Result<()> {
        ensure!(stored.len() == 2 * self.params.len(), "{source}: optimizer state has {} tensors, expected {}", stored.len(), 2 * self.params.len());
        for (i, (name, param)) in self.params.iter().enumerate() {
            for (prefix, slot) in [("exp_avg", &mut self.exp_avg[i]), ("exp_avg_sq", &mut self.exp_avg_sq[i])] {
                let key = format!("{prefix}.{name}");
                let value = stored.get(&key).with_context(|| format!("{source}: {key} is missing"))?;
                ensure!(value.size() == param.size(), "{source}: {key} has the wrong shape");
                *slot = value.to_kind(param.kind()).to_device(param.device());
            }
        }
        self.step = step;
        Ok(())
    }
}

/// HF's linear schedule without warm-up: `lr * (max_steps - step) / max_steps` for the
/// optimizer step numbered `step` (0-based).
pub fn linear_lr(base_lr: f64, step: usize, max_steps: usize) -> f64 {
    base_lr * (max_steps.saturating_sub(step)) as f64 / max_steps.max(1) as f64
}
