//! Sampling replay: with `top_k`/`top_p` the sampler draws from a truncated, renormalised
//! distribution and reports its log-probabilities; the policy's full softmax differs from it by
//! the log of the kept probability mass at every token, which is not a policy change (TRL issue
//! #6789, fixed in 1.17 by PR #7269; prime-rl's "keep sampling mask"). So the sampler records
//! each token's kept set and every log-probability compared with the sampler's is renormalised
//! over it (`engine::logprobs`; which comparisons: [`super::LossLogprobs`]).

use tch::{Kind, Tensor};

crate::choice::choice! {
    /// Which policy log-probabilities are compared with the sampler's when sampling truncates
    /// (`top_k` > 0 or `top_p` < 1).
    pub enum SamplingReplay ("sampling_replay") {
        /// Renormalised over each token's kept set, which the sampler records (TRL 1.17,
        /// prime-rl).
        KeptSets = "kept_sets",
        /// The full softmax, as TRL 1.16 computes them (for parity tests with it).
        Trl116 = "trl_1_16",
    }
}

/// The band of ratios to the sampler the metrics count as close to 1.
pub const REPLAY_RATIO_BAND: (f64, f64) = (0.9, 1.1);

/// What a step logs about sampling replay, over the loss tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayStats {
    /// Mean probability mass of the kept sets under the policy (`exp(full - replayed)`).
    pub kept_mass_mean: f64,
    /// Share of the tokens whose ratio of the policy's renormalised probability to the
    /// sampler's, `exp(replayed - sampler)`, is outside [`REPLAY_RATIO_BAND`].
    pub ratio_outside_band: f64,
}

impl ReplayStats {
    /// From `[batch, len]` log-probabilities (the policy's full and replayed ones, the
    /// sampler's) and the loss `mask`.
    pub fn of(full: &Tensor, replayed: &Tensor, sampler: &Tensor, mask: &Tensor) -> Self {
        let mask = mask.to_kind(Kind::Bool);
        let pick = |t: &Tensor| t.detach().to_kind(Kind::Double).masked_select(&mask);
        let (full, replayed, sampler) = (pick(full), pick(replayed), pick(sampler));
        let tokens = full.numel().max(1) as f64;
        let kept_mass = (&full - &replayed).exp().sum(Kind::Double).double_value(&[]) / tokens;
        let ratio = (&replayed - &sampler).exp();
        let (low, high) = REPLAY_RATIO_BAND;
        let outside = ratio.lt(low).logical_or(&ratio.gt(high)).to_kind(Kind::Double).sum(Kind::Double).double_value(&[]) / tokens;
        Self { kept_mass_mean: kept_mass, ratio_outside_band: outside }
    }
}
