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
        self.clip_grad_norm_also(max_norm, &mut [])
    }

    /// [`Self::clip_grad_norm`], and `others` (split-moment's natural gradients) scaled by the
    /// same coefficient: one clipping event for both moments, as the original's
    /// `clip_pre_routing_grads_`. The norm is the parameters' gradients' only.
    pub fn clip_grad_norm_also(&mut self, max_norm: f64, others: &mut [Tensor]) -> f64 {
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
        for g in others {
            *g *= &coef;
        }
        total.double_value(&[])
    }

    /// One AdamW step at learning rate `lr`.
    pub fn step(&mut self, lr: f64) {
        let grads = tch::no_grad(|| self.grads());
        self.step_moments(lr, &grads, &grads);
    }

    /// One split-moment AdamW step (the original's `SplitMomentAdamW`, `split_moment.py`): the
    /// first moment from the parameters' (routed) gradients, the second from `natural`, one
    /// tensor per parameter. With `natural` equal to the gradients it is [`Self::step`].
    pub fn step_split_moment(&mut self, lr: f64, natural: &[Tensor]) {
        assert_eq!(natural.len(), self.params.len(), "one natural gradient per parameter");
        let grads = tch::no_grad(|| self.grads());
        self.step_moments(lr, &grads, natural);
    }

    /// AdamW with `first` feeding `exp_avg` and `second` feeding `exp_avg_sq`.
    fn step_moments(&mut self, lr: f64, first: &[Tensor], second: &[Tensor]) {
        let _guard = tch::no_grad_guard();
        self.step += 1;
        let c = self.config;
        let bias_correction1 = 1.0 - c.beta1.powi(self.step as i32);
        let bias_correction2_sqrt = (1.0 - c.beta2.powi(self.step as i32)).sqrt();
        let step_size = lr / bias_correction1;
        for (i, (_, param)) in self.params.iter_mut().enumerate() {
            if c.weight_decay != 0.0 && self.decays[i] {
                *param *= 1.0 - lr * c.weight_decay;
            }
            let _ = self.exp_avg[i].lerp_(&first[i], 1.0 - c.beta1);
            self.exp_avg_sq[i] *= c.beta2;
            let _ = self.exp_avg_sq[i].addcmul_(&second[i], &(&second[i] * (1.0 - c.beta2)));
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
    use super::{AdamW, AdamWConfig, warmup_cosine_lr};
    use tch::{Kind, Tensor};

    const CONFIG: AdamWConfig = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 };

    /// A float64 parameter `[start]` whose gradient is set to `grad` by a backward pass.
    fn optimizer(start: &[f64]) -> AdamW {
        let param = Tensor::from_slice(start).to_kind(Kind::Double).set_requires_grad(true);
        AdamW::new(vec![("p".into(), param)], CONFIG)
    }

    fn set_grad(opt: &mut AdamW, grad: &[f64]) {
        opt.zero_grad();
        (&opt.params()[0].1 * Tensor::from_slice(grad)).sum(Kind::Double).backward();
    }

    fn values(opt: &AdamW) -> Vec<f64> {
        Vec::try_from(opt.params()[0].1.detach()).unwrap()
    }

    /// The original's tests/test_split_moment_optim.py: SplitMomentAdamW is AdamW when the
    /// pre-routing gradient equals the routed one.
    #[test]
    fn split_moment_with_equal_gradients_is_adamw() {
        let (mut plain, mut split) = (optimizer(&[0.5, -1.0, 2.0]), optimizer(&[0.5, -1.0, 2.0]));
        for grad in [[0.1, -0.2, 0.3], [1.0, 0.0, -0.5], [-0.3, 0.7, 0.2]] {
            set_grad(&mut plain, &grad);
            plain.step(1e-2);
            set_grad(&mut split, &grad);
            let natural = [Tensor::from_slice(&grad).to_kind(Kind::Double)];
            split.step_split_moment(1e-2, &natural);
        }
        assert_eq!(values(&plain), values(&split));
    }

    /// The original's test_split_moment_optim.py "v driven by g_pre", against AdamW's published
    /// update written out in float64: m from the routed gradient, v from the natural one.
    #[test]
    fn split_moment_takes_the_second_moment_from_the_natural_gradient() {
        let start = [0.5, -1.0];
        let mut opt = optimizer(&start);
        let routed = [[0.2, 0.0], [0.4, -0.1], [-0.1, 0.3]];
        let natural = [[0.1, 0.5], [0.8, -0.2], [0.0, 0.3]];
        let lr = 1e-2;
        let (mut p, mut m, mut v) = (start, [0.0; 2], [0.0; 2]);
        for t in 0..3 {
            set_grad(&mut opt, &routed[t]);
            opt.step_split_moment(lr, &[Tensor::from_slice(&natural[t]).to_kind(Kind::Double)]);
            let step = (t + 1) as i32;
            for j in 0..2 {
                p[j] *= 1.0 - lr * CONFIG.weight_decay;
                m[j] = CONFIG.beta1 * m[j] + (1.0 - CONFIG.beta1) * routed[t][j];
                v[j] = CONFIG.beta2 * v[j] + (1.0 - CONFIG.beta2) * natural[t][j] * natural[t][j];
                let m_hat = m[j] / (1.0 - CONFIG.beta1.powi(step));
                let v_hat = v[j] / (1.0 - CONFIG.beta2.powi(step));
                p[j] -= lr * m_hat / (v_hat.sqrt() + CONFIG.eps);
            }
        }
        for (ours, exact) in values(&opt).iter().zip(p) {
            assert!((ours - exact).abs() < 1e-12, "{ours} vs {exact} (float64 AdamW by hand)");
        }
        // The second parameter's routed gradient was 0 at step 1, its natural one not: the
        // update differs from plain AdamW's.
        let mut plain = optimizer(&start);
        for grad in routed {
            set_grad(&mut plain, &grad);
            plain.step(lr);
        }
        assert!((values(&plain)[1] - p[1]).abs() > 1e-4);
    }

    /// The original's test_split_moment_optim.py: the natural gradients are clipped by the
    /// routed gradients' coefficient (a norm of 5 clipped to 1).
    #[test]
    fn clipping_scales_the_natural_gradient_by_the_same_coefficient() {
        let mut opt = optimizer(&[0.0, 0.0]);
        set_grad(&mut opt, &[3.0, 4.0]);
        let mut natural = [Tensor::from_slice(&[6.0, -8.0]).to_kind(Kind::Double)];
        let norm = opt.clip_grad_norm_also(1.0, &mut natural);
        assert!((norm - 5.0).abs() < 1e-12);
        let coef = 1.0 / (5.0 + 1e-6);
        let clipped: Vec<f64> = Vec::try_from(&natural[0]).unwrap();
        let routed: Vec<f64> = Vec::try_from(opt.params()[0].1.grad()).unwrap();
        for (ours, exact) in clipped.iter().chain(&routed).zip([6.0 * coef, -8.0 * coef, 3.0 * coef, 4.0 * coef]) {
            assert!((ours - exact).abs() < 1e-12, "{ours} vs {exact}");
        }
    }

    #[test]
    fn warmup_then_cosine_to_the_floor() {
        let lr = |step| warmup_cosine_lr(1.0, step, 10, 110, 0.1);
        assert!((lr(0) - 0.1).abs() < 1e-12 && (lr(9) - 1.0).abs() < 1e-12);
        assert!((lr(10) - 1.0).abs() < 1e-12, "decay starts at the peak");
        assert!((lr(60) - 0.55).abs() < 1e-12, "half way: (1 + 0.1) / 2");
        assert!((lr(110) - 0.1).abs() < 1e-12 && (lr(500) - 0.1).abs() < 1e-12);
    }
}
