//! The GRPO objective as TRL 1.16's `GRPOTrainer` computes it: group-normalised advantages
//! (`scale_rewards`), per-token log-probabilities, Schulman's k3 KL estimator, the clipped
//! surrogate (token or sequence importance ratios, `epsilon` / `epsilon_high`, `delta`) and the
//! four loss aggregations. Pure tensor functions; the trainer decides what goes in.

use anyhow::Result;
use tch::{Kind, Tensor};

use crate::model::Llama;
use crate::model::generate::Generation;
use crate::model::linear::{AdapterCtl, gradient_only};

crate::choice::choice! {
    /// How the per-token loss is aggregated (TRL's `loss_type`).
    pub enum LossType ("loss_type") {
        /// Mean over each sequence's tokens, then mean over sequences.
        Grpo = "grpo",
        /// Sum over tokens / (sequences * max_completion_length).
        DrGrpo = "dr_grpo",
        /// Sum over tokens / active tokens of the (global) batch.
        Dapo = "dapo",
        /// Sum over tokens / active tokens of the local batch (the same as dapo on one process).
        Bnpo = "bnpo",
    }
}

crate::choice::choice! {
    /// What the advantages are divided by (TRL's `scale_rewards`); the mean subtracted is always
    /// the group's.
    pub enum ScaleRewards ("scale_rewards") {
        /// The group's standard deviation.
        Group = "group",
        /// The whole batch's standard deviation (PPO Lite).
        Batch = "batch",
        /// Nothing: `r - mean_g` (Dr. GRPO).
        Off = "none",
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

/// Advantages `r - mean_g`, divided by `std + eps` unless `scale` is off, in float32 and with
/// TRL 1.16's arithmetic: the unbiased standard deviation as `sqrt(mean(d^2) * n / (n - 1))`,
/// of the group or (`batch`) of the whole batch. `rewards` is `[batch]`, groups are
/// consecutive rows of `group_size`. Also returns TRL's `frac_reward_zero_std`: the fraction
/// of rows whose standard deviation (the one `scale` names; the group's when off) is zero.
pub fn group_advantages(rewards: &Tensor, group_size: usize, scale: ScaleRewards, eps: f64) -> (Tensor, f64) {
    let n = group_size as i64;
    let rewards = rewards.to_kind(Kind::Float);
    let grouped = rewards.view([-1, n]);
    let mean = grouped.mean_dim(1, true, Kind::Float).reshape([-1]).repeat_interleave_self_int(n, 0, None);
    let std = match scale {
        ScaleRewards::Group | ScaleRewards::Off => unbiased_std(&grouped).repeat_interleave_self_int(n, 0, None),
        ScaleRewards::Batch => unbiased_std(&rewards.view([1, -1])).expand_as(&rewards),
    };
    let centred = &rewards - mean;
    let advantages = match scale {
        ScaleRewards::Off => centred,
        ScaleRewards::Group | ScaleRewards::Batch => centred / (&std + eps),
    };
    let zero_std = std.isclose(&std.zeros_like(), 1e-5, 1e-8, false).to_kind(Kind::Float);
    (advantages, zero_std.mean(Kind::Float).double_value(&[]))
}

/// `[rows]` unbiased standard deviation of each row of `values` `[rows, n]`, as TRL's `nanstd`.
fn unbiased_std(values: &Tensor) -> Tensor {
    let n = values.size()[1] as f64;
    let mean = values.mean_dim(1, true, Kind::Float);
    let squared = (values - &mean).square().mean_dim(1, false, Kind::Float);
    (squared * (n / (n - 1.0))).sqrt()
}

/// The completion mask, without the rows that ended without EOS when `mask_truncated` (TRL's
/// `mask_truncated_completions`: their advantages still count in their group's statistics).
pub fn loss_mask(generation: &Generation, mask_truncated: bool) -> Tensor {
    if !mask_truncated {
        return generation.completion_mask.shallow_clone();
    }
    let ended: Vec<i64> = generation.rows.iter().map(|r| i64::from(r.ended_with_eos)).collect();
    let ended = Tensor::from_slice(&ended).to(generation.completion_mask.device());
    &generation.completion_mask * ended.unsqueeze(1)
}

/// Log-probabilities of the completion tokens and the logits they came from.
pub struct TokenLogprobs {
    /// `[batch, completion_len]`, differentiable.
    pub logprobs: Tensor,
    /// `[batch, completion_len]` entropy of each next-token distribution (no gradient).
    pub entropy: Tensor,
}

/// A batch of `[prompt | completion]` sequences: prompts left-padded, completions
/// right-padded, masks 1 on real tokens (completions up to and including EOS).
#[derive(Clone, Copy)]
pub struct Sequences<'a> {
    pub prompt_ids: &'a Tensor,
    pub prompt_mask: &'a Tensor,
    pub completion_ids: &'a Tensor,
    pub completion_mask: &'a Tensor,
}

impl<'a> From<&'a Generation> for Sequences<'a> {
    fn from(g: &'a Generation) -> Self {
        Self { prompt_ids: &g.prompt_ids, prompt_mask: &g.prompt_mask, completion_ids: &g.completion_ids, completion_mask: &g.completion_mask }
    }
}

/// One forward pass over `[prompt | completion]`; logits divided by `temperature`, then
/// `log_softmax` gathered at the completion tokens (TRL's `selective_log_softmax`), and the
/// entropy of each next-token distribution (a metric, no gradient). `[batch, completion_len]`,
/// 0 after each row's first EOS.
pub fn completion_logprobs(model: &Llama, seqs: Sequences, temperature: f64, ctl: &[AdapterCtl]) -> TokenLogprobs {
    let real = real_completion_hidden(model, seqs, ctl);
    let head = head_logprobs(model.head_weight(), &real.hidden, &real.targets, temperature);
    TokenLogprobs { logprobs: real.scatter(&head.logprobs), entropy: real.scatter(&head.entropy) }
}

/// The completion log-probabilities only, without gradient: reference and old policies.
pub fn frozen_logprobs(model: &Llama, seqs: Sequences, temperature: f64, ctl: &[AdapterCtl]) -> Tensor {
    tch::no_grad(|| {
        let real = real_completion_hidden(model, seqs, ctl);
        real.scatter(&head_logprobs(model.head_weight(), &real.hidden, &real.targets, temperature).logprobs)
    })
}

/// Final hidden states at the positions that predict real completion tokens (mask 1), one
/// row per token. Only those positions go through the output head: padding after EOS never
/// reaches the loss (it is masked), so computing it, as TRL does, only costs time (about half
/// of the head and log-softmax work when completions average half the longest).
struct RealCompletionHidden {
    /// `[n_real, hidden]`.
    hidden: Tensor,
    /// `[n_real]` the completion tokens these states predict.
    targets: Tensor,
    /// `[n_real]` positions in the flattened `[batch, completion_len]` grid.
    positions: Tensor,
    shape: [i64; 2],
}

impl RealCompletionHidden {
    /// Per-token values `[n_real]` back on the `[batch, completion_len]` grid, 0 on padding
    /// (differentiable in `values`).
    fn scatter(&self, values: &Tensor) -> Tensor {
        let grid = Tensor::zeros([self.shape[0] * self.shape[1]], (values.kind(), values.device()));
        grid.index_copy(0, &self.positions, values).view(self.shape)
    }
}

fn real_completion_hidden(model: &Llama, seqs: Sequences, ctl: &[AdapterCtl]) -> RealCompletionHidden {
    let input_ids = Tensor::cat(&[seqs.prompt_ids, seqs.completion_ids], 1);
    let attention_mask = Tensor::cat(&[seqs.prompt_mask, seqs.completion_mask], 1);
    let prompt_len = seqs.prompt_ids.size()[1];
    let (batch, completion_len) = seqs.completion_ids.size2().expect("completion ids are [batch, len]");
    let hidden = model.forward(&input_ids, &attention_mask, ctl);
    let width = hidden.size()[2];
    let predicting = hidden.narrow(1, prompt_len - 1, completion_len).reshape([-1, width]);
    let positions = seqs.completion_mask.reshape([-1]).nonzero().squeeze_dim(1);
    let targets = seqs.completion_ids.reshape([-1]).index_select(0, &positions);
    RealCompletionHidden { hidden: predicting.index_select(0, &positions), targets, positions, shape: [batch, completion_len] }
}

/// Rows of the output head done together: a `[rows, vocab]` block of logits (4 MB for
/// 256 × 4096) stays in cache through log-softmax, entropy and the residual product `r W`.
const HEAD_CHUNK_ROWS: i64 = 256;

struct HeadOutputs {
    /// `[n]` log p(target), differentiable in the hidden states and the head weight.
    logprobs: Tensor,
    /// `[n]` entropy of each next-token distribution (no gradient).
    entropy: Tensor,
}

/// `log_softmax(hidden W^T / T)` at `targets`, and the entropies, without `[tokens, vocab]`
/// tensors in the autograd graph. The values are computed in cached chunks of rows outside
/// autograd; the gradient comes from zero-valued terms built on the analytic derivatives
/// (p = softmax, w_v = row v of W, r_v = 1[v = target] - p_v):
///
///   d logp / d h   = Σ_v r_v w_v / T    (a `[n, hidden]` product `r W`, made in the forward
///                                        pass in place of the backward's `dlogits W`)
///   d logp / d w_v = r_v h / T          (the backward of that same product `r W`)
///
/// So the log-softmax and gather backward passes and their `[tokens, vocab]` gradients are
/// gone and the matrix products stay the same in number. `r` keeps the one-hot and the
/// probabilities together: `w_target - p W` would cancel when the model is confident and
/// lose digits. Tested against TRL's gradients and float64 ones (`tests/grpo_trl.rs`).
fn head_logprobs(weight: &Tensor, hidden: &Tensor, targets: &Tensor, temperature: f64) -> HeadOutputs {
    // Under `no_grad` nothing requires grad; a head weight learns only with full fine-tuning,
    // where the hidden states learn too.
    let learns_hidden = hidden.requires_grad();
    let learns_weight = learns_hidden && weight.requires_grad();
    let (frozen_hidden, frozen_weight) = (hidden.detach(), weight.detach());
    // The weight of the residual product, made only when a gradient is wanted.
    let product_weight = learns_hidden.then(|| (if learns_weight { weight } else { &frozen_weight }).to_kind(Kind::Float));
    let (mut logprobs, mut entropy, mut jacobian) = (Vec::new(), Vec::new(), Vec::new());
    for (rows, row_targets) in frozen_hidden.split(HEAD_CHUNK_ROWS, 0).iter().zip(targets.split(HEAD_CHUNK_ROWS, 0)) {
        let logits = rows.matmul(&frozen_weight.tr()).to_kind(Kind::Float);
        let logits = if temperature != 1.0 { logits / temperature } else { logits };
        let normaliser = logits.logsumexp([-1], false);
        let row_targets = row_targets.unsqueeze(-1);
        let picked = logits.gather(-1, &row_targets, false).squeeze_dim(-1);
        logprobs.push(picked - &normaliser);
        let mut probs = logits.softmax(-1, Kind::Float);
        entropy.push(&normaliser - (&probs * &logits).sum_dim_intlist(-1, false, Kind::Float));
        if let Some(product_weight) = &product_weight {
            // r_target = Σ_{v ≠ target} p_v, not 1 - p_target: a confident model (p_target
            // ≈ 1) would lose digits in the subtraction.
            let zeros = Tensor::zeros(row_targets.size(), (Kind::Float, probs.device()));
            let _ = probs.scatter_(-1, &row_targets, &zeros);
            let others = probs.sum_dim_intlist(-1, true, Kind::Float);
            let residual = probs.neg_().scatter_(-1, &row_targets, &others);
            // With a learning head weight this product keeps `residual` for its backward.
            jacobian.push(residual.matmul(product_weight) / temperature);
        }
    }
    let mut logprobs = Tensor::cat(&logprobs, 0);
    if learns_hidden {
        let jacobian = Tensor::cat(&jacobian, 0);
        let hidden_f = hidden.to_kind(Kind::Float);
        logprobs = logprobs + (gradient_only(&hidden_f) * jacobian.detach()).sum_dim_intlist(-1, false, Kind::Float);
        if learns_weight {
            logprobs = logprobs + gradient_only(&(jacobian * hidden_f.detach()).sum_dim_intlist(-1, false, Kind::Float));
        }
    }
    HeadOutputs { logprobs, entropy: Tensor::cat(&entropy, 0) }
}

/// Schulman's k3 estimator of KL(policy || reference), per token.
pub fn k3_kl(logprobs: &Tensor, ref_logprobs: &Tensor) -> Tensor {
    let delta = ref_logprobs - logprobs;
    delta.exp() - &delta - 1.0
}

pub struct LossSettings {
    pub beta: f64,
    /// The clip range below 1: ratios under `1 - epsilon` stop learning (negative advantages).
    pub epsilon: f64,
    /// The clip range above 1 (DAPO's clip-higher; TRL's default is `epsilon`).
    pub epsilon_high: f64,
    /// Upper clamp of the unclipped ratio (TRL's two-sided clipping), none by default.
    pub delta: Option<f64>,
    pub importance_sampling_level: ImportanceSamplingLevel,
    pub loss_type: LossType,
    pub max_completion_length: usize,
}

pub struct LossTerms {
    pub loss: Tensor,
    /// Per-token KL (`None` when beta = 0, as TRL skips the reference model then).
    pub per_token_kl: Option<Tensor>,
    /// Fraction of loss tokens whose ratio was clipped (low or high side, whatever the sign of
    /// the advantage; per token also with sequence ratios).
    pub clip_ratio: Tensor,
    pub clip_fractions: ClipFractions,
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

/// The GRPO loss. `loss_mask` is 1 on the completion tokens that train (the completion mask,
/// without truncated completions when they are masked). `classes` are `[batch]` 0/1 row masks
/// that partition the batch (one mask of ones when nothing is routed); the loss is
/// `sum_c (n_c / n) * aggregate(rows of c)` with `n` the batch's rows, which is exactly what
/// separate backward passes per class with loss scaled by `n_c / n` produce. For `grpo` this
/// equals the plain aggregate over the whole batch. Rows in no class (dropped coherence rows)
/// add nothing but still count in `n`.
pub fn grpo_loss(
    logprobs: &Tensor,
    old_logprobs: Option<&Tensor>,
    ref_logprobs: Option<&Tensor>,
    advantages: &Tensor,
    loss_mask: &Tensor,
    classes: &[Tensor],
    settings: &LossSettings,
) -> LossTerms {
    let mask = loss_mask.to_kind(Kind::Float);
    let old = old_logprobs.map_or_else(|| logprobs.detach(), Tensor::shallow_clone);
    // `[batch, len]` per token, `[batch, 1]` per sequence; everything below broadcasts.
    let ratio = importance_ratio(&(logprobs - &old), &mask, settings.importance_sampling_level);
    let clipped = ratio.clamp(1.0 - settings.epsilon, 1.0 + settings.epsilon_high);
    let unclipped = match settings.delta {
        Some(delta) => ratio.clamp_max(delta),
        None => ratio.shallow_clone(),
    };
    let advantages = advantages.unsqueeze(1);
    let surrogate = (&unclipped * &advantages).min_other(&(&clipped * &advantages));
    let mut per_token_loss = -surrogate;
    let per_token_kl = ref_logprobs.filter(|_| settings.beta != 0.0).map(|r| k3_kl(logprobs, r));
    if let Some(kl) = &per_token_kl {
        per_token_loss = per_token_loss + kl * settings.beta;
    }
    let batch = mask.size()[0] as f64;
    let mut loss = Tensor::zeros([], (Kind::Float, mask.device()));
    for class in classes {
        let rows = class.to_kind(Kind::Float);
        let n_class = rows.sum(Kind::Float);
        let class_mask = &mask * rows.unsqueeze(1);
        let aggregate = aggregate(&per_token_loss, &class_mask, &rows, settings);
        loss = loss + aggregate * (n_class / batch);
    }
    let is_clipped = ratio.ne_tensor(&clipped).to_kind(Kind::Float);
    let clip_ratio = (is_clipped * &mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0);
    let clip_fractions = clip_fractions(&unclipped.detach(), &advantages, &mask, settings);
    LossTerms { loss, per_token_kl, clip_ratio, clip_fractions }
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
fn clip_fractions(ratio: &Tensor, advantages: &Tensor, mask: &Tensor, settings: &LossSettings) -> ClipFractions {
    let low = ratio.lt(1.0 - settings.epsilon).logical_and(&advantages.lt(0.0));
    let high = ratio.gt(1.0 + settings.epsilon_high).logical_and(&advantages.gt(0.0));
    let region = low.logical_or(&high);
    let fraction = |flags: &Tensor| {
        let flags = flags.to_kind(Kind::Float);
        match settings.importance_sampling_level {
            ImportanceSamplingLevel::Token => (flags * mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0),
            ImportanceSamplingLevel::Sequence => flags.mean(Kind::Float),
        }
    };
    ClipFractions { low: fraction(&low), high: fraction(&high), region: fraction(&region) }
}

/// TRL's aggregation of `per_token_loss` over the tokens in `mask` (rows outside the class
/// have an all-zero mask; `rows` counts the class's sequences).
fn aggregate(per_token_loss: &Tensor, mask: &Tensor, rows: &Tensor, settings: &LossSettings) -> Tensor {
    let masked = per_token_loss * mask;
    match settings.loss_type {
        LossType::Grpo => {
            let per_sequence = masked.sum_dim_intlist(-1, false, Kind::Float) / mask.sum_dim_intlist(-1, false, Kind::Float).clamp_min(1.0);
            (per_sequence * rows).sum(Kind::Float) / rows.sum(Kind::Float).clamp_min(1.0)
        }
        LossType::DrGrpo => masked.sum(Kind::Float) / (rows.sum(Kind::Float).clamp_min(1.0) * settings.max_completion_length as f64),
        LossType::Dapo | LossType::Bnpo => masked.sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0),
    }
}

/// Mean of `values` over the tokens in `mask` (TRL's `masked_batch_mean`).
pub fn masked_mean(values: &Tensor, mask: &Tensor) -> f64 {
    let mask = mask.to_kind(Kind::Float);
    ((values * &mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0)).double_value(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approx(actual: &Tensor, expected: f64, what: &str) {
        let actual = actual.double_value(&[]);
        assert!((actual - expected).abs() < 1e-6, "{what}: {actual} vs {expected} (by hand)");
    }

    /// Two completions of 3 and 2 tokens (a padding token after the second), advantages +1 and
    /// -1, and the ratios to the old policy given per token.
    struct HandBatch {
        logprobs: Tensor,
        old: Tensor,
        advantages: Tensor,
        mask: Tensor,
    }

    fn hand_batch() -> HandBatch {
        let ratios = [1.5f64, 1.1, 0.5, 0.7, 1.5, 0.1];
        let old: Vec<f32> = ratios.iter().map(|r| -r.ln() as f32).collect();
        HandBatch {
            logprobs: Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)),
            old: Tensor::from_slice(&old).view([2, 3]),
            advantages: Tensor::from_slice(&[1.0f32, -1.0]),
            mask: Tensor::from_slice(&[1i64, 1, 1, 1, 1, 0]).view([2, 3]),
        }
    }

    fn loss_terms(b: &HandBatch, settings: &LossSettings) -> LossTerms {
        let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
        grpo_loss(&b.logprobs, Some(&b.old), None, &b.advantages, &b.mask, &all_rows, settings)
    }

    fn settings(level: ImportanceSamplingLevel, loss_type: LossType) -> LossSettings {
        LossSettings { beta: 0.0, epsilon: 0.2, epsilon_high: 0.28, delta: Some(1.3), importance_sampling_level: level, loss_type, max_completion_length: 3 }
    }

    #[test]
    fn token_ratios_clip_at_epsilon_high_and_delta_and_count_as_trl_logs_them() {
        let terms = loss_terms(&hand_batch(), &settings(ImportanceSamplingLevel::Token, LossType::Dapo));
        // -min(min(r, delta) A, clip(r, 0.8, 1.28) A) per token: row A = +1: 1.5 -> -1.28,
        // 1.1 -> -1.1, 0.5 -> -0.5; row A = -1: 0.7 -> 0.8, 1.5 -> 1.3 (delta). dapo: sum / 5.
        approx(&terms.loss, (-1.28 - 1.1 - 0.5 + 0.8 + 1.3) / 5.0, "loss");
        // Low: 0.7 with A < 0; high: 1.5 (clamped to 1.3, still above 1.28) with A > 0.
        approx(&terms.clip_fractions.low, 1.0 / 5.0, "clip_ratio/low_mean");
        approx(&terms.clip_fractions.high, 1.0 / 5.0, "clip_ratio/high_mean");
        approx(&terms.clip_fractions.region, 2.0 / 5.0, "clip_ratio/region_mean");
        // Outside [0.8, 1.28] whatever the advantage: 1.5, 0.5, 0.7, 1.5.
        approx(&terms.clip_ratio, 4.0 / 5.0, "clip_ratio");
    }

    #[test]
    fn sequence_ratios_are_the_exp_of_the_mean_log_ratio_over_real_tokens() {
        let b = hand_batch();
        let terms = loss_terms(&b, &settings(ImportanceSamplingLevel::Sequence, LossType::Grpo));
        // Geometric means, the padding's 0.1 left out: both inside the clip range, so the
        // per-sequence loss is -r A.
        let (first, second) = ((1.5f64 * 1.1 * 0.5).powf(1.0 / 3.0), (0.7f64 * 1.5).sqrt());
        approx(&terms.loss, (-first + second) / 2.0, "loss");
        approx(&terms.clip_fractions.region, 0.0, "clip_ratio/region_mean");
        // With A = +1 on both rows, the first stays in range and the second (1.025) is above
        // 1 + epsilon_high = 1.02: one completion in two.
        let tight = LossSettings { epsilon: 0.02, epsilon_high: 0.02, delta: None, ..settings(ImportanceSamplingLevel::Sequence, LossType::Grpo) };
        let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
        let positive = Tensor::from_slice(&[1.0f32, 1.0]);
        let terms = grpo_loss(&b.logprobs, Some(&b.old), None, &positive, &b.mask, &all_rows, &tight);
        approx(&terms.clip_fractions.high, 0.5, "clip_ratio/high_mean per completion");
        approx(&terms.loss, (-first - 1.02) / 2.0, "loss with the second completion clipped");
    }

    /// `r - mean_g`, over the unbiased std of the group or of the batch, in plain f64.
    fn by_hand(rewards: &[f64], group: usize, scale: ScaleRewards) -> Vec<f64> {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let std = |v: &[f64]| (v.iter().map(|x| (x - mean(v)).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt();
        rewards
            .chunks(group)
            .flat_map(|g| {
                let divisor = match scale {
                    ScaleRewards::Group => std(g) + 1e-4,
                    ScaleRewards::Batch => std(rewards) + 1e-4,
                    ScaleRewards::Off => 1.0,
                };
                g.iter().map(move |r| (r - mean(g)) / divisor)
            })
            .collect()
    }

    #[test]
    fn advantages_scale_by_the_group_the_batch_or_nothing() {
        let rewards = [0.0, 1.0, 1.0, 1.0, 0.0, 0.5, 0.0, 2.0, 3.0, 3.0, 3.0, 3.0];
        for (scale, zero_std) in [(ScaleRewards::Group, 1.0 / 3.0), (ScaleRewards::Batch, 0.0), (ScaleRewards::Off, 1.0 / 3.0)] {
            let (advantages, frac_zero_std) = group_advantages(&Tensor::from_slice(&rewards), 4, scale, 1e-4);
            let advantages = Vec::<f64>::try_from(advantages.to_kind(Kind::Double)).unwrap();
            for (ours, exact) in advantages.iter().zip(by_hand(&rewards, 4, scale)) {
                assert!((ours - exact).abs() < 1e-6, "{scale}: {ours} vs {exact}");
            }
            assert!((frac_zero_std - zero_std).abs() < 1e-7, "{scale}: frac_reward_zero_std {frac_zero_std}, by hand {zero_std}");
        }
    }

    #[test]
    fn masking_truncated_completions_removes_their_rows_only() {
        use crate::model::batch::CompletionRow;
        let generation = Generation {
            prompt_ids: Tensor::ones([2, 1], (Kind::Int64, tch::Device::Cpu)),
            prompt_mask: Tensor::ones([2, 1], (Kind::Int64, tch::Device::Cpu)),
            completion_ids: Tensor::from_slice(&[5i64, 1, 1, 5, 6, 7]).view([2, 3]),
            completion_mask: Tensor::from_slice(&[1i64, 1, 0, 1, 1, 1]).view([2, 3]),
            sampling_logprobs: Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)),
            rows: vec![CompletionRow::new(&[5, 1], 1), CompletionRow::new(&[5, 6, 7], 1)],
        };
        assert!(loss_mask(&generation, false).equal(&generation.completion_mask));
        let expected = Tensor::from_slice(&[1i64, 1, 0, 0, 0, 0]).view([2, 3]);
        assert!(loss_mask(&generation, true).equal(&expected), "the row without EOS leaves the loss");
    }
}
