//! The flat configuration resolved into the typed parts a run is built from (as
//! [`TrainConfig::objective`] is); the trainer keeps the flat `TrainConfig` only to write
//! `config.yaml` and checkpoints. A key a part reads as it is comes from its row in the table
//! (a row ending `=> StepKeys`, `=> Recipe` or `=> DrawKeys` gives the part an accessor,
//! [`crate::hyperparams::Part`]); what several keys make together is computed here, once.

use anyhow::{Context, Result};
use tch::Device;

use super::{LrHorizon, TrainConfig};
use crate::engine::Passes;
use crate::grpo::{Aggregation, MultiObjectiveAggregation};
use crate::hyperparams::Part;
use crate::intervention::AdvantageScore;
use crate::reward::{ComponentInfo, DetectorSpec};
use crate::train::draw::{AheadHorizon, DrawKeys, DrawMode};
use crate::train::fisher::FisherSchedule;
use crate::train::recipe::{CoherenceSchedule, Recipe};

/// The keys an optimizer step reads (`step.rs`), and when a run evaluates, saves and logs.
/// A key the step reads as it is (`max_grad_norm`, `eval_every`, ...) is its row's alone: the
/// row ends `=> StepKeys`, which gives this part the accessor `keys.max_grad_norm()`; the
/// fields here are the values derived from several keys.
pub struct StepKeys {
    /// The resolved configuration, read only through the accessors of the rows that name
    /// this part ([`Part`]).
    table: TrainConfig,
    /// Optimizer steps per rollout: `num_iterations * num_substeps`.
    pub steps_per_rollout: usize,
    /// Mini-batches per pass over a rollout (`num_substeps`, or 1 when streamed).
    pub substeps_per_rollout: usize,
    /// Completions per optimizer step: `batch_size / num_substeps`.
    pub mini_batch_size: usize,
    /// The rollout is sampled ahead by another policy version (`max_steps_off_policy`,
    /// `stream_minibatches`): its ratio is taken to the sampler.
    pub samples_ahead: bool,
    /// The rollouts are a finished run's, replayed (`replay_rollouts`): their ratio is taken to
    /// the sampler too.
    pub replays: bool,
    /// The step's backward passes (`gradient_accumulation_steps`, halves for the noise scale).
    pub passes: Passes,
    pub lr: LrSchedule,
    pub fisher: FisherSchedule,
}

impl Part<TrainConfig> for StepKeys {
    fn table(&self) -> &TrainConfig {
        &self.table
    }
}

/// The linear learning-rate schedule: `lr` decayed to zero over `max_steps`, or over an earlier
/// horizon recorded by `--extend-schedule` for the steps trained before the extension.
pub struct LrSchedule {
    peak: f64,
    max_steps: usize,
    horizons: Vec<LrHorizon>,
}

impl LrSchedule {
    /// The learning rate of 0-based `step`.
    pub fn at(&self, step: usize) -> f64 {
        let horizon = self.horizons.iter().find(|h| step < h.until_step).map_or(self.max_steps, |h| h.max_steps);
        crate::optim::linear_lr(self.peak, step, horizon)
    }
}

impl TrainConfig {
    /// The step's keys, read once.
    pub fn step_keys(&self) -> StepKeys {
        StepKeys {
            table: self.clone(),
            steps_per_rollout: self.steps_per_rollout(),
            substeps_per_rollout: self.substeps_per_rollout(),
            mini_batch_size: self.mini_batch_size(),
            samples_ahead: self.samples_ahead(),
            replays: self.replay_rollouts.is_some(),
            passes: self.backward_passes(),
            lr: LrSchedule { peak: self.lr, max_steps: self.max_steps, horizons: self.lr_horizons.clone() },
            fisher: self.fisher_schedule(),
        }
    }

    /// The recipe (advantages, intervention, routing plan, loss mask) of a run whose tensors
    /// live on `device` and whose reward has `components` (which GDPO normalises one by one).
    pub fn recipe(&self, device: Device, components: &[ComponentInfo]) -> Result<Recipe> {
        Ok(Recipe {
            table: self.clone(),
            advantage_score_component: self.advantage_score_component(components)?,
            aggregation: Aggregation::of(self.loss_type, self.max_completion_length),
            normalize_then_sum: (self.multi_objective_aggregation == MultiObjectiveAggregation::NormalizeThenSum).then(|| components.to_vec()),
            row_weights: self.row_weights()?,
            coherence: self.coherence_schedule(),
            retain_verifier_recall: self.rh_detector_verifies_retain_samples.then_some(self.rh_detector_retain_recall),
            adapters: self.adapter_config()?,
            device,
        })
    }

    /// With `advantage_score: detector_score`: the index of the component the
    /// `score_threshold` detector thresholds (the configuration checks that there is one).
    fn advantage_score_component(&self, components: &[ComponentInfo]) -> Result<Option<usize>> {
        match (self.advantage_score, &self.rh_detector) {
            (AdvantageScore::Flag, _) => Ok(None),
            (AdvantageScore::DetectorScore, Some(DetectorSpec::ScoreThreshold(rule))) => {
                let index = components.iter().position(|info| info.name == rule.component);
                let names: Vec<&str> = components.iter().map(|info| info.name.as_str()).collect();
                index.map(Some).with_context(|| format!("advantage_score detector_score: the rh_detector's component `{}` is not a reward component ({})", rule.component, names.join(", ")))
            }
            (AdvantageScore::DetectorScore, _) => anyhow::bail!("internal error: advantage_score detector_score without a score_threshold detector passed the checks"),
        }
    }

    /// Coherence rows from step `round(coherence_start_frac * max_steps)` on.
    pub fn coherence_schedule(&self) -> CoherenceSchedule {
        let start_step = (self.coherence_start_frac * self.max_steps as f64).round() as usize;
        CoherenceSchedule { start_step, rows: self.coh_samples_per_rollout }
    }

    /// Which prompts a step draws, how many and when.
    pub fn draw_keys(&self) -> DrawKeys {
        DrawKeys {
            table: self.clone(),
            rollout_rows: self.rollout_rows(),
            steps_per_rollout: self.steps_per_rollout(),
            coherence: self.coherence_schedule(),
            mode: self.draw_mode(),
        }
    }

    /// Where each step's rollout comes from (config/checks.rs refuses combinations of modes).
    pub fn draw_mode(&self) -> DrawMode {
        match (&self.replay_rollouts, self.stream_minibatches, self.pipeline_depth()) {
            (Some(dir), _, _) => DrawMode::Replay(dir.clone()),
            (None, true, _) => DrawMode::Ahead(AheadHorizon::Streamed { substeps: self.num_substeps }),
            (None, false, 0) => DrawMode::OnPolicy,
            (None, false, depth) => DrawMode::Ahead(AheadHorizon::Steps { depth }),
        }
    }

    /// When the sketched Fisher kernel is measured, and how wide.
    pub fn fisher_schedule(&self) -> FisherSchedule {
        FisherSchedule { every: self.fisher_kernel_every, sketch: self.fisher_kernel_sketch, seed: self.seed }
    }
}
