//! Packed runs: several runs of one architecture trained by one process, in lockstep. Each run
//! is a whole solo [`Trainer`] (its own weights or adapters, optimizer state, clipping, random
//! streams, reward plugins, `metrics.jsonl`, evaluations and checkpoints), so a packed run's
//! directory is exactly a solo run's and `eval`, `sweep --collect`, `--resume` and export read
//! it unchanged. The pack advances every live run by one step per round (the parts of
//! [`Trainer::advance`], below); a run that fails (a plugin error, a non-finite loss) records why in its train.log and leaves the
//! pack, the others go on.
//!
//! Sampling, the bulk of a GPU step, is stacked ([`Stacking`]): before each round the pack asks
//! every run what its next step will sample ([`Trainer::next_sample_requests`]: prompts,
//! adapter scales, seed), decodes all runs' rows at once with their weights stacked on a
//! leading run axis (`DecodeModel::stacked`, one batched matrix product per projection), and
//! hands each run its part, which the run's step takes instead of sampling alone (only for
//! exactly the request it makes; one it does not take is an error). A stacked decode draws each
//! run's tokens from that run's own weights and random streams, so a run samples what it
//! samples alone.
//!
//! A round then goes in three phases: each run begins its step (scoring in its plugins,
//! advantages, routing plan: [`Trainer::begin_step`]); the runs' reference log-probabilities
//! come from one forward pass of their reference models stacked on the run axis, and the runs
//! whose passes can stack do one forward and backward pass of their models stacked
//! ([`StackedPasses`], `engine::backward_stacked`: each run's own loss, the gradients of each in
//! its own parameters); each run finishes its step alone (clipping, AdamW, metrics,
//! evaluation, checkpoint). Stacked passes are on where launches dominate ([`Stacking::Auto`]:
//! CUDA; not yet measured there). A run whose step needs its own backward passes
//! (micro-batches, probes that read a pass's gradients) does them in the third phase, and its
//! train.log says why.
//!
//! Architecture invariant: nothing here computes a run's numbers (the stacked passes are
//! `engine`'s, the stacked decode `generate`'s); the pack only decides the order of work, which
//! engine samples and whether a pass is stacked, so a packed run
//! is the solo run (bit for bit unstacked; to float32 rounding stacked, `tests/train/`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use serde_json::Value;

use super::rollout::{Reference, SampleRequest, Served};
use super::step::{PendingStep, StackedPassInput, Trained};
use super::{RunSummary, TrainConfig, Trainer};
use crate::engine::{self, LossBatch};
use crate::grpo::Objective;
use crate::hyperparams::{Hyperparameters, Prop};
use crate::model::Llama;
use crate::model::linear::AdapterCtl;
use crate::model::decode::DecodeModel;
use crate::model::generate::{Engine, generate_stacked};

/// One run of a pack: a configuration, and the run directory it resumes (if any).
pub struct PackedRun {
    pub config: TrainConfig,
    pub resume: Option<PathBuf>,
}

/// Refuses, before any work, runs that differ in a key that fixes tensor shapes or the schedule
/// of steps ([`Prop::Pack`] in the table; they may differ in anything else: seed, learning rate,
/// KL coefficient, loss and routing settings, rewards, detectors), naming the key, both values
/// and what to do.
pub fn check_packable(configs: &[&TrainConfig]) -> Result<()> {
    let Some((first, rest)) = configs.split_first() else { return Ok(()) };
    let same_in_a_pack = TrainConfig::keys_with(Prop::Pack);
    let first_keys = serde_json::to_value(first)?;
    for other in rest {
        let other_keys = serde_json::to_value(other)?;
        for &key in &same_in_a_pack {
            let (a, b) = (first_keys.get(key).unwrap_or(&Value::Null), other_keys.get(key).unwrap_or(&Value::Null));
            if a != b {
                bail!(
                    "packed runs must share their architecture and shapes, but `{key}` is {a} in run {} and {b} in run {}; \
                     drop --pack, or sweep `{key}` in separate sweeps (keys packed runs must share: {})",
                    first.run_name()?,
                    other.run_name()?,
                    same_in_a_pack.join(", ")
                );
            }
        }
    }
    Ok(())
}

/// Whether a pack samples its runs' rollouts, and does their backward passes, together,
/// stacked on a leading run axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stacking {
    /// Sampling when the runs sample with libtorch (on CUDA, or in bfloat16), where a decode
    /// step is a few hundred small kernels whatever the batch, so R runs cost about what one
    /// costs (on the CPU in float32 each run keeps the native sampler, which is faster there);
    /// reference and backward passes on CUDA, for the same reason.
    Auto,
    /// Always, libtorch in place of the native sampler and reference scorer on the CPU (tests
    /// and benchmarks: the stacked libtorch decoder draws the tokens the native sampler draws;
    /// the reference log-probabilities differ by float32 rounding).
    Always,
    /// Never: each run samples and trains alone.
    Never,
}

/// How a pack runs; neither choice changes what a run computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackOptions {
    pub stacking: Stacking,
    /// Threads that advance the runs' steps at once, each a fixed share of the runs (1: one
    /// run after another). The stacked sampling before each round stays on the calling thread.
    pub workers: usize,
}

impl Default for PackOptions {
    fn default() -> Self {
        Self { stacking: Stacking::Auto, workers: 1 }
    }
}

/// Trains the runs together, in lockstep, each to its `max_steps` (or `stop_after` steps from
/// where it starts, for tests of resumption), sampling stacked where that is faster
/// ([`Stacking::Auto`]), one run's step after another. Returns each run's outcome in the given
/// order: a run that cannot start or fails at a step is an `Err` (recorded in its train.log
/// once its directory exists); the others are unaffected.
pub fn train_packed(runs: Vec<PackedRun>, stop_after: Option<usize>) -> Result<Vec<Result<RunSummary>>> {
    train_packed_with(runs, stop_after, PackOptions::default())
}

/// [`train_packed`] with the stacking and the worker threads chosen.
pub fn train_packed_with(runs: Vec<PackedRun>, stop_after: Option<usize>, options: PackOptions) -> Result<Vec<Result<RunSummary>>> {
    anyhow::ensure!(options.workers >= 1, "a pack needs at least one worker thread");
    check_packable(&runs.iter().map(|r| &r.config).collect::<Vec<_>>())?;
    let mut members: Vec<Member> = runs
        .into_iter()
        .map(|run| match Trainer::start(run.config, run.resume.as_deref(), false) {
            Ok(trainer) => {
                let end = trainer.end_step(stop_after);
                trainer.log.progress(trainer.optimizer.step as u64, String::new());
                Member::Training { trainer: Box::new(trainer), end, pending: None, trained: None }
            }
            Err(error) => Member::Done(Err(error)),
        })
        .collect();
    let mut samplers = StackedSamplers::default();
    let mut passes = StackedPasses::default();
    while members.iter().any(Member::is_training) {
        if options.stacking != Stacking::Never {
            samplers.serve(&mut members, options.stacking);
        }
        let stack_passes = options.stacking == Stacking::Always || (options.stacking == Stacking::Auto && on_cuda(&members));
        let reference = if stack_passes { Reference::Deferred } else { Reference::Now };
        for_each_member(&mut members, options.workers, |member| member.begin(reference));
        if stack_passes {
            passes.reference(&mut members);
            passes.train(&mut members);
        }
        for_each_member(&mut members, options.workers, Member::finish);
    }
    Ok(members.into_iter().map(Member::outcome).collect())
}

/// Whether the pack's runs train on a CUDA device (they share their device).
fn on_cuda(members: &[Member]) -> bool {
    members.iter().filter_map(Member::trainer).any(|t| t.model.device.is_cuda())
}

/// Applies `work` to every run: one after another, or with `workers` > 1 in that many scoped
/// threads, each a fixed share of the runs. Runs share nothing (each `Trainer` owns its
/// tensors, plugins and files; libtorch's grad mode is per thread), so the threads do not
/// change what any run computes (`tests/train/` holds them to the solo runs).
fn for_each_member(members: &mut [Member], workers: usize, work: impl Fn(&mut Member) + Sync) {
    if workers <= 1 || members.len() <= 1 {
        members.iter_mut().for_each(work);
        return;
    }
    let share = members.len().div_ceil(workers);
    let work = &work;
    std::thread::scope(|scope| {
        for runs in members.chunks_mut(share) {
            scope.spawn(move || runs.iter_mut().for_each(work));
        }
    });
}

/// Writes `line` to the train.log of each of `runs` not yet in `announced` (once per run).
fn announce_once(members: &mut [Member], announced: &mut Vec<usize>, runs: &[usize], line: &str) {
    for &run in runs {
        if announced.contains(&run) {
            continue;
        }
        announced.push(run);
        if let Member::Training { trainer, .. } = &mut members[run] {
            if let Err(error) = trainer.log.line(line) {
                eprintln!("warning: {error:#}");
            }
        }
    }
}

/// The pack's stacked passes between the runs' `begin` and `finish`: the reference
/// log-probabilities of the runs' new rollouts ([`StackedPasses::reference`]), then the backward
/// passes ([`StackedPasses::train`]). Each run then finishes its step (clipping, AdamW,
/// metrics) alone, on the gradients of its own loss.
#[derive(Default)]
struct StackedPasses {
    /// Runs whose train.log says how they train (once per run).
    announced: Vec<usize>,
    /// Runs whose train.log says that their reference pass is stacked (once per run).
    announced_reference: Vec<usize>,
}

impl StackedPasses {
    /// The reference log-probabilities of the runs whose new rollouts left them out
    /// ([`Reference::Deferred`]): one forward pass (no gradient) of the runs' reference models
    /// stacked; a run with no partner computes its own. A run whose own pass fails leaves the
    /// pack.
    fn reference(&mut self, members: &mut [Member]) {
        // Every run's rollout has `batch_size` rows, a key packed runs share.
        let runs: Vec<usize> = (0..members.len()).filter(|&i| matches!(&members[i], Member::Training { pending: Some(pending), .. } if pending.reference_pending())).collect();
        match runs.len() {
            0 => return,
            1 => return members[runs[0]].own_reference(),
            _ => {}
        }
        let line = format!("reference log-probabilities stacked with {} packed runs (one batched forward pass)", runs.len());
        announce_once(members, &mut self.announced_reference, &runs, &line);
        let started = Instant::now();
        let logprobs = {
            let inputs: Vec<_> = runs.iter().map(|&i| members[i].trainer().expect("a run whose step has begun").reference_pass_input()).collect();
            let models: Vec<&Llama> = inputs.iter().map(|input| input.0).collect();
            let ctl: Vec<&[AdapterCtl]> = inputs.iter().map(|input| input.1.as_slice()).collect();
            let seqs: Vec<_> = inputs.iter().map(|input| input.2).collect();
            let temperatures: Vec<f64> = inputs.iter().map(|input| input.3).collect();
            engine::stacked_frozen_logprobs(&models, &ctl, &seqs, &temperatures)
        };
        let seconds = started.elapsed().as_secs_f64() / runs.len() as f64;
        for (&i, logprobs) in runs.iter().zip(logprobs) {
            if let Member::Training { trainer, pending: Some(pending), .. } = &mut members[i] {
                trainer.set_reference(pending, logprobs, seconds);
            }
        }
    }

    /// The runs whose steps have begun and whose passes can stack
    /// ([`Trainer::unstackable_pass`]), in groups that train on as many rows, go through one
    /// forward and backward pass of their models stacked on a leading axis
    /// ([`engine::backward_stacked`]).
    fn train(&mut self, members: &mut [Member]) {
        let mut groups: Vec<(i64, Vec<usize>)> = Vec::new();
        let mut alone = Vec::new();
        for (i, member) in members.iter().enumerate() {
            let Member::Training { trainer, pending: Some(pending), .. } = member else { continue };
            assert!(!pending.reference_pending(), "the stacked reference pass ran first");
            if let Some(reason) = trainer.unstackable_pass() {
                alone.push((i, reason));
                continue;
            }
            let rows = pending.rows();
            match groups.iter_mut().find(|(r, _)| *r == rows) {
                Some((_, group)) => group.push(i),
                None => groups.push((rows, vec![i])),
            }
        }
        for (i, reason) in alone {
            let line = format!("training each step alone, not stacked with the other packed runs: {reason} needs the run's own backward passes");
            announce_once(members, &mut self.announced, &[i], &line);
        }
        for (_, runs) in groups.into_iter().filter(|(_, runs)| runs.len() >= 2) {
            let line = format!("training stacked with {} packed runs (one batched forward and backward pass; each run's own loss and optimizer)", runs.len());
            announce_once(members, &mut self.announced, &runs, &line);
            let started = Instant::now();
            let passes = {
                let inputs: Vec<StackedPassInput> = runs.iter().map(|&i| members[i].stacked_pass_input()).collect();
                let models: Vec<&Llama> = inputs.iter().map(|input| input.model).collect();
                let temperatures: Vec<f64> = inputs.iter().map(|input| input.temperature).collect();
                let objectives: Vec<&Objective> = inputs.iter().map(|input| input.loss).collect();
                let batches: Vec<LossBatch> = inputs.into_iter().map(|input| input.batch).collect();
                engine::backward_stacked(&models, &batches, &temperatures, &objectives)
            };
            let seconds = started.elapsed().as_secs_f64() / runs.len() as f64;
            for (&i, pass) in runs.iter().zip(passes) {
                if let Member::Training { trained, .. } = &mut members[i] {
                    *trained = Some(Trainer::stacked_pass_result(pass, seconds));
                }
            }
        }
    }
}

/// The pack's stacked decoders, one per set of runs sampled together (and per sampler call of
/// a step: routed rows, coherence rows), kept across rounds so that CUDA graphs captured on
/// them are replayed.
#[derive(Default)]
struct StackedSamplers {
    decoders: HashMap<Vec<(usize, usize)>, DecodeModel>,
    /// Runs whose train.log says that they sample stacked (once per run).
    announced: Vec<usize>,
}

impl StackedSamplers {
    /// Samples, stacked, what the training runs' next steps will ask for, and serves each run
    /// its part. A run whose requests cannot be computed fails (as its step would); a stacked
    /// decode that fails is reported and its runs sample alone, where the error is theirs.
    fn serve(&mut self, members: &mut [Member], stacking: Stacking) {
        // A stack that holds a run which left the pack is never used again: free it (and its graphs).
        self.decoders.retain(|runs, _| runs.iter().all(|&(run, _)| members[run].is_training()));
        let mut requests: Vec<Vec<SampleRequest>> = Vec::with_capacity(members.len());
        for member in members.iter_mut() {
            requests.push(member.next_sample_requests(stacking));
        }
        let calls = requests.iter().map(Vec::len).max().unwrap_or(0);
        for call in 0..calls {
            for runs in stackable(members, &requests, call) {
                match self.sample_stacked(members, &requests, call, &runs) {
                    Ok(()) => self.announce(members, &runs),
                    Err(error) => eprintln!("warning: stacked sampling of {} packed runs failed, so they sample one by one: {error:#}", runs.len()),
                }
            }
        }
    }

    /// Says in each run's train.log, the first time, that its rollouts are sampled stacked.
    fn announce(&mut self, members: &mut [Member], runs: &[usize]) {
        let line = format!("sampling stacked with {} packed runs (one batched decode; the same tokens as alone)", runs.len());
        announce_once(members, &mut self.announced, runs, &line);
    }

    /// Decodes request `call` of each of `runs` (member indices) at once and serves the parts.
    fn sample_stacked(&mut self, members: &[Member], requests: &[Vec<SampleRequest>], call: usize, runs: &[usize]) -> Result<()> {
        let trainers: Vec<&Trainer> = runs.iter().map(|&i| members[i].trainer().expect("only training runs are stacked")).collect();
        let run_requests: Vec<&SampleRequest> = runs.iter().map(|&i| &requests[i][call]).collect();
        let started = Instant::now();
        let generations = {
            let guards = trainers.iter().zip(&run_requests).map(|(t, r)| t.refreshed_decoder(&r.scales)).collect::<Result<Vec<_>>>()?;
            let parts: Vec<&DecodeModel> = guards.iter().map(|(decoders, index)| &decoders[*index].1).collect();
            let key: Vec<(usize, usize)> = runs.iter().map(|&i| (i, call)).collect();
            let stacked = match self.decoders.get_mut(&key) {
                Some(stacked) => {
                    stacked.refresh_stacked(&parts);
                    stacked
                }
                None => self.decoders.entry(key).or_insert_with(|| DecodeModel::stacked(&parts)),
            };
            let engine = if stacked.device.is_cuda() { Engine::CudaGraphs } else { Engine::Libtorch };
            let prompts: Vec<&[Vec<u32>]> = run_requests.iter().map(|r| r.prompt_ids.as_slice()).collect();
            let seeds: Vec<u64> = run_requests.iter().map(|r| r.seed).collect();
            generate_stacked(engine, stacked, &prompts, &trainers[0].sampling, &seeds)?
        };
        let seconds = started.elapsed().as_secs_f64() / runs.len() as f64;
        for ((trainer, request), generation) in trainers.iter().zip(run_requests).zip(generations) {
            // A run whose weights diverged is not served: sampling alone, it fails with the error.
            if let Ok(generation) = generation {
                trainer.prefetch(Served { request: request.clone(), generation, seconds })?;
            }
        }
        Ok(())
    }
}

/// The groups of training runs whose request `call` can be decoded together: the same number
/// of prompts and the same sampling settings (the weights, prompts and seeds may differ). Only
/// groups of two or more runs.
fn stackable(members: &[Member], requests: &[Vec<SampleRequest>], call: usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, run_requests) in requests.iter().enumerate() {
        let (Some(request), Some(trainer)) = (run_requests.get(call), members[i].trainer()) else { continue };
        let same = |&j: &usize| {
            let other = members[j].trainer().expect("grouped runs are training");
            requests[j][call].prompt_ids.len() == request.prompt_ids.len() && other.sampling == trainer.sampling
        };
        match groups.iter_mut().find(|group| same(&group[0])) {
            Some(group) => group.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups.retain(|group| group.len() >= 2);
    groups
}

enum Member {
    Training {
        trainer: Box<Trainer>,
        end: usize,
        /// The step begun this round ([`Member::begin`]), finished by [`Member::finish`].
        pending: Option<PendingStep>,
        /// Its backward pass when a stacked pass did it ([`StackedPasses`]).
        trained: Option<Trained>,
    },
    Done(Result<RunSummary>),
}

impl Member {
    fn is_training(&self) -> bool {
        matches!(self, Member::Training { .. })
    }

    fn trainer(&self) -> Option<&Trainer> {
        match self {
            Member::Training { trainer, .. } => Some(trainer),
            Member::Done(_) => None,
        }
    }

    /// What this run's next step will sample, if it trains another step and samples with an
    /// engine that `stacking` stacks; a run whose requests cannot be computed fails here.
    fn next_sample_requests(&mut self, stacking: Stacking) -> Vec<SampleRequest> {
        let Member::Training { trainer, end, .. } = self else { return Vec::new() };
        let native = DecodeModel::native_available(trainer.model.device, trainer.model.kind);
        if trainer.optimizer.step >= *end || (stacking == Stacking::Auto && native) {
            return Vec::new();
        }
        let requests = trainer.next_sample_requests().map_err(|e| e.context(trainer.stopped_at(trainer.optimizer.step)));
        match trainer.log_failure(requests) {
            Ok(requests) => requests,
            Err(error) => {
                *self = Member::Done(Err(error));
                Vec::new()
            }
        }
    }

    /// Begins a training run's next step (or ends the run once it reached its last step); a
    /// failure is logged to its train.log, and the trainer (its lock included) is dropped.
    fn begin(&mut self, reference: Reference) {
        let Member::Training { trainer, end, pending, .. } = self else { return };
        if trainer.optimizer.step >= *end {
            trainer.log.finish();
            *self = Member::Done(Ok(RunSummary { run_dir: trainer.run_dir.clone(), steps: *end }));
            return;
        }
        let begun = trainer.begin_advance(reference);
        match trainer.log_failure(begun) {
            Ok(begun) => *pending = Some(begun),
            Err(error) => *self = Member::Done(Err(error)),
        }
    }

    /// Finishes the step [`Member::begin`] began, with its own backward pass unless a stacked
    /// pass did it; a failure is handled as in `begin`.
    fn finish(&mut self) {
        let Member::Training { trainer, pending, trained, .. } = self else { return };
        let Some(pending) = pending.take() else { return };
        let trained = trained.take().unwrap_or_else(|| trainer.backward(&pending));
        let outcome = trainer.finish_advance(pending, trained);
        if let Err(error) = trainer.log_failure(outcome) {
            *self = Member::Done(Err(error));
        }
    }

    /// The reference log-probabilities of the step begun, computed alone; a failure is handled
    /// as in `begin`.
    fn own_reference(&mut self) {
        let Member::Training { trainer, pending: Some(pending), .. } = self else { return };
        let step = trainer.optimizer.step;
        let outcome = trainer.own_reference(pending).map_err(|e| e.context(trainer.stopped_at(step)));
        if let Err(error) = trainer.log_failure(outcome) {
            *self = Member::Done(Err(error));
        }
    }

    /// This run's part of a stacked backward pass (a run whose step has begun).
    fn stacked_pass_input(&self) -> StackedPassInput<'_> {
        match self {
            Member::Training { trainer, pending: Some(pending), .. } => trainer.stacked_pass_input(pending),
            _ => unreachable!("only runs whose step has begun are stacked"),
        }
    }

    fn outcome(self) -> Result<RunSummary> {
        match self {
            Member::Done(outcome) => outcome,
            Member::Training { .. } => unreachable!("the pack loop ends when no run is training"),
        }
    }
}

