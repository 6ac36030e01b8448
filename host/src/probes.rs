//! Cheap probes of an optimizer step, logged in `metrics.jsonl`: computed from tensors the step
//! already has (the sampler's log-probabilities from generation, the learner's log-probabilities
//! and entropies from the training forward pass), no extra forward or backward pass. Each is a
//! few element-wise passes over `[batch, completion_len]` (4,096 values at the defaults) or a
//! sort of the loss tokens' entropies.

use tch::{Kind, Tensor};

/// Sampler vs learner log-probabilities of the sampled tokens (tinker's `kl_sample_train`):
/// `v1 = mean(sampler - learner)`, `v2 = mean((sampler - learner)^2) / 2` over the tokens in
/// `mask`. Both estimate KL(sampler || learner): about 0 when the learner scores with the
/// sampler's weights (the CPU, one update per batch), they grow with each update on a reused
/// batch and reveal a decode/training mismatch otherwise. 0 without tokens.
pub fn sampler_learner_kl(sampler_logprobs: &Tensor, learner_logprobs: &Tensor, mask: &Tensor) -> (f64, f64) {
    let mask = mask.to_kind(Kind::Float);
    let tokens = mask.sum(Kind::Float).clamp_min(1.0);
    let difference = (sampler_logprobs - learner_logprobs.detach()) * &mask;
    let v1 = difference.sum(Kind::Float) / &tokens;
    let v2 = difference.square().sum(Kind::Float) / &tokens * 0.5;
    (v1.double_value(&[]), v2.double_value(&[]))
}

/// `Cov(logp, A)` over the tokens in `mask`: the mean of `(logp_t - mean logp)(A_t - mean A)`,
/// each token with its completion's advantage. Cui et al. (2025, "The Entropy Mechanism of
/// Reinforcement Learning for Reasoning Language Models") show that a policy-gradient step
/// changes the entropy by about `-eta * Cov(logp, A)` (natural gradient; with `pi * A` in place
/// of `A` for the plain one): a positive covariance (confident tokens rewarded) predicts falling
/// entropy. Computed over the batch as they do. 0 without tokens.
pub fn logprob_advantage_covariance(logprobs: &Tensor, advantages: &Tensor, mask: &Tensor) -> f64 {
    let mask = mask.to_kind(Kind::Bool);
    let logprobs = logprobs.detach().to_kind(Kind::Double).masked_select(&mask);
    if logprobs.numel() == 0 {
        return 0.0;
    }
    let advantages = advantages.to_kind(Kind::Double).unsqueeze(1).expand(mask.size(), false).masked_select(&mask);
    let centred = |t: &Tensor| t - t.mean(Kind::Double);
    (centred(&logprobs) * centred(&advantages)).mean(Kind::Double).double_value(&[])
}

/// The quantiles [`entropy_quantiles`] reports: the 10th, 50th and 90th percentile.
pub const ENTROPY_QUANTILES: [f64; 3] = [0.1, 0.5, 0.9];

/// [`ENTROPY_QUANTILES`] of the per-token entropies of the tokens in `mask`, interpolated
/// linearly between order statistics (numpy's and torch's default: rank `q (n - 1)`). NaN
/// (null in `metrics.jsonl`) without tokens.
pub fn entropy_quantiles(entropy: &Tensor, mask: &Tensor) -> [f64; 3] {
    let values = entropy.detach().to_kind(Kind::Double).masked_select(&mask.to_kind(Kind::Bool));
    if values.numel() == 0 {
        return [f64::NAN; 3];
    }
    let levels = Tensor::from_slice(&ENTROPY_QUANTILES).to(values.device());
    let quantiles = Vec::<f64>::try_from(values.quantile(&levels, None::<i64>, false, "linear")).expect("three quantiles");
    [quantiles[0], quantiles[1], quantiles[2]]
}

/// The squared L2 norms of the gradients of a step's backward passes, from the parameters'
/// accumulated gradients after each pass: a pass's gradient is the change since the previous
/// pass (the gradients start at zero). One copy of the gradients per pass but the last.
#[derive(Default)]
pub struct PassGradients {
    previous: Option<Vec<Tensor>>,
    /// `|g_j|²` of each pass `j` so far.
    pub pass_squared_norms: Vec<f64>,
    /// `|Σ_j g_j|²`: the accumulated gradient's after the last pass.
    pub total_squared_norm: f64,
}

impl PassGradients {
    /// Records the pass that just went backward; `accumulated` are the parameters' gradients
    /// now (zeros for a parameter without one). `last`: no copy is kept after it.
    pub fn record(&mut self, accumulated: Vec<Tensor>, last: bool) {
        let _guard = tch::no_grad_guard();
        // One read of a number per norm (not per tensor, as `AdapterConfig::slot_norms`): a
        // step has a few hundred tensors, and each read waits for the device.
        let squared_norm = |tensors: &mut dyn Iterator<Item = Tensor>| {
            let sums: Vec<Tensor> = tensors.map(|t| t.square().sum(Kind::Double)).collect();
            if sums.is_empty() { 0.0 } else { Tensor::stack(&sums, 0).sum(Kind::Double).double_value(&[]) }
        };
        let total = || squared_norm(&mut accumulated.iter().map(Tensor::shallow_clone));
        match &self.previous {
            // The first pass's gradient is the accumulated one.
            None => {
                let pass = total();
                self.pass_squared_norms.push(pass);
                self.total_squared_norm = pass;
            }
            Some(previous) => {
                self.pass_squared_norms.push(squared_norm(&mut accumulated.iter().zip(previous).map(|(now, then)| now - then)));
                // Only the last pass's total is the step's.
                if last {
                    self.total_squared_norm = total();
                }
            }
        }
        self.previous = (!last).then(|| accumulated.iter().map(Tensor::copy).collect());
    }
}

/// McCandlish et al. (2018, "An Empirical Model of Large-Batch Training", appendix A.1) unbiased
/// estimates of the true gradient's squared norm `|G|²` and of the per-sample gradient
/// covariance's trace `tr(Σ)`, from gradient norms at two batch sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoiseScale {
    pub grad_squared: f64,
    pub trace: f64,
}

impl NoiseScale {
    /// The step's `k` passes over equal parts of a batch of `batch` samples: each part's
    /// gradient times `k` is a gradient estimate from `B_small = batch / k` samples (the
    /// batch's loss restricted to the part, rescaled to the whole), their sum the estimate
    /// `G_big` from `B_big = batch`. With `|G_small|²` the mean over the parts:
    /// `|G|² = (B_big |G_big|² - B_small |G_small|²) / (B_big - B_small)`,
    /// `tr(Σ) = (|G_small|² - |G_big|²) / (1 / B_small - 1 / B_big)`.
    pub fn from_passes(gradients: &PassGradients, batch: usize) -> Self {
        let k = gradients.pass_squared_norms.len() as f64;
        assert!(k >= 2.0, "the gradient noise scale needs at least two passes");
        let (big, small) = (batch as f64, batch as f64 / k);
        let small_squared = gradients.pass_squared_norms.iter().map(|g| k * k * g).sum::<f64>() / k;
        let big_squared = gradients.total_squared_norm;
        NoiseScale {
            grad_squared: (big * big_squared - small * small_squared) / (big - small),
            trace: (small_squared - big_squared) / (1.0 / small - 1.0 / big),
        }
    }

    /// The simple noise scale `B_simple = tr(Σ) / |G|²` (in samples; NaN, null in
    /// `metrics.jsonl`, when `|G|²` is 0). Each step's estimate is noisy and can be negative.
    pub fn simple(&self) -> f64 {
        if self.grad_squared == 0.0 { f64::NAN } else { self.trace / self.grad_squared }
    }

    /// The running average: numerator and denominator each an exponential moving average
    /// (decay [`NOISE_SCALE_EMA_DECAY`], started at the first step's estimates), as McCandlish
    /// et al. average them separately before taking the ratio.
    pub fn averaged(previous: Option<NoiseScale>, now: NoiseScale) -> NoiseScale {
        let Some(previous) = previous else { return now };
        let mix = |old: f64, new: f64| NOISE_SCALE_EMA_DECAY * old + (1.0 - NOISE_SCALE_EMA_DECAY) * new;
        NoiseScale { grad_squared: mix(previous.grad_squared, now.grad_squared), trace: mix(previous.trace, now.trace) }
    }
}

/// The running gradient noise scale's decay per step (a horizon of about 20 steps).
pub const NOISE_SCALE_EMA_DECAY: f64 = 0.95;

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rows, the second with one padding token that must not count.
    fn batch() -> (Tensor, Tensor, Tensor) {
        let sampler = Tensor::from_slice(&[-1.0f32, -2.0, -0.5, -3.0, -1.5, 9.0]).view([2, 3]);
        let learner = Tensor::from_slice(&[-1.25f32, -1.5, -0.5, -2.0, -1.0, -7.0]).view([2, 3]);
        let mask = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 0]).view([2, 3]);
        (sampler, learner, mask)
    }

    #[test]
    fn sampler_learner_kl_is_the_mean_and_half_mean_square_over_real_tokens() {
        let (sampler, learner, mask) = batch();
        // Differences on the five real tokens: 0.25, -0.5, 0, -1, -0.5.
        let (v1, v2) = sampler_learner_kl(&sampler, &learner, &mask);
        assert!((v1 - (-1.75 / 5.0)).abs() < 1e-7, "{v1}");
        assert!((v2 - 0.5 * (0.0625 + 0.25 + 0.0 + 1.0 + 0.25) / 5.0).abs() < 1e-7, "{v2}");
        assert_eq!(sampler_learner_kl(&sampler, &sampler, &mask), (0.0, 0.0));
    }

    #[test]
    fn the_covariance_of_logprob_and_advantage_is_over_the_real_tokens() {
        let (_, learner, mask) = batch();
        let advantages = Tensor::from_slice(&[1.0f32, -2.0]);
        // Real tokens: logp -1.25 -1.5 -0.5 (A = 1), -2 -1 (A = -2); in plain f64:
        let (logp, adv) = ([-1.25f64, -1.5, -0.5, -2.0, -1.0], [1.0f64, 1.0, 1.0, -2.0, -2.0]);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let exact = logp.iter().zip(adv).map(|(l, a)| (l - mean(&logp)) * (a - mean(&adv))).sum::<f64>() / 5.0;
        let ours = logprob_advantage_covariance(&learner, &advantages, &mask);
        assert!((ours - exact).abs() < 1e-7, "{ours} vs {exact} (by hand)");
        assert_eq!(logprob_advantage_covariance(&learner, &advantages, &mask.zeros_like()), 0.0);
    }

    #[test]
    fn entropy_quantiles_interpolate_between_the_real_tokens() {
        // Real tokens' entropies, sorted: 1, 2, 3, 4, 5 (the padding's 100 must not count).
        let entropy = Tensor::from_slice(&[3.0f32, 1.0, 5.0, 2.0, 4.0, 100.0]).view([2, 3]);
        let (_, _, mask) = batch();
        // Rank q (n - 1) = 0.4, 2, 3.6: 1 + 0.4, 3, 4 + 0.6.
        let [p10, p50, p90] = entropy_quantiles(&entropy, &mask);
        assert!((p10 - 1.4).abs() < 1e-6 && (p50 - 3.0).abs() < 1e-6 && (p90 - 4.6).abs() < 1e-6, "{p10} {p50} {p90}");
        assert!(entropy_quantiles(&entropy, &mask.zeros_like()).iter().all(|q| q.is_nan()));
    }
}
