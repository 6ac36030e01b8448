//! The engine: every way the trainer runs the policy's model. [`Engine`] (`shared.rs`) is what
//! the runs of a process share (a solo run is a pack of one): each run's [`Seat`] samples (for
//! training and for its evaluations, with decoders kept for the run's life), scores its
//! reference and old log-probabilities and trains its plain backward pass, and the engine
//! alone chooses the implementation (native CPU sampler and scorer, libtorch eager, CUDA
//! graphs) and whether jobs of several runs run stacked; the run's own passes (micro-batches
//! and probes, the entropy change's re-scoring, the Fisher kernel's per-sequence gradients) are
//! its jobs too, run alone. Below it, plain functions compute
//! completion log-probabilities with and without gradient and the step's backward passes
//! (micro-batches, splits, stacked); the loss itself is [`crate::grpo`]'s.
//!
//! Architecture invariant: the trainer reaches the model's forward pass for scoring and
//! training, and the sampler, only through this module; `grpo` never sees a model.

mod ahead;
mod delivery;
mod jobs;
mod logprobs;
mod passes;
mod shared;
mod stacked;

pub use logprobs::{HEAD_CHUNK_ROWS, Sequences, TokenLogprobs, completion_logprobs, completion_logprobs_and_entropy, frozen_logprobs};
pub use ahead::{Ahead, Extra, Play};
pub use jobs::{Done, OwnPassesJob, RescoreJob, ScoreJob, SketchJob, TrainJob};
pub use shared::{Engine, Sampled, Seat, Stacking};
pub use passes::{BackwardPass, LossBatch, Passes, backward_micro_batches, backward_passes, backward_stacked, sequence_gradient_sketches, stacked_frozen_logprobs};
