//! The step's training passes: forward and backward over micro-batches of a run's batch
//! (TRL's gradient accumulation), split for probes that compare the gradients of parts of a
//! batch, several runs' passes stacked on a leading run axis, and the per-sequence passes of
//! the Fisher kernel's sketches. The loss of each pass is [`crate::grpo`]'s; this module only
//! decides which rows go through the model together.

use tch::{Kind, Tensor};

use super::logprobs::{Sequences, TokenLogprobs, completion_logprobs, completion_logprobs_and_entropy, stacked_completion_logprobs};
use crate::grpo::{self, EntropyBonus, LossLogprobs, LossTerms, Objective, TokenMasks, high_entropy_mask, sampled_loss, token_weights};
use crate::model::Llama;
use crate::model::linear::{AdapterCtl, RowLearn, RowScale};

/// One step's batch as the loss sees it (all `[batch, ...]`).
#[derive(Clone, Copy)]
pub struct LossBatch<'a> {
    pub seqs: Sequences<'a>,
    /// The routing plan's per-row adapter controls.
    pub ctl: &'a [AdapterCtl],
    pub old_logprobs: Option<&'a Tensor>,
    pub ref_logprobs: Option<&'a Tensor>,
    /// The sampler's log-probabilities (read with the importance-sampling correction only).
    pub sampling_logprobs: Option<&'a Tensor>,
    /// `old_logprobs` are the sampler's (a ratio to the sampler, or a batch sampled ahead or
    /// replayed): with kept sets the policy's side of the ratio is then the replayed one.
    pub old_is_sampler: bool,
    pub advantages: &'a Tensor,
    pub loss_mask: &'a Tensor,
    pub classes: &'a [Tensor],
    /// The entropy bonus's coefficient at this step (`None`: the objective has no bonus; an
    /// adaptive control may apply 0).
    pub entropy_coef: Option<f64>,
}

impl<'a> LossBatch<'a> {
    /// The loss's log-probabilities: the policy's `current` ones (and `replayed`, over the
    /// sampler's kept sets) and the batch's others.
    pub fn logprobs(&self, current: &'a TokenLogprobs) -> LossLogprobs<'a> {
        LossLogprobs {
            current: &current.logprobs,
            old: self.old_logprobs,
            reference: self.ref_logprobs,
            sampler: self.sampling_logprobs,
            replayed: current.replayed.as_ref(),
            old_is_sampler: self.old_is_sampler,
        }
    }
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
pub fn backward_micro_batches(model: &Llama, batch: &LossBatch, temperature: f64, objective: &Objective, micro_batches: usize, before_backward: &mut dyn FnMut(&TokenLogprobs, TokenMasks)) -> BackwardPass {
    let passes = Passes { micro_batches, splits: 1 };
    backward_passes(model, batch, temperature, objective, passes, before_backward, &mut || {})
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
    objective: &Objective,
    passes: Passes,
    before_backward: &mut dyn FnMut(&TokenLogprobs, TokenMasks),
    after_backward: &mut dyn FnMut(),
) -> BackwardPass {
    let loss_mask = batch.loss_mask.to_kind(Kind::Float);
    let weights = token_weights(&loss_mask, batch.classes, objective.aggregation, passes.micro_batches);
    let total_rows = loss_mask.size()[0];
    let rows = total_rows / passes.micro_batches as i64;
    let part_rows = rows / passes.splits as i64;
    assert_eq!(part_rows * passes.count() as i64, total_rows, "micro-batches and their splits must divide the batch");
    // The whole step's trained tokens count the bonus's mean (with the high-entropy mask,
    // each micro-batch's own: `grpo::entropy`'s documentation).
    let step_trained = grpo::trained_tokens(&weights, None);
    let mut chunks = Vec::with_capacity(passes.count());
    for start in (0..passes.micro_batches as i64).map(|k| k * rows) {
        let parts: Vec<(i64, TokenLogprobs)> = (0..passes.splits as i64)
            .map(|p| start + p * part_rows)
            .map(|part_start| (part_start, rows_logprobs(model, batch, temperature, part_start, part_rows)))
            .collect();
        let high_entropy = (objective.top_entropy_quantile < 1.0).then(|| {
            let entropy = match &parts[..] {
                [(_, only)] => only.entropy.shallow_clone(),
                _ => Tensor::cat(&parts.iter().map(|(_, part)| part.entropy.shallow_clone()).collect::<Vec<_>>(), 0),
            };
            high_entropy_mask(&entropy, &batch.loss_mask.narrow(0, start, rows), objective.top_entropy_quantile)
        });
        for (part_start, logprobs) in parts {
            let pick = |t: &Tensor| t.narrow(0, part_start, part_rows);
            let part_mask = pick(batch.loss_mask);
            let part_high_entropy = high_entropy.as_ref().map(|mask| mask.narrow(0, part_start - start, part_rows));
            let masks = TokenMasks { loss: &part_mask, policy: part_high_entropy.as_ref() };
            let (old, reference, sampler) = (batch.old_logprobs.map(pick), batch.ref_logprobs.map(pick), batch.sampling_logprobs.map(pick));
            let part_logprobs = LossLogprobs {
                current: &logprobs.logprobs,
                old: old.as_ref(),
                reference: reference.as_ref(),
                sampler: sampler.as_ref(),
                replayed: logprobs.replayed.as_ref(),
                old_is_sampler: batch.old_is_sampler,
            };
            let part_weights = pick(&weights);
            let mut terms = sampled_loss(part_logprobs, &pick(batch.advantages), masks, &part_weights, objective);
            if let Some(coef) = batch.entropy_coef {
                let trained = grpo::trained_tokens(&part_weights, masks.policy);
                let bonus_weights = match &high_entropy {
                    Some(high_entropy) => grpo::bonus_weights(&trained, &(grpo::trained_tokens(&weights.narrow(0, start, rows), Some(high_entropy)) * passes.micro_batches as f64)),
                    None => grpo::bonus_weights(&trained, &step_trained),
                };
                add_entropy_bonus(&mut terms, &logprobs.entropy, &bonus_weights, &trained, coef);
            }
            before_backward(&logprobs, masks);
            terms.loss.backward();
            after_backward();
            // The chunk's terms outlive its pass (for the step's statistics): without their
            // graph, or every micro-batch's graph stays alive to the step's end (a 544-row
            // SmolLM2 step in 32 micro-batches peaked at 22.6 GB, 7.3 GB estimated).
            terms.loss = terms.loss.detach();
            terms.per_token_kl = terms.per_token_kl.map(|kl| kl.detach());
            chunks.push((logprobs.detach(), part_high_entropy, terms));
        }
    }
    if chunks.len() == 1 {
        let (logprobs, _, mut terms) = chunks.pop().expect("one chunk");
        terms.loss = terms.loss.detach();
        return BackwardPass { logprobs, terms };
    }
    // The statistics of the whole batch from the chunks' detached values (element-wise only).
    let cat = |part: &dyn Fn(&(TokenLogprobs, Option<Tensor>, LossTerms)) -> Tensor| Tensor::cat(&chunks.iter().map(part).collect::<Vec<_>>(), 0);
    let replayed = chunks[0].0.replayed.is_some().then(|| cat(&|c| c.0.replayed.as_ref().expect("every chunk replayed").shallow_clone()));
    let logprobs = TokenLogprobs { logprobs: cat(&|c| c.0.logprobs.shallow_clone()), entropy: cat(&|c| c.0.entropy.shallow_clone()), replayed };
    let high_entropy = (objective.top_entropy_quantile < 1.0).then(|| cat(&|c| c.1.as_ref().expect("a mask per chunk").shallow_clone()));
    let masks = TokenMasks { loss: batch.loss_mask, policy: high_entropy.as_ref() };
    let mut terms = sampled_loss(batch.logprobs(&logprobs), batch.advantages, masks, &weights, objective);
    let sum = |part: &dyn Fn(&LossTerms) -> Tensor| Tensor::stack(&chunks.iter().map(|c| part(&c.2).detach()).collect::<Vec<_>>(), 0).sum(Kind::Float);
    terms.loss = sum(&|t| t.loss.shallow_clone());
    if batch.entropy_coef.is_some() {
        let policy_loss = sum(&|t| t.entropy_bonus.as_ref().expect("each chunk's bonus").policy_loss.shallow_clone());
        let mean_entropy = grpo::mean_entropy(&logprobs.entropy, &grpo::trained_tokens(&weights, masks.policy));
        terms.entropy_bonus = Some(EntropyBonus { policy_loss, mean_entropy });
    }
    BackwardPass { logprobs, terms }
}

/// TRL's entropy bonus added to a pass's loss: `loss - coef * Σ entropy * bonus_weights`, with
/// the loss before it and the mean entropy of the pass's `trained` tokens kept for the metrics.
fn add_entropy_bonus(terms: &mut LossTerms, entropy: &Tensor, bonus_weights: &Tensor, trained: &Tensor, coef: f64) {
    let policy_loss = terms.loss.detach();
    if coef != 0.0 {
        terms.loss = &terms.loss - (entropy * bonus_weights).sum(Kind::Float) * coef;
    }
    terms.entropy_bonus = Some(EntropyBonus { policy_loss, mean_entropy: grpo::mean_entropy(entropy, trained) });
}

/// [`backward_micro_batches`] with one micro-batch for several runs at once: one forward pass of
/// their `models` stacked on a leading axis ([`Llama::stacked`]; in the order of `batches`),
/// each run's loss with its own settings and temperature, and one backward pass of their sum,
/// which leaves in each run's parameters the gradient of its own loss (the runs share no
/// parameter). The batches have the same number of rows.
pub fn backward_stacked(models: &[&Llama], batches: &[LossBatch], temperatures: &[f64], objectives: &[&Objective]) -> Vec<BackwardPass> {
    let ctl: Vec<&[AdapterCtl]> = batches.iter().map(|b| b.ctl).collect();
    assert!(ctl.iter().flat_map(|c| c.iter()).all(|c| c.natural.is_none()), "a run with split_moment's natural share trains alone (its own backward passes)");
    let seqs: Vec<Sequences> = batches.iter().map(|b| b.seqs).collect();
    let entropy_gradients: Vec<bool> = batches.iter().map(|b| b.entropy_coef.is_some_and(|coef| coef != 0.0)).collect();
    let logprobs = stacked_completion_logprobs(&Llama::stacked(models), &seqs, temperatures, &entropy_gradients, &stacked_controls(&ctl, &seqs));
    let terms: Vec<LossTerms> = batches.iter().zip(objectives).zip(&logprobs).map(|((batch, objective), logprobs)| whole_batch_terms(batch, objective, logprobs)).collect();
    let total = terms.iter().map(|t| t.loss.shallow_clone()).reduce(|a, b| a + b).expect("at least one run");
    total.backward();
    logprobs
        .into_iter()
        .zip(terms)
        .map(|(logprobs, mut terms)| {
            terms.loss = terms.loss.detach();
            BackwardPass { logprobs: logprobs.detach(), terms }
        })
        .collect()
}

/// [`super::frozen_logprobs`] of several runs' batches in one forward pass of their `models` stacked
/// (no gradient; each run with its own adapter controls `ctl` and temperature).
pub fn stacked_frozen_logprobs(models: &[&Llama], ctl: &[&[AdapterCtl]], runs: &[Sequences], temperatures: &[f64]) -> Vec<Tensor> {
    tch::no_grad(|| {
        let stacked = Llama::stacked(models);
        // The frozen policies' log-probabilities are never compared with the sampler's.
        let runs: Vec<Sequences> = runs.iter().map(|seqs| Sequences { kept: None, ..*seqs }).collect();
        stacked_completion_logprobs(&stacked, &runs, temperatures, &vec![false; runs.len()], &stacked_controls(ctl, &runs)).into_iter().map(|t| t.logprobs).collect()
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
fn whole_batch_terms(batch: &LossBatch, objective: &Objective, logprobs: &TokenLogprobs) -> LossTerms {
    let weights = token_weights(&batch.loss_mask.to_kind(Kind::Float), batch.classes, objective.aggregation, 1);
    let high_entropy = (objective.top_entropy_quantile < 1.0).then(|| high_entropy_mask(&logprobs.entropy, batch.loss_mask, objective.top_entropy_quantile));
    let masks = TokenMasks { loss: batch.loss_mask, policy: high_entropy.as_ref() };
    let mut terms = sampled_loss(batch.logprobs(logprobs), batch.advantages, masks, &weights, objective);
    if let Some(coef) = batch.entropy_coef {
        let trained = grpo::trained_tokens(&weights, masks.policy);
        add_entropy_bonus(&mut terms, &logprobs.entropy, &grpo::bonus_weights(&trained, &trained), &trained, coef);
    }
    terms
}

/// The differentiable log-probabilities of rows `start..start + rows` of `batch`.
fn rows_logprobs(model: &Llama, batch: &LossBatch, temperature: f64, start: i64, rows: i64) -> TokenLogprobs {
    let pick = |t: &Tensor| t.narrow(0, start, rows);
    let (prompt_ids, prompt_mask, completion_ids, completion_mask) = (pick(batch.seqs.prompt_ids), pick(batch.seqs.prompt_mask), pick(batch.seqs.completion_ids), pick(batch.seqs.completion_mask));
    let kept = batch.seqs.kept.map(pick);
    let seqs = Sequences { prompt_ids: &prompt_ids, prompt_mask: &prompt_mask, completion_ids: &completion_ids, completion_mask: &completion_mask, kept: kept.as_ref() };
    let ctl: Vec<AdapterCtl> = batch.ctl.iter().map(|c| c.rows(start, rows)).collect();
    match batch.entropy_coef.is_some_and(|coef| coef != 0.0) {
        true => completion_logprobs_and_entropy(model, seqs, temperature, &ctl),
        false => completion_logprobs(model, seqs, temperature, &ctl),
    }
}

/// The sketches `[n, D]` of each sequence's gradient of its total log-probability over its
/// `counted` completion tokens (`[n, completion_len]` 0/1: the model's tokens,
/// `Generation::model_tokens`, so an episode's observation tokens are attended to but not
/// summed) with respect to `params` (`project` maps one gradient, a tensor per parameter, an
/// undefined one for a zero gradient, to its row): one forward and one backward pass per sequence, alone, with
/// `ctl`'s adapter scales for its row and every adapter learning. The gradients go into fresh
/// tensors; the parameters' `.grad` are not touched (`crate::train::fisher`).
pub fn sequence_gradient_sketches(model: &Llama, seqs: Sequences, counted: &Tensor, temperature: f64, ctl: &[AdapterCtl], params: &[Tensor], project: &dyn Fn(&[Tensor]) -> Tensor) -> Tensor {
    assert_eq!(counted.size(), seqs.completion_mask.size(), "one counted flag per completion position");
    let rows = seqs.completion_ids.size()[0];
    let mut sketches = Vec::with_capacity(rows as usize);
    for i in 0..rows {
        let row = |t: &Tensor| t.narrow(0, i, 1);
        let (prompt_ids, prompt_mask, completion_ids, completion_mask) = (row(seqs.prompt_ids), row(seqs.prompt_mask), row(seqs.completion_ids), row(seqs.completion_mask));
        let one = Sequences { prompt_ids: &prompt_ids, prompt_mask: &prompt_mask, completion_ids: &completion_ids, completion_mask: &completion_mask, kept: None };
        let learning: Vec<AdapterCtl> = ctl.iter().map(|c| learning_row(c, i)).collect();
        let logprobs = completion_logprobs(model, one, temperature, &learning).logprobs;
        let total = (logprobs * row(counted).to_kind(Kind::Float)).sum(Kind::Float);
        let gradient = if total.requires_grad() { Tensor::run_backward(&[&total], params, false, false) } else { params.iter().map(|_| Tensor::new()).collect() };
        sketches.push(project(&gradient));
    }
    Tensor::stack(&sketches, 0)
}

/// Row `i` of `ctl` with the adapter learning from it (the policy's gradient, not the routed one).
fn learning_row(ctl: &AdapterCtl, i: i64) -> AdapterCtl {
    let scale = match &ctl.scale {
        RowScale::All(s) => RowScale::All(*s),
        RowScale::PerRow(t) => RowScale::PerRow(t.narrow(0, i, 1)),
    };
    AdapterCtl::new(scale, RowLearn::All)
}
