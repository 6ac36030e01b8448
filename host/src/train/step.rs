//! One optimizer step, as a pipeline of values: the rollout when the step starts one (the
//! draw's scored batch → the recipe's prepared batch → reference and old log-probabilities),
//! the step's mini-batch of it, the backward pass (through the engine, or the run's own passes
//! for micro-batches and probes), clipping, AdamW with the linear schedule, then the step's
//! metrics line, log lines and live views.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use tch::{Kind, Tensor};

use super::Trainer;
use super::metrics::{self, GradientNoise, StepMetrics, key};
use super::draw::Drawing;
use super::live::BatchRecord;
use super::recipe::Prepared;
use super::rollout::{Rollout, rollout_metrics, rollout_tensors};
use crate::model::generate::Generation;
use crate::model::linear::{AdapterCtl, NaturalLeaves};
use crate::routing::RoutePlan;
use crate::{engine, grpo, probes, stats};
use crate::probes::NoiseScale;

/// What a step leaves for the next.
#[derive(Default)]
pub(super) struct StepState {
    /// The batch the steps of a rollout train on (made by its first step).
    pub rollout: Option<Rollout>,
    /// Prompt and completion tokens sampled so far (TRL's `num_tokens`).
    pub num_tokens: usize,
    /// The running average of the gradient noise scale (`gradient_noise_scale`), restored from
    /// the last metrics line on resume.
    pub noise_scale_average: Option<NoiseScale>,
    /// TRL's entropy bonus's coefficient between steps (with the bonus only), restored from the
    /// last metrics line on resume.
    pub entropy: Option<grpo::EntropyController>,
}

/// A step prepared up to its backward pass: its rollout is the trainer's, its rows here, the
/// gradients zeroed.
pub(super) struct PendingStep {
    step: usize,
    started: Instant,
    new_rollout: bool,
    mini: MiniBatch,
    /// The entropy bonus's coefficient this step applies (with the bonus only).
    entropy_coef: Option<f64>,
}

/// What a step's backward pass left beside the gradients in the parameters.
pub(super) struct Trained {
    pass: engine::BackwardPass,
    /// With `split_moment`: the natural plan's gradients, taken out of the parameters.
    natural_grads: Option<Vec<Tensor>>,
    absorption: Vec<(String, f64)>,
    gradient_noise: Option<GradientNoise>,
    /// The backward pass's share of the wall-clock time (a stacked pass's, divided by its runs).
    seconds: f64,
}

impl Trainer {
    /// Optimizer step `step` (0-based); returns its metrics line.
    pub(super) fn step(&mut self, step: usize) -> Result<serde_json::Value> {
        let pending = self.begin_step(step)?;
        let trained = self.backward(&pending)?;
        self.finish_step(pending, trained)
    }

    /// The step up to its backward pass: the rollout (sampled, scored and planned when the step
    /// starts one) and the mini-batch's rows.
    fn begin_step(&mut self, step: usize) -> Result<PendingStep> {
        let started = Instant::now();
        let per_rollout = self.keys.steps_per_rollout;
        let new_rollout = step % per_rollout == 0;
        if new_rollout {
            self.state.rollout = Some(self.rollout(step)?);
        }
        // Only a run resumed from its final checkpoint (saved at max_steps) can start inside a
        // rollout, whose batch no checkpoint keeps.
        let rollout = self.state.rollout.as_ref().with_context(|| {
            format!("step {} continues a rollout of num_iterations * num_substeps = {per_rollout} steps that the checkpoint does not hold: extend runs whose max_steps is a multiple of {per_rollout}", step + 1)
        })?;
        // Each pass over the rollout goes through its mini-batches in order.
        let substeps = self.keys.substeps_per_rollout;
        let mini = MiniBatch::of(rollout, step % substeps, substeps);
        self.policy.zero_grad();
        let entropy_coef = self.state.entropy.as_ref().map(grpo::EntropyController::applied);
        Ok(PendingStep { step, started, new_rollout, mini, entropy_coef })
    }

    /// Generates, scores and prepares the rollout of optimizer step `step` (and the next
    /// `num_iterations * num_substeps - 1` steps).
    pub(super) fn rollout(&mut self, step: usize) -> Result<Rollout> {
        // The evaluations' samples since the last rollout are not this batch's.
        self.policy.begin_rollout();
        let mut with = Drawing { policy: &mut self.policy, rewards: &mut self.rewards, recipe: &self.recipe, log: &mut self.files.log };
        let drawn = self.draw.batch(step, &mut with)?;
        let (generation, samples, scored) = (drawn.generation, drawn.samples, drawn.scored);
        let replays = self.policy.replays_kept_sets();
        ensure!(
            generation.kept.is_some() == replays,
            "step {}: the batch was sampled {} kept sets, but this run's sampling replay {} them (a batch replayed from the dumps of a run with another sampling_replay?)",
            step + 1,
            if generation.kept.is_some() { "with" } else { "without" },
            if replays { "needs" } else { "takes none of" }
        );
        let prepared = self.recipe.prepare(&scored, &generation, step, self.keys.seed());
        let component_names: Vec<String> = self.rewards.components().iter().map(|c| c.name.clone()).collect();
        let record = BatchRecord {
            step: step + 1,
            samples: &samples,
            scored: &scored,
            trained_rewards: &prepared.rewards,
            component_names: component_names.iter().map(String::as_str).collect(),
            advantages: &prepared.advantages,
            routed: &prepared.labels.is_rh,
            ablated: &prepared.labels.ablated,
        };
        self.files.live.batch(record)?;

        let (ref_logprobs, mut reference_seconds) = match self.policy.needs_reference() {
            true => {
                let done = self.policy.reference_logprobs(&generation, &mut self.files.log)?;
                (Some(done.value), done.seconds)
            }
            false => (None, 0.0),
        };
        let old_start = Instant::now();
        // Batches sampled ahead or replayed take the ratio to the sampler too: the policy that
        // drew them.
        let old_is_sampler = self.policy.ratio_to_sampler() || self.keys.samples_ahead || self.keys.replays;
        let old_logprobs = match old_is_sampler {
            true => Some(generation.sampling_logprobs.shallow_clone()),
            false if self.keys.steps_per_rollout > 1 => Some(self.policy.old_logprobs(&generation, &prepared.plan.ctl)?),
            false => None,
        };
        let old_logprobs_seconds = old_start.elapsed().as_secs_f64();
        reference_seconds += old_logprobs_seconds;

        let mut metrics = rollout_metrics(&scored, &prepared.rewards, &component_names, &generation, prepared.frac_zero_std, &prepared.labels, self.recipe.max_no_score_frac() > 0.0);
        (metrics.generate_seconds, metrics.score_seconds, metrics.reference_seconds) = (drawn.generate_seconds, drawn.score_seconds, reference_seconds);
        (metrics.sampler_setup_seconds, metrics.old_logprobs_seconds) = (self.policy.take_setup_seconds(), old_logprobs_seconds);
        metrics.dynamic_sampling = drawn.dynamic_sampling;
        metrics.off_policy = drawn.off_policy;
        metrics.frac_verified = prepared.frac_verified;
        metrics.intervention = prepared.intervention_metrics.clone();
        // Carried with the batch from its sampler call (none for a replayed batch: another run
        // sampled it).
        metrics.sampler_weights = drawn.weights_fingerprint;
        ensure!(metrics.sampler_weights.is_some() || self.keys.replays || self.keys.samples_ahead, "internal error: step {}'s batch was drawn without its weights' fingerprint", step + 1);
        let first_sample = (samples[0].prompt.clone(), samples[0].completion.clone());
        let dump = match self.keys.dump_batches() {
            Some(_) => rollout_tensors(&scored, &component_names, &prepared, self.recipe.max_no_score_frac() > 0.0),
            None => Vec::new(),
        };
        let loss_mask = self.recipe.loss_mask(&generation, &prepared);
        let Prepared { advantages, plan, flagged, .. } = prepared;
        Ok(Rollout { generation, loss_mask, advantages, plan, ref_logprobs, old_logprobs, old_is_sampler, metrics, first_sample, dump, flagged })
    }

    /// What needs this run's own backward passes rather than one pass over the whole batch
    /// (which the engine may stack with other runs'): micro-batches, or probes that read a
    /// pass's graph or gradients. `None` for one plain pass.
    fn own_passes(&self) -> Option<&'static str> {
        let keys = &self.keys;
        if keys.passes.micro_batches > 1 {
            Some("gradient_accumulation_steps > 1")
        } else if keys.gradient_noise_scale() {
            Some("gradient_noise_scale")
        } else if keys.split_moment() {
            Some("split_moment")
        } else if self.policy.is_dual() && keys.absorption_by_class() {
            Some("absorption_by_class")
        } else {
            None
        }
    }

    /// The step's backward passes: one plain pass through the engine, or the run's own.
    fn backward(&mut self, pending: &PendingStep) -> Result<Trained> {
        if let Some(reason) = self.own_passes() {
            if self.policy.stacks_passes_in_a_pack() {
                self.policy.announce(&mut self.files.log, "train", || format!("training each step alone, not stacked with the other packed runs: {reason} needs the run's own backward passes"));
            }
            return Ok(self.own_backward(pending));
        }
        let done = self.policy.train(pending.mini.loss_batch(&pending.mini.plan, pending.entropy_coef), &mut self.files.log)?;
        Ok(Trained { pass: done.value, natural_grads: None, absorption: Vec::new(), gradient_noise: None, seconds: done.seconds })
    }

    /// The step's own backward passes: the routed loss (and with `split_moment` the natural
    /// plan's first), with the probes that need the graph or each pass's gradients.
    fn own_backward(&mut self, pending: &PendingStep) -> Trained {
        let pass_start = Instant::now();
        let rollout = self.state.rollout.as_ref().expect("begin_step made the rollout");
        let mini = &pending.mini;
        // absorption_by_class's per-class gradient norms need the one pass's live graph over the
        // whole batch (the configuration refuses it with micro-batches and substeps).
        let mut absorption = Vec::new();
        let by_class = self.policy.is_dual() && self.keys.absorption_by_class();
        let mut before_backward = |logprobs: &engine::TokenLogprobs, masks: grpo::TokenMasks| {
            if by_class {
                absorption = self.policy.gradient_norms_by_class(rollout, logprobs, masks);
            }
        };
        let batch = mini.loss_batch(&mini.plan, pending.entropy_coef);
        let passes = self.keys.passes;
        let mut pass_gradients = self.keys.gradient_noise_scale().then(probes::PassGradients::default);
        let trained = self.policy.trained_tensors();
        let mut after_backward = || {
            if let Some(gradients) = pass_gradients.as_mut() {
                let accumulated = trained.iter().map(|t| crate::adapters::gradient_or_zeros(t.grad(), t)).collect();
                let last = gradients.pass_squared_norms.len() + 1 == passes.count();
                gradients.record(accumulated, last);
            }
        };
        let pass = self.policy.backward_passes(batch, passes, &mut before_backward, &mut after_backward);
        // split_moment: the routed gradient is in the parameters, the natural plan's difference
        // in its leaves (one pass for both).
        let natural_grads = mini.plan.natural.as_ref().map(|leaves| leaves.take_gradients(&trained));
        // The step's gradient noise scale from its passes' gradients (before clipping), and the
        // running average updated with it.
        let gradient_noise = pass_gradients.map(|gradients| {
            let step = NoiseScale::from_passes(&gradients, self.keys.mini_batch_size);
            let average = NoiseScale::averaged(self.state.noise_scale_average, step);
            self.state.noise_scale_average = Some(average);
            GradientNoise { step, average }
        });
        Trained { pass, natural_grads, absorption, gradient_noise, seconds: pass_start.elapsed().as_secs_f64() }
    }

    /// The rest of the step after its backward pass: clipping, AdamW with the schedule, the
    /// metrics line, log lines and live views; returns the metrics line.
    fn finish_step(&mut self, pending: PendingStep, trained: Trained) -> Result<serde_json::Value> {
        // Before the update: the kernel of the policy that computed the step's gradient.
        let fisher_kernel = self.keys.fisher.measure(&self.policy, &self.files.dir, pending.step, &pending.mini.generation, &pending.mini.plan.ctl)?;
        let optimizer_start = Instant::now();
        let PendingStep { step, started, new_rollout, mini, entropy_coef } = pending;
        let Trained { pass: engine::BackwardPass { logprobs, terms }, mut natural_grads, mut absorption, gradient_noise, seconds: pass_seconds } = trained;
        let rollout = self.state.rollout.as_ref().expect("begin_step made the rollout");
        let g = &rollout.generation;
        if let Some(dir) = self.keys.dump_batches() {
            super::dump::write_step(&dir, step + 1, rollout, &logprobs.logprobs, &terms.loss)?;
        }
        let loss = terms.loss.double_value(&[]);
        ensure!(loss.is_finite(), "the loss is {loss} at step {}", step + 1);
        let learning_rate = self.keys.lr.at(step);
        let grad_norm = self.policy.update(learning_rate, self.keys.max_grad_norm(), natural_grads.as_mut(), &mut absorption);
        let entropy_bonus = update_entropy_coef(self.state.entropy.as_mut(), entropy_coef, terms.entropy_bonus.as_ref())?;
        let optimizer_seconds = optimizer_start.elapsed().as_secs_f64();
        let train_seconds = pass_seconds + optimizer_seconds;
        let entropy = stats::masked_mean(&logprobs.entropy, &mini.loss_mask);
        // The same batch re-scored by the updated policy (one forward pass, no gradient).
        let entropy_change = self.keys.measure_entropy_change().then(|| {
            let seqs = engine::Sequences { kept: None, ..mini.seqs() };
            let after = self.policy.rescore(seqs, &mini.plan.ctl);
            stats::masked_mean(&after.entropy, &mini.loss_mask) - entropy
        });

        if new_rollout {
            self.state.num_tokens += (g.prompt_mask.sum(Kind::Int64).int64_value(&[]) + g.completion_mask.sum(Kind::Int64).int64_value(&[])) as usize;
        }
        // The loss's statistics over the loss tokens (as TRL), the sampler's over every sampled one.
        let mask = &mini.loss_mask;
        let done = step + 1;
        let measured = StepMetrics {
            step: done,
            loss,
            grad_norm,
            learning_rate,
            entropy,
            logprob_advantage_covariance: probes::logprob_advantage_covariance(&logprobs.logprobs, &mini.advantages, mask),
            entropy_change,
            entropy_quantiles: probes::entropy_quantiles(&logprobs.entropy, mask),
            loss_metrics: terms.logged(),
            entropy_bonus,
            aggregation_ess: metrics::AGGREGATIONS
                .iter()
                .map(|&loss_type| {
                    let aggregation = grpo::Aggregation::of(loss_type, self.keys.max_completion_length());
                    (loss_type, grpo::WeightEss::of(mask, aggregation, self.keys.passes.micro_batches))
                })
                .collect(),
            // Under sampling replay the learner's side is renormalised over the kept sets too.
            kl_sample_train: probes::sampler_learner_kl(&mini.generation.sampling_logprobs, logprobs.replayed.as_ref().unwrap_or(&logprobs.logprobs), &mini.generation.model_tokens()),
            sampling_replay: logprobs.replayed.as_ref().map(|replayed| grpo::ReplayStats::of(&logprobs.logprobs, replayed, &mini.generation.sampling_logprobs, mask)),
            gradient_noise,
            fisher_kernel,
            num_tokens: self.state.num_tokens,
            train_seconds,
            optimizer_seconds,
            step_seconds: started.elapsed().as_secs_f64(),
            absorption,
        };
        let line = metrics::line(&rollout.metrics, &measured);
        self.files.metrics.append(&line)?;
        self.files.log.progress(done as u64, format!("reward {:.3}", line[key::REWARD].as_f64().unwrap_or(f64::NAN)));
        let (prompt, completion) = &rollout.first_sample;
        let shown = done % self.keys.logging_steps() == 0 || done == 1;
        if shown {
            self.files.log.line(&format!("[Sample @ step {done}] {prompt} ||| {completion}"))?;
            self.files.log.line(&format!("[Step {done}] {}", metrics::summary_line(&line)))?;
        }
        self.files.live.step(&line, shown.then_some((prompt.as_str(), completion.as_str())))?;
        Ok(line)
    }
}

/// A routing plan's adapter controls and loss classes restricted to some rows.
struct PlanRows {
    ctl: Vec<AdapterCtl>,
    classes: Vec<Tensor>,
    /// With `split_moment`: the leaves of the natural plan's share ([`RoutePlan::natural`]).
    natural: Option<NaturalLeaves>,
}

impl PlanRows {
    fn of(plan: &RoutePlan, start: i64, rows: i64) -> Self {
        let ctl = plan.ctl.iter().map(|c| c.rows(start, rows)).collect();
        Self { ctl, classes: plan.classes.iter().map(|c| c.narrow(0, start, rows)).collect(), natural: plan.natural.clone() }
    }
}

/// The rows of a rollout that one optimizer step trains on: mini-batch `substep` of
/// `substeps` equal runs of consecutive rows (whole groups, as the configuration checks), as
/// views of the rollout's tensors. With one substep it is the whole rollout.
struct MiniBatch {
    generation: Generation,
    loss_mask: Tensor,
    advantages: Tensor,
    old_logprobs: Option<Tensor>,
    old_is_sampler: bool,
    ref_logprobs: Option<Tensor>,
    plan: PlanRows,
}

impl MiniBatch {
    fn of(rollout: &Rollout, substep: usize, substeps: usize) -> Self {
        let g = &rollout.generation;
        let batch = g.completion_ids.size()[0];
        let rows = batch / substeps as i64;
        assert_eq!(rows * substeps as i64, batch, "num_substeps divides the batch (checked by the configuration)");
        let start = substep as i64 * rows;
        let pick = |t: &Tensor| t.narrow(0, start, rows);
        Self {
            generation: g.narrow_rows(start as usize, rows as usize),
            loss_mask: pick(&rollout.loss_mask),
            advantages: pick(&rollout.advantages),
            old_logprobs: rollout.old_logprobs.as_ref().map(pick),
            old_is_sampler: rollout.old_is_sampler,
            ref_logprobs: rollout.ref_logprobs.as_ref().map(pick),
            plan: PlanRows::of(&rollout.plan, start, rows),
        }
    }

    fn seqs(&self) -> engine::Sequences<'_> {
        (&self.generation).into()
    }

    /// The loss's inputs for these rows under `plan` (its adapter controls and loss classes).
    fn loss_batch<'a>(&'a self, plan: &'a PlanRows, entropy_coef: Option<f64>) -> engine::LossBatch<'a> {
        engine::LossBatch {
            seqs: self.seqs(),
            ctl: &plan.ctl,
            old_logprobs: self.old_logprobs.as_ref(),
            ref_logprobs: self.ref_logprobs.as_ref(),
            sampling_logprobs: Some(&self.generation.sampling_logprobs),
            old_is_sampler: self.old_is_sampler,
            advantages: &self.advantages,
            loss_mask: &self.loss_mask,
            classes: &plan.classes,
            entropy_coef,
        }
    }
}

/// After the optimizer step: the entropy bonus's control reads the step's trained entropy (TRL
/// updates it at each optimizer step), and what the metrics line logs about the bonus.
fn update_entropy_coef(controller: Option<&mut grpo::EntropyController>, applied: Option<f64>, bonus: Option<&grpo::EntropyBonus>) -> Result<Option<metrics::EntropyBonusMetrics>> {
    let (Some(controller), Some(applied)) = (controller, applied) else {
        return Ok(None);
    };
    let bonus = bonus.context("internal error: a step with the entropy bonus returned none of its terms")?;
    controller.update(bonus.mean_entropy);
    Ok(Some(metrics::EntropyBonusMetrics { coef: controller.coef(), applied, policy_loss: bonus.policy_loss.double_value(&[]), trained_entropy: bonus.mean_entropy }))
}
