//! AdamW, gradient-norm clipping and the learning-rate schedules (linear; warm-up + cosine),
//! written out so that their state can be checkpointed and resumed exactly (tch's optimizers
//! expose no state).
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
    /// Whether weight decay applies to each parameter.
    decays: Vec<bool>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Optimizer steps taken so far.
    pub step: usize,
}

impl AdamW {
    /// Weight decay (if any) on every parameter, as the GRPO trainer's single parameter group.
    pub fn new(params: Vec<(String, Tensor)>, config: AdamWConfig) -> Self {
        let decays = vec![true; params.len()];
        Self::with_decays(params, decays, config)
    }

    /// Weight decay only on matrices (2-D and larger), none on norm weights: the usual
    /// pre-training parameter groups.
    pub fn decay_matrices_only(params: Vec<(String, Tensor)>, config: AdamWConfig) -> Self {
        let decays = params.iter().map(|(_, t)| t.dim() >= 2).collect();
        Self::with_decays(params, decays, config)
    }

    fn with_decays(params: Vec<(String, Tensor)>, decays: Vec<bool>, config: AdamWConfig) -> Self {
        let zeros = |p: &Vec<(String, Tensor)>| p.iter().map(|(_, t)| t.zeros_like().detach()).collect();
        Self { config, decays, exp_avg: zeros(&params), exp_avg_sq: zeros(&params), params, step: 0 }
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
            if c.weight_decay != 0.0 && self.decays[i] {
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

/// Linear warm-up from 0 over `warmup_steps`, then cosine decay to `min_ratio * base_lr` at
/// `max_steps`, for the optimizer step numbered `step` (0-based; step 0 already gets a
/// non-zero rate, `base_lr / warmup_steps`).
pub fn warmup_cosine_lr(base_lr: f64, step: usize, warmup_steps: usize, max_steps: usize, min_ratio: f64) -> f64 {
    if step < warmup_steps {
        return base_lr * (step + 1) as f64 / warmup_steps as f64;
    }
    let decay_steps = max_steps.saturating_sub(warmup_steps).max(1);
    let progress = ((step - warmup_steps) as f64 / decay_steps as f64).min(1.0);
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    base_lr * (min_ratio + (1.0 - min_ratio) * cosine)
}

#[cfg(test)]
mod tests {
    use super::warmup_cosine_lr;

    #[test]
    fn warmup_then_cosine_to_the_floor() {
        let lr = |step| warmup_cosine_lr(1.0, step, 10, 110, 0.1);
        assert!((lr(0) - 0.1).abs() < 1e-12 && (lr(9) - 1.0).abs() < 1e-12);
        assert!((lr(10) - 1.0).abs() < 1e-12, "decay starts at the peak");
        assert!((lr(60) - 0.55).abs() < 1e-12, "half way: (1 + 0.1) / 2");
        assert!((lr(110) - 0.1).abs() < 1e-12 && (lr(500) - 0.1).abs() < 1e-12);
    }
}
