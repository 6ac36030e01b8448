//! The engine: every way the trainer runs the policy's model for scoring and training. Given a
//! model (or several runs' models of one architecture) and sequences, it computes completion
//! log-probabilities with and without gradient and the step's backward passes, deciding
//! micro-batches, splits and stacking; the loss itself is [`crate::grpo`]'s.
//!
//! Architecture invariant: the trainer reaches the model's forward pass for scoring and
//! training only through this module (sampling is `model::generate`'s, over the folded
//! decoder weights); `grpo` never sees a model.

mod logprobs;
mod passes;

pub use logprobs::{Sequences, TokenLogprobs, completion_logprobs, frozen_logprobs};
pub use passes::{BackwardPass, LossBatch, Passes, backward_micro_batches, backward_passes, backward_stacked, stacked_frozen_logprobs};
