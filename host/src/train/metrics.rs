//! `metrics.jsonl`: one line per optimizer step. The keys are the constants in [`key`]; the
//! trainer fills the typed records below, and readers (sweep summaries and charts, `smallrl
//! eval --reward-history`, `smallrl bench`) import the same constants, so a key is spelled once.
//! What a loss and an intervention log are named-values lists (`grpo::LossTerms::metrics`,
//! `Prepared::intervention_metrics`) that [`line`] writes as it finds them: a new loss metric
//! changes no record here.
//!
//! Architecture invariant: a line is a flat JSON object written once per step; keys never
//! change meaning (old run directories are read with today's constants).

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::{Map, Value};

use crate::grpo::{LossType, WeightEss};
use crate::probes::NoiseScale;

pub use crate::grpo::importance_sampling_metrics;

/// The aggregations whose loss-weight ESS every step logs (`ess/...`; cispo aggregates as dapo).
/// The ESS ignores a common scale: dr_grpo's always equals dapo's, and bnpo's does with one
/// micro-batch; all four are logged so that every run's line has the same keys.
pub const AGGREGATIONS: [LossType; 4] = [LossType::Grpo, LossType::DrGrpo, LossType::Dapo, LossType::Bnpo];

/// The keys of a `metrics.jsonl` line.
pub mod key {
    /// What a loss logs (`kl`, `clip_ratio`, ..., `sampling/...`): `grpo`'s keys.
    pub use crate::grpo::metric_key::*;

    pub const STEP: &str = "step";
    /// Mean combined reward of the batch.
    pub const REWARD: &str = "reward";
    pub const REWARD_STD: &str = "reward_std";
    pub const FRAC_REWARD_ZERO_STD: &str = "frac_reward_zero_std";
    pub const MEAN_LENGTH: &str = "completions/mean_length";
    pub const MAX_LENGTH: &str = "completions/max_length";
    pub const CLIPPED_RATIO: &str = "completions/clipped_ratio";
    /// Fraction of samples the detector flags (only with a detector).
    pub const HACK_FREQ: &str = "hack_freq";
    pub const FRAC_RH: &str = "routing/frac_rh";
    pub const FRAC_ABLATED: &str = "routing/frac_ablated";
    pub const FRAC_ELIGIBLE: &str = "routing/frac_eligible";
    /// Fraction of the batch's samples whose prompt offers the hack (`hackable`, `hack_frac`).
    pub const FRAC_HACKABLE: &str = "routing/frac_hackable";
    pub const LOSS: &str = "loss";
    pub const GRAD_NORM: &str = "grad_norm";
    pub const LEARNING_RATE: &str = "learning_rate";
    pub const ENTROPY: &str = "entropy";
    /// TRL's entropy bonus: its coefficient after the step's update (TRL's `entropy_coef`), the
    /// coefficient the step's loss applied, the loss before the bonus (TRL's `policy_loss`) and
    /// the mean entropy of the tokens that trained (what the adaptive control read).
    pub const ENTROPY_COEF: &str = "entropy_coef";
    pub const ENTROPY_COEF_APPLIED: &str = "entropy/applied_coef";
    pub const POLICY_LOSS: &str = "policy_loss";
    pub const ENTROPY_TRAINED_MEAN: &str = "entropy/trained_mean";
    /// Covariance of the log-prob and the advantage over the loss tokens
    /// (`probes::logprob_advantage_covariance`): Cui et al.'s predictor of the entropy change.
    pub const LOGPROB_ADVANTAGE_COVARIANCE: &str = "entropy/cov_logp_advantage";
    /// Mean entropy of the batch's loss tokens after the update minus before, the same batch
    /// re-scored (with `measure_entropy_change` only).
    pub const ENTROPY_CHANGE: &str = "entropy/measured_change";
    /// Sampler vs learner log-probabilities (`probes::sampler_learner_kl`): mean difference and
    /// half its mean square.
    pub const KL_SAMPLE_TRAIN_V1: &str = "kl_sample_train_v1";
    pub const KL_SAMPLE_TRAIN_V2: &str = "kl_sample_train_v2";
    /// Sampling replay (`grpo::ReplayStats`; with kept sets only): the policy's mean probability
    /// mass of the kept sets over loss tokens, and the share of loss tokens whose ratio of the
    /// renormalised policy to the sampler is outside [0.9, 1.1].
    pub const REPLAY_KEPT_MASS_MEAN: &str = "sampling/kept_mass/mean";
    pub const REPLAY_RATIO_OUTSIDE: &str = "sampling/replay_ratio/outside_0.9_1.1";
    /// Quantiles of the per-token entropy of the loss tokens (`probes::ENTROPY_QUANTILES`).
    pub const ENTROPY_QUANTILES: [&str; 3] = ["entropy/p10", "entropy/p50", "entropy/p90"];
    /// The gradient noise scale (`probes::NoiseScale`, with `gradient_noise_scale` only): the
    /// step's unbiased estimates of |G|² and tr(Σ), their ratio B_simple (in completions), and
    /// the same three from the running averages of |G|² and tr(Σ).
    pub const NOISE_GRAD_SQUARED: &str = "gradient_noise/grad_squared";
    pub const NOISE_TRACE: &str = "gradient_noise/trace";
    pub const NOISE_SCALE: &str = "gradient_noise/b_simple";
    pub const NOISE_GRAD_SQUARED_AVG: &str = "gradient_noise/grad_squared_avg";
    pub const NOISE_TRACE_AVG: &str = "gradient_noise/trace_avg";
    pub const NOISE_SCALE_AVG: &str = "gradient_noise/b_simple_avg";
    /// The sketched Fisher kernel of the step's sequences (`train::fisher`, every
    /// `fisher_kernel_every` steps): its trace, three largest eigenvalues, the mean correlation
    /// `K_ij / sqrt(K_ii K_jj)` over pairs `i < j`, the effective rank as the participation ratio
    /// `(Σλ)² / Σλ²`, and the seconds the measurement took.
    pub const FISHER_TRACE: &str = "fisher/trace";
    pub const FISHER_TOP_EIGENVALUES: [&str; 3] = ["fisher/top_eigenvalue_1", "fisher/top_eigenvalue_2", "fisher/top_eigenvalue_3"];
    pub const FISHER_MEAN_OFFDIAG_CORRELATION: &str = "fisher/mean_offdiag_correlation";
    pub const FISHER_EFFECTIVE_RANK: &str = "fisher/effective_rank";
    pub const TIMING_FISHER: &str = "timing/fisher_kernel";
    /// DAPO's dynamic sampling (`dynamic_sampling_rounds` only): generation rounds the batch
    /// took, groups dropped for equal rewards, and groups with differing rewards generated
    /// beyond what filled the batch (discarded, as verl does; with `sampling_steps_ahead`:
    /// chunks scored, and those carried to the next step).
    pub const DYNAMIC_SAMPLING_ROUNDS: &str = "dynamic_sampling/rounds";
    /// Off-policy training (`max_steps_off_policy`, `sampling_steps_ahead`): the version of the
    /// weights that sampled the step's batch (its oldest group's; optimizer steps done before it),
    /// the seconds the step waited for its batch and the sampler thread for its job.
    pub const OFF_POLICY_VERSION: &str = "off_policy/policy_version";
    /// The staleness of the step's groups in steps (the step's index minus the version of the
    /// weights that sampled the group), max, min and mean over its groups: tinker-cookbook
    /// 0.6.1's `async/staleness_*` (`rl/train.py`, `training_loop`), under its names.
    pub const ASYNC_STALENESS_MAX: &str = "async/staleness_max";
    pub const ASYNC_STALENESS_MIN: &str = "async/staleness_min";
    pub const ASYNC_STALENESS_MEAN: &str = "async/staleness_mean";
    pub const TIMING_WAIT_FOR_SAMPLES: &str = "timing/wait_for_samples";
    pub const TIMING_SAMPLER_IDLE: &str = "timing/sampler_idle";
    /// `max_no_score_frac` above 0: the batch's samples a reward or environment gave no score
    /// (contract 0.5's none); they are out of the loss and of every other statistic.
    pub const NO_SCORE_COUNT: &str = "rewards/no_score_count";
    pub const DYNAMIC_SAMPLING_DROPPED: &str = "dynamic_sampling/groups_dropped";
    pub const DYNAMIC_SAMPLING_SURPLUS: &str = "dynamic_sampling/groups_surplus";
    /// The retain verifier (`rh_detector_verifies_retain_samples`, steps with coherence rows):
    /// the share of coherence rows it verified (the rest are dropped from the loss).
    pub const VERIFIER_FRAC_VERIFIED: &str = "verifier/frac_verified";
    /// `intervention: adv_mod`: the mean over the batch of what was subtracted from the
    /// advantages, `advantage_penalty × score` (0 for unflagged rows with the flag's score).
    pub const ADVANTAGE_MODIFICATION_MEAN: &str = "adv_mod/mean_modification";
    /// `intervention: matched_placebo`: the gradient-energy proxy of the flagged rows (the
    /// target) and of the routed ones, and how many rows were routed (`crate::intervention`).
    pub const PLACEBO_ENERGY_FLAGGED: &str = "placebo/energy_flagged";
    pub const PLACEBO_ENERGY_ROUTED: &str = "placebo/energy_routed";
    pub const PLACEBO_ROWS_ROUTED: &str = "placebo/rows_routed";
    /// The fingerprint of the weights that sampled the step's batch (its first rows), checked
    /// against the policy's when they were folded (`engine/delivery.rs`).
    pub const SAMPLER_WEIGHTS_FINGERPRINT: &str = "sampler/weights_fingerprint";
    /// Prompt and completion tokens generated so far (each batch counted once).
    pub const NUM_TOKENS: &str = "num_tokens";
    pub const TIMING_GENERATE: &str = "timing/generate";
    pub const TIMING_SCORE: &str = "timing/score";
    pub const TIMING_REFERENCE: &str = "timing/reference";
    pub const TIMING_TRAIN: &str = "timing/train";
    /// Of `timing/generate`: setting the samplers up (folding the policy's weights, refreshing
    /// and checking the sampler's copy); with `max_steps_off_policy`, that of the batches
    /// posted to the sampler thread during the step, outside `timing/generate`.
    pub const TIMING_SAMPLER_SETUP: &str = "timing/sampler_setup";
    /// Of `timing/reference`: the old policy's log-probabilities (0 where the ratio is to the
    /// sampler or there is one step per rollout).
    pub const TIMING_OLD_LOGPROBS: &str = "timing/old_logprobs";
    /// Of `timing/train`: after the backward pass, gradient clipping and the AdamW update
    /// (with the step's statistics read back); the rest is the forward and backward pass.
    pub const TIMING_OPTIMIZER: &str = "timing/optimizer";
    pub const STEP_TIME: &str = "step_time";
    /// DualLoRA's absorption diagnostics, `absorption/<retain|forget>/<quantity>`: the
    /// adapter's gradient norm before clipping, its weights' norm after the step, the norm of
    /// the step's change, and (with `absorption_by_class`) the gradient norm of the flagged and
    /// of the unflagged samples' loss terms alone.
    pub const ABSORPTION_GRAD_NORM: &str = "grad_norm";
    pub const ABSORPTION_PARAM_NORM: &str = "param_norm";
    pub const ABSORPTION_UPDATE_NORM: &str = "update_norm";
    pub const ABSORPTION_GRAD_NORM_FLAGGED: &str = "grad_norm_flagged";
    pub const ABSORPTION_GRAD_NORM_UNFLAGGED: &str = "grad_norm_unflagged";

    /// `ess/<over>/<loss_type>`: Kish's effective sample size of `loss_type`'s aggregation
    /// weights of the step's loss tokens, `over` tokens or sequences (`grpo::WeightEss`).
    pub fn ess(over: &str, loss_type: crate::grpo::LossType) -> String {
        format!("ess/{over}/{loss_type}")
    }
    /// The `over` of [`ess`]: tokens and sequences.
    pub const ESS_TOKENS: &str = "tokens";
    pub const ESS_SEQUENCES: &str = "sequences";

    /// `absorption/<adapter>/<quantity>`.
    pub fn absorption(adapter: &str, quantity: &str) -> String {
        format!("absorption/{adapter}/{quantity}")
    }
    /// Prefix and suffix of a reward component's mean: `rewards/<name>/mean`.
    pub const COMPONENT_PREFIX: &str = "rewards/";
    pub const COMPONENT_SUFFIX: &str = "/mean";

    /// `rewards/<name>/mean`.
    pub fn component(name: &str) -> String {
        format!("{COMPONENT_PREFIX}{name}{COMPONENT_SUFFIX}")
    }
}

/// What generating and scoring a batch measured (logged with every step that uses the batch).
#[derive(Debug, Clone, Default)]
pub struct RolloutMetrics {
    pub reward: f64,
    pub reward_std: f64,
    /// Mean raw score of each reward component, by component name.
    pub components: Vec<(String, f64)>,
    /// Mean of each environment metric, by its key `env/<environment>/<name>`.
    pub env_metrics: Vec<(String, f64)>,
    pub frac_reward_zero_std: f64,
    pub mean_length: f64,
    pub max_length: f64,
    pub clipped_ratio: f64,
    pub hack_freq: Option<f64>,
    pub frac_rh: f64,
    pub frac_ablated: f64,
    pub frac_eligible: f64,
    pub frac_hackable: f64,
    /// The monitor against `rh_ground_truth:` (with one).
    pub monitor: Option<crate::reward::MonitorStats>,
    /// With `max_no_score_frac` above 0: the samples without a score (out of every other
    /// statistic); None otherwise.
    pub no_score_count: Option<f64>,
    /// With `dynamic_sampling_rounds`: what filling the batch took.
    pub dynamic_sampling: Option<DynamicSampling>,
    /// With `max_steps_off_policy`: how stale the batch was.
    pub off_policy: Option<OffPolicy>,
    /// With the retain verifier and coherence rows: the share of them it verified.
    pub frac_verified: Option<f64>,
    /// What the intervention logs (`adv_mod/...`, `placebo/...`), by key.
    pub intervention: Vec<(&'static str, f64)>,
    /// The fingerprint of the weights that sampled the batch's first rows.
    pub sampler_weights: Option<f64>,
    pub generate_seconds: f64,
    pub score_seconds: f64,
    pub reference_seconds: f64,
    pub sampler_setup_seconds: f64,
    pub old_logprobs_seconds: f64,
}

/// How stale a step's batch was and what waiting the overlap left.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OffPolicy {
    /// The version of the weights that sampled the batch (optimizer steps done before).
    pub policy_version: usize,
    /// Steps between the weights that sampled a group and the step's own: the batch's oldest
    /// group's (the max), its newest group's (the min) and the mean over its groups.
    pub staleness_max: usize,
    pub staleness_min: usize,
    pub staleness_mean: f64,
    /// Seconds the step waited for its batch.
    pub wait_seconds: f64,
    /// Seconds the sampler thread sat idle waiting for the batch's job (for weights).
    pub sampler_idle_seconds: f64,
}

/// What DAPO's dynamic sampling did for one batch (see [`key::DYNAMIC_SAMPLING_ROUNDS`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DynamicSampling {
    pub rounds: usize,
    pub groups_dropped: usize,
    pub groups_surplus: usize,
}

/// What one optimizer step measured.
#[derive(Debug, Clone, Default)]
pub struct StepMetrics {
    /// Steps done (1-based).
    pub step: usize,
    pub loss: f64,
    pub grad_norm: f64,
    pub learning_rate: f64,
    pub entropy: f64,
    pub logprob_advantage_covariance: f64,
    /// With `measure_entropy_change` only.
    pub entropy_change: Option<f64>,
    /// [`crate::probes::ENTROPY_QUANTILES`] of the per-token entropy.
    pub entropy_quantiles: [f64; 3],
    /// What the loss logs (`grpo::LossTerms::logged`: `kl`, `clip_ratio`, ..., `sampling/...`),
    /// by key; `None` is logged as null.
    pub loss_metrics: Vec<(&'static str, Option<f64>)>,
    /// With TRL's entropy bonus.
    pub entropy_bonus: Option<EntropyBonusMetrics>,
    /// Each aggregation's [`crate::grpo::WeightEss`] of the step's loss tokens, whichever the
    /// run trains with ([`AGGREGATIONS`]).
    pub aggregation_ess: Vec<(LossType, WeightEss)>,
    /// `kl_sample_train_v1` and `_v2`.
    pub kl_sample_train: (f64, f64),
    /// With kept sets (sampling replay).
    pub sampling_replay: Option<crate::grpo::ReplayStats>,
    /// With `gradient_noise_scale`: the step's estimates and their running averages.
    pub gradient_noise: Option<GradientNoise>,
    /// With `fisher_kernel_every`, on the steps it measures: the kernel's summary and seconds
    /// (`fisher/...`, `timing/fisher_kernel`); empty otherwise.
    pub fisher_kernel: Vec<(&'static str, f64)>,
    pub num_tokens: usize,
    pub train_seconds: f64,
    pub optimizer_seconds: f64,
    pub step_seconds: f64,
    /// DualLoRA's absorption diagnostics, keyed by [`key::absorption`].
    pub absorption: Vec<(String, f64)>,
}

/// What a step with TRL's entropy bonus logs about it.
#[derive(Debug, Clone, Copy)]
pub struct EntropyBonusMetrics {
    /// The coefficient after the step's update, and the one its loss applied.
    pub coef: f64,
    pub applied: f64,
    pub policy_loss: f64,
    pub trained_entropy: f64,
}

impl EntropyBonusMetrics {
    fn put(&self, put: &mut dyn FnMut(&str, Value) -> bool) {
        put(key::ENTROPY_COEF, self.coef.into());
        put(key::ENTROPY_COEF_APPLIED, self.applied.into());
        put(key::POLICY_LOSS, self.policy_loss.into());
        put(key::ENTROPY_TRAINED_MEAN, self.trained_entropy.into());
    }

    /// The adaptive control's state a metrics line recorded, `(coefficient, last entropy)`, to
    /// continue it on resume (read with `float_roundtrip`: the same float64 values).
    pub fn controller_in(line: &Value) -> Option<(f64, f64)> {
        Some((line[key::ENTROPY_COEF].as_f64()?, line[key::ENTROPY_TRAINED_MEAN].as_f64()?))
    }
}

/// The gradient noise scale of a step and its running average.
#[derive(Debug, Clone, Copy)]
pub struct GradientNoise {
    pub step: NoiseScale,
    pub average: NoiseScale,
}

impl GradientNoise {
    fn put(&self, put: &mut dyn FnMut(&str, Value) -> bool) {
        for (scale, [grad_squared, trace, simple]) in [(self.step, [key::NOISE_GRAD_SQUARED, key::NOISE_TRACE, key::NOISE_SCALE]), (self.average, [key::NOISE_GRAD_SQUARED_AVG, key::NOISE_TRACE_AVG, key::NOISE_SCALE_AVG])] {
            put(grad_squared, scale.grad_squared.into());
            put(trace, scale.trace.into());
            put(simple, scale.simple().into());
        }
    }

    /// The running average a metrics line recorded (to continue it on resume; the line is read
    /// with serde_json's `float_roundtrip`, so the resumed run continues the same float64 average).
    pub fn average_in(line: &Value) -> Option<NoiseScale> {
        let (grad_squared, trace) = (line[key::NOISE_GRAD_SQUARED_AVG].as_f64()?, line[key::NOISE_TRACE_AVG].as_f64()?);
        Some(NoiseScale { grad_squared, trace })
    }
}

/// One `metrics.jsonl` line.
pub fn line(rollout: &RolloutMetrics, step: &StepMetrics) -> Value {
    let mut m = Map::new();
    // Whether the key was new to the line.
    let mut put = |key: &str, value: Value| m.insert(key.to_string(), value).is_none();
    put(key::REWARD, rollout.reward.into());
    put(key::REWARD_STD, rollout.reward_std.into());
    for (name, mean) in &rollout.components {
        put(&key::component(name), (*mean).into());
    }
    for (env_key, mean) in &rollout.env_metrics {
        put(env_key, (*mean).into());
    }
    put(key::FRAC_REWARD_ZERO_STD, rollout.frac_reward_zero_std.into());
    put(key::MEAN_LENGTH, rollout.mean_length.into());
    put(key::MAX_LENGTH, rollout.max_length.into());
    put(key::CLIPPED_RATIO, rollout.clipped_ratio.into());
    if let Some(hack_freq) = rollout.hack_freq {
        put(key::HACK_FREQ, hack_freq.into());
    }
    put(key::FRAC_RH, rollout.frac_rh.into());
    put(key::FRAC_ABLATED, rollout.frac_ablated.into());
    put(key::FRAC_ELIGIBLE, rollout.frac_eligible.into());
    put(key::FRAC_HACKABLE, rollout.frac_hackable.into());
    for (name, value) in rollout.monitor.iter().flat_map(|stats| stats.fields()) {
        put(name, value);
    }
    if let Some(count) = rollout.no_score_count {
        put(key::NO_SCORE_COUNT, count.into());
    }
    if let Some(counts) = rollout.dynamic_sampling {
        put(key::DYNAMIC_SAMPLING_ROUNDS, counts.rounds.into());
        put(key::DYNAMIC_SAMPLING_DROPPED, counts.groups_dropped.into());
        put(key::DYNAMIC_SAMPLING_SURPLUS, counts.groups_surplus.into());
    }
    if let Some(frac) = rollout.frac_verified {
        put(key::VERIFIER_FRAC_VERIFIED, frac.into());
    }
    put_named(&mut put, rollout.intervention.iter().map(|&(name, value)| (name, Some(value))));
    if let Some(off_policy) = rollout.off_policy {
        put(key::OFF_POLICY_VERSION, off_policy.policy_version.into());
        put(key::ASYNC_STALENESS_MAX, off_policy.staleness_max.into());
        put(key::ASYNC_STALENESS_MIN, off_policy.staleness_min.into());
        put(key::ASYNC_STALENESS_MEAN, off_policy.staleness_mean.into());
        put(key::TIMING_WAIT_FOR_SAMPLES, off_policy.wait_seconds.into());
        put(key::TIMING_SAMPLER_IDLE, off_policy.sampler_idle_seconds.into());
    }
    if let Some(fingerprint) = rollout.sampler_weights {
        put(key::SAMPLER_WEIGHTS_FINGERPRINT, fingerprint.into());
    }
    put(key::TIMING_GENERATE, rollout.generate_seconds.into());
    put(key::TIMING_SCORE, rollout.score_seconds.into());
    put(key::TIMING_REFERENCE, rollout.reference_seconds.into());
    put(key::TIMING_SAMPLER_SETUP, rollout.sampler_setup_seconds.into());
    put(key::TIMING_OLD_LOGPROBS, rollout.old_logprobs_seconds.into());
    put(key::STEP, step.step.into());
    put(key::LOSS, step.loss.into());
    put(key::GRAD_NORM, step.grad_norm.into());
    put(key::LEARNING_RATE, step.learning_rate.into());
    put(key::ENTROPY, step.entropy.into());
    put(key::LOGPROB_ADVANTAGE_COVARIANCE, step.logprob_advantage_covariance.into());
    if let Some(change) = step.entropy_change {
        put(key::ENTROPY_CHANGE, change.into());
    }
    for (name, quantile) in key::ENTROPY_QUANTILES.iter().zip(step.entropy_quantiles) {
        put(name, quantile.into());
    }
    put_named(&mut put, step.loss_metrics.iter().copied());
    if let Some(bonus) = &step.entropy_bonus {
        bonus.put(&mut put);
    }
    for (loss_type, ess) in &step.aggregation_ess {
        put(&key::ess(key::ESS_TOKENS, *loss_type), ess.tokens.into());
        put(&key::ess(key::ESS_SEQUENCES, *loss_type), ess.sequences.into());
    }
    put(key::KL_SAMPLE_TRAIN_V1, step.kl_sample_train.0.into());
    put(key::KL_SAMPLE_TRAIN_V2, step.kl_sample_train.1.into());
    if let Some(replay) = &step.sampling_replay {
        put(key::REPLAY_KEPT_MASS_MEAN, replay.kept_mass_mean.into());
        put(key::REPLAY_RATIO_OUTSIDE, replay.ratio_outside_band.into());
    }
    if let Some(noise) = &step.gradient_noise {
        noise.put(&mut put);
    }
    for (name, value) in &step.fisher_kernel {
        put(name, (*value).into());
    }
    put(key::NUM_TOKENS, step.num_tokens.into());
    put(key::TIMING_TRAIN, step.train_seconds.into());
    put(key::TIMING_OPTIMIZER, step.optimizer_seconds.into());
    put(key::STEP_TIME, step.step_seconds.into());
    for (name, value) in &step.absorption {
        put(name, (*value).into());
    }
    Value::Object(m)
}

/// Writes a named-values list (a loss's, an intervention's) into a line: `None` as null. A key
/// the line already holds is an error: two parts of the step logging one key would otherwise
/// leave whichever came last.
fn put_named(put: &mut dyn FnMut(&str, Value) -> bool, values: impl IntoIterator<Item = (&'static str, Option<f64>)>) {
    for (name, value) in values {
        assert!(put(name, value.into()), "internal error: the metrics line's key {name} is written twice");
    }
}

/// The step line people read: reward, its components, kl, loss, length, time.
pub fn summary_line(m: &Value) -> String {
    let mut parts = vec![format!("reward={:.3}", m[key::REWARD].as_f64().unwrap_or(f64::NAN))];
    if let Some(obj) = m.as_object() {
        for (name, value) in obj.iter().filter(|(k, _)| k.starts_with(key::COMPONENT_PREFIX)) {
            let component = name.trim_start_matches(key::COMPONENT_PREFIX).trim_end_matches(key::COMPONENT_SUFFIX);
            parts.push(format!("{component}={:.3}", value.as_f64().unwrap_or(f64::NAN)));
        }
    }
    for name in [key::HACK_FREQ, key::KL, key::ENTROPY, key::LOSS, key::GRAD_NORM, key::MEAN_LENGTH, key::STEP_TIME] {
        if let Some(v) = m[name].as_f64() {
            // Small values (the KL early in a run) keep their significant digits.
            let text = if v != 0.0 && v.abs() < 1e-3 { format!("{v:.2e}") } else { format!("{v:.4}") };
            parts.push(format!("{}={text}", name.trim_start_matches("completions/")));
        }
    }
    parts.join(" ")
}

/// A run's reward curve (`smallrl eval --reward-history`): final average (last 10% of steps)
/// and whether the reward stayed above 90% of that average over those steps (the original's
/// stability verdict).
pub fn reward_history(run_dir: &Path) -> Result<Value> {
    let metrics = run_dir.join("metrics.jsonl");
    let rewards: Vec<f64> = crate::runlog::Jsonl::new(metrics.clone())
        .read()?
        .iter()
        .map(|line| line[key::REWARD].as_f64())
        .collect::<Option<_>>()
        .with_context(|| format!("{} has a line without a numeric reward", metrics.display()))?;
    ensure!(!rewards.is_empty(), "{} is empty", metrics.display());
    let tail = &rewards[rewards.len() - (rewards.len() / 10).max(1)..];
    let final_average = crate::stats::mean(tail);
    let stable = tail.iter().all(|&r| r >= 0.9 * final_average);
    let summary = format!(
        "reward history: {} steps, first {:.3}, final average {:.3} (last {} steps), {}",
        rewards.len(),
        rewards[0],
        final_average,
        tail.len(),
        if stable { "stable" } else { "not stable (a step fell below 90% of the final average)" }
    );
    Ok(serde_json::json!({"rewards": rewards, "final_average": final_average, "stable": stable, "summary": summary}))
}

#[cfg(test)]
mod tests {
    use tch::{Kind, Tensor};

    use super::{RolloutMetrics, StepMetrics, key, line};
    use crate::grpo::{self, Aggregation, ImportanceSamplingLevel, LossMetric, LossType, Objective, RatioTo, Surrogate};

    /// One completion of two tokens with ratios 1.5 and 0.5 to the old policy, advantage +1,
    /// TRL's clip [0.8, 1.28], dapo: the loss terms.
    fn terms() -> grpo::LossTerms {
        let objective = Objective {
            surrogate: Surrogate::Clip { low: 0.2, high: 0.28, delta: None },
            ratio_to: RatioTo::OldPolicy,
            ratio_level: ImportanceSamplingLevel::Token,
            aggregation: Aggregation::of(LossType::Dapo, 2),
            kl: None,
            top_entropy_quantile: 1.0,
            correction: None,
            off_policy_mask_threshold: None,
            entropy: None,
        };
        let logprobs = Tensor::zeros([1, 2], (Kind::Float, tch::Device::Cpu));
        let old = Tensor::from_slice(&[-(1.5f64.ln()) as f32, -(0.5f64.ln()) as f32]).view([1, 2]);
        let (advantages, mask) = (Tensor::from_slice(&[1.0f32]), Tensor::ones([1, 2], (Kind::Int64, tch::Device::Cpu)));
        let all_rows = [Tensor::ones([1], (Kind::Float, tch::Device::Cpu))];
        grpo::grpo_loss(&logprobs, Some(&old), None, &advantages, (&mask).into(), &all_rows, &objective)
    }

    /// A metric is one entry on the loss's list: the test pushes one the trainer does not know
    /// (`test/ratio_mean`, the mean ratio: (1.5 + 0.5) / 2 in float64) and it reaches the line
    /// beside the loss's own, with nothing else changed. The loss's own against float64 by hand:
    /// 1.5 is above 1.28 with A > 0 (TRL's high clip, one token in two), both ratios are outside
    /// [0.8, 1.28] (`clip_ratio` 1), Kish's ESS of the weights (1.5 / 2, 0.5 / 2) is 1 / 0.625 = 1.6,
    /// no KL penalty logs null, and cispo's and VESPO's keys are absent.
    #[test]
    fn a_metric_pushed_on_the_loss_list_reaches_the_metrics_line() {
        let mut terms = terms();
        let ratio = Tensor::from_slice(&[1.5f32, 0.5]);
        terms.metrics.push(LossMetric::new("test/ratio_mean", ratio.mean(Kind::Float)));
        let step = StepMetrics { loss_metrics: terms.logged(), ..Default::default() };
        let line = line(&RolloutMetrics::default(), &step);
        let expected = [("test/ratio_mean", 1.0), (key::CLIP_LOW, 0.0), (key::CLIP_HIGH, 0.5), (key::CLIP_REGION, 0.5), (key::CLIP_RATIO, 1.0), (key::EFFECTIVE_SAMPLE_SIZE, 1.6)];
        for (name, value) in expected {
            let logged = line[name].as_f64().unwrap_or_else(|| panic!("no {name} in {line}"));
            assert!((logged - value).abs() < 1e-6, "{name}: {logged} vs {value} (float64, by hand)");
        }
        assert!(line[key::KL].is_null() && line.get(key::KL).is_some(), "kl is logged as null without a KL penalty: {line}");
        assert!(line.get(key::CISPO_CLIP_RATIO).is_none() && line.get(key::VESPO_PHI_SEQ_MEAN).is_none(), "{line}");
    }

    /// Two parts of the step logging one key is an error, not a silent overwrite.
    #[test]
    #[should_panic(expected = "the metrics line's key clip_ratio is written twice")]
    fn an_intervention_and_a_loss_logging_one_key_is_an_error() {
        let rollout = RolloutMetrics { intervention: vec![(key::CLIP_RATIO, 0.5)], ..Default::default() };
        line(&rollout, &StepMetrics { loss_metrics: terms().logged(), ..Default::default() });
    }
}
