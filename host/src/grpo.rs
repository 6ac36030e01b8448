//! The GRPO objective as TRL's `GRPOTrainer` computes it: group-normalised advantages,
//! per-token log-probabilities, Schulman's k3 KL estimator, the clipped surrogate and the four
//! loss aggregations. Pure tensor functions; the trainer decides what goes in.

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

/// Group-normalised advantages `(r - mean_g) / (std_g + eps)` with the unbiased standard
/// deviation, in float32 and with TRL 1.16's arithmetic (`sqrt(mean(d^2) * n / (n - 1))`).
/// `rewards` is `[batch]`, groups are consecutive rows of `group_size`. Also returns the
/// fraction of groups whose rewards are all equal (TRL's `frac_reward_zero_std`).
pub fn group_advantages(rewards: &Tensor, group_size: usize, eps: f64) -> (Tensor, f64) {
    let n = group_size as i64;
    let rewards = rewards.to_kind(Kind::Float);
    let grouped = rewards.view([-1, n]);
    let mean = grouped.mean_dim(1, true, Kind::Float);
    let squared = (&grouped - &mean).square().mean_dim(1, false, Kind::Float);
    let std = (squared * (n as f64 / (n - 1) as f64)).sqrt();
    let spread = |t: &Tensor| t.reshape([-1]).repeat_interleave_self_int(n, 0, None);
    let advantages = (&rewards - spread(&mean)) / (spread(&std) + eps);
    let zero_std = std.isclose(&std.zeros_like(), 1e-5, 1e-8, false).to_kind(Kind::Float);
    (advantages, zero_std.mean(Kind::Float).double_value(&[]))
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
    pub epsilon: f64,
    pub loss_type: LossType,
    pub max_completion_length: usize,
}

pub struct LossTerms {
    pub loss: Tensor,
    /// Per-token KL (`None` when beta = 0, as TRL skips the reference model then).
    pub per_token_kl: Option<Tensor>,
    /// Fraction of completion tokens whose ratio was clipped (low or high side).
    pub clip_ratio: Tensor,
}

/// The GRPO loss. `classes` are `[batch]` 0/1 row masks that partition the batch (one mask
/// of ones when nothing is routed); the loss is `sum_c (n_c / n) * aggregate(rows of c)`,
/// which is exactly what separate backward passes per class with loss scaled by `n_c / n`
/// produce. For `grpo` this equals the plain aggregate over the whole batch.
pub fn grpo_loss(
    logprobs: &Tensor,
    old_logprobs: Option<&Tensor>,
    ref_logprobs: Option<&Tensor>,
    advantages: &Tensor,
    completion_mask: &Tensor,
    classes: &[Tensor],
    settings: &LossSettings,
) -> LossTerms {
    let old = old_logprobs.map_or_else(|| logprobs.detach(), Tensor::shallow_clone);
    let ratio = (logprobs - &old).exp();
    let clipped = ratio.clamp(1.0 - settings.epsilon, 1.0 + settings.epsilon);
    let advantages = advantages.unsqueeze(1);
    let surrogate = (&ratio * &advantages).min_other(&(&clipped * &advantages));
    let mut per_token_loss = -surrogate;
    let per_token_kl = ref_logprobs.filter(|_| settings.beta != 0.0).map(|r| k3_kl(logprobs, r));
    if let Some(kl) = &per_token_kl {
        per_token_loss = per_token_loss + kl * settings.beta;
    }
    let mask = completion_mask.to_kind(Kind::Float);
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
    LossTerms { loss, per_token_kl, clip_ratio }
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
