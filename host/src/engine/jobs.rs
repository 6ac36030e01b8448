//! The jobs a run's [`super::Seat`] hands the engine (sampling, scoring without gradient, a
//! backward pass, and the run's own passes: micro-batches and probes, the entropy change's
//! re-scoring, the Fisher kernel's per-sequence gradients) and what comes back: the types
//! `shared.rs` schedules and `stacked.rs` runs as one pass for a pack.

use std::time::Instant;

use anyhow::Result;
use tch::Tensor;

use super::{BackwardPass, LossBatch, Passes, Sequences, TokenLogprobs};
use crate::grpo::{Objective, TokenMasks};
use crate::model::decode::DecodeModel;
use crate::model::generate::{Generation, SamplingParams};
use crate::model::linear::AdapterCtl;
use crate::model::{Llama, native};

/// A job's result, its share of the wall time, and how many runs' jobs ran in its call (1 when
/// it ran alone).
pub struct Done<T> {
    pub value: T,
    pub seconds: f64,
    pub runs: usize,
}

/// Log-probabilities of a run's completions under a policy that does not train in the pass
/// (no gradient): the reference, or the old policy of the ratio.
pub struct ScoreJob<'a> {
    /// The reference policy (a frozen copy, or the policy with its adapters off: `ctl`), or the
    /// policy itself with the batch's routed `ctl`.
    pub model: &'a Llama,
    pub ctl: &'a [AdapterCtl],
    pub generation: &'a Generation,
    pub temperature: f64,
    /// The same weights for the native scorer (float32 on the CPU only), from the seat.
    pub(super) native: Option<&'a native::NativeModel>,
}

impl<'a> ScoreJob<'a> {
    pub fn new(model: &'a Llama, ctl: &'a [AdapterCtl], generation: &'a Generation, temperature: f64) -> Self {
        Self { model, ctl, generation, temperature, native: None }
    }
}

/// One forward and backward pass of a run's loss over its whole batch (a step with
/// micro-batches or probes that read a pass's gradients does its passes itself).
pub struct TrainJob<'a> {
    pub model: &'a Llama,
    pub batch: LossBatch<'a>,
    pub temperature: f64,
    pub objective: &'a Objective,
}

/// The run's own backward passes over its batch ([`super::backward_passes`]: micro-batches,
/// each split for the gradient noise scale), with the probes' hooks, which read the pass's
/// graph or the gradients between passes: never stacked (another run's passes would enter the
/// gradients the hooks read).
pub struct OwnPassesJob<'a> {
    pub model: &'a Llama,
    pub batch: LossBatch<'a>,
    pub temperature: f64,
    pub objective: &'a Objective,
    pub passes: Passes,
    pub before_backward: &'a mut dyn FnMut(&TokenLogprobs, TokenMasks),
    pub after_backward: &'a mut dyn FnMut(),
}

/// The completions' log-probabilities and entropies under the policy as it is now, without
/// gradient (the entropy change: the step's batch re-scored after the update). Never stacked:
/// a stacked pass rounds differently from the run's own.
pub struct RescoreJob<'a> {
    pub model: &'a Llama,
    pub seqs: Sequences<'a>,
    pub ctl: &'a [AdapterCtl],
    pub temperature: f64,
}

/// The sketch of each sequence's gradient of its total completion log-probability over
/// `params` ([`super::sequence_gradient_sketches`], the Fisher kernel's): one pass per
/// sequence, alone, never stacked.
pub struct SketchJob<'a> {
    pub model: &'a Llama,
    pub seqs: Sequences<'a>,
    /// The completion tokens whose log-probabilities a sequence's total sums (the model's).
    pub counted: &'a Tensor,
    pub ctl: &'a [AdapterCtl],
    pub temperature: f64,
    pub params: &'a [Tensor],
    /// One gradient (a tensor per parameter) to its sketch row.
    pub project: &'a dyn Fn(&[Tensor]) -> Tensor,
}

/// One call of a run's sampler.
pub(super) struct SampleJob<'a> {
    pub(super) decoder: &'a DecodeModel,
    /// The adapter scales `decoder` is folded at: with the run, the key of the stacked decoder.
    pub(super) scales: &'a [f64],
    pub(super) prompts: &'a [Vec<u32>],
    pub(super) params: &'a SamplingParams,
    pub(super) seed: u64,
}

pub(super) enum Job<'a> {
    Sample(SampleJob<'a>),
    Score(ScoreJob<'a>),
    Train(TrainJob<'a>),
    OwnPasses(OwnPassesJob<'a>),
    Rescore(RescoreJob<'a>),
    Sketch(SketchJob<'a>),
}

impl Job<'_> {
    /// The job's kind, as the seat counts it ([`super::Seat::jobs`]).
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Job::Sample(_) => "sample",
            Job::Score(_) => "score",
            Job::Train(_) => "train",
            Job::OwnPasses(_) => "own_passes",
            Job::Rescore(_) => "rescore",
            Job::Sketch(_) => "sketch",
        }
    }
}

pub(super) enum Outcome {
    Sample(Result<Generation>),
    Score(Result<Tensor>),
    Train(BackwardPass),
    Rescore(TokenLogprobs),
    Sketch(Tensor),
}

/// Times `work` and shares its wall time among `runs` runs.
pub(super) fn timed<T>(runs: usize, work: impl FnOnce() -> T) -> (T, f64) {
    let started = Instant::now();
    let value = work();
    (value, started.elapsed().as_secs_f64() / runs as f64)
}
