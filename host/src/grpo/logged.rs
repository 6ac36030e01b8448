//! What a loss logs on the step's metrics line: one list of named values on [`super::LossTerms`]
//! ([`LossMetric`]), which the trainer writes to `metrics.jsonl` as it finds it. A new loss
//! metric is one key below and one entry pushed where `sampled_loss` builds the list; the step,
//! the engine's micro-batches and the line writer carry it without a change.
//!
//! The keys live here, not in `train::metrics::key` (which re-exports them), because `grpo`
//! does not import `train`.

use tch::Tensor;

use super::is_correction::IsStats;

/// The `metrics.jsonl` keys of what a loss logs (re-exported by `train::metrics::key`).
pub mod key {
    /// Mean per-token KL to the reference over the loss tokens (null when beta = 0).
    pub const KL: &str = "kl";
    /// Fraction of loss tokens whose ratio was clipped, either side, any advantage.
    pub const CLIP_RATIO: &str = "clip_ratio";
    /// TRL's clip fractions (`grpo::ClipFractions`): ratio below 1 - epsilon with a negative
    /// advantage, above 1 + epsilon_high with a positive one, either.
    pub const CLIP_LOW: &str = "clip_ratio/low_mean";
    pub const CLIP_HIGH: &str = "clip_ratio/high_mean";
    pub const CLIP_REGION: &str = "clip_ratio/region_mean";
    /// TRL's `cispo_clip_ratio` (only with loss_type cispo, whose lines have null
    /// `clip_ratio/*_mean`): the fraction of weights capped at epsilon_high, positive advantage.
    pub const CISPO_CLIP_RATIO: &str = "cispo_clip_ratio";
    /// TRL's `vespo/phi_seq_mean` (only with loss_type vespo): the mean over completions of
    /// VESPO's Gamma weight `phi(w)` (1 on policy).
    pub const VESPO_PHI_SEQ_MEAN: &str = "vespo/phi_seq_mean";
    /// Kish's effective sample size of the loss weights (`grpo::LossTerms`'s `effective_sample_size`).
    pub const EFFECTIVE_SAMPLE_SIZE: &str = "effective_sample_size";
    /// TRL's metrics of the importance-sampling correction (`grpo::IsStats`; with
    /// `importance_sampling_correction` only): the ratio over loss tokens (per completion in the
    /// sequence modes), and `|logp_old - logp_sampler|` over loss tokens.
    pub const IS_RATIO_MIN: &str = "sampling/importance_sampling_ratio/min";
    pub const IS_RATIO_MEAN: &str = "sampling/importance_sampling_ratio/mean";
    pub const IS_RATIO_MAX: &str = "sampling/importance_sampling_ratio/max";
    pub const SAMPLING_LOGP_DIFFERENCE_MEAN: &str = "sampling/sampling_logp_difference/mean";
    pub const SAMPLING_LOGP_DIFFERENCE_MAX: &str = "sampling/sampling_logp_difference/max";
}

/// One value a loss logs under `key`: a scalar tensor, read back when the step writes its line
/// (no device sync per micro-batch), or `None`, logged as null (a key every line of the run has
/// whether or not this objective measures it).
///
/// Across micro-batches nothing is averaged: the engine recomputes the whole batch's terms from
/// the chunks' detached values (`engine::passes`), so every value is of the step's whole batch.
pub struct LossMetric {
    pub key: &'static str,
    pub value: Option<Tensor>,
}

impl LossMetric {
    pub fn new(key: &'static str, value: Tensor) -> Self {
        Self { key, value: Some(value) }
    }

    /// A value computed as a float64 on the host (kept exactly: a double scalar tensor).
    pub fn number(key: &'static str, value: f64) -> Self {
        Self::new(key, Tensor::from(value))
    }

    /// A key logged as null by this objective.
    pub fn null(key: &'static str) -> Self {
        Self { key, value: None }
    }
}

/// The importance-sampling correction's statistics under TRL's metric names.
pub fn importance_sampling_metrics(is: &IsStats) -> [(&'static str, f64); 5] {
    [
        (key::SAMPLING_LOGP_DIFFERENCE_MEAN, is.logp_difference_mean),
        (key::SAMPLING_LOGP_DIFFERENCE_MAX, is.logp_difference_max),
        (key::IS_RATIO_MIN, is.ratio_min),
        (key::IS_RATIO_MEAN, is.ratio_mean),
        (key::IS_RATIO_MAX, is.ratio_max),
    ]
}
