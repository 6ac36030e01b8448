//! The per-token loss of an [`Objective`]: the importance ratio, the surrogate, the
//! sampler/learner correction, the KL penalty, and what a step logs about them (clip fractions,
//! Kish's effective sample size, the correction's ratios) as one list of named values
//! ([`LossMetric`], `logged.rs`).

use tch::{Kind, Tensor};

use super::aggregation::token_weights;
use super::kl::per_token_kl;
use super::logged::{LossMetric, importance_sampling_metrics, key};
use super::masks::TokenMasks;
use super::objective::{ImportanceSamplingLevel, Objective, RatioTo, Surrogate, VespoGamma};
use crate::stats::effective_sample_size;

pub struct LossTerms {
    pub loss: Tensor,
    /// Per-token KL (`None` without a KL penalty, as TRL skips the reference model then).
    pub per_token_kl: Option<Tensor>,
    /// What the step's metrics line logs about the loss, each key once, in the order
    /// [`sampled_loss`] pushes them:
    /// - `kl`: the mean per-token KL over the loss tokens (null without a KL penalty);
    /// - `clip_ratio`: the fraction of loss tokens whose ratio was clipped (low or high side,
    ///   whatever the sign of the advantage; per token also with sequence ratios);
    /// - TRL's clip fractions ([`ClipFractions`]) of the clipped surrogate (also tinker's `ppo`;
    ///   null with cispo, which TRL does not log them for, and with the unclipped losses);
    /// - TRL's `cispo_clip_ratio` (with cispo only): the fraction of loss tokens (completions
    ///   with sequence ratios) whose weight the cap caps, with a positive advantage;
    /// - TRL's `vespo/phi_seq_mean` (with vespo only): the mean over completions of VESPO's weight;
    /// - `effective_sample_size`: `(Σw)² / Σw²` of the loss weights `w` = each token's weight in
    ///   the aggregation times its importance ratio and the correction's weight (0 for tokens
    ///   the policy mask drops): the number of equally weighted tokens that would carry as much
    ///   information ([`effective_sample_size`]);
    /// - TRL's `sampling/...` metrics of the importance-sampling correction (with it only).
    pub metrics: Vec<LossMetric>,
    /// With TRL's entropy bonus: what the engine's passes add to `loss` (`None` here).
    pub entropy_bonus: Option<EntropyBonus>,
}

impl LossTerms {
    /// The value logged under `key` (`None` when the loss logs it as null or not at all).
    pub fn metric(&self, key: &str) -> Option<&Tensor> {
        self.metrics.iter().find(|m| m.key == key).and_then(|m| m.value.as_ref())
    }

    /// [`Self::metric`] read back as a float64.
    pub fn number(&self, key: &str) -> Option<f64> {
        self.metric(key).map(|value| value.double_value(&[]))
    }

    /// The named values of the step's metrics line, read back (`None`: null).
    pub fn logged(&self) -> Vec<(&'static str, Option<f64>)> {
        self.metrics.iter().map(|m| (m.key, m.value.as_ref().map(|value| value.double_value(&[])))).collect()
    }
}

/// What a pass with TRL's entropy bonus logs about it.
pub struct EntropyBonus {
    /// The loss before the bonus (TRL's `policy_loss`), no gradient.
    pub policy_loss: Tensor,
    /// The mean entropy of the tokens that train (what the adaptive control reads).
    pub mean_entropy: f64,
}

/// The log-probabilities a loss reads (`[batch, len]` each): the policy's (differentiable), what
/// the ratio divides by ([`RatioTo`]; `None`: the current ones detached), the reference policy's
/// (with a KL penalty) and the sampler's (with the importance-sampling correction).
///
/// Sampling replay: `replayed` are the policy's log-probabilities renormalised over the
/// sampler's kept sets (differentiable), and wherever a ratio or a gap divides by the sampler's
/// log-probabilities, the policy's side is these (a ratio to `old` when `old_is_sampler`, the
/// importance-sampling correction on policy, the off-policy mask); the ratio between the policy
/// and an old policy of the trainer's, and the KL to the reference, keep the full softmax.
#[derive(Clone, Copy)]
pub struct LossLogprobs<'a> {
    pub current: &'a Tensor,
    pub old: Option<&'a Tensor>,
    pub reference: Option<&'a Tensor>,
    pub sampler: Option<&'a Tensor>,
    pub replayed: Option<&'a Tensor>,
    /// `old` are the sampler's log-probabilities (tinker's ratio, a batch sampled ahead or replayed).
    pub old_is_sampler: bool,
}

impl<'a> LossLogprobs<'a> {
    /// Without a sampler or kept sets: the policy's, what the ratio divides by and the reference's.
    pub fn plain(current: &'a Tensor, old: Option<&'a Tensor>, reference: Option<&'a Tensor>) -> Self {
        Self { current, old, reference, sampler: None, replayed: None, old_is_sampler: false }
    }
}

/// TRL's `clip_ratio/low_mean`, `high_mean` and `region_mean`: the fraction of ratios at which
/// the clip stops the gradient, below `1 - epsilon` with a negative advantage, above
/// `1 + epsilon_high` with a positive one (the ratio after `delta`'s clamp, as TRL tests it).
/// Over loss tokens with token ratios, over completions with sequence ratios.
pub struct ClipFractions {
    pub low: Tensor,
    pub high: Tensor,
    pub region: Tensor,
}

impl ClipFractions {
    const KEYS: [&'static str; 3] = [key::CLIP_LOW, key::CLIP_HIGH, key::CLIP_REGION];

    fn logged(self) -> Vec<LossMetric> {
        Self::KEYS.into_iter().zip([self.low, self.high, self.region]).map(|(key, value)| LossMetric::new(key, value)).collect()
    }

    /// The keys every line has, null for a surrogate without TRL's clip.
    fn null() -> Vec<LossMetric> {
        Self::KEYS.into_iter().map(LossMetric::null).collect()
    }
}

/// The GRPO loss of a whole batch in one pass. `classes` are `[batch]` 0/1 row masks that
/// partition the batch (one mask of ones when nothing is routed); the loss is
/// `sum_c (n_c / n) * aggregate(rows of c)` with `n` the rows of the classes, which is exactly
/// what separate backward passes per class with loss scaled by `n_c / n` produce. For `grpo`
/// this equals the plain aggregate over the whole batch. Rows in no class (samples without a
/// score) add nothing and are out of `n`; dropped coherence rows are a class whose tokens are
/// all masked (they count in `n`).
pub fn grpo_loss(
    logprobs: &Tensor,
    old_logprobs: Option<&Tensor>,
    ref_logprobs: Option<&Tensor>,
    advantages: &Tensor,
    masks: TokenMasks,
    classes: &[Tensor],
    objective: &Objective,
) -> LossTerms {
    let weights = token_weights(&masks.loss.to_kind(Kind::Float), classes, objective.aggregation, 1);
    weighted_loss(logprobs, old_logprobs, ref_logprobs, advantages, masks, &weights, objective)
}

/// The loss `Σ per_token_loss * weights` of some rows, with the rows' token weights.
/// `old_logprobs` are what the ratio divides by ([`RatioTo`]); without them the ratio is to the
/// current log-probabilities detached (1, with the gradient of `logp`). No sampler's
/// log-probabilities: for objectives without the importance-sampling correction
/// ([`sampled_loss`] takes them).
pub fn weighted_loss(
    logprobs: &Tensor,
    old_logprobs: Option<&Tensor>,
    ref_logprobs: Option<&Tensor>,
    advantages: &Tensor,
    masks: TokenMasks,
    weights: &Tensor,
    objective: &Objective,
) -> LossTerms {
    sampled_loss(LossLogprobs::plain(logprobs, old_logprobs, ref_logprobs), advantages, masks, weights, objective)
}

/// [`weighted_loss`] with the sampler's log-probabilities too, which the objective's
/// importance-sampling correction (TRL's) weighs each token's policy term by: the loss is
/// `Σ (-surrogate * policy_mask * rho + beta * kl) * weights`, `rho` the correction's ratio of the
/// old policy's probabilities (`logprobs.old`, or the current ones detached) to the sampler's,
/// as TRL's `_compute_loss` multiplies it in (after the entropy mask, before the KL term).
pub fn sampled_loss(logprobs: LossLogprobs, advantages: &Tensor, masks: TokenMasks, weights: &Tensor, objective: &Objective) -> LossTerms {
    let LossLogprobs { current: full, old: old_logprobs, reference: ref_logprobs, sampler, replayed, old_is_sampler } = logprobs;
    let mask = masks.loss.to_kind(Kind::Float);
    assert!(objective.ratio_to == RatioTo::OldPolicy || old_logprobs.is_some(), "tinker's losses take their ratio to the sampler's log-probabilities: pass them as old_logprobs");
    // tinker's losses divide by the sampler's log-probabilities by definition.
    let old_is_sampler = old_is_sampler || objective.ratio_to == RatioTo::Sampler;
    // The policy's log-probabilities as compared with the sampler's (replay), and as the ratio
    // to `old` reads them.
    let versus_sampler = replayed.unwrap_or(full);
    let logprobs = if old_is_sampler { versus_sampler } else { full };
    let old = old_logprobs.map_or_else(|| logprobs.detach(), Tensor::shallow_clone);
    // The correction's learner side: the old policy's, or on policy the current ones detached.
    let learner = old_logprobs.map_or_else(|| versus_sampler.detach(), Tensor::shallow_clone);
    // `[batch, len]` per token, `[batch, 1]` per sequence; everything below broadcasts.
    let log_ratio = logprobs - &old;
    let ratio = importance_ratio(&log_ratio, &mask, objective.ratio_level);
    let advantages = advantages.unsqueeze(1);
    let correction = objective.correction.map(|correction| {
        let sampler = sampler.expect("importance_sampling_correction needs the sampler's log-probabilities: pass them to sampled_loss");
        let rho = correction.ratio(&learner, sampler, &mask);
        let stats = correction.stats(&rho, &learner, sampler, &mask);
        (rho, stats)
    });
    let surrogate = match objective.surrogate {
        Surrogate::Clip { low, high, delta } => clipped(&ratio, &advantages, &mask, (low, high, delta), objective.ratio_level),
        Surrogate::Cispo { cap } => cispo(logprobs, &ratio, &advantages, &mask, cap, objective.ratio_level),
        Surrogate::ImportanceSampling => unclipped(&ratio * &advantages, &ratio),
        Surrogate::Dro { beta } => unclipped(logprobs * &advantages - (logprobs - &old).square() * (0.5 * beta), &ratio),
        Surrogate::Sapo { positive, negative } => unclipped(sapo_gate(&ratio, &advantages, positive, negative) * &advantages, &ratio),
        Surrogate::Vespo(gamma) => {
            let phi = vespo_weights(&advantages, &log_ratio, &mask, correction.as_ref().map(|(rho, _)| rho), gamma);
            let mut terms = unclipped(&phi * &advantages * logprobs, &ratio);
            terms.metrics.push(LossMetric::new(key::VESPO_PHI_SEQ_MEAN, phi.mean(Kind::Float)));
            terms
        }
    };
    // Which tokens' policy terms count and how much: the entropy mask, the off-policy mask and
    // the correction's weights (which VESPO folds into its own weight instead, as TRL).
    let off_policy = objective.off_policy_mask_threshold.map(|threshold| match sampler {
        Some(sampler) => off_policy_mask(&advantages, versus_sampler, sampler, &mask, threshold),
        None => off_policy_mask(&advantages, logprobs, &old, &mask, threshold),
    });
    let rho = correction.as_ref().filter(|_| !matches!(objective.surrogate, Surrogate::Vespo(_))).map(|(rho, _)| rho);
    let policy = [masks.policy, off_policy.as_ref(), rho].into_iter().flatten().map(Tensor::shallow_clone).reduce(|a, b| a * b);
    let mut per_token_loss = match &policy {
        Some(policy) => -&surrogate.objective * policy,
        None => -&surrogate.objective,
    };
    let per_token_kl = objective.kl.zip(ref_logprobs).map(|(kl, reference)| {
        // Both the trainer's: the full softmax.
        let estimate = per_token_kl(full, reference, kl.estimator);
        (if kl.bias_correction { estimate * &ratio } else { estimate }, kl.beta)
    });
    if let Some((kl, beta)) = &per_token_kl {
        per_token_loss = per_token_loss + kl * *beta;
    }
    let loss = (&per_token_loss * weights).sum(Kind::Float);
    let policy_weights = match &policy {
        Some(policy) => weights * policy,
        None => weights.shallow_clone(),
    };
    let effective_sample_size = effective_sample_size(&(policy_weights * ratio.detach()));
    let is_clipped = ratio.ne_tensor(&surrogate.clipped_ratio).to_kind(Kind::Float);
    let tokens = mask.sum(Kind::Float).clamp_min(1.0);
    let clip_ratio = (is_clipped * &mask).sum(Kind::Float) / &tokens;
    let kl_mean = per_token_kl.as_ref().map(|(kl, _)| (kl.detach() * &mask).sum(Kind::Float) / &tokens);
    let mut metrics = vec![LossMetric { key: key::KL, value: kl_mean }, LossMetric::new(key::CLIP_RATIO, clip_ratio)];
    metrics.extend(surrogate.metrics);
    metrics.push(LossMetric::number(key::EFFECTIVE_SAMPLE_SIZE, effective_sample_size));
    if let Some((_, stats)) = &correction {
        metrics.extend(importance_sampling_metrics(stats).map(|(key, value)| LossMetric::number(key, value)));
    }
    LossTerms { loss, per_token_kl: per_token_kl.map(|(kl, _)| kl), metrics, entropy_bonus: None }
}

/// A surrogate's per-token objective (maximised) and what the step logs about it (TRL's clip
/// fractions, null without its clip, then the surrogate's own).
struct SurrogateTerms {
    objective: Tensor,
    /// The ratio after the surrogate's clip (`ratio` where nothing clips).
    clipped_ratio: Tensor,
    metrics: Vec<LossMetric>,
}

/// A surrogate without a clip (tinker's `importance_sampling` and `dro`, TRL's `sapo`): nothing
/// to log about it.
fn unclipped(objective: Tensor, ratio: &Tensor) -> SurrogateTerms {
    SurrogateTerms { objective, clipped_ratio: ratio.shallow_clone(), metrics: ClipFractions::null() }
}

/// PPO's `min(min(r, delta) A, clip(r, 1 - low, 1 + high) A)`, as TRL.
fn clipped(ratio: &Tensor, advantages: &Tensor, mask: &Tensor, (low, high, delta): (f64, f64, Option<f64>), level: ImportanceSamplingLevel) -> SurrogateTerms {
    let clipped = ratio.clamp(1.0 - low, 1.0 + high);
    let unclipped = match delta {
        Some(delta) => ratio.clamp_max(delta),
        None => ratio.shallow_clone(),
    };
    let objective = (&unclipped * advantages).min_other(&(&clipped * advantages));
    let clip_fractions = clip_fractions(&unclipped.detach(), advantages, mask, (low, high), level);
    SurrogateTerms { objective, clipped_ratio: clipped, metrics: clip_fractions.logged() }
}

/// CISPO's `min(r, cap).detach() A logp` (TRL's `loss_type="cispo"`, `cap` its `epsilon_high`):
/// the weight caps (an absolute bound, TRL's recommended 5.0), no token stops learning.
fn cispo(logprobs: &Tensor, ratio: &Tensor, advantages: &Tensor, mask: &Tensor, cap: f64, level: ImportanceSamplingLevel) -> SurrogateTerms {
    let weight = ratio.clamp_max(cap).detach();
    let objective = &weight * advantages * logprobs;
    let capped = ratio.detach().gt(cap).logical_and(&advantages.gt(0.0));
    let cispo_clip_ratio = flag_fraction(&capped, mask, level);
    let mut metrics = ClipFractions::null();
    metrics.push(LossMetric::new(key::CISPO_CLIP_RATIO, cispo_clip_ratio));
    SurrogateTerms { objective, clipped_ratio: weight, metrics }
}

/// SAPO's soft gate in place of the clipped ratio: `sigmoid(tau (r - 1)) 4 / tau`, `tau` =
/// `positive` where `A > 0`, `negative` elsewhere (TRL's `loss_type="sapo"`). Its slope at
/// `r = 1` is 1, so on policy its gradient is the plain policy gradient's.
fn sapo_gate(ratio: &Tensor, advantages: &Tensor, positive: f64, negative: f64) -> Tensor {
    let tau = advantages.gt(0.0).to_kind(Kind::Float) * (positive - negative) + negative;
    (&tau * (ratio - 1.0)).sigmoid() * 4.0 / tau
}

/// VESPO's weight `phi(w)` of each completion (`[batch, 1]`, no gradient), as TRL's
/// `get_gamma_weights`: `log w = Σ_t clamp(log_ratio, ±20)` over the loss tokens, plus
/// `Σ_t clamp(log rho, ln 1e-8, 20)` of the per-token correction when it is on, clamped into
/// `[ln 1e-8, 20]`; `phi = exp(lambda + k log w - lambda w)` (0 where not finite), `(k, lambda)` by
/// the sign of the advantage (`A >= 0`: the positive pair; `lambda` at least 1e-4). The
/// correction's logs are summed over loss tokens only: TRL sums its padded row, whose ratio is 1
/// there (log 0) unless the bounds exclude 1.
pub fn vespo_weights(advantages: &Tensor, log_ratio: &Tensor, mask: &Tensor, rho: Option<&Tensor>, gamma: VespoGamma) -> Tensor {
    let _no_grad = tch::no_grad_guard();
    let lower = 1e-8f64.ln();
    let mut log_w = (log_ratio.detach().clamp(-20.0, 20.0) * mask).sum_dim_intlist(-1, true, Kind::Float);
    if let Some(rho) = rho {
        log_w = log_w + (rho.log().clamp(lower, 20.0) * mask).sum_dim_intlist(-1, true, Kind::Float);
    }
    let log_w = log_w.clamp(lower, 20.0);
    let nonnegative = advantages.ge(0.0).to_kind(Kind::Float);
    let pick = |pos: f64, neg: f64| &nonnegative * (pos - neg) + neg;
    let (k, lambda) = (pick(gamma.k_pos, gamma.k_neg), pick(gamma.lambda_pos, gamma.lambda_neg).clamp_min(1e-4));
    let log_phi = &lambda + k * &log_w - &lambda * log_w.exp();
    log_phi.exp().nan_to_num(0.0, 0.0, 0.0)
}

/// DeepSeek-V3.2's off-policy sequence mask (TRL's `get_off_policy_mask`), `[batch, 1]`: 1 where
/// the advantage is at least 0 or the mean over loss tokens of `behaviour - logp` (the
/// sampler's log-probabilities, else the old policy's) is at most `threshold`, 0 elsewhere.
fn off_policy_mask(advantages: &Tensor, logprobs: &Tensor, behaviour: &Tensor, mask: &Tensor, threshold: f64) -> Tensor {
    let gap = ((behaviour - logprobs.detach()).nan_to_num(0.0, None, None) * mask).sum_dim_intlist(-1, true, Kind::Float);
    let mean_gap = gap / mask.sum_dim_intlist(-1, true, Kind::Float).clamp_min(1.0);
    advantages.ge(0.0).logical_or(&mean_gap.le(threshold)).to_kind(Kind::Float)
}

/// `exp(log_ratio)` per token, or `exp(mean_t log_ratio)` per sequence over its loss tokens
/// (`[batch, 1]`; a row without loss tokens gets ratio 1), as TRL's `_compute_loss`.
fn importance_ratio(log_ratio: &Tensor, mask: &Tensor, level: ImportanceSamplingLevel) -> Tensor {
    match level {
        ImportanceSamplingLevel::Token => log_ratio.exp(),
        ImportanceSamplingLevel::Sequence => {
            let tokens = mask.sum_dim_intlist(-1, true, Kind::Float).clamp_min(1.0);
            ((log_ratio * mask).sum_dim_intlist(-1, true, Kind::Float) / tokens).exp()
        }
    }
}

/// TRL's clip fractions (see [`ClipFractions`]) of `ratio` (after `delta`'s clamp).
fn clip_fractions(ratio: &Tensor, advantages: &Tensor, mask: &Tensor, (low, high): (f64, f64), level: ImportanceSamplingLevel) -> ClipFractions {
    let below = ratio.lt(1.0 - low).logical_and(&advantages.lt(0.0));
    let above = ratio.gt(1.0 + high).logical_and(&advantages.gt(0.0));
    let region = below.logical_or(&above);
    let fraction = |flags: &Tensor| flag_fraction(flags, mask, level);
    ClipFractions { low: fraction(&below), high: fraction(&above), region: fraction(&region) }
}

/// The fraction of boolean `flags` set, over the loss tokens in `mask` (`[batch, len]` flags,
/// token ratios) or over completions (`[batch, 1]`, sequence ratios): TRL's `global_masked_mean`.
fn flag_fraction(flags: &Tensor, mask: &Tensor, level: ImportanceSamplingLevel) -> Tensor {
    let flags = flags.to_kind(Kind::Float);
    match level {
        ImportanceSamplingLevel::Token => (flags * mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0),
        ImportanceSamplingLevel::Sequence => flags.mean(Kind::Float),
    }
}
