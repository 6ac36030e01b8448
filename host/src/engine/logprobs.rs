//! Log-probabilities of completions under the model: one forward pass over
//! `[prompt | completion]`, only the positions that predict real completion tokens through the
//! output head, which runs in cached row chunks with an analytic gradient (no `[tokens, vocab]`
//! tensor in the autograd graph).

use tch::{Kind, Tensor};

use crate::model::{Llama, autocast};
use crate::model::batch::Generation;
use crate::model::linear::{AdapterCtl, gradient_only};

/// Log-probabilities of the completion tokens and the logits they came from.
pub struct TokenLogprobs {
    /// `[batch, completion_len]`, differentiable.
    pub logprobs: Tensor,
    /// `[batch, completion_len]` entropy of each next-token distribution (differentiable only
    /// from [`completion_logprobs_and_entropy`]).
    pub entropy: Tensor,
    /// Sampling replay (the sequences carry kept sets): `[batch, completion_len]` the
    /// log-probabilities renormalised over each token's kept set, differentiable like
    /// `logprobs`: what is compared with the sampler's.
    pub replayed: Option<Tensor>,
}

impl TokenLogprobs {
    /// The same values without their graph.
    pub fn detach(&self) -> TokenLogprobs {
        TokenLogprobs { logprobs: self.logprobs.detach(), entropy: self.entropy.detach(), replayed: self.replayed.as_ref().map(Tensor::detach) }
    }
}

/// A batch of `[prompt | completion]` sequences: prompts left-padded, completions
/// right-padded, masks 1 on real tokens (completions up to and including EOS).
#[derive(Clone, Copy)]
pub struct Sequences<'a> {
    pub prompt_ids: &'a Tensor,
    pub prompt_mask: &'a Tensor,
    pub completion_ids: &'a Tensor,
    pub completion_mask: &'a Tensor,
    /// The sampler's kept sets (`[batch, completion_len, k]`, [`Generation::kept`]): with them
    /// the policy's log-probabilities come renormalised over them too
    /// ([`TokenLogprobs::replayed`]).
    pub kept: Option<&'a Tensor>,
}

impl<'a> From<&'a Generation> for Sequences<'a> {
    fn from(g: &'a Generation) -> Self {
        Self { prompt_ids: &g.prompt_ids, prompt_mask: &g.prompt_mask, completion_ids: &g.completion_ids, completion_mask: &g.completion_mask, kept: g.kept.as_ref() }
    }
}

/// One forward pass over `[prompt | completion]`; logits divided by `temperature`, then
/// `log_softmax` gathered at the completion tokens (TRL's `selective_log_softmax`), and the
/// entropy of each next-token distribution (a metric, no gradient). `[batch, completion_len]`,
/// 0 after each row's first EOS.
pub fn completion_logprobs(model: &Llama, seqs: Sequences, temperature: f64, ctl: &[AdapterCtl]) -> TokenLogprobs {
    policy_logprobs(model, seqs, temperature, ctl, false)
}

/// [`completion_logprobs`] with the entropies differentiable too: TRL's entropy bonus
/// (`entropy_coef`) trains on them.
pub fn completion_logprobs_and_entropy(model: &Llama, seqs: Sequences, temperature: f64, ctl: &[AdapterCtl]) -> TokenLogprobs {
    policy_logprobs(model, seqs, temperature, ctl, true)
}

fn policy_logprobs(model: &Llama, seqs: Sequences, temperature: f64, ctl: &[AdapterCtl], entropy_gradient: bool) -> TokenLogprobs {
    let _autocast = autocast::enter(model.autocast);
    let real = real_completion_hidden(model, seqs, ctl);
    let head = head_logprobs(model.head_weight(), &real.hidden, &real.targets, temperature, entropy_gradient, real.kept.as_ref());
    real.token_logprobs(head)
}

/// The completion log-probabilities only, without gradient: reference and old policies.
pub fn frozen_logprobs(model: &Llama, seqs: Sequences, temperature: f64, ctl: &[AdapterCtl]) -> Tensor {
    tch::no_grad(|| {
        let _autocast = autocast::enter(model.autocast);
        let real = real_completion_hidden(model, seqs, ctl);
        real.scatter(&head_logprobs(model.head_weight(), &real.hidden, &real.targets, temperature, false, None).logprobs)
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
    /// `[n_real, k]` the kept sets of these tokens (sampling replay).
    kept: Option<Tensor>,
}

impl RealCompletionHidden {
    /// Per-token values `[n_real]` back on the `[batch, completion_len]` grid, 0 on padding
    /// (differentiable in `values`).
    fn scatter(&self, values: &Tensor) -> Tensor {
        let grid = Tensor::zeros([self.shape[0] * self.shape[1]], (values.kind(), values.device()));
        grid.index_copy(0, &self.positions, values).view(self.shape)
    }

    /// The head's outputs on the `[batch, completion_len]` grid.
    fn token_logprobs(&self, head: HeadOutputs) -> TokenLogprobs {
        TokenLogprobs { logprobs: self.scatter(&head.logprobs), entropy: self.scatter(&head.entropy), replayed: head.replayed.map(|replayed| self.scatter(&replayed)) }
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
        let kept = seqs.kept.map(|kept| {
            assert_eq!(kept.size()[..2], [batch, completion_len], "one kept set per completion token");
            kept.reshape([batch * completion_len, -1]).index_select(0, &positions)
        });
        Self { hidden: predicting.index_select(0, &positions), targets, positions, shape: [batch, completion_len], kept }
    }
}

/// [`completion_logprobs`] of several runs' batches in one forward pass of their models stacked
/// on a leading axis (`stacked`, [`Llama::stacked`]; `ctl` the runs' controls stacked with
/// [`AdapterCtl::stacked`]). The runs' batches have the same number of rows; prompts are
/// left-padded and completions right-padded to the longest (padding that no real token attends
/// to, and positions that only shift, which RoPE does not see), and each run's states go through
/// its own output head at its own temperature (its entropies differentiable where
/// `entropy_gradients` says).
pub(super) fn stacked_completion_logprobs(stacked: &Llama, runs: &[Sequences], temperatures: &[f64], entropy_gradients: &[bool], ctl: &[AdapterCtl]) -> Vec<TokenLogprobs> {
    assert_eq!(stacked.runs(), runs.len() as i64, "one batch per stacked run");
    let _autocast = autocast::enter(stacked.autocast);
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
        .zip(temperatures.iter().zip(entropy_gradients))
        .enumerate()
        .map(|(r, (seqs, (&temperature, &entropy_gradient)))| {
            let real = RealCompletionHidden::of(&hidden.narrow(0, r as i64 * rows, rows), prompt_len, *seqs);
            let head = head_logprobs(&stacked.head_weight().get(r as i64), &real.hidden, &real.targets, temperature, entropy_gradient, real.kept.as_ref());
            real.token_logprobs(head)
        })
        .collect()
}

/// Rows of the output head done together: a `[rows, vocab]` block of logits (4 MB for
/// 256 × 4096) stays in cache through log-softmax, entropy and the residual product `r W`.
pub const HEAD_CHUNK_ROWS: i64 = 256;

struct HeadOutputs {
    /// `[n]` log p(target), differentiable in the hidden states and the head weight.
    logprobs: Tensor,
    /// `[n]` entropy of each next-token distribution (differentiable when asked for).
    entropy: Tensor,
    /// `[n]` log p(target) renormalised over each row's kept set, when given (differentiable
    /// like `logprobs`).
    replayed: Option<Tensor>,
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
///
/// With `entropy_gradient` the entropy `H = log Z - Σ_v p_v z_v` gets the same treatment, with
/// `dH / dz_v = -p_v (log p_v + H)` (TRL's kernel's) in place of `r`: one more `[n, hidden]`
/// product, made only then.
///
/// With `kept` (`[n, k]` ids, sampling replay) the log-probabilities renormalised over each
/// row's kept set too, `z_target - log Σ_{v ∈ S} exp z_v` with `S` the kept set plus the target
/// (prime-rl's rule: the sampled token counts even if rounding moved it out of the set the
/// sampler recorded), and their gradient the same way with `p` the softmax over `S`: one more
/// `[n, hidden]` product.
fn head_logprobs(weight: &Tensor, hidden: &Tensor, targets: &Tensor, temperature: f64, entropy_gradient: bool, kept: Option<&Tensor>) -> HeadOutputs {
    // Under `no_grad` nothing requires grad; a head weight learns only with full fine-tuning,
    // where the hidden states learn too.
    let learns_hidden = hidden.requires_grad();
    let learns_weight = learns_hidden && weight.requires_grad();
    let (frozen_hidden, frozen_weight) = (hidden.detach(), weight.detach());
    // The weight of the residual product, made only when a gradient is wanted.
    let product_weight = learns_hidden.then(|| (if learns_weight { weight } else { &frozen_weight }).to_kind(Kind::Float));
    let entropy_weight = product_weight.as_ref().filter(|_| entropy_gradient);
    let (mut logprobs, mut entropy, mut jacobian, mut entropy_jacobian) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut replayed, mut replayed_jacobian) = (Vec::new(), Vec::new());
    let kept_chunks = kept.map(|kept| kept.split(HEAD_CHUNK_ROWS, 0));
    for (chunk, (rows, row_targets)) in frozen_hidden.split(HEAD_CHUNK_ROWS, 0).iter().zip(targets.split(HEAD_CHUNK_ROWS, 0)).enumerate() {
        let logits = autocast::matmul(rows, &frozen_weight.tr()).to_kind(Kind::Float);
        let logits = if temperature != 1.0 { logits / temperature } else { logits };
        let normaliser = logits.logsumexp([-1], false);
        let row_targets = row_targets.unsqueeze(-1);
        let picked = logits.gather(-1, &row_targets, false).squeeze_dim(-1);
        if let Some(kept) = kept_chunks.as_ref().map(|chunks| &chunks[chunk]) {
            let outside = kept_set_mask(&logits, kept, &row_targets).logical_not();
            let kept_logits = logits.masked_fill(&outside, f64::NEG_INFINITY);
            replayed.push(&picked - kept_logits.logsumexp([-1], false));
            if let Some(product_weight) = &product_weight {
                let residual = target_residual(kept_logits.softmax(-1, Kind::Float), &row_targets);
                replayed_jacobian.push(jacobian_product(&residual, product_weight, temperature));
            }
        }
        logprobs.push(picked - &normaliser);
        let probs = logits.softmax(-1, Kind::Float);
        match entropy_weight {
            None => entropy.push(&normaliser - (&probs * &logits).sum_dim_intlist(-1, false, Kind::Float)),
            Some(product_weight) => {
                let (row_entropy, derivative) = entropy_and_derivative(&logits, &probs);
                entropy_jacobian.push(jacobian_product(&derivative, product_weight, temperature));
                entropy.push(row_entropy);
            }
        }
        if let Some(product_weight) = &product_weight {
            // With a learning head weight this product keeps `residual` for its backward.
            jacobian.push(jacobian_product(&target_residual(probs, &row_targets), product_weight, temperature));
        }
    }
    let (mut logprobs, mut entropy) = (Tensor::cat(&logprobs, 0), Tensor::cat(&entropy, 0));
    let mut replayed = kept.map(|_| Tensor::cat(&replayed, 0));
    if learns_hidden {
        let hidden_f = hidden.to_kind(Kind::Float);
        logprobs = logprobs + analytic_gradient(&hidden_f, Tensor::cat(&jacobian, 0), learns_weight);
        if entropy_weight.is_some() {
            entropy = entropy + analytic_gradient(&hidden_f, Tensor::cat(&entropy_jacobian, 0), learns_weight);
        }
        replayed = replayed.map(|replayed| replayed + analytic_gradient(&hidden_f, Tensor::cat(&replayed_jacobian, 0), learns_weight));
    }
    HeadOutputs { logprobs, entropy, replayed }
}

/// `r W / T`, a row of derivatives in the logits times the head weight: the head's backward
/// product, in the passes' matrix-product kind as autograd's would be (float32 after).
fn jacobian_product(derivative: &Tensor, weight: &Tensor, temperature: f64) -> Tensor {
    autocast::matmul(derivative, weight).to_kind(Kind::Float) / temperature
}

/// `r = onehot(target) - p` for each row of `probs` (consumed), the derivative of
/// `log p(target)` in the logits. `r_target = Σ_{v ≠ target} p_v`, not `1 - p_target`: a
/// confident model (p_target ≈ 1) would lose digits in the subtraction.
fn target_residual(mut probs: Tensor, targets: &Tensor) -> Tensor {
    let zeros = Tensor::zeros(targets.size(), (Kind::Float, probs.device()));
    let _ = probs.scatter_(-1, targets, &zeros);
    let others = probs.sum_dim_intlist(-1, true, Kind::Float);
    probs.neg_().scatter_(-1, targets, &others)
}

/// `[n, vocab]` bool: each row's kept set (`kept`, `[n, k]` ids) and its `targets` (`[n, 1]`).
fn kept_set_mask(logits: &Tensor, kept: &Tensor, targets: &Tensor) -> Tensor {
    let mask = Tensor::zeros(logits.size(), (Kind::Bool, logits.device()));
    let mask = mask.scatter_value(-1, &kept.to_device(logits.device()), 1);
    mask.scatter_value(-1, targets, 1)
}

/// The entropy `H` of each row of `logits` (`[rows, vocab]`, softmax `probs`) and its derivative
/// `dH / dz_v = -p_v (log p_v + H) = -p_v (z_v - E_p[z])`, both from logits shifted by their
/// maximum: `log Z - E_p[z]` on the raw logits subtracts two numbers of the size of the largest
/// logit and left the bonus's float32 gradient 1e-4 from float64 (TRL's 1e-5); shifted, they are
/// of the size of the entropy. (The metric's entropy, without the bonus, keeps its formula, so
/// that runs without the bonus log the bits they did.)
fn entropy_and_derivative(logits: &Tensor, probs: &Tensor) -> (Tensor, Tensor) {
    let shifted = logits - logits.amax([-1], true);
    let expected = (probs * &shifted).sum_dim_intlist(-1, true, Kind::Float);
    let entropy = shifted.logsumexp([-1], true) - &expected;
    let derivative = -(probs * (shifted - expected));
    (entropy.squeeze_dim(-1), derivative)
}

/// The zero-valued term whose gradient is a head output's: `jacobian` (`[n, hidden]`, the output's
/// derivative in the hidden states, made with the head weight, differentiable in it when it
/// learns) against the hidden states, and its own backward for the weight.
fn analytic_gradient(hidden: &Tensor, jacobian: Tensor, learns_weight: bool) -> Tensor {
    let term = (gradient_only(hidden) * jacobian.detach()).sum_dim_intlist(-1, false, Kind::Float);
    match learns_weight {
        true => term + gradient_only(&(jacobian * hidden.detach()).sum_dim_intlist(-1, false, Kind::Float)),
        false => term,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sampling replay's log-probabilities from the head: `z_t - log Σ_{v ∈ S ∪ {t}} exp z_v`
    /// (`z = h W^T / T`), against float64 autograd of that formula, values and gradients in the
    /// hidden states and the head weight; the kept sets padded with the target as the samplers
    /// pad them, one of them missing its target (prime-rl's rule puts it back), one the target
    /// alone. More rows than a chunk, so chunks are crossed.
    #[test]
    fn replayed_logprobs_and_gradients_are_the_float64_formulas() {
        tch::manual_seed(7);
        let (n, width, vocab, k, temperature) = (HEAD_CHUNK_ROWS + 9, 16, 40, 6, 0.7);
        let hidden = Tensor::randn([n, width], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let weight = (Tensor::randn([vocab, width], (Kind::Float, tch::Device::Cpu)) * 0.8).set_requires_grad(true);
        let targets = Tensor::randint(vocab, [n], (Kind::Int64, tch::Device::Cpu));
        // Each row's kept set: k ids drawn at random, the last the target (padding as the
        // samplers pad); row 1's set lacks its target, row 2's is the target alone.
        let kept = Tensor::randint(vocab, [n, k], (Kind::Int64, tch::Device::Cpu));
        let _ = kept.narrow(1, k - 1, 1).copy_(&targets.unsqueeze(1));
        let _ = kept.get(1).fill_(if targets.int64_value(&[1]) == 0 { 1 } else { 0 });
        let _ = kept.get(2).copy_(&targets.get(2).expand([k], false));
        let head = head_logprobs(&weight, &hidden, &targets, temperature, false, Some(&kept));
        let replayed = head.replayed.expect("kept sets give replayed log-probabilities");
        let loss_weights = Tensor::randn([n], (Kind::Float, tch::Device::Cpu));
        (&replayed * &loss_weights).sum(Kind::Float).backward();
        let (hidden_grad, weight_grad) = (hidden.grad(), weight.grad());

        // float64 autograd of the formula.
        let hidden64 = hidden.detach().to_kind(Kind::Double).set_requires_grad(true);
        let weight64 = weight.detach().to_kind(Kind::Double).set_requires_grad(true);
        let logits = hidden64.matmul(&weight64.tr()) / temperature;
        let in_set = Tensor::zeros([n, vocab], (Kind::Bool, tch::Device::Cpu)).scatter_value(1, &kept, 1).scatter_value(1, &targets.unsqueeze(1), 1);
        let expected = logits.gather(1, &targets.unsqueeze(1), false).squeeze_dim(1) - logits.masked_fill(&in_set.logical_not(), f64::NEG_INFINITY).logsumexp([1], false);
        (&expected * loss_weights.to_kind(Kind::Double)).sum(Kind::Double).backward();
        let close = |ours: &Tensor, reference: &Tensor, what: &str| {
            let error = (ours.to_kind(Kind::Double) - reference).abs().max().double_value(&[]);
            let scale = reference.abs().max().double_value(&[]).max(1.0);
            assert!(error <= 2e-5 * scale, "{what}: {error} (scale {scale})");
        };
        close(&replayed.detach(), &expected.detach(), "replayed log-probabilities");
        close(&hidden_grad, &hidden64.grad(), "gradient in the hidden states");
        close(&weight_grad, &weight64.grad(), "gradient in the head weight");
        assert_eq!(expected.double_value(&[2]), 0.0, "a kept set of the target alone: log 1");
        assert!(replayed.double_value(&[2]).abs() < 1e-6);
        // The full log-probabilities are unchanged by kept sets.
        let plain = head_logprobs(&weight.detach(), &hidden.detach(), &targets, temperature, false, None);
        assert!(plain.logprobs.equal(&head.logprobs.detach()), "the full softmax bit for bit");
    }
}
