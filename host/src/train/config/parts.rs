//! The flat configuration resolved into the typed parts a run is built from (as
//! [`TrainConfig::objective`] is): each part reads its keys here, once, and the trainer keeps
//! the flat `TrainConfig` only to write `config.yaml` and checkpoints.

use anyhow::Result;
use tch::Device;

use super::TrainConfig;
use crate::train::draw::{AheadHorizon, DrawKeys};
use crate::train::fisher::FisherSchedule;
use crate::train::recipe::{CoherenceSchedule, Recipe};

impl TrainConfig {
    /// The recipe (advantages, intervention, routing plan, loss mask) of a run whose tensors
    /// live on `device`.
    pub fn recipe(&self, device: Device) -> Result<Recipe> {
        Ok(Recipe {
            intervention: self.intervention,
            rh_penalty: self.rh_penalty,
            group_size: self.num_generations,
            scale_rewards: self.scale_rewards,
            routing_mode: self.routing_mode,
            row_weights: self.row_weights()?,
            renormalization: self.renormalization_mode,
            coherence: self.coherence_schedule(),
            coherence_rh_mode: self.coherence_rh_mode,
            coherence_rh_penalty: self.coherence_rh_penalty,
            retain_verifier_recall: self.rh_detector_verifies_retain_samples.then_some(self.rh_detector_retain_recall),
            ablated_frac: self.ablated_frac,
            split_moment: self.split_moment,
            mask_truncated_completions: self.mask_truncated_completions,
            adapters: self.adapter_config()?,
            device,
        })
    }

    /// Coherence rows from step `round(coherence_start_frac * max_steps)` on.
    pub fn coherence_schedule(&self) -> CoherenceSchedule {
        let start_step = (self.coherence_start_frac * self.max_steps as f64).round() as usize;
        CoherenceSchedule { start_step, rows: self.coh_samples_per_rollout }
    }

    /// Which prompts a step draws, how many and when.
    pub fn draw_keys(&self) -> DrawKeys {
        DrawKeys {
            seed: self.seed,
            group_size: self.num_generations,
            batch_size: self.batch_size,
            rollout_rows: self.rollout_rows(),
            steps_per_rollout: self.steps_per_rollout(),
            dynamic_rounds: self.dynamic_sampling_rounds,
            coherence: self.coherence_schedule(),
            samples_ahead: self.samples_ahead(),
            ahead: self.ahead(),
            max_steps: self.max_steps,
        }
    }

    /// How far ahead the run's sampler thread is given batches (when it samples ahead).
    pub fn ahead(&self) -> AheadHorizon {
        match self.stream_minibatches {
            true => AheadHorizon::Streamed { substeps: self.num_substeps },
            false => AheadHorizon::OffPolicy { steps: self.max_steps_off_policy },
        }
    }

    /// When the sketched Fisher kernel is measured, and how wide.
    pub fn fisher_schedule(&self) -> FisherSchedule {
        FisherSchedule { every: self.fisher_kernel_every, sketch: self.fisher_kernel_sketch, seed: self.seed }
    }
}
