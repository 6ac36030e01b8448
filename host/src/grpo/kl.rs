//! The KL penalty: Schulman's per-token estimators of KL(policy || reference), chosen apart
//! from the surrogate and the aggregation (TRL's `beta` and tinker's `kl_estimator`).

use tch::Tensor;

crate::choice::choice! {
    /// The per-token estimator of KL(policy || reference) in the loss (Schulman, "Approximating
    /// KL divergence", 2020), with `d = logp_ref - logp` of the sampled token.
    pub enum KlEstimator ("kl_estimator") {
        /// `-d`: unbiased, high variance, negative on some tokens.
        K1 = "k1",
        /// `d^2 / 2`: biased, low variance, never negative.
        K2 = "k2",
        /// `exp(d) - d - 1`: unbiased, low variance, never negative (TRL's, GRPO's).
        K3 = "k3",
    }
}

/// `beta * estimator` added to every loss token's loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KlPenalty {
    pub beta: f64,
    pub estimator: KlEstimator,
    /// TRL's `use_bias_correction_kl` (DeepSeek-V3.2): the estimator multiplied by the
    /// (differentiable) importance ratio, so that off policy its gradient is the reverse KL's.
    /// TRL's default is on; smallrl's is off, the loss of every run before the key existed.
    pub bias_correction: bool,
}

/// `estimator`'s value of KL(policy || reference) at each sampled token.
pub fn per_token_kl(logprobs: &Tensor, ref_logprobs: &Tensor, estimator: KlEstimator) -> Tensor {
    let delta = ref_logprobs - logprobs;
    match estimator {
        KlEstimator::K1 => -delta,
        KlEstimator::K2 => delta.square() * 0.5,
        KlEstimator::K3 => delta.exp() - &delta - 1.0,
    }
}
