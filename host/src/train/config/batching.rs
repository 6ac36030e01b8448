//! How a run's batches are cut, derived from its keys: rollouts (generated batches, or with
//! `stream_minibatches` mini-batches), the optimizer steps trained on each, mini-batches and
//! micro-batches (backward passes), and the coherence rows of a step.

use super::{Accumulation, TrainConfig};

impl TrainConfig {
    /// Optimizer steps trained on each rollout (a generated batch, or with `stream_minibatches`
    /// one mini-batch of it).
    pub fn steps_per_rollout(&self) -> usize {
        self.num_iterations * self.substeps_per_rollout()
    }

    /// Mini-batches each rollout is split into (one optimizer step each).
    pub fn substeps_per_rollout(&self) -> usize {
        if self.stream_minibatches { 1 } else { self.num_substeps }
    }

    /// Completions of a rollout: the batch, or with `stream_minibatches` one mini-batch.
    pub fn rollout_rows(&self) -> usize {
        self.batch_size / (self.num_substeps / self.substeps_per_rollout())
    }

    /// Whether rollouts are sampled ahead by the run's sampler thread (`train/draw/pipeline.rs`).
    pub fn samples_ahead(&self) -> bool {
        self.max_steps_off_policy > 0 || self.stream_minibatches || self.sampling_steps_ahead > 0
    }

    /// Steps a batch may be sampled ahead of its training (`max_steps_off_policy` or
    /// `sampling_steps_ahead`; 0 on policy and with `stream_minibatches` alone).
    pub fn pipeline_depth(&self) -> usize {
        self.max_steps_off_policy.max(self.sampling_steps_ahead)
    }

    /// Completions each optimizer step trains on (its mini-batch).
    pub fn mini_batch_size(&self) -> usize {
        self.batch_size / self.num_substeps
    }

    /// Coherence rows of optimizer step `step` (0-based): none before `coherence_start_frac`.
    pub fn coherence_rows(&self, step: usize) -> usize {
        self.coherence_schedule().rows_at(step)
    }

    /// The step's backward passes: the micro-batches, each halved for the gradient noise scale
    /// when there is only one.
    pub fn backward_passes(&self) -> crate::engine::Passes {
        let halves = self.gradient_noise_scale && self.micro_batches() == 1;
        crate::engine::Passes { micro_batches: self.micro_batches(), splits: if halves { 2 } else { 1 } }
    }

    /// Micro-batches of each optimizer step: gradient_accumulation_steps, or with auto the
    /// count the memory planner recorded before the first step (`train/memory.rs`).
    pub fn micro_batches(&self) -> usize {
        match self.gradient_accumulation_steps {
            Accumulation::Steps(n) => n,
            Accumulation::Auto => self.planned_micro_batches.expect("gradient_accumulation_steps auto is planned before the first step"),
        }
    }
}
