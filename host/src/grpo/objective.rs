//! The objective as a typed value, built once from the configuration's flat keys
//! ([`ObjectiveKeys`] -> [`Objective`]): the surrogate (TRL's clip, CISPO, SAPO or VESPO, or one
//! of tinker's `loss_fn`s), where the importance ratio is taken, the aggregation and the KL penalty, each
//! chosen separately as TRL does. Every cross-key rule lives in [`Objective::new`], so a value of
//! [`Objective`] is valid by construction and the loss never reads a key that does not apply.

use anyhow::{Context, Result, ensure};

use super::aggregation::Aggregation;
use super::entropy::{EntropyControl, EntropyKeys};
use super::is_correction::{ImportanceSamplingMode, IsCorrection};
use super::kl::{KlEstimator, KlPenalty};

crate::choice::choice! {
    /// How the per-token loss is aggregated (TRL's `loss_type`; the flat key).
    pub enum LossType ("loss_type") {
        /// Mean over each sequence's tokens, then mean over sequences.
        Grpo = "grpo",
        /// Sum over tokens / (sequences * max_completion_length).
        DrGrpo = "dr_grpo",
        /// Sum over tokens / active tokens of the (global) batch.
        Dapo = "dapo",
        /// Sum over tokens / active tokens of the local batch (the same as dapo on one process).
        Bnpo = "bnpo",
        /// TRL's CISPO (MiniMax-M1): the surrogate `-min(r, epsilon_high).detach() A logp` in
        /// place of the clipped ratio, aggregated as dapo.
        Cispo = "cispo",
        /// TRL's SAPO: the soft gate `sigmoid(tau (r - 1)) 4 / tau` in place of the clip,
        /// aggregated as grpo.
        Sapo = "sapo",
        /// TRL's LUSPO: GSPO's clipped sequence ratio, each sequence's token losses summed (its
        /// loss scaled by its length), then the mean over sequences.
        Luspo = "luspo",
        /// TRL's VESPO: `-phi(w).detach() A logp`, `phi` a Gamma weighting of the sequence's
        /// importance weight `w`, aggregated as dapo.
        Vespo = "vespo",
    }
}

crate::choice::choice! {
    /// The per-token surrogate (the flat key): TRL's (as [`LossType`] names it) or one of
    /// tinker's built-in RL losses (`forward_backward(loss_fn=...)`, as tinker's documentation
    /// `losses.mdx` writes them), whose ratio `r = exp(logp - logq)` is to the sampler's
    /// log-probability `logq`.
    pub enum LossFn ("loss_fn") {
        /// TRL's: PPO's clip, or CISPO's with `loss_type: cispo`.
        Trl = "trl",
        /// tinker's `importance_sampling`: `r A`, no clip.
        ImportanceSampling = "importance_sampling",
        /// tinker's `ppo`: `min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A)`.
        Ppo = "ppo",
        /// tinker's `dro`: `logp A - dro_beta / 2 (logp - logq)^2`.
        Dro = "dro",
    }
}

crate::choice::choice! {
    /// Where the importance ratio is taken (TRL's `importance_sampling_level`).
    pub enum ImportanceSamplingLevel ("importance_sampling_level") {
        /// One ratio per token, `exp(logp - old_logp)`.
        Token = "token",
        /// One ratio per completion, `exp(mean_t(logp - old_logp))` over its loss tokens (GSPO).
        Sequence = "sequence",
    }
}

/// The per-token surrogate that the loss maximises, with exactly the settings it reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Surrogate {
    /// PPO's `min(min(r, delta) A, clip(r, 1 - low, 1 + high) A)` (TRL's; tinker's `ppo`
    /// without `delta`).
    Clip { low: f64, high: f64, delta: Option<f64> },
    /// CISPO's `min(r, cap).detach() A logp` (TRL's `loss_type: cispo`, `cap` = `epsilon_high`).
    Cispo { cap: f64 },
    /// tinker's `importance_sampling`: `r A`.
    ImportanceSampling,
    /// tinker's `dro`: `logp A - beta / 2 (logp - logq)^2`.
    Dro { beta: f64 },
    /// TRL's SAPO: `sigmoid(tau (r - 1)) 4 / tau A`, `tau` = `positive` where `A > 0`, else
    /// `negative`.
    Sapo { positive: f64, negative: f64 },
    /// TRL's VESPO: `phi(w).detach() A logp` ([`super::vespo_weights`]).
    Vespo(VespoGamma),
}

/// VESPO's Gamma weighting `phi(w) = e^lambda w^k e^(-lambda w)` (`phi(1) = 1`) of a sequence's
/// importance weight `w`, with `(k, lambda)` chosen by the sign of the advantage (TRL's
/// `vespo_k_pos`, `vespo_lambda_pos` where `A >= 0`, `vespo_k_neg`, `vespo_lambda_neg` below).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VespoGamma {
    pub k_pos: f64,
    pub lambda_pos: f64,
    pub k_neg: f64,
    pub lambda_neg: f64,
}

/// Which log-probabilities the importance ratio divides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RatioTo {
    /// TRL's: the old policy's (the rollout's, or the current ones detached when each rollout
    /// trains once).
    OldPolicy,
    /// tinker's: the sampler's own log-probabilities.
    Sampler,
}

/// The GRPO objective: what [`super::weighted_loss`] computes per token and how it weighs tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Objective {
    pub surrogate: Surrogate,
    pub ratio_to: RatioTo,
    pub ratio_level: ImportanceSamplingLevel,
    pub aggregation: Aggregation,
    /// `None` when `beta` is 0 (TRL then skips the reference model).
    pub kl: Option<KlPenalty>,
    /// The top fraction of loss tokens by entropy whose policy term trains (1: all; see
    /// [`super::high_entropy_mask`]).
    pub top_entropy_quantile: f64,
    /// TRL's sampler/learner importance-sampling correction (`None`: off, every weight 1).
    pub correction: Option<IsCorrection>,
    /// TRL's `off_policy_mask_threshold` (DeepSeek-V3.2's off-policy sequence mask): a completion
    /// with a negative advantage whose mean `logp_sampler - logp` over its loss tokens exceeds it
    /// leaves the policy term (`None`: off).
    pub off_policy_mask_threshold: Option<f64>,
    /// TRL's entropy bonus and how its coefficient is set (`None`: no bonus).
    pub entropy: Option<EntropyControl>,
}

/// The configuration's flat keys that the objective is built from (TRL's and tinker's names).
pub struct ObjectiveKeys {
    pub loss_type: LossType,
    pub loss_fn: LossFn,
    pub epsilon: f64,
    /// Whether `epsilon` was set away from its default (tinker's unclipped losses refuse it).
    pub epsilon_is_set: bool,
    pub epsilon_high: Option<f64>,
    pub delta: Option<f64>,
    pub dro_beta: Option<f64>,
    pub importance_sampling_level: ImportanceSamplingLevel,
    pub beta: f64,
    pub kl_estimator: KlEstimator,
    pub max_completion_length: usize,
    pub top_entropy_quantile: f64,
    /// TRL's `vllm_importance_sampling_correction` and its mode and bounds (without the
    /// `vllm_` prefix: smallrl's samplers are its own engines).
    pub importance_sampling_correction: bool,
    pub importance_sampling_mode: ImportanceSamplingMode,
    pub importance_sampling_clip_min: f64,
    pub importance_sampling_clip_max: f64,
    /// Whether the mode or a bound was set away from its default (refused without the correction).
    pub importance_sampling_correction_keys_set: bool,
    /// SAPO's temperatures `(sapo_temperature_pos, sapo_temperature_neg)`.
    pub sapo_temperatures: (f64, f64),
    /// VESPO's Gamma parameters (`vespo_k_pos`, `vespo_lambda_pos`, `vespo_k_neg`, `vespo_lambda_neg`).
    pub vespo: VespoGamma,
    /// Whether a `sapo_*` or a `vespo_*` key was set away from its default (refused with another loss).
    pub sapo_keys_set: bool,
    pub vespo_keys_set: bool,
    pub off_policy_mask_threshold: Option<f64>,
    /// TRL's `use_bias_correction_kl`: the KL term multiplied by the importance ratio.
    pub use_bias_correction_kl: bool,
    /// TRL's `entropy_coef` and its adaptive control's keys.
    pub entropy: EntropyKeys,
}

impl Objective {
    /// The objective the keys describe, or the first rule they break, named with its keys. TRL
    /// accepts any values; these rules refuse the ones whose objective is not the one named.
    pub fn new(keys: &ObjectiveKeys) -> Result<Self> {
        ensure!(
            keys.top_entropy_quantile > 0.0 && keys.top_entropy_quantile <= 1.0,
            "top_entropy_quantile ({}) must be in (0, 1]: the fraction of loss tokens (by entropy) that train",
            keys.top_entropy_quantile
        );
        ensure!(
            (keys.loss_fn == LossFn::Dro) == keys.dro_beta.is_some(),
            "dro_beta is DRO's penalty coefficient: set it with loss_fn dro (tinker's documentation uses 0.05) and only then (loss_fn {}, dro_beta {:?})",
            keys.loss_fn,
            keys.dro_beta
        );
        let surrogate = match keys.loss_fn {
            LossFn::Trl => trl_surrogate(keys)?,
            tinker => tinker_surrogate(tinker, keys)?,
        };
        let ratio_to = if keys.loss_fn == LossFn::Trl { RatioTo::OldPolicy } else { RatioTo::Sampler };
        let correction = correction(keys)?;
        soft_loss_rules(keys, correction)?;
        Ok(Self {
            surrogate,
            ratio_to,
            ratio_level: keys.importance_sampling_level,
            aggregation: Aggregation::of(keys.loss_type, keys.max_completion_length),
            kl: kl(keys)?,
            top_entropy_quantile: keys.top_entropy_quantile,
            correction,
            off_policy_mask_threshold: off_policy_mask(keys.off_policy_mask_threshold)?,
            entropy: EntropyControl::of(&keys.entropy)?,
        })
    }
}

/// The KL penalty (`None` with `beta` 0, where `use_bias_correction_kl` has no term to weigh).
fn kl(keys: &ObjectiveKeys) -> Result<Option<KlPenalty>> {
    if keys.beta == 0.0 {
        ensure!(!keys.use_bias_correction_kl, "use_bias_correction_kl weighs the KL term by the importance ratio; beta is 0, so there is no KL term: set beta, or unset use_bias_correction_kl");
        return Ok(None);
    }
    Ok(Some(KlPenalty { beta: keys.beta, estimator: keys.kl_estimator, bias_correction: keys.use_bias_correction_kl }))
}

/// The off-policy mask's threshold on a mean log-probability gap: any finite value (TRL's
/// documentation expects a positive one, e.g. 0.5).
fn off_policy_mask(threshold: Option<f64>) -> Result<Option<f64>> {
    if let Some(threshold) = threshold {
        ensure!(threshold.is_finite(), "off_policy_mask_threshold ({threshold}) must be finite (DeepSeek-V3.2's delta, e.g. 0.5)");
    }
    Ok(threshold)
}

/// The rules of TRL 1.16's sapo, luspo and vespo that their surrogates do not check: their keys
/// only with them, the importance-sampling level each is defined at (TRL warns; smallrl refuses,
/// since the objective would not be the one named), and VESPO's per-token correction (TRL's
/// `ValueError`).
fn soft_loss_rules(keys: &ObjectiveKeys, correction: Option<IsCorrection>) -> Result<()> {
    let loss_type = keys.loss_type;
    ensure!(!keys.sapo_keys_set || loss_type == LossType::Sapo, "sapo_temperature_pos and sapo_temperature_neg are SAPO's gate temperatures: set them with loss_type sapo only (loss_type {loss_type})");
    ensure!(!keys.vespo_keys_set || loss_type == LossType::Vespo, "vespo_k_pos, vespo_lambda_pos, vespo_k_neg and vespo_lambda_neg shape VESPO's weighting: set them with loss_type vespo only (loss_type {loss_type})");
    let level = keys.importance_sampling_level;
    ensure!(
        loss_type != LossType::Luspo || level == ImportanceSamplingLevel::Sequence,
        "loss_type luspo is defined on GSPO's sequence ratios: set importance_sampling_level: sequence (it is {level})"
    );
    ensure!(
        loss_type != LossType::Vespo || level == ImportanceSamplingLevel::Token,
        "loss_type vespo takes its sequence weight from the per-token log-ratios itself: leave importance_sampling_level at token (it is {level})"
    );
    if let (LossType::Vespo, Some(correction)) = (loss_type, correction) {
        ensure!(
            !correction.mode.per_sequence(),
            "loss_type vespo folds the importance-sampling correction into its sequence weight token by token: set importance_sampling_mode to token_truncate or token_mask (it is {})",
            correction.mode
        );
    }
    Ok(())
}

/// The importance-sampling correction the keys ask for: TRL's loss only (tinker's losses already
/// take their ratio to the sampler's log-probabilities, a second correction would count the
/// mismatch twice), and its mode and bounds only with it.
fn correction(keys: &ObjectiveKeys) -> Result<Option<IsCorrection>> {
    if !keys.importance_sampling_correction {
        ensure!(
            !keys.importance_sampling_correction_keys_set,
            "importance_sampling_mode, importance_sampling_clip_min and importance_sampling_clip_max shape the importance-sampling correction: set importance_sampling_correction: true, or unset them"
        );
        return Ok(None);
    }
    ensure!(
        keys.loss_fn == LossFn::Trl,
        "importance_sampling_correction weights TRL's loss by the learner's over the sampler's probabilities; loss_fn {} already takes its ratio to the sampler's log-probabilities: unset one of them",
        keys.loss_fn
    );
    IsCorrection::new(keys.importance_sampling_mode, keys.importance_sampling_clip_min, keys.importance_sampling_clip_max).map(Some)
}

/// TRL's surrogates: CISPO's, SAPO's or VESPO's with their loss types, PPO's clip otherwise.
fn trl_surrogate(keys: &ObjectiveKeys) -> Result<Surrogate> {
    match keys.loss_type {
        LossType::Cispo => cispo(keys),
        LossType::Sapo | LossType::Vespo => soft_surrogate(keys),
        LossType::Grpo | LossType::DrGrpo | LossType::Dapo | LossType::Bnpo | LossType::Luspo => clip(keys),
    }
}

/// SAPO's gate or VESPO's weighting: neither clips, so a clip range or `delta` set with them is
/// a setting the objective would ignore.
fn soft_surrogate(keys: &ObjectiveKeys) -> Result<Surrogate> {
    let loss_type = keys.loss_type;
    ensure!(!keys.epsilon_is_set && keys.epsilon_high.is_none() && keys.delta.is_none(), "epsilon, epsilon_high and delta shape the clip; loss_type {loss_type} has none: unset them");
    if loss_type == LossType::Sapo {
        let (positive, negative) = keys.sapo_temperatures;
        ensure!(positive > 0.0 && negative > 0.0 && positive.is_finite() && negative.is_finite(), "sapo_temperature_pos ({positive}) and sapo_temperature_neg ({negative}) must be positive (TRL's defaults: 1.0 and 1.05)");
        return Ok(Surrogate::Sapo { positive, negative });
    }
    let VespoGamma { k_pos, lambda_pos, k_neg, lambda_neg } = keys.vespo;
    ensure!([k_pos, k_neg].iter().all(|k| k.is_finite() && *k >= 0.0), "vespo_k_pos ({k_pos}) and vespo_k_neg ({k_neg}) are powers of the weight: finite and at least 0 (TRL's defaults: 2 and 3)");
    ensure!([lambda_pos, lambda_neg].iter().all(|l| l.is_finite() && *l > 0.0), "vespo_lambda_pos ({lambda_pos}) and vespo_lambda_neg ({lambda_neg}) are decay rates: finite and positive (TRL's defaults: 3 and 2)");
    Ok(Surrogate::Vespo(keys.vespo))
}

/// CISPO's cap: `epsilon_high`, which must be set and above 1.
fn cispo(keys: &ObjectiveKeys) -> Result<Surrogate> {
    // TRL would cap CISPO's weight at epsilon (0.2): weights of at most 0.2, not a CISPO.
    let cap = keys.epsilon_high.context("loss_type cispo caps the importance weight at epsilon_high: set it (TRL and ScaleRL recommend 5.0)")?;
    ensure!(cap > 1.0, "epsilon_high ({cap}) is CISPO's cap on the importance weight and must exceed 1 (TRL and ScaleRL recommend 5.0)");
    ensure!(keys.delta.is_none(), "delta clamps the PPO surrogate's ratio; cispo does not use it: unset delta");
    Ok(Surrogate::Cispo { cap })
}

/// PPO's clip range: `epsilon` below 1, `epsilon_high` (default `epsilon`) above, `delta`'s clamp.
fn clip(keys: &ObjectiveKeys) -> Result<Surrogate> {
    let high = keys.epsilon_high.unwrap_or(keys.epsilon);
    ensure!(high >= keys.epsilon, "epsilon_high ({high}) is below epsilon ({}): clip-higher widens the range above 1, it never narrows it", keys.epsilon);
    if let Some(delta) = keys.delta {
        ensure!(
            delta > 1.0 + high,
            "delta ({delta}) must exceed 1 + epsilon_high ({}), as TRL's documentation asks: below it the clamp cuts into the clip range",
            1.0 + high
        );
    }
    Ok(Surrogate::Clip { low: keys.epsilon, high, delta: keys.delta })
}

/// tinker's losses as tinker defines them: one ratio per token to the sampler's
/// log-probabilities, no `delta`, their own surrogate in place of cispo's, only the knobs each
/// uses (a clip range for `ppo`, a penalty for `dro`).
fn tinker_surrogate(loss_fn: LossFn, keys: &ObjectiveKeys) -> Result<Surrogate> {
    let loss_type = keys.loss_type;
    ensure!(
        matches!(loss_type, LossType::Grpo | LossType::DrGrpo | LossType::Dapo | LossType::Bnpo),
        "loss_type {loss_type} is TRL's own surrogate; loss_fn {loss_fn} replaces it: pick an aggregation (grpo, dr_grpo, dapo, bnpo)"
    );
    ensure!(
        keys.importance_sampling_level == ImportanceSamplingLevel::Token,
        "tinker's {loss_fn} takes one ratio per token: leave importance_sampling_level at token"
    );
    ensure!(keys.delta.is_none(), "delta is TRL's clamp; tinker's {loss_fn} has none: unset delta");
    if loss_fn != LossFn::Ppo {
        ensure!(!keys.epsilon_is_set && keys.epsilon_high.is_none(), "epsilon and epsilon_high set a clip range; tinker's {loss_fn} has no clip: unset them");
    }
    Ok(match (loss_fn, keys.dro_beta) {
        (LossFn::Ppo, _) => clip(keys)?,
        (LossFn::ImportanceSampling, _) => Surrogate::ImportanceSampling,
        (LossFn::Dro, Some(beta)) => {
            ensure!(beta > 0.0 && beta.is_finite(), "dro_beta ({beta}) must be positive");
            Surrogate::Dro { beta }
        }
        (LossFn::Dro, None) | (LossFn::Trl, _) => unreachable!("Objective::new pairs dro with dro_beta and sends trl to trl_surrogate"),
    })
}

impl Aggregation {
    /// The aggregation `loss_type` names (cispo's and vespo's are dapo's, sapo's grpo's, as in
    /// TRL's `_compute_loss`). Here, beside the flat key, so that `aggregation` knows nothing of
    /// the keys.
    pub fn of(loss_type: LossType, max_completion_length: usize) -> Self {
        match loss_type {
            LossType::Grpo | LossType::Sapo => Self::Grpo,
            LossType::DrGrpo => Self::DrGrpo { max_completion_length },
            LossType::Dapo | LossType::Cispo | LossType::Vespo => Self::Dapo,
            LossType::Bnpo => Self::Bnpo,
            LossType::Luspo => Self::Luspo,
        }
    }
}
