//! The GRPO objective as TRL 1.16's `GRPOTrainer` computes it: group-normalised advantages
//! (`scale_rewards`), per-token log-probabilities, Schulman's k3 KL estimator, the clipped
//! surrogate (token or sequence importance ratios, `epsilon` / `epsilon_high`, `delta`) or
//! CISPO's, or tinker's `importance_sampling` / `ppo` / `dro` (`loss_fn`), the high-entropy
//! token mask (`top_entropy_quantile`) and the loss aggregations as
//! per-token weights, and the step's forward and backward passes over micro-batches
//! (`gradient_accumulation_steps`). Tensor functions; the trainer decides what goes in.

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
        /// TRL's CISPO (MiniMax-M1): the surrogate `-min(r, epsilon_high).detach() A logp` in
        /// place of the clipped ratio, aggregated as dapo.
        Cispo = "cispo",
    }
}

crate::choice::choice! {
    /// The per-token surrogate: TRL's (as [`LossType`] names it) or one of tinker's built-in RL
    /// losses (`forward_backward(loss_fn=...)`, as tinker's documentation `losses.mdx` writes
    /// them), whose ratio `r = exp(logp - logq)` is to the sampler's log-probability `logq`.
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

impl LossFn {
    /// One of tinker's losses, whose ratio is to the sampler's log-probabilities.
    pub fn is_tinker(self) -> bool {
        self != LossFn::Trl
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

/// DAPO's dynamic-sampling filter: whether each group (consecutive rows of `group_size`) has
/// rewards that differ among its `counted` rows. A group whose counted rewards are all equal
/// (or with fewer than two counted rows) has zero advantages and teaches nothing: DAPO drops it.
/// Exact equality (verl keeps groups whose `np.std` is above 0; the two differ only for rewards
/// that differ by rounding).
pub fn informative_groups(rewards: &[f64], counted: &[bool], group_size: usize) -> Vec<bool> {
    assert!(rewards.len() == counted.len() && rewards.len() % group_size == 0, "whole groups, one flag per reward");
    rewards
        .chunks(group_size)
        .zip(counted.chunks(group_size))
        .map(|(group, counted)| {
            let mut values = group.iter().zip(counted).filter(|(_, c)| **c).map(|(r, _)| *r);
            let first = values.next();
            first.is_some_and(|first| values.any(|r| r != first))
        })
        .collect()
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

/// The loss tokens whose entropy is at least the `1 - top_quantile` quantile of the loss
/// tokens' entropies (linear interpolation, `torch.quantile`): TRL's `get_high_entropy_mask`
/// ("Beyond the 80/20 Rule": only the highest-entropy tokens' policy term trains). Float
/// `[batch, len]`, all zeros without loss tokens.
pub fn high_entropy_mask(entropy: &Tensor, loss_mask: &Tensor, top_quantile: f64) -> Tensor {
    let mask = loss_mask.to_kind(Kind::Bool);
    let values = entropy.detach().to_kind(Kind::Float).masked_select(&mask);
    if values.numel() == 0 {
        return entropy.zeros_like().to_kind(Kind::Float);
    }
    let threshold = values.quantile_scalar(1.0 - top_quantile, None::<i64>, false, "linear");
    (entropy.detach() * mask.to_kind(Kind::Float)).ge_tensor(&threshold).logical_and(&mask).to_kind(Kind::Float)
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
    let hidden = model.forward(&input_ids, &attention_mask, ctl);
    RealCompletionHidden::of(&hidden, seqs.prompt_ids.size()[1], seqs)
}

impl RealCompletionHidden {
    /// The states of `hidden` (`[batch, seq, hidden]`, the completion starting at column
    /// `prompt_len`) that predict `seqs`' real completion tokens.
    fn of(hidden: &Tensor, prompt_len: i64, seqs: Sequences) -> Self {
        let (batch, completion_len) = seqs.completion_ids.size2().expect("completion ids are [batch, len]");
        let width = hidden.size()[2];
        let predicting = hidden.narrow(1, prompt_len - 1, completion_len).reshape([-1, width]);
        let positions = seqs.completion_mask.reshape([-1]).nonzero().squeeze_dim(1);
        let targets = seqs.completion_ids.reshape([-1]).index_select(0, &positions);
        Self { hidden: predicting.index_select(0, &positions), targets, positions, shape: [batch, completion_len] }
    }
}

/// [`completion_logprobs`] of several runs' batches in one forward pass of their models stacked
/// on a leading axis (`stacked`, [`Llama::stacked`]; `ctl` the runs' controls stacked with
/// [`AdapterCtl::stacked`]). The runs' batches have the same number of rows; prompts are
/// left-padded and completions right-padded to the longest (padding that no real token attends
/// to, and positions that only shift, which RoPE does not see), and each run's states go through
/// its own output head at its own temperature.
fn stacked_completion_logprobs(stacked: &Llama, runs: &[Sequences], temperatures: &[f64], ctl: &[AdapterCtl]) -> Vec<TokenLogprobs> {
    assert_eq!(stacked.runs(), runs.len() as i64, "one batch per stacked run");
    let prompt_len = runs.iter().map(|s| s.prompt_ids.size()[1]).max().expect("at least one run");
    let completion_len = runs.iter().map(|s| s.completion_ids.size()[1]).max().expect("at least one run");
    let pad = |t: &Tensor, left: i64, right: i64| t.constant_pad_nd([left, right]);
    let (mut ids, mut masks) = (Vec::new(), Vec::new());
    for seqs in runs {
        let (left, right) = (prompt_len - seqs.prompt_ids.size()[1], completion_len - seqs.completion_ids.size()[1]);
        ids.push(Tensor::cat(&[pad(seqs.prompt_ids, left, 0), pad(seqs.completion_ids, 0, right)], 1));
        masks.push(Tensor::cat(&[pad(seqs.prompt_mask, left, 0), pad(seqs.completion_mask, 0, right)], 1));
    }
    let hidden = stacked.forward(&Tensor::cat(&ids, 0), &Tensor::cat(&masks, 0), ctl);
    let rows = runs[0].prompt_ids.size()[0];
    runs.iter()
        .zip(temperatures)
        .enumerate()
        .map(|(r, (seqs, &temperature))| {
            let real = RealCompletionHidden::of(&hidden.narrow(0, r as i64 * rows, rows), prompt_len, *seqs);
            let head = head_logprobs(&stacked.head_weight().get(r as i64), &real.hidden, &real.targets, temperature);
            TokenLogprobs { logprobs: real.scatter(&head.logprobs), entropy: real.scatter(&head.entropy) }
        })
        .collect()
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

/// The token masks of the loss: `loss` is 1 on the tokens that train and count in the
/// aggregation (the completion mask, without truncated completions when they are masked);
/// `policy`, when set, further restricts the policy term (not the KL term, not the
/// aggregation's counts) to its tokens, as TRL's entropy mask does.
#[derive(Clone, Copy)]
pub struct TokenMasks<'a> {
    pub loss: &'a Tensor,
    pub policy: Option<&'a Tensor>,
}

impl<'a> From<&'a Tensor> for TokenMasks<'a> {
    fn from(loss: &'a Tensor) -> Self {
        Self { loss, policy: None }
    }
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

pub struct LossSettings {
    pub beta: f64,
    pub kl_estimator: KlEstimator,
    /// The clip range below 1: ratios under `1 - epsilon` stop learning (negative advantages).
    pub epsilon: f64,
    /// The clip range above 1 (DAPO's clip-higher; TRL's default is `epsilon`); with cispo the
    /// upper bound of the importance weight itself (TRL's use of the same key).
    pub epsilon_high: f64,
    /// Upper clamp of the unclipped ratio (TRL's two-sided clipping), none by default.
    pub delta: Option<f64>,
    pub importance_sampling_level: ImportanceSamplingLevel,
    pub loss_type: LossType,
    /// The surrogate (TRL's, or tinker's with the sampler's log-probabilities as `old_logprobs`).
    pub loss_fn: LossFn,
    /// tinker's DRO: the quadratic penalty's coefficient (`loss_fn: dro` only).
    pub dro_beta: f64,
    pub max_completion_length: usize,
    /// The top fraction of loss tokens by entropy whose policy term trains (1: all; see
    /// [`high_entropy_mask`]).
    pub top_entropy_quantile: f64,
}

pub struct LossTerms {
    pub loss: Tensor,
    /// Per-token KL (`None` when beta = 0, as TRL skips the reference model then).
    pub per_token_kl: Option<Tensor>,
    /// Fraction of loss tokens whose ratio was clipped (low or high side, whatever the sign of
    /// the advantage; per token also with sequence ratios).
    pub clip_ratio: Tensor,
    /// TRL's clip fractions of the clipped surrogate (also tinker's `ppo`; `None` with cispo,
    /// which TRL does not log them for, and with tinker's unclipped losses).
    pub clip_fractions: Option<ClipFractions>,
    /// TRL's `cispo_clip_ratio` (with cispo only): the fraction of loss tokens (completions with
    /// sequence ratios) whose weight `epsilon_high` caps, with a positive advantage.
    pub cispo_clip_ratio: Option<Tensor>,
    /// `(Σw)² / Σw²` of the loss weights `w` = each token's weight in the aggregation times its
    /// importance ratio (0 for tokens the policy mask drops): the number of equally weighted
    /// tokens that would carry as much information ([`effective_sample_size`]).
    pub effective_sample_size: f64,
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

/// The GRPO loss of a whole batch in one pass. `classes` are `[batch]` 0/1 row masks that
/// partition the batch (one mask of ones when nothing is routed); the loss is
/// `sum_c (n_c / n) * aggregate(rows of c)` with `n` the batch's rows, which is exactly what
/// separate backward passes per class with loss scaled by `n_c / n` produce. For `grpo` this
/// equals the plain aggregate over the whole batch. Rows in no class (dropped coherence rows)
/// add nothing but still count in `n`.
pub fn grpo_loss(
    logprobs: &Tensor,
    old_logprobs: Option<&Tensor>,
    ref_logprobs: Option<&Tensor>,
    advantages: &Tensor,
    masks: TokenMasks,
    classes: &[Tensor],
    settings: &LossSettings,
) -> LossTerms {
    let weights = token_weights(&masks.loss.to_kind(Kind::Float), classes, settings, 1);
    weighted_loss(logprobs, old_logprobs, ref_logprobs, advantages, masks, &weights, settings)
}

/// The batch's token weights ([`token_weights`], one pass) kept on `rows` only (`[batch]` 0/1):
/// the weights of complementary row sets add up to the batch's for every loss type, so their
/// losses split [`grpo_loss`]. Restricting the classes instead would change the token counts
/// that dapo, bnpo and cispo divide by.
pub fn row_token_weights(mask: &Tensor, classes: &[Tensor], settings: &LossSettings, rows: &Tensor) -> Tensor {
    token_weights(&mask.to_kind(Kind::Float), classes, settings, 1) * rows.to_kind(Kind::Float).unsqueeze(1)
}

/// The loss `Σ per_token_loss * weights` of some rows, with the rows' [`token_weights`].
pub fn weighted_loss(
    logprobs: &Tensor,
    old_logprobs: Option<&Tensor>,
    ref_logprobs: Option<&Tensor>,
    advantages: &Tensor,
    masks: TokenMasks,
    weights: &Tensor,
    settings: &LossSettings,
) -> LossTerms {
    let mask = masks.loss.to_kind(Kind::Float);
    assert!(!settings.loss_fn.is_tinker() || old_logprobs.is_some(), "tinker's {} takes its ratio to the sampler's log-probabilities: pass them as old_logprobs", settings.loss_fn);
    let old = old_logprobs.map_or_else(|| logprobs.detach(), Tensor::shallow_clone);
    // `[batch, len]` per token, `[batch, 1]` per sequence; everything below broadcasts.
    let ratio = importance_ratio(&(logprobs - &old), &mask, settings.importance_sampling_level);
    let advantages = advantages.unsqueeze(1);
    let surrogate = match (settings.loss_fn, settings.loss_type) {
        (LossFn::Trl, LossType::Cispo) => cispo_surrogate(logprobs, &ratio, &advantages, &mask, settings),
        // tinker's ppo is TRL's clip without delta (refused with it by the configuration).
        (LossFn::Trl | LossFn::Ppo, _) => clipped_surrogate(&ratio, &advantages, &mask, settings),
        (LossFn::ImportanceSampling, _) => unclipped(&ratio * &advantages, &ratio),
        (LossFn::Dro, _) => unclipped(logprobs * &advantages - (logprobs - &old).square() * (0.5 * settings.dro_beta), &ratio),
    };
    let mut per_token_loss = match masks.policy {
        Some(policy) => -surrogate.objective * policy,
        None => -surrogate.objective,
    };
    let per_token_kl = ref_logprobs.filter(|_| settings.beta != 0.0).map(|r| per_token_kl(logprobs, r, settings.kl_estimator));
    if let Some(kl) = &per_token_kl {
        per_token_loss = per_token_loss + kl * settings.beta;
    }
    let loss = (&per_token_loss * weights).sum(Kind::Float);
    let policy_weights = match masks.policy {
        Some(policy) => weights * policy,
        None => weights.shallow_clone(),
    };
    let effective_sample_size = effective_sample_size(&(policy_weights * ratio.detach()));
    let is_clipped = ratio.ne_tensor(&surrogate.clipped_ratio).to_kind(Kind::Float);
    let clip_ratio = (is_clipped * &mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0);
    LossTerms { loss, per_token_kl, clip_ratio, clip_fractions: surrogate.clip_fractions, cispo_clip_ratio: surrogate.cispo_clip_ratio, effective_sample_size }
}

/// A surrogate's per-token objective (maximised) and what the step logs about its clip.
struct Surrogate {
    objective: Tensor,
    /// The ratio after the surrogate's clip (`ratio` where nothing clips).
    clipped_ratio: Tensor,
    clip_fractions: Option<ClipFractions>,
    cispo_clip_ratio: Option<Tensor>,
}

/// A surrogate without a clip (tinker's `importance_sampling` and `dro`): nothing to log about it.
fn unclipped(objective: Tensor, ratio: &Tensor) -> Surrogate {
    Surrogate { objective, clipped_ratio: ratio.shallow_clone(), clip_fractions: None, cispo_clip_ratio: None }
}

/// PPO's `min(min(r, delta) A, clip(r, 1 - epsilon, 1 + epsilon_high) A)`, as TRL.
fn clipped_surrogate(ratio: &Tensor, advantages: &Tensor, mask: &Tensor, settings: &LossSettings) -> Surrogate {
    let clipped = ratio.clamp(1.0 - settings.epsilon, 1.0 + settings.epsilon_high);
    let unclipped = match settings.delta {
        Some(delta) => ratio.clamp_max(delta),
        None => ratio.shallow_clone(),
    };
    let objective = (&unclipped * advantages).min_other(&(&clipped * advantages));
    let clip_fractions = clip_fractions(&unclipped.detach(), advantages, mask, settings);
    Surrogate { objective, clipped_ratio: clipped, clip_fractions: Some(clip_fractions), cispo_clip_ratio: None }
}

/// CISPO's `min(r, epsilon_high).detach() A logp` (TRL's `loss_type="cispo"`): the weight caps
/// at `epsilon_high` (an absolute bound, TRL's recommended 5.0), no token stops learning.
fn cispo_surrogate(logprobs: &Tensor, ratio: &Tensor, advantages: &Tensor, mask: &Tensor, settings: &LossSettings) -> Surrogate {
    let weight = ratio.clamp_max(settings.epsilon_high).detach();
    let objective = &weight * advantages * logprobs;
    let capped = ratio.detach().gt(settings.epsilon_high).logical_and(&advantages.gt(0.0));
    let cispo_clip_ratio = flag_fraction(&capped, mask, settings.importance_sampling_level);
    Surrogate { objective, clipped_ratio: weight, clip_fractions: None, cispo_clip_ratio: Some(cispo_clip_ratio) }
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
    let fraction = |flags: &Tensor| flag_fraction(flags, mask, settings.importance_sampling_level);
    ClipFractions { low: fraction(&low), high: fraction(&high), region: fraction(&region) }
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

/// Each token's weight in the loss, so that `loss = Σ per_token_loss * weights`: TRL's
/// aggregation of the tokens in `mask` within each class (rows of other classes have weight 0),
/// times the class's share of the batch `n_c / n`. With the batch split into `micro_batches`
/// consecutive row chunks (TRL's gradient accumulation), only bnpo changes: TRL normalises it by
/// each micro-batch's own tokens and averages the micro-batches, where dapo and cispo divide by
/// the whole generation batch's tokens (`num_items_in_batch`) and grpo and dr_grpo by row
/// counts that add up to the batch's.
pub fn token_weights(mask: &Tensor, classes: &[Tensor], settings: &LossSettings, micro_batches: usize) -> Tensor {
    let batch = mask.size()[0] as f64;
    let mut weights = mask.zeros_like();
    for class in classes {
        let rows = class.to_kind(Kind::Float);
        let n_class = rows.sum(Kind::Float);
        let class_mask = mask * rows.unsqueeze(1);
        weights = weights + aggregation_weights(&class_mask, &n_class, settings, micro_batches) * (n_class / batch);
    }
    weights
}

/// TRL's aggregation of one class (`mask` zero outside it; `rows` its sequence count) as
/// per-token weights.
fn aggregation_weights(mask: &Tensor, rows: &Tensor, settings: &LossSettings, micro_batches: usize) -> Tensor {
    let over_tokens = |mask: &Tensor| mask / mask.sum(Kind::Float).clamp_min(1.0);
    match settings.loss_type {
        LossType::Grpo => mask / (mask.sum_dim_intlist(-1, true, Kind::Float).clamp_min(1.0) * rows.clamp_min(1.0)),
        LossType::DrGrpo => mask / (rows.clamp_min(1.0) * settings.max_completion_length as f64),
        LossType::Dapo | LossType::Cispo => over_tokens(mask),
        LossType::Bnpo if micro_batches == 1 => over_tokens(mask),
        LossType::Bnpo => {
            let chunks: Vec<Tensor> = mask.chunk(micro_batches as i64, 0).iter().map(|chunk| over_tokens(chunk) / micro_batches as f64).collect();
            Tensor::cat(&chunks, 0)
        }
    }
}

/// One step's batch as the loss sees it (all `[batch, ...]`).
pub struct LossBatch<'a> {
    pub seqs: Sequences<'a>,
    /// The routing plan's per-row adapter controls.
    pub ctl: &'a [AdapterCtl],
    pub old_logprobs: Option<&'a Tensor>,
    pub ref_logprobs: Option<&'a Tensor>,
    pub advantages: &'a Tensor,
    pub loss_mask: &'a Tensor,
    pub classes: &'a [Tensor],
}

/// What [`backward_micro_batches`] computed, over the whole batch.
pub struct BackwardPass {
    /// Log-probabilities and entropies of every row (no gradient).
    pub logprobs: TokenLogprobs,
    /// The loss (the sum of the micro-batches'), no gradient, and the step's statistics.
    pub terms: LossTerms,
}

/// Forward and backward over `micro_batches` consecutive row chunks of `batch`, the gradients
/// accumulating into the parameters: TRL's gradient accumulation with `steps_per_generation`
/// equal to it (the whole batch generated and scored at once, then trained in chunks). Each
/// chunk's loss is its share of the whole batch's ([`token_weights`]); the high-entropy mask's
/// threshold is each chunk's own, as TRL computes it inside `_compute_loss`. With one chunk this
/// is one forward and one backward pass over the batch. `before_backward` sees each chunk's
/// differentiable log-probabilities and masks before its backward pass (for probes that need
/// the graph).
pub fn backward_micro_batches(model: &Llama, batch: &LossBatch, temperature: f64, settings: &LossSettings, micro_batches: usize, before_backward: &mut dyn FnMut(&Tensor, TokenMasks)) -> BackwardPass {
    let passes = Passes { micro_batches, splits: 1 };
    backward_passes(model, batch, temperature, settings, passes, before_backward, &mut || {})
}

/// How a step's batch goes through backward passes: `micro_batches` chunks of consecutive rows
/// (the objective's `gradient_accumulation_steps`), each run as `splits` passes of consecutive
/// rows. Splitting changes nothing in the objective (weights and high-entropy thresholds stay
/// the micro-batch's); it exists so that probes can see the gradient of each part of the batch
/// (the gradient noise scale, `crate::probes`).
#[derive(Clone, Copy, Debug)]
pub struct Passes {
    pub micro_batches: usize,
    pub splits: usize,
}

impl Passes {
    /// Backward passes in all.
    pub fn count(&self) -> usize {
        self.micro_batches * self.splits
    }
}

/// [`backward_micro_batches`] with each micro-batch run as `passes.splits` backward passes: the
/// micro-batch's parts are all forwarded first (their graphs kept, together as large as the
/// micro-batch's one), so its high-entropy threshold is computed over all its rows, then each
/// part's loss goes backward on its own. `after_backward` runs after every backward pass (the
/// parameters' gradients then hold the sum of the passes so far).
pub fn backward_passes(
    model: &Llama,
    batch: &LossBatch,
    temperature: f64,
    settings: &LossSettings,
    passes: Passes,
    before_backward: &mut dyn FnMut(&Tensor, TokenMasks),
    after_backward: &mut dyn FnMut(),
) -> BackwardPass {
    let loss_mask = batch.loss_mask.to_kind(Kind::Float);
    let weights = token_weights(&loss_mask, batch.classes, settings, passes.micro_batches);
    let total_rows = loss_mask.size()[0];
    let rows = total_rows / passes.micro_batches as i64;
    let part_rows = rows / passes.splits as i64;
    assert_eq!(part_rows * passes.count() as i64, total_rows, "micro-batches and their splits must divide the batch");
    let mut chunks = Vec::with_capacity(passes.count());
    for start in (0..passes.micro_batches as i64).map(|k| k * rows) {
        let parts: Vec<(i64, TokenLogprobs)> = (0..passes.splits as i64)
            .map(|p| start + p * part_rows)
            .map(|part_start| (part_start, rows_logprobs(model, batch, temperature, part_start, part_rows)))
            .collect();
        let high_entropy = (settings.top_entropy_quantile < 1.0).then(|| {
            let entropy = match &parts[..] {
                [(_, only)] => only.entropy.shallow_clone(),
                _ => Tensor::cat(&parts.iter().map(|(_, part)| part.entropy.shallow_clone()).collect::<Vec<_>>(), 0),
            };
            high_entropy_mask(&entropy, &batch.loss_mask.narrow(0, start, rows), settings.top_entropy_quantile)
        });
        for (part_start, logprobs) in parts {
            let pick = |t: &Tensor| t.narrow(0, part_start, part_rows);
            let part_mask = pick(batch.loss_mask);
            let part_high_entropy = high_entropy.as_ref().map(|mask| mask.narrow(0, part_start - start, part_rows));
            let masks = TokenMasks { loss: &part_mask, policy: part_high_entropy.as_ref() };
            let (old, reference) = (batch.old_logprobs.map(pick), batch.ref_logprobs.map(pick));
            let terms = weighted_loss(&logprobs.logprobs, old.as_ref(), reference.as_ref(), &pick(batch.advantages), masks, &pick(&weights), settings);
            before_backward(&logprobs.logprobs, masks);
            terms.loss.backward();
            after_backward();
            chunks.push((TokenLogprobs { logprobs: logprobs.logprobs.detach(), entropy: logprobs.entropy }, part_high_entropy, terms));
        }
    }
    if chunks.len() == 1 {
        let (logprobs, _, mut terms) = chunks.pop().expect("one chunk");
        terms.loss = terms.loss.detach();
        return BackwardPass { logprobs, terms };
    }
    // The statistics of the whole batch from the chunks' detached values (element-wise only).
    let cat = |part: &dyn Fn(&(TokenLogprobs, Option<Tensor>, LossTerms)) -> Tensor| Tensor::cat(&chunks.iter().map(part).collect::<Vec<_>>(), 0);
    let logprobs = TokenLogprobs { logprobs: cat(&|c| c.0.logprobs.shallow_clone()), entropy: cat(&|c| c.0.entropy.shallow_clone()) };
    let high_entropy = (settings.top_entropy_quantile < 1.0).then(|| cat(&|c| c.1.as_ref().expect("a mask per chunk").shallow_clone()));
    let masks = TokenMasks { loss: batch.loss_mask, policy: high_entropy.as_ref() };
    let mut terms = weighted_loss(&logprobs.logprobs, batch.old_logprobs, batch.ref_logprobs, batch.advantages, masks, &weights, settings);
    terms.loss = Tensor::stack(&chunks.iter().map(|c| c.2.loss.detach()).collect::<Vec<_>>(), 0).sum(Kind::Float);
    BackwardPass { logprobs, terms }
}

/// [`backward_micro_batches`] with one micro-batch for several runs at once: one forward pass of
/// their `models` stacked on a leading axis ([`Llama::stacked`]; in the order of `batches`),
/// each run's loss with its own settings and temperature, and one backward pass of their sum,
/// which leaves in each run's parameters the gradient of its own loss (the runs share no
/// parameter). The batches have the same number of rows.
pub fn backward_stacked(models: &[&Llama], batches: &[LossBatch], temperatures: &[f64], settings: &[&LossSettings]) -> Vec<BackwardPass> {
    let ctl: Vec<&[AdapterCtl]> = batches.iter().map(|b| b.ctl).collect();
    let seqs: Vec<Sequences> = batches.iter().map(|b| b.seqs).collect();
    let logprobs = stacked_completion_logprobs(&Llama::stacked(models), &seqs, temperatures, &stacked_controls(&ctl, &seqs));
    let terms: Vec<LossTerms> = batches.iter().zip(settings).zip(&logprobs).map(|((batch, settings), logprobs)| whole_batch_terms(batch, settings, logprobs)).collect();
    let total = terms.iter().map(|t| t.loss.shallow_clone()).reduce(|a, b| a + b).expect("at least one run");
    total.backward();
    logprobs
        .into_iter()
        .zip(terms)
        .map(|(logprobs, mut terms)| {
            terms.loss = terms.loss.detach();
            BackwardPass { logprobs: TokenLogprobs { logprobs: logprobs.logprobs.detach(), entropy: logprobs.entropy }, terms }
        })
        .collect()
}

/// [`frozen_logprobs`] of several runs' batches in one forward pass of their `models` stacked
/// (no gradient; each run with its own adapter controls `ctl` and temperature).
pub fn stacked_frozen_logprobs(models: &[&Llama], ctl: &[&[AdapterCtl]], runs: &[Sequences], temperatures: &[f64]) -> Vec<Tensor> {
    tch::no_grad(|| {
        let stacked = Llama::stacked(models);
        stacked_completion_logprobs(&stacked, runs, temperatures, &stacked_controls(ctl, runs)).into_iter().map(|t| t.logprobs).collect()
    })
}

/// Each run's adapter controls (one per slot, over its batch's rows) as the stacked batch's
/// ([`AdapterCtl::stacked`]); the runs' batches have the same number of rows.
fn stacked_controls(ctl: &[&[AdapterCtl]], runs: &[Sequences]) -> Vec<AdapterCtl> {
    let rows = runs[0].completion_ids.size()[0];
    assert!(runs.iter().all(|s| s.completion_ids.size()[0] == rows), "stacked runs have the same number of rows");
    let device = runs[0].completion_ids.device();
    (0..ctl[0].len()).map(|slot| AdapterCtl::stacked(&ctl.iter().map(|c| &c[slot]).collect::<Vec<_>>(), rows, device)).collect()
}

/// The loss terms of a whole batch trained in one pass, from its differentiable log-probabilities
/// (what [`backward_passes`] computes with one micro-batch and one split).
fn whole_batch_terms(batch: &LossBatch, settings: &LossSettings, logprobs: &TokenLogprobs) -> LossTerms {
    let weights = token_weights(&batch.loss_mask.to_kind(Kind::Float), batch.classes, settings, 1);
    let high_entropy = (settings.top_entropy_quantile < 1.0).then(|| high_entropy_mask(&logprobs.entropy, batch.loss_mask, settings.top_entropy_quantile));
    let masks = TokenMasks { loss: batch.loss_mask, policy: high_entropy.as_ref() };
    weighted_loss(&logprobs.logprobs, batch.old_logprobs, batch.ref_logprobs, batch.advantages, masks, &weights, settings)
}

/// The differentiable log-probabilities of rows `start..start + rows` of `batch`.
fn rows_logprobs(model: &Llama, batch: &LossBatch, temperature: f64, start: i64, rows: i64) -> TokenLogprobs {
    let pick = |t: &Tensor| t.narrow(0, start, rows);
    let (prompt_ids, prompt_mask, completion_ids, completion_mask) = (pick(batch.seqs.prompt_ids), pick(batch.seqs.prompt_mask), pick(batch.seqs.completion_ids), pick(batch.seqs.completion_mask));
    let seqs = Sequences { prompt_ids: &prompt_ids, prompt_mask: &prompt_mask, completion_ids: &completion_ids, completion_mask: &completion_mask };
    let ctl: Vec<AdapterCtl> = batch.ctl.iter().map(|c| c.rows(start, rows)).collect();
    completion_logprobs(model, seqs, temperature, &ctl)
}

/// Kish's effective sample size `(Σw)² / Σw²` of non-negative weights (0 when all are 0).
pub fn effective_sample_size(weights: &Tensor) -> f64 {
    let weights = weights.detach().to_kind(Kind::Double);
    let squares = weights.square().sum(Kind::Double).double_value(&[]);
    if squares == 0.0 {
        return 0.0;
    }
    weights.sum(Kind::Double).double_value(&[]).powi(2) / squares
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
        grpo_loss(&b.logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &all_rows, settings)
    }

    fn settings(level: ImportanceSamplingLevel, loss_type: LossType) -> LossSettings {
        LossSettings { beta: 0.0, kl_estimator: KlEstimator::K3, epsilon: 0.2, epsilon_high: 0.28, delta: Some(1.3), importance_sampling_level: level, loss_type, loss_fn: LossFn::Trl, dro_beta: 0.0, max_completion_length: 3, top_entropy_quantile: 1.0 }
    }

    #[test]
    fn token_ratios_clip_at_epsilon_high_and_delta_and_count_as_trl_logs_them() {
        let terms = loss_terms(&hand_batch(), &settings(ImportanceSamplingLevel::Token, LossType::Dapo));
        // -min(min(r, delta) A, clip(r, 0.8, 1.28) A) per token: row A = +1: 1.5 -> -1.28,
        // 1.1 -> -1.1, 0.5 -> -0.5; row A = -1: 0.7 -> 0.8, 1.5 -> 1.3 (delta). dapo: sum / 5.
        approx(&terms.loss, (-1.28 - 1.1 - 0.5 + 0.8 + 1.3) / 5.0, "loss");
        // Low: 0.7 with A < 0; high: 1.5 (clamped to 1.3, still above 1.28) with A > 0.
        approx(&terms.clip_fractions.as_ref().unwrap().low, 1.0 / 5.0, "clip_ratio/low_mean");
        approx(&terms.clip_fractions.as_ref().unwrap().high, 1.0 / 5.0, "clip_ratio/high_mean");
        approx(&terms.clip_fractions.as_ref().unwrap().region, 2.0 / 5.0, "clip_ratio/region_mean");
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
        approx(&terms.clip_fractions.as_ref().unwrap().region, 0.0, "clip_ratio/region_mean");
        // With A = +1 on both rows, the first stays in range and the second (1.025) is above
        // 1 + epsilon_high = 1.02: one completion in two.
        let tight = LossSettings { epsilon: 0.02, epsilon_high: 0.02, delta: None, ..settings(ImportanceSamplingLevel::Sequence, LossType::Grpo) };
        let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
        let positive = Tensor::from_slice(&[1.0f32, 1.0]);
        let terms = grpo_loss(&b.logprobs, Some(&b.old), None, &positive, (&b.mask).into(), &all_rows, &tight);
        approx(&terms.clip_fractions.as_ref().unwrap().high, 0.5, "clip_ratio/high_mean per completion");
        approx(&terms.loss, (-first - 1.02) / 2.0, "loss with the second completion clipped");
    }

    #[test]
    fn cispo_weights_the_log_prob_by_the_capped_detached_ratio() {
        let b = hand_batch();
        let logprobs = b.logprobs.set_requires_grad(true);
        let cispo = LossSettings { epsilon_high: 1.2, delta: None, ..settings(ImportanceSamplingLevel::Token, LossType::Cispo) };
        let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
        let terms = grpo_loss(&logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &all_rows, &cispo);
        terms.loss.backward();
        // d loss / d logp = -min(r, 1.2) A / 5 (dapo over the 5 loss tokens); the ratio itself
        // carries no gradient. Ratios 1.5 1.1 0.5 | 0.7 1.5 (padding), A = +1 | -1.
        let expected = [-1.2, -1.1, -0.5, 0.7, 1.2, 0.0].map(|g| g / 5.0);
        let grad = Vec::<f64>::try_from(logprobs.grad().to_kind(Kind::Double).reshape([-1])).unwrap();
        for (ours, hand) in grad.iter().zip(expected) {
            assert!((ours - hand).abs() < 1e-6, "gradient {grad:?} vs {expected:?} (by hand)");
        }
        assert!(terms.clip_fractions.is_none(), "TRL logs no PPO clip fractions for cispo");
        // Capped with A > 0: the first row's 1.5 only; capped at all: both 1.5s.
        approx(terms.cispo_clip_ratio.as_ref().unwrap(), 1.0 / 5.0, "cispo_clip_ratio");
        approx(&terms.clip_ratio, 2.0 / 5.0, "clip_ratio");
    }

    #[test]
    fn tinker_losses_follow_their_documented_formulas_by_hand() {
        let b = hand_batch();
        let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
        let tinker = |loss_fn| LossSettings { loss_fn, dro_beta: 0.5, delta: None, ..settings(ImportanceSamplingLevel::Token, LossType::Dapo) };
        // importance_sampling, dapo over the 5 loss tokens: -(r A) = -(1.5 + 1.1 + 0.5) + (0.7 + 1.5).
        let terms = grpo_loss(&b.logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &all_rows, &tinker(LossFn::ImportanceSampling));
        approx(&terms.loss, (-3.1 + 2.2) / 5.0, "importance_sampling loss");
        approx(&terms.clip_ratio, 0.0, "importance_sampling clips nothing");
        assert!(terms.clip_fractions.is_none() && terms.cispo_clip_ratio.is_none());
        // dro at logp = 0: -(0 * A - 0.25 (ln r)^2) per token; d/dlogp = -(A - 0.5 ln r) / 5.
        let logprobs = b.logprobs.set_requires_grad(true);
        let terms = grpo_loss(&logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &all_rows, &tinker(LossFn::Dro));
        terms.loss.backward();
        let ratios = [1.5f64, 1.1, 0.5, 0.7, 1.5];
        approx(&terms.loss, ratios.iter().map(|r| 0.25 * r.ln().powi(2)).sum::<f64>() / 5.0, "dro loss");
        let advantages = [1.0, 1.0, 1.0, -1.0, -1.0];
        let grad = Vec::<f64>::try_from(logprobs.grad().to_kind(Kind::Double).reshape([-1])).unwrap();
        for (i, (r, a)) in ratios.iter().zip(advantages).enumerate() {
            let hand = -(a - 0.5 * r.ln()) / 5.0;
            assert!((grad[i] - hand).abs() < 1e-6, "dro gradient {grad:?}: token {i} should be {hand} (by hand)");
        }
        assert_eq!(grad[5], 0.0, "padding");
    }

    #[test]
    fn the_high_entropy_mask_keeps_the_tokens_at_or_above_the_quantile() {
        let b = hand_batch();
        // Loss tokens' entropies 3 1 5 | 2 4 (the padding's 100 must not count): the 0.6
        // quantile (top 0.4) is at rank 0.6 * 4 = 2.4 of 1 2 3 4 5, so 3.4; 5 and 4 stay.
        let entropy = Tensor::from_slice(&[3.0f32, 1.0, 5.0, 2.0, 4.0, 100.0]).view([2, 3]);
        let kept = high_entropy_mask(&entropy, &b.mask, 0.4);
        assert!(kept.equal(&Tensor::from_slice(&[0.0f32, 0.0, 1.0, 0.0, 1.0, 0.0]).view([2, 3])), "{kept}");
        assert!(high_entropy_mask(&entropy, &b.mask, 1.0).equal(&b.mask.to_kind(Kind::Float)), "quantile 1 keeps every loss token");
        // The policy term trains on the kept tokens only; the aggregation still counts all five.
        let masks = TokenMasks { loss: &b.mask, policy: Some(&kept) };
        let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
        let terms = grpo_loss(&b.logprobs, Some(&b.old), None, &b.advantages, masks, &all_rows, &settings(ImportanceSamplingLevel::Token, LossType::Dapo));
        // Kept: 0.5 with A = +1 (-0.5), 1.5 with A = -1 (1.3 after delta).
        approx(&terms.loss, (-0.5 + 1.3) / 5.0, "loss");
    }

    #[test]
    fn the_losses_of_complementary_rows_split_the_batch_loss_for_every_loss_type() {
        let b = hand_batch();
        let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
        let first = Tensor::from_slice(&[1.0f32, 0.0]);
        for loss_type in [LossType::Grpo, LossType::DrGrpo, LossType::Dapo, LossType::Bnpo, LossType::Cispo] {
            let s = settings(ImportanceSamplingLevel::Token, loss_type);
            let part = |rows: &Tensor| weighted_loss(&b.logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &row_token_weights(&b.mask, &all_rows, &s, rows), &s).loss;
            let whole = loss_terms(&b, &s).loss.double_value(&[]);
            let (a, c) = (part(&first).double_value(&[]), part(&(1.0 - &first)).double_value(&[]));
            assert!((a + c - whole).abs() < 1e-6, "{loss_type}: {a} + {c} vs {whole}");
        }
        // dapo's first row alone keeps the batch's five tokens as its divisor (by hand, as in
        // the clip test): (-1.28 - 1.1 - 0.5) / 5, not / 3 as a class of that row alone would.
        let dapo = settings(ImportanceSamplingLevel::Token, LossType::Dapo);
        let weights = row_token_weights(&b.mask, &all_rows, &dapo, &first);
        approx(&weighted_loss(&b.logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &weights, &dapo).loss, (-1.28 - 1.1 - 0.5) / 5.0, "first row's part");
    }

    /// Kish's `(Σw)² / Σw²` in f64.
    fn kish(weights: &[f64]) -> f64 {
        weights.iter().sum::<f64>().powi(2) / weights.iter().map(|w| w * w).sum::<f64>()
    }

    #[test]
    fn the_effective_sample_size_weighs_tokens_by_aggregation_and_ratio() {
        let b = hand_batch();
        let ratios = [1.5, 1.1, 0.5, 0.7, 1.5];
        // dapo: every loss token weighs 1/5; grpo: 1/(3 * 2) in the first row, 1/(2 * 2) in the second.
        let dapo = ratios.map(|r| r / 5.0);
        let grpo = [1.5 / 6.0, 1.1 / 6.0, 0.5 / 6.0, 0.7 / 4.0, 1.5 / 4.0];
        for (loss_type, weights) in [(LossType::Dapo, dapo), (LossType::Grpo, grpo)] {
            let ess = loss_terms(&b, &settings(ImportanceSamplingLevel::Token, loss_type)).effective_sample_size;
            assert!((ess - kish(&weights)).abs() < 1e-5, "{loss_type}: {ess} vs {} (by hand)", kish(&weights));
        }
        // On-policy (ratio 1) dapo weighs the five tokens alike: five.
        let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
        let fresh = grpo_loss(&b.logprobs, None, None, &b.advantages, (&b.mask).into(), &all_rows, &settings(ImportanceSamplingLevel::Token, LossType::Dapo));
        assert!((fresh.effective_sample_size - 5.0).abs() < 1e-5, "{}", fresh.effective_sample_size);
    }

    #[test]
    fn kl_estimators_and_their_gradients_follow_schulman() {
        let mut logprobs = Tensor::from_slice(&[-1.0f32, -2.0, -0.25]).set_requires_grad(true);
        let reference = Tensor::from_slice(&[-1.5f32, -1.0, -0.25]);
        // d = ref - logp = -0.5, 1, 0; each value and d/dlogp written out in f64.
        let d = [-0.5f64, 1.0, 0.0];
        let exact: [(KlEstimator, fn(f64) -> f64, fn(f64) -> f64); 3] = [
            (KlEstimator::K1, |d| -d, |_| 1.0),
            (KlEstimator::K2, |d| 0.5 * d * d, |d| -d),
            (KlEstimator::K3, |d| d.exp() - d - 1.0, |d| 1.0 - d.exp()),
        ];
        for (estimator, value, slope) in exact {
            logprobs.zero_grad();
            let kl = per_token_kl(&logprobs, &reference, estimator);
            kl.sum(Kind::Float).backward();
            let (kl, grad) = (Vec::<f64>::try_from(kl.detach().to_kind(Kind::Double)).unwrap(), Vec::<f64>::try_from(logprobs.grad().to_kind(Kind::Double)).unwrap());
            for i in 0..3 {
                assert!((kl[i] - value(d[i])).abs() < 1e-6 && (grad[i] - slope(d[i])).abs() < 1e-6, "{estimator}: {kl:?} {grad:?} at d = {d:?}");
            }
        }
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
    fn dynamic_sampling_keeps_the_groups_whose_counted_rewards_differ() {
        let all = [true; 9];
        // Groups of 3: equal, one differs, equal zeros.
        let rewards = [0.5, 0.5, 0.5, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        assert_eq!(informative_groups(&rewards, &all, 3), [false, true, false]);
        // Only counted rows matter (intervention: filter): the second group's kept rows are
        // equal, the first's single kept row is not a spread, the third's two kept rows differ.
        let rewards = [0.5, 0.2, 0.5, 1.0, 0.0, 1.0, 0.0, 0.3, 0.0];
        let counted = [true, false, false, true, false, true, false, true, true];
        assert_eq!(informative_groups(&rewards, &counted, 3), [false, false, true]);
        assert_eq!(informative_groups(&rewards, &all, 3), [true, true, true]);
        assert_eq!(informative_groups(&[1.0, 1.0 + 1e-12], &[true, true], 2), [true], "any difference counts");
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
