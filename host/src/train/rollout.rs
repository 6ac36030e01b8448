//! The rollout: the batch that one or more optimizer steps train on. Prompts → sample (the
//! fused decoder, every adapter on) → score (reward plugins, detector, protocol knobs, ground
//! truth) → the intervention (penalty, filter, placebo: `crate::intervention`) → group
//! advantages → routing plan → reference and old log-probabilities.
//!
//! Architecture invariant: everything random here derives from `(seed, purpose, step)`
//! (`rng::derive`), so a resumed run draws the same rollout as the uninterrupted one.

use std::time::Instant;

use anyhow::Result;
use tch::{Kind, Tensor};

use super::Trainer;
use super::live::BatchRecord;
use super::metrics::RolloutMetrics;
use crate::{engine, grpo};
use crate::intervention::{self, Intervention};
use crate::engine::Done;
use crate::model::generate::Generation;
use crate::model::linear::AdapterCtl;
use crate::reward::ScoredBatch;
use crate::rng::{self, SplitMix64};
use crate::adapters::FORGET;
use crate::routing::{self, GroupedRows, Labels, RenormalizationMode, RoutePlan, RoutingMode, RowWeights};

/// One call of the policy's sampler: `prompt_ids` at adapter `scales`, seeded by `seed`.
pub(super) struct SampleRequest {
    pub scales: Vec<f64>,
    pub prompt_ids: Vec<Vec<u32>>,
    pub seed: u64,
}

/// A generated, scored batch, kept for `num_iterations * num_substeps` optimizer steps.
pub(super) struct Rollout {
    pub generation: Generation,
    /// `[batch, completion_len]` 1 on the completion tokens that train: the completion mask,
    /// without truncated completions with `mask_truncated_completions`.
    pub loss_mask: Tensor,
    pub advantages: Tensor,
    pub plan: RoutePlan,
    /// With `split_moment`: the same batch with every adapter learning from every row, whose
    /// gradient feeds Adam's second moment.
    pub natural_plan: Option<RoutePlan>,
    pub ref_logprobs: Option<Tensor>,
    /// The ratio's denominator: TRL's old policy (when the batch serves more than one update),
    /// or with a tinker `loss_fn` the sampler's log-probabilities.
    pub old_logprobs: Option<Tensor>,
    /// Logged with every step that uses the rollout.
    pub metrics: RolloutMetrics,
    pub first_sample: (String, String),
    /// Per-sample tensors kept for `dump_batches` (rewards per component, labels).
    pub dump: Vec<(String, Tensor)>,
    /// The monitor's flags (routing labels before an intervention), which the absorption
    /// diagnostics split gradients by.
    pub flagged: Vec<bool>,
}

impl Trainer {
    /// Generates, scores and prepares the rollout of optimizer step `step` (and the next
    /// `num_iterations * num_substeps - 1` steps).
    pub(super) fn rollout(&mut self, step: usize) -> Result<Rollout> {
        let drawn = self.draw_batch(step)?;
        let (generation, samples, scored) = (drawn.generation, drawn.samples, drawn.scored);
        let device = self.model.device;
        let flagged = scored.flags();
        let trained_rewards = self.trained_rewards(&scored);
        let rewards = Tensor::from_slice(&trained_rewards).to_kind(Kind::Float).to(device);
        let kept = routing::row_mask(&flagged.iter().map(|f| !f).collect::<Vec<_>>(), device);
        let (advantages, frac_zero_std) = self.advantages(&rewards, &kept);
        let routed = match self.cfg.intervention {
            Intervention::Placebo => intervention::placebo_labels(&flagged, self.cfg.seed, step),
            _ => flagged.clone(),
        };
        let coherence_rows = self.cfg.coherence_rows(step);
        let coherence: Vec<bool> = (0..samples.len()).map(|i| i >= samples.len() - coherence_rows).collect();
        let grouped = GroupedRows { rewards: &trained_rewards, is_rh: &routed, coherence: &coherence, group_size: self.cfg.num_generations };
        let verified = self.cfg.rh_detector_verifies_retain_samples.then(|| self.verified(&scored, &coherence, step));
        let (advantages, dropped) = self.routed_advantages(advantages, &grouped, verified.as_deref());
        let ablated = self.draw_ablated(&routed, &coherence, step);
        let labels = Labels { is_rh: routed, ablated, coherence, dropped };
        let plan = routing::plan(&self.adapters, self.cfg.row_weights()?, &self.loss_class_labels(&labels), device);
        let natural_plan = self.cfg.split_moment.then(|| routing::plan(&self.adapters, RowWeights::gates(RoutingMode::None), &labels, device));
        let component_names: Vec<String> = self.rewards.components().iter().map(|c| c.name.clone()).collect();
        let names = component_names.iter().map(String::as_str).collect();
        let record = BatchRecord {
            step: step + 1,
            samples: &samples,
            scored: &scored,
            trained_rewards: &trained_rewards,
            component_names: names,
            advantages: &advantages,
            routed: &labels.is_rh,
            ablated: &labels.ablated,
        };
        self.live.batch(record)?;

        let (ref_logprobs, mut reference_seconds) = match self.needs_reference() {
            true => {
                let done = self.reference_logprobs(&generation)?;
                (Some(done.value), done.seconds)
            }
            false => (None, 0.0),
        };
        let old_start = Instant::now();
        // Batches sampled ahead take the ratio to the sampler too: the policy that drew them.
        let old_logprobs = match self.loss.ratio_to == grpo::RatioTo::Sampler || self.cfg.samples_ahead() {
            true => Some(generation.sampling_logprobs.shallow_clone()),
            false => (self.cfg.steps_per_rollout() > 1).then(|| engine::frozen_logprobs(&self.model, (&generation).into(), self.cfg.temperature, &plan.ctl)),
        };
        reference_seconds += old_start.elapsed().as_secs_f64();

        let mut metrics = rollout_metrics(&scored, &trained_rewards, &component_names, &generation, frac_zero_std, &labels);
        (metrics.generate_seconds, metrics.score_seconds, metrics.reference_seconds) = (drawn.generate_seconds, drawn.score_seconds, reference_seconds);
        metrics.dynamic_sampling = drawn.dynamic_sampling;
        metrics.off_policy = drawn.off_policy;
        metrics.frac_verified = verified.filter(|_| coherence_rows > 0).map(|verified| verified.iter().filter(|&&v| v).count() as f64 / coherence_rows as f64);
        let first_sample = (samples[0].prompt.clone(), samples[0].completion.clone());
        let dump = match self.cfg.dump_batches {
            Some(_) => rollout_tensors(&scored, &component_names, &rewards, &labels),
            None => Vec::new(),
        };
        // Dropped rows leave the loss (and its token statistics) entirely.
        let dropped = routing::row_mask(&labels.dropped.iter().map(|d| !d).collect::<Vec<_>>(), device).unsqueeze(1);
        let mut loss_mask = grpo::loss_mask(&generation, self.cfg.mask_truncated_completions) * dropped;
        if self.cfg.intervention == Intervention::Filter {
            loss_mask = intervention::filtered_loss_mask(&loss_mask, &kept);
        }
        Ok(Rollout { generation, loss_mask, advantages, plan, natural_plan, ref_logprobs, old_logprobs, metrics, first_sample, dump, flagged })
    }

    /// The labels the loss classes are planned from. Flagged rows are a class of their own only
    /// when something treats them apart (routing, `intervention: filter`); otherwise they train
    /// like any other row, in one class with them, so dapo, bnpo and cispo normalise over the
    /// whole batch as TRL's loss does (and the original's single backward pass without
    /// routing). The adapter controls are the same either way.
    fn loss_class_labels(&self, labels: &Labels) -> Labels {
        let treated_apart = self.cfg.routing_mode != RoutingMode::None || self.cfg.intervention == Intervention::Filter;
        match treated_apart {
            true => labels.clone(),
            false => Labels { is_rh: vec![false; labels.is_rh.len()], ..labels.clone() },
        }
    }

    /// Group advantages; with `intervention: filter`, over the `kept` rows only (see
    /// [`crate::intervention`]).
    fn advantages(&self, rewards: &Tensor, kept: &Tensor) -> (Tensor, f64) {
        let (group, scale, eps) = (self.cfg.num_generations, self.cfg.scale_rewards, crate::defaults::ADVANTAGE_STD_EPSILON);
        match self.cfg.intervention {
            Intervention::Filter => intervention::kept_group_advantages(rewards, kept, group, scale, eps),
            _ => grpo::group_advantages(rewards, group, scale, eps),
        }
    }

    /// Each of the step's prompts, repeated `num_generations` times (one group each). With the
    /// retain verifier, the coherence groups' prompts come from its own stream (the hackable and
    /// detectable prompts); the routing groups keep the prompts they have without it.
    pub(super) fn step_prompts(&mut self, step: usize) -> Vec<crate::reward::Prompt> {
        let batch_index = step / self.cfg.steps_per_rollout();
        let per_step = self.cfg.rollout_rows() / self.cfg.num_generations;
        let verified_groups = match self.verifier_prompts.is_some() {
            true => self.cfg.coherence_rows(step) / self.cfg.num_generations,
            false => 0,
        };
        let mut prompt_texts = Vec::with_capacity(self.cfg.rollout_rows());
        for i in 0..per_step {
            let text = match (i + verified_groups >= per_step, self.verifier_prompts.as_mut()) {
                (true, Some(stream)) => stream.at(batch_index * verified_groups + i + verified_groups - per_step),
                _ => self.prompts.at(batch_index * per_step + i),
            };
            prompt_texts.extend(std::iter::repeat_n(text, self.cfg.num_generations));
        }
        prompt_texts
    }

    /// Whether the loss has a KL term, whose reference log-probabilities a rollout holds (as
    /// TRL, no reference pass with beta = 0).
    pub(super) fn needs_reference(&self) -> bool {
        self.loss.kl.is_some()
    }

    /// Log-probabilities of the completions under the reference policy: the frozen starting
    /// model (full fine-tuning), or the model with its adapters off (the engine picks the native
    /// scorer where it serves, or stacks the pass with other runs').
    fn reference_logprobs(&mut self, generation: &Generation) -> Result<Done<Tensor>> {
        let off: Vec<AdapterCtl> = self.adapters.slots.iter().map(|_| AdapterCtl::off()).collect();
        let (model, ctl) = match &self.reference {
            Some(reference) => (reference, &[][..]),
            None => (&self.model, &off[..]),
        };
        let done = self.seat.reference(engine::ReferenceJob::new(model, ctl, generation, self.cfg.temperature))?;
        if done.runs > 1 {
            self.announce("reference", || format!("reference log-probabilities stacked with {} packed runs (one batched forward pass)", done.runs));
        }
        Ok(done)
    }

    /// Samples the step's completions with every adapter on, the last `coherence_rows` (if
    /// any) with the forget adapter off (the original samples coherence rows at the deployed
    /// retain-only scales); returns the generation and this run's share of the sampling time.
    pub(super) fn sample(&mut self, prompt_ids: &[Vec<u32>], coherence_rows: usize, step: usize, run_seed: u64) -> Result<(Generation, f64)> {
        let mut seconds = 0.0;
        let mut parts = Vec::new();
        for request in self.sample_requests(prompt_ids, coherence_rows, step, run_seed) {
            let done = self.sample_at(&request)?;
            seconds += done.seconds;
            parts.push(done.value);
        }
        let eos = self.model.config.eos_token_id as i64;
        let mut parts = parts.into_iter();
        let first = parts.next().expect("at least the routed rows are sampled");
        Ok((parts.fold(first, |joined, part| joined.concat(part, eos)), seconds))
    }

    /// The sampler calls of [`Trainer::sample`]: the routed rows at scales 1, then the
    /// coherence rows (if any) with the forget adapter off, each with its own seed.
    pub(super) fn sample_requests(&self, prompt_ids: &[Vec<u32>], coherence_rows: usize, step: usize, run_seed: u64) -> Vec<SampleRequest> {
        let routed_rows = prompt_ids.len() - coherence_rows;
        let seed = |purpose| rng::derive(run_seed, purpose, step as u64);
        let mut scales = vec![1.0; self.adapters.slots.len()];
        let mut requests = vec![SampleRequest { scales: scales.clone(), prompt_ids: prompt_ids[..routed_rows].to_vec(), seed: seed("sample") }];
        if coherence_rows > 0 {
            scales[FORGET] = 0.0;
            requests.push(SampleRequest { scales, prompt_ids: prompt_ids[routed_rows..].to_vec(), seed: seed("sample_coherence") });
        }
        requests
    }

    /// Samples from the policy at the request's adapter scales.
    fn sample_at(&mut self, request: &SampleRequest) -> Result<Done<Generation>> {
        let done = self.seat.sample(&self.model, &request.scales, &request.prompt_ids, &self.sampling, request.seed)?;
        if done.runs > 1 {
            self.announce("sample", || format!("sampling stacked with {} packed runs (one batched decode; the same tokens as alone)", done.runs));
        }
        Ok(done)
    }

    /// The group advantages with coherence groups handled per `coherence_rh_mode`, and routing
    /// groups per `renormalization_mode` (the same tensor when neither applies), and the rows
    /// to drop from the loss. `verified` (the retain verifier's, one per row) replaces
    /// `coherence_rh_mode` on coherence groups.
    fn routed_advantages(&self, group_advantages: Tensor, batch: &GroupedRows, verified: Option<&[bool]>) -> (Tensor, Vec<bool>) {
        let n = batch.rewards.len();
        let coherence = batch.coherence.iter().any(|&c| c);
        let mode = self.cfg.renormalization_mode;
        if mode == RenormalizationMode::Off && !coherence {
            return (group_advantages, vec![false; n]);
        }
        let eps = crate::defaults::ADVANTAGE_STD_EPSILON;
        let group: Vec<f64> = Vec::try_from(group_advantages.to_kind(Kind::Double)).expect("advantages are a 1-D tensor");
        let (advantages, dropped) = match verified {
            Some(verified) => routing::verified_coherence_advantages(batch, verified, &group, eps),
            None => routing::coherence_advantages(self.cfg.coherence_rh_mode, self.cfg.coherence_rh_penalty, batch, &group, eps),
        };
        let advantages = routing::renormalized_advantages(mode, batch, &advantages, eps);
        (Tensor::from_slice(&advantages).to_kind(Kind::Float).to(group_advantages.device()), dropped)
    }

    /// The retain verifier's verdict on each row: a coherence row whose prompt is detectable
    /// (and eligible), that the monitor did not flag before recall and the false-positive rate
    /// (its own output), and whose coin of probability `rh_detector_retain_recall` succeeds (one
    /// draw per row, seeded by `(seed, "retain-verifier", step)`). Routing rows are never verified.
    fn verified(&self, scored: &ScoredBatch, coherence: &[bool], step: usize) -> Vec<bool> {
        let raw = scored.detector_raw.as_ref().expect("the retain verifier runs with a monitor (checked with the configuration)");
        routing::verified_rows(coherence, &scored.monitored, raw, self.cfg.rh_detector_retain_recall, rng::derive(self.cfg.seed, "retain-verifier", step as u64))
    }

    /// Clean routing rows trained with the forget adapter off, each with probability
    /// `ablated_frac` (one draw per row, coherence rows included, so the draws of routing rows
    /// do not depend on the coherence rows).
    fn draw_ablated(&self, is_rh: &[bool], coherence: &[bool], step: usize) -> Vec<bool> {
        let mut rng = SplitMix64::new(rng::derive(self.cfg.seed, "ablate", step as u64));
        is_rh.iter().zip(coherence).map(|(&rh, &coh)| { let draw = rng.next_f64(); !rh && !coh && draw < self.cfg.ablated_frac }).collect()
    }
}

/// Reward, length and routing statistics of a scored batch (timings are filled in by the
/// caller). `rewards` are those the advantages were computed from (after a penalty).
fn rollout_metrics(scored: &ScoredBatch, rewards: &[f64], component_names: &[String], generation: &Generation, frac_zero_std: f64, labels: &Labels) -> RolloutMetrics {
    let n = rewards.len() as f64;
    let reward = crate::stats::mean(rewards);
    let reward_std = (rewards.iter().map(|r| (r - reward).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    let components = component_names.iter().zip(&scored.components).map(|(name, scores)| (name.clone(), crate::stats::mean(scores))).collect();
    let lengths: Vec<f64> = generation.rows.iter().map(|r| (r.ids.len() + usize::from(r.ended_with_eos)) as f64).collect();
    let truncated = generation.rows.iter().filter(|r| !r.ended_with_eos).count() as f64;
    let frac = |flags: &[bool]| flags.iter().filter(|&&f| f).count() as f64 / n;
    RolloutMetrics {
        reward,
        reward_std,
        components,
        env_metrics: scored.metric_means(),
        frac_reward_zero_std: frac_zero_std,
        mean_length: crate::stats::mean(&lengths),
        max_length: lengths.iter().copied().fold(0.0, f64::max),
        clipped_ratio: truncated / n,
        hack_freq: scored.hack_freq(),
        frac_rh: frac(&labels.is_rh),
        frac_ablated: frac(&labels.ablated),
        frac_eligible: frac(&scored.eligible),
        frac_hackable: frac(&scored.hackable),
        monitor: scored.monitor(),
        dynamic_sampling: None,
        off_policy: None,
        frac_verified: None,
        generate_seconds: 0.0,
        score_seconds: 0.0,
        reference_seconds: 0.0,
    }
}

/// The rollout's per-sample tensors that the generation does not hold: rewards (combined and
/// per component) and the routing labels.
fn rollout_tensors(scored: &ScoredBatch, component_names: &[String], rewards: &Tensor, labels: &Labels) -> Vec<(String, Tensor)> {
    let flags = |v: &[bool]| Tensor::from_slice(&v.iter().map(|&b| b as i64).collect::<Vec<_>>());
    let mut out = vec![
        ("rewards".to_string(), rewards.shallow_clone()),
        ("is_rh".to_string(), flags(&labels.is_rh)),
        ("ablated".to_string(), flags(&labels.ablated)),
        ("coherence".to_string(), flags(&labels.coherence)),
        ("dropped".to_string(), flags(&labels.dropped)),
        ("eligible".to_string(), flags(&scored.eligible)),
    ];
    for (name, scores) in component_names.iter().zip(&scored.components) {
        out.push((format!("rewards/{name}"), Tensor::from_slice(scores)));
    }
    out
}
