//! The sampler/learner importance-sampling correction (TRL 1.16's
//! `vllm_importance_sampling_correction`): each token's (or each completion's) weight
//! `rho = exp(logp_learner - logp_sampler)`, with `logp_learner` the old policy's log-probabilities
//! (the rollout's, or the current ones detached when each rollout trains once) and
//! `logp_sampler` what the sampler reported while drawing the token; truncated into
//! `[clip_min, clip_max]` or set to 0 outside it; then multiplying the per-token policy loss.
//! Per sequence, `rho = exp(sum_t (logp_learner - logp_sampler))` over the completion's loss
//! tokens (a sum, as TRL: the ratio of the two sequence probabilities).
//!
//! The ratio carries no gradient (TRL computes it under `no_grad` before the loss).

use anyhow::{Result, ensure};
use tch::{Kind, Tensor};

crate::choice::choice! {
    /// How the correction's ratio is taken and bounded (TRL's `vllm_importance_sampling_mode`).
    pub enum ImportanceSamplingMode ("importance_sampling_mode") {
        /// One ratio per token, clamped into `[clip_min, clip_max]`.
        TokenTruncate = "token_truncate",
        /// One ratio per token, 0 outside `[clip_min, clip_max]`.
        TokenMask = "token_mask",
        /// One ratio per completion, clamped into `[clip_min, clip_max]`.
        SequenceTruncate = "sequence_truncate",
        /// One ratio per completion, 0 outside `[clip_min, clip_max]` (TRL's default).
        SequenceMask = "sequence_mask",
    }
}

impl ImportanceSamplingMode {
    /// One ratio per completion (`[batch, 1]`) rather than per token.
    pub fn per_sequence(self) -> bool {
        matches!(self, Self::SequenceTruncate | Self::SequenceMask)
    }

    fn truncates(self) -> bool {
        matches!(self, Self::TokenTruncate | Self::SequenceTruncate)
    }
}

/// The correction's settings, valid by construction ([`IsCorrection::new`]). `clip_min` 0 is
/// TRL's unset lower bound (a ratio is never negative, so a bound at 0 changes nothing); TRL's
/// unset upper bound is a `clip_max` no ratio reaches (1e30: the configuration is JSON, which has
/// no infinity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IsCorrection {
    pub mode: ImportanceSamplingMode,
    pub clip_min: f64,
    pub clip_max: f64,
}

/// What a step logs about the correction, under TRL's names (`sampling/...`): the ratio's
/// min / mean / max (over loss tokens per token, over completions per sequence) and the mean / max
/// of `|logp_learner - logp_sampler|` over loss tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IsStats {
    pub ratio_min: f64,
    pub ratio_mean: f64,
    pub ratio_max: f64,
    pub logp_difference_mean: f64,
    pub logp_difference_max: f64,
}

impl IsCorrection {
    /// The correction with these bounds, or the rule they break (TRL's: `clip_min < clip_max`).
    pub fn new(mode: ImportanceSamplingMode, clip_min: f64, clip_max: f64) -> Result<Self> {
        ensure!(clip_min >= 0.0 && clip_min.is_finite(), "importance_sampling_clip_min ({clip_min}) must be finite and at least 0 (0: no lower bound)");
        ensure!(clip_max.is_finite(), "importance_sampling_clip_max ({clip_max}) must be finite (no upper bound: a value no ratio reaches, e.g. 1e30)");
        ensure!(clip_min < clip_max, "importance_sampling_clip_min ({clip_min}) must be below importance_sampling_clip_max ({clip_max})");
        Ok(Self { mode, clip_min, clip_max })
    }

    /// The correction's weights (detached): `[batch, len]` per token, `[batch, 1]` per
    /// sequence. `learner` and `sampler` are `[batch, len]` log-probabilities, `mask` the loss
    /// tokens (tokens outside it contribute a log-difference of 0, as in TRL).
    pub fn ratio(&self, learner: &Tensor, sampler: &Tensor, mask: &Tensor) -> Tensor {
        let diff = masked_difference(learner, sampler, mask);
        let log_ratio = match self.mode.per_sequence() {
            true => diff.sum_dim_intlist(-1, true, Kind::Float),
            false => diff,
        };
        let ratio = log_ratio.exp();
        match self.mode.truncates() {
            true => ratio.clamp(self.clip_min, self.clip_max),
            false => {
                let outside = ratio.lt(self.clip_min).logical_or(&ratio.gt(self.clip_max));
                ratio.masked_fill(&outside, 0.0)
            }
        }
    }

    /// TRL's metrics of the correction ([`IsStats`]); `ratio` is [`Self::ratio`]'s.
    pub fn stats(&self, ratio: &Tensor, learner: &Tensor, sampler: &Tensor, mask: &Tensor) -> IsStats {
        let tokens = mask.to_kind(Kind::Bool);
        let pick = |t: &Tensor| t.to_kind(Kind::Double).masked_select(&tokens);
        let ratios = match self.mode.per_sequence() {
            true => ratio.to_kind(Kind::Double).flatten(0, -1),
            false => pick(ratio),
        };
        let delta = pick(&(learner.detach() - sampler).abs());
        let [ratio_min, ratio_mean, ratio_max] = extremes(&ratios);
        let [_, logp_difference_mean, logp_difference_max] = extremes(&delta);
        IsStats { ratio_min, ratio_mean, ratio_max, logp_difference_mean, logp_difference_max }
    }
}

/// `(learner - sampler)` on the loss tokens, 0 elsewhere (padding's values never enter), detached.
fn masked_difference(learner: &Tensor, sampler: &Tensor, mask: &Tensor) -> Tensor {
    let diff = learner.detach() - sampler;
    diff.where_self(&mask.to_kind(Kind::Bool), &diff.zeros_like())
}

/// `[min, mean, max]` of a flat tensor, 0s when it is empty (as TRL logs them).
fn extremes(values: &Tensor) -> [f64; 3] {
    if values.numel() == 0 {
        return [0.0; 3];
    }
    [values.min(), values.mean(Kind::Double), values.max()].map(|v| v.double_value(&[]))
}
