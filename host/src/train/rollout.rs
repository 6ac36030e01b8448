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
use super::draw::Drawing;
use super::live::BatchRecord;
use super::metrics::RolloutMetrics;
use crate::grpo;
use crate::model::generate::Generation;
use crate::reward::ScoredBatch;
use crate::routing::{Labels, RoutePlan};
use super::recipe::Prepared;

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
        let mut with = Drawing { policy: &mut self.policy, rewards: &mut self.rewards, recipe: &self.recipe, tokenizer: &self.tokenizer, log: &mut self.log };
        let drawn = self.draw.batch(step, &mut with)?;
        let (generation, samples, scored) = (drawn.generation, drawn.samples, drawn.scored);
        let prepared = self.recipe.prepare(&scored, step, self.cfg.seed);
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
        self.live.batch(record)?;

        let (ref_logprobs, mut reference_seconds) = match self.policy.needs_reference() {
            true => {
                let done = self.policy.reference_logprobs(&generation, &mut self.log)?;
                (Some(done.value), done.seconds)
            }
            false => (None, 0.0),
        };
        let old_start = Instant::now();
        // Batches sampled ahead take the ratio to the sampler too: the policy that drew them.
        let old_logprobs = match self.policy.objective.ratio_to == grpo::RatioTo::Sampler || self.cfg.samples_ahead() {
            true => Some(generation.sampling_logprobs.shallow_clone()),
            false if self.cfg.steps_per_rollout() > 1 => Some(self.policy.old_logprobs(&generation, &prepared.plan.ctl)?),
            false => None,
        };
        reference_seconds += old_start.elapsed().as_secs_f64();

        let mut metrics = rollout_metrics(&scored, &prepared.rewards, &component_names, &generation, prepared.frac_zero_std, &prepared.labels);
        (metrics.generate_seconds, metrics.score_seconds, metrics.reference_seconds) = (drawn.generate_seconds, drawn.score_seconds, reference_seconds);
        metrics.dynamic_sampling = drawn.dynamic_sampling;
        metrics.off_policy = drawn.off_policy;
        metrics.frac_verified = prepared.frac_verified;
        let first_sample = (samples[0].prompt.clone(), samples[0].completion.clone());
        let dump = match self.cfg.dump_batches {
            Some(_) => rollout_tensors(&scored, &component_names, &prepared),
            None => Vec::new(),
        };
        let loss_mask = self.recipe.loss_mask(&generation, &prepared);
        let Prepared { advantages, plan, natural_plan, flagged, .. } = prepared;
        Ok(Rollout { generation, loss_mask, advantages, plan, natural_plan, ref_logprobs, old_logprobs, metrics, first_sample, dump, flagged })
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
fn rollout_tensors(scored: &ScoredBatch, component_names: &[String], prepared: &Prepared) -> Vec<(String, Tensor)> {
    let (rewards, labels) = (Tensor::from_slice(&prepared.rewards).to_kind(Kind::Float), &prepared.labels);
    let flags = |v: &[bool]| Tensor::from_slice(&v.iter().map(|&b| b as i64).collect::<Vec<_>>());
    let mut out = vec![
        ("rewards".to_string(), rewards),
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
