//! The engine shared by the runs of one process: every run (a solo run is a pack of one) holds
//! a [`Seat`] and asks it to sample, to score its reference and old log-probabilities and to do
//! its backward pass. The engine decides, here and nowhere else, how each job runs: the CPU's
//! native sampler and scorer or libtorch (whose decoder replays CUDA graphs on CUDA), and
//! whether jobs of several runs run as one pass over their weights stacked on a leading run
//! axis ([`Stacking`]).
//!
//! Each run of a pack steps on its own thread through the same straight-line step as a solo
//! run. A job that may stack is a rendezvous: the run waits until every live run is waiting
//! for a job (or has left), then the last run to arrive runs all of them, compatible jobs
//! stacked, and hands each run its result. A job that may not stack (the native sampler on
//! the CPU, a run alone) runs on its own thread at once. Which jobs run together depends only
//! on which jobs the runs ask for, never on thread timing, so a pack is reproducible. The run's
//! own passes (micro-batches and probes, the entropy change, the Fisher kernel) never stack: a
//! stacked pass rounds differently from a run's own, and the probes read one run's gradients.
//!
//! Architecture invariant: nothing outside this module knows whether a job ran stacked or with
//! which implementation; a run sees only its own result (and how many runs shared the call, for
//! its log), so a packed run is its solo run (bit for bit unstacked; to float32 rounding
//! stacked, `tests/train/`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use anyhow::{Context, Result, anyhow};
use tch::Tensor;

use super::ahead::{Ahead, AheadSampler, Play, Work};
use super::jobs::{Done, Job, Outcome, OwnPassesJob, RescoreJob, SampleJob, ScoreJob, SketchJob, TrainJob, timed};
use super::stacked::{sample_group, score_group, train_group};
use super::{BackwardPass, TokenLogprobs, backward_micro_batches, backward_passes, completion_logprobs, frozen_logprobs, sequence_gradient_sketches};
use crate::model::decode::DecodeModel;
use crate::model::folded::{FoldedWeights, SamplerDtype};
use crate::model::generate::{Generation, SamplingParams, generate};
use crate::model::linear::AdapterCtl;
use crate::model::{Llama, native};

/// Whether jobs of several runs run as one pass over their weights stacked on a run axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stacking {
    /// Where launches dominate: sampling with libtorch (on CUDA, or in bfloat16), where a
    /// decode step is a few hundred small kernels whatever the batch, so R runs cost about
    /// what one costs (on the CPU in float32 each run keeps the native sampler, which is faster
    /// there); reference and backward passes on CUDA, for the same reason.
    Auto,
    /// Always: libtorch in place of the native sampler and reference scorer on the CPU (tests
    /// and benchmarks: the stacked libtorch decoder draws the tokens the native sampler draws;
    /// the reference log-probabilities differ by float32 rounding).
    Always,
    /// Never: each run samples and trains alone.
    Never,
}

/// A job waiting at the rendezvous. SAFETY of the `'static`: the job borrows from the thread
/// that posted it, which blocks in [`Engine::rendezvous`] until the job's outcome is posted;
/// the engine drops the job before it posts the outcome. The borrowed tensors are read by
/// the one thread that runs the jobs while their owners wait (libtorch tensors are safe to
/// read from another thread; `tch::Tensor` is only not `Sync` by default).
struct Posted {
    run: usize,
    job: Job<'static>,
}

unsafe impl Send for Posted {}

#[derive(Default)]
struct State {
    /// Seats not yet dropped.
    live: usize,
    next_run: usize,
    posted: Vec<Posted>,
    outcomes: HashMap<usize, Done<Outcome>>,
    /// Threads free to work (`workers` minus those working).
    permits: usize,
    /// The packs' stacked decoders, by their runs and adapter scales, kept so that CUDA graphs
    /// captured on them are replayed at every step.
    stacked_decoders: HashMap<Vec<(usize, Vec<u64>)>, DecodeModel>,
    /// Jobs handed to the engine, by run and kind ([`Seat::jobs`]).
    jobs: BTreeMap<(usize, &'static str), usize>,
}

/// The engine shared by the runs of a process (see the module's documentation).
pub struct Engine {
    stacking: Stacking,
    state: Mutex<State>,
    changed: Condvar,
    /// Set when running the jobs panicked: the waiting runs fail instead of waiting forever.
    broken: AtomicBool,
}

impl Engine {
    /// An engine for runs of one device that stack per `stacking`; at most `workers` runs work
    /// at once between jobs (each run's thread waits for a turn).
    pub fn new(stacking: Stacking, workers: usize) -> Arc<Self> {
        assert!(workers >= 1, "at least one worker");
        Arc::new(Self { stacking, state: Mutex::new(State { permits: workers, ..State::default() }), changed: Condvar::new(), broken: AtomicBool::new(false) })
    }

    /// A solo run's engine: a pack of one.
    pub fn solo() -> Seat {
        Self::seat(&Self::new(Stacking::Auto, 1))
    }

    /// A new run's seat; the engine waits for it at every rendezvous until it is dropped.
    pub fn seat(engine: &Arc<Self>) -> Seat {
        let mut state = engine.lock();
        state.live += 1;
        state.next_run += 1;
        Seat { engine: engine.clone(), run: state.next_run - 1, working: false, sampler_dtype: SamplerDtype::Float32, decoders: Vec::new(), reference: None, ahead: None, broken_refresh: false, setup_seconds: 0.0 }
    }

    /// Counts `job` among `run`'s ([`Seat::jobs`]).
    fn count(&self, run: usize, job: &Job) {
        *self.lock().jobs.entry((run, job.kind())).or_default() += 1;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A thread that panicked holding the lock left the state consistent (it only moves
        // values in and out), so the others go on and report their own errors.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether a pass over whole models (reference or backward) is stacked with other runs'.
    fn stacks_passes(&self, model: &Llama) -> bool {
        self.stacking == Stacking::Always || (self.stacking == Stacking::Auto && model.device.is_cuda())
    }

    /// Whether a sampler call is stacked with other runs' (libtorch decoders; the CPU's native
    /// sampler decodes one run at a time).
    fn stacks_sampling(&self, decoder: &DecodeModel) -> bool {
        self.stacking == Stacking::Always || (self.stacking == Stacking::Auto && decoder.native().is_none())
    }

    /// Posts `job` for `run` and waits for its outcome (see the module's documentation).
    fn rendezvous(&self, run: usize, job: Job<'_>) -> Result<Done<Outcome>> {
        let broken = || anyhow!("another run's job panicked in the shared engine; this run stops with it");
        let mut state = self.lock();
        if self.broken.load(Ordering::SeqCst) {
            return Err(broken());
        }
        // SAFETY: see `Posted`: this thread does not return while the job is posted (it is
        // either consumed by `run_posted` or taken back below).
        let job: Job<'static> = unsafe { std::mem::transmute::<Job<'_>, Job<'static>>(job) };
        state.posted.push(Posted { run, job });
        loop {
            if let Some(done) = state.outcomes.remove(&run) {
                return Ok(done);
            }
            if self.broken.load(Ordering::SeqCst) {
                state.posted.retain(|posted| posted.run != run);
                return Err(broken());
            }
            if state.posted.len() == state.live {
                state = self.run_posted(state);
                continue;
            }
            state = self.changed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Runs every posted job (all live runs are waiting), compatible jobs stacked, posts the
    /// outcomes and wakes the runs.
    fn run_posted<'g>(&'g self, mut state: MutexGuard<'g, State>) -> MutexGuard<'g, State> {
        let posted = std::mem::take(&mut state.posted);
        let mut decoders = std::mem::take(&mut state.stacked_decoders);
        let broken = BrokenOnPanic { engine: self };
        // The jobs run with the lock held: every run is waiting, none can post or leave.
        let outcomes = self.run_jobs(posted, &mut decoders);
        std::mem::forget(broken);
        state.stacked_decoders = decoders;
        state.outcomes.extend(outcomes);
        self.changed.notify_all();
        state
    }

    fn run_jobs(&self, posted: Vec<Posted>, decoders: &mut HashMap<Vec<(usize, Vec<u64>)>, DecodeModel>) -> Vec<(usize, Done<Outcome>)> {
        let mut samples = Vec::new();
        let mut scores = Vec::new();
        let mut trains = Vec::new();
        let mut outcomes = Vec::new();
        for Posted { run, job } in posted {
            match job {
                Job::Sample(job) => samples.push((run, job)),
                Job::Score(job) => scores.push((run, job)),
                Job::Train(job) => trains.push((run, job)),
                // The seat runs them alone, at once (`Seat::alone`): never posted here.
                own => unreachable!("a {} job waited at the rendezvous", own.kind()),
            }
        }
        let same_call = |a: &SampleJob, b: &SampleJob| a.prompts.len() == b.prompts.len() && a.params == b.params;
        for group in groups(samples, same_call) {
            outcomes.extend(alone_or(group, Job::Sample, |group| sample_group(group, decoders)));
        }
        for group in groups(scores, |a, b| rows(a.generation) == rows(b.generation)) {
            outcomes.extend(alone_or(group, Job::Score, score_group));
        }
        for group in groups(trains, |a, b| a.batch.loss_mask.size()[0] == b.batch.loss_mask.size()[0]) {
            outcomes.extend(alone_or(group, Job::Train, train_group));
        }
        outcomes
    }
}

/// Marks the engine broken (and wakes the runs) if running the jobs panics.
struct BrokenOnPanic<'a> {
    engine: &'a Engine,
}

impl Drop for BrokenOnPanic<'_> {
    fn drop(&mut self) {
        // Only reached while unwinding (forgotten otherwise), with the lock held: the waiting
        // runs wake once the unwinding releases it (poisoned) and find the flag.
        self.engine.broken.store(true, Ordering::SeqCst);
        self.engine.changed.notify_all();
    }
}

fn rows(generation: &Generation) -> i64 {
    generation.completion_ids.size()[0]
}

/// A group of one job run alone ([`run_alone`]), or a larger group by `stacked`.
fn alone_or<'a, J>(mut group: Vec<(usize, J)>, job: fn(J) -> Job<'a>, stacked: impl FnOnce(Vec<(usize, J)>) -> Vec<(usize, Done<Outcome>)>) -> Vec<(usize, Done<Outcome>)> {
    match group.len() {
        1 => {
            let (run, only) = group.pop().expect("one job");
            vec![(run, run_alone(job(only)))]
        }
        _ => stacked(group),
    }
}

/// `jobs` in groups of mutually compatible ones, in order of first appearance.
fn groups<J>(jobs: Vec<(usize, J)>, compatible: impl Fn(&J, &J) -> bool) -> Vec<Vec<(usize, J)>> {
    let mut groups: Vec<Vec<(usize, J)>> = Vec::new();
    for (run, job) in jobs {
        match groups.iter_mut().find(|group| compatible(&group[0].1, &job)) {
            Some(group) => group.push((run, job)),
            None => groups.push(vec![(run, job)]),
        }
    }
    groups
}

/// A scoring job computed alone: the native scorer where the seat gave the job one (the
/// reference on the CPU in float32: the same function up to float rounding, several times
/// faster), libtorch elsewhere.
fn score_alone(job: &ScoreJob) -> Result<Tensor> {
    match job.native {
        Some(native) => {
            let threads = tch::get_num_threads().max(1) as usize;
            native::frozen_logprobs(native, job.generation, job.temperature, threads)
        }
        None => Ok(frozen_logprobs(job.model, job.generation.into(), job.temperature, job.ctl)),
    }
}

/// A run's place at the engine (see the module's documentation). Dropping it leaves the
/// engine, which then stops waiting for this run.
pub struct Seat {
    engine: Arc<Engine>,
    run: usize,
    /// Whether this run holds one of the engine's worker permits.
    working: bool,
    /// The precision the run's decoders sample in (the reference and old policies score in the
    /// model's own).
    sampler_dtype: SamplerDtype,
    /// The run's decoders, one per set of adapter scales it samples at, refolded from the
    /// weights before each use. They live as long as the run, so CUDA graphs captured in the
    /// first step are replayed in every later one.
    decoders: Vec<(Vec<f64>, DecodeModel)>,
    /// The reference policy's weights for the native scorer, built at the first reference job
    /// (the reference never changes: a frozen copy, or base weights with adapters off); `None`
    /// inside where the native scorer does not serve the device and dtype.
    reference: Option<Option<DecodeModel>>,
    /// The run's sampler thread, once it samples ahead (off-policy training).
    ahead: Option<AheadSampler>,
    /// A test hook: decoders are no longer refreshed, as if the update never reached them.
    broken_refresh: bool,
    /// Seconds spent setting samplers up (folding the weights, refreshing and checking the
    /// sampler's copy) since [`Seat::take_setup_seconds`] last took them.
    setup_seconds: f64,
}

/// A generation [`Seat::sample`] handed out, with the fingerprint of the weights that sampled
/// it ([`crate::model::folded::FoldedWeights::fingerprints`]): the two travel together, so a
/// batch is logged with its own sampler's weights.
pub struct Sampled {
    pub generation: Generation,
    pub fingerprint: f64,
}

impl Seat {
    /// Waits for a turn to work (at most `workers` runs work at once); a run's thread calls it
    /// before its first step.
    pub fn start_working(&mut self) {
        start_working(&self.engine, &mut self.working);
    }

    /// Whether passes over whole models are stacked with other runs' at this engine, which
    /// more than one run has joined (a run that does its own passes says so in its log).
    pub fn stacks_passes_in_a_pack(&self, model: &Llama) -> bool {
        self.engine.stacks_passes(model) && self.engine.lock().next_run > 1
    }

    /// A test hook: from now on the run's decoders and sampler-thread snapshots are not
    /// refreshed from the policy's weights, which the weight-delivery check must catch.
    #[doc(hidden)]
    pub fn break_weight_refresh_for_tests(&mut self) {
        self.broken_refresh = true;
    }

    /// Runs seated at this engine so far (a pack seats all its runs before any starts): the
    /// memory planner shares the device among them.
    pub fn runs(&self) -> usize {
        self.engine.lock().next_run
    }

    /// Samples in `dtype` from now on (set before the first sample: decoders are kept).
    pub fn set_sampler_dtype(&mut self, dtype: SamplerDtype) {
        assert!(self.decoders.is_empty() && self.ahead.is_none(), "the sampler dtype is set before the run's first sample");
        self.sampler_dtype = dtype;
    }

    /// The decoders the run holds: one per set of adapter scales it has sampled at, for its life.
    pub fn decoders(&self) -> usize {
        self.decoders.len()
    }

    /// Samples `prompts` from the policy `model` at adapter `scales` (with the run's decoder
    /// for those scales, refolded from the current weights); the generation comes with the
    /// fingerprint of the weights that sampled it.
    pub fn sample(&mut self, model: &Llama, scales: &[f64], prompts: &[Vec<u32>], params: &SamplingParams, seed: u64) -> Result<Done<Sampled>> {
        let (index, fingerprint, fold_seconds) = self.refreshed_decoder(model, scales)?;
        let decoder = &self.decoders[index].1;
        let stacks = self.engine.stacks_sampling(decoder);
        let job = Job::Sample(SampleJob { decoder, scales, prompts, params, seed });
        let done = run_job(&self.engine, self.run, &mut self.working, stacks, job)?;
        match done.value {
            Outcome::Sample(value) => Ok(Done { value: Sampled { generation: value?, fingerprint }, seconds: done.seconds + fold_seconds, runs: done.runs }),
            _ => unreachable!("a sample job's outcome"),
        }
    }

    /// The run's decoder at `scales`, refreshed and checked as [`Seat::sample`]'s, and the
    /// fingerprint of the weights it holds, for the multi-turn episodes of `train/episodes.rs`
    /// (never stacked: in a pack each run decodes its episodes alone, turn by turn, as its
    /// environment answers).
    pub fn decoder(&mut self, model: &Llama, scales: &[f64]) -> Result<(&DecodeModel, f64)> {
        let (index, fingerprint, _) = self.refreshed_decoder(model, scales)?;
        Ok((&self.decoders[index].1, fingerprint))
    }

    /// The index of the run's decoder at `scales` (made at the first call with them), refreshed
    /// from `model` and its weights checked; their fingerprint; and the seconds it took.
    fn refreshed_decoder(&mut self, model: &Llama, scales: &[f64]) -> Result<(usize, f64, f64)> {
        let dtype = self.sampler_dtype;
        let (delivered, setup_seconds) = timed(1, || -> Result<(usize, f64)> {
            let fresh = FoldedWeights::new(model, scales);
            match self.decoders.iter().position(|(at, _)| at == scales) {
                Some(index) => Ok((index, super::delivery::delivered(self.decoders[index].1.deliver(fresh, !self.broken_refresh), "the run's sampler")?)),
                None => {
                    let decoder = DecodeModel::from_folded(fresh, model.device, model.kind, dtype);
                    let fingerprint = decoder.delivered_fingerprint();
                    self.decoders.push((scales.to_vec(), decoder));
                    Ok((self.decoders.len() - 1, fingerprint))
                }
            }
        });
        let (index, fingerprint) = delivered?;
        self.setup_seconds += setup_seconds;
        Ok((index, fingerprint, setup_seconds))
    }

    /// Starts sampling `prompts` ahead, on the run's sampler thread, from the policy `model`
    /// as its weights are now (a snapshot), at adapter `scales`; returns the snapshot's
    /// fingerprint. Never stacked: the thread works while the run trains.
    pub fn sample_ahead(&mut self, model: &Llama, scales: &[f64], prompts: Vec<Vec<u32>>, params: SamplingParams, seed: u64) -> Result<f64> {
        self.post_ahead(model, scales, Work::Sample { prompts, params, seed })
    }

    /// [`Seat::sample_ahead`] of a job that plays its rows itself (`play`: a run's multi-turn
    /// episodes, with the thread's instance of its environment), given the snapshot's decoder.
    pub fn play_ahead(&mut self, model: &Llama, scales: &[f64], play: Play) -> Result<f64> {
        self.post_ahead(model, scales, Work::Play(play))
    }

    fn post_ahead(&mut self, model: &Llama, scales: &[f64], work: Work) -> Result<f64> {
        let broken_refresh = self.broken_refresh;
        let ahead = self.ahead.get_or_insert_with(AheadSampler::new);
        let (fingerprint, setup_seconds) = timed(1, || ahead.post(model, scales, self.sampler_dtype, work, broken_refresh));
        self.setup_seconds += setup_seconds;
        fingerprint
    }

    /// The oldest generation [`Seat::sample_ahead`] started, waiting for it if need be.
    pub fn take_ahead(&mut self) -> Result<Ahead> {
        self.ahead.as_mut().context("internal error: no generation was sampled ahead")?.take()
    }

    /// Seconds spent setting the run's samplers up (folding the policy's weights, refreshing
    /// and checking each sampler's copy) since the last call: part of
    /// [`Seat::sample`]'s seconds, and outside the sampler thread's with [`Seat::sample_ahead`].
    pub fn take_setup_seconds(&mut self) -> f64 {
        std::mem::take(&mut self.setup_seconds)
    }

    /// The reference log-probabilities of a run's completions (the native scorer where it
    /// serves). Under mixed precision (`train_dtype`) the reference pass rounds its products
    /// as the policy's do (TRL's `bf16=True` runs its reference under the same autocast), so the
    /// float32 native scorer does not serve it: a float32 reference against a bfloat16 policy
    /// would put the policy's rounding into the KL term.
    pub fn reference<'a>(&'a mut self, mut job: ScoreJob<'a>) -> Result<Done<Tensor>> {
        let (model, ctl) = (job.model, job.ctl);
        let reference = self.reference.get_or_insert_with(|| {
            assert!(ctl.iter().all(AdapterCtl::is_off), "the reference policy has every adapter off");
            let native = model.autocast.is_none() && DecodeModel::native_available(model.device, model.kind);
            native.then(|| DecodeModel::new(model, &vec![0.0; ctl.len()]))
        });
        job.native = reference.as_ref().and_then(DecodeModel::native);
        score(&self.engine, self.run, &mut self.working, job)
    }

    /// The old policy's log-probabilities of a run's completions (the policy before the
    /// rollout's updates, with the batch's routed adapter controls): libtorch, whose per-row
    /// controls the native scorer does not have; stacked with other runs' scoring passes where
    /// passes stack.
    pub fn old_logprobs(&mut self, job: ScoreJob<'_>) -> Result<Done<Tensor>> {
        score(&self.engine, self.run, &mut self.working, job)
    }

    /// One forward and backward pass of a run's loss: its gradients land in its parameters.
    pub fn train(&mut self, job: TrainJob<'_>) -> Result<Done<BackwardPass>> {
        let stacks = self.engine.stacks_passes(job.model);
        let done = run_job(&self.engine, self.run, &mut self.working, stacks, Job::Train(job))?;
        match done.value {
            Outcome::Train(value) => Ok(Done { value, seconds: done.seconds, runs: done.runs }),
            _ => unreachable!("a train job's outcome"),
        }
    }

    /// The run's own backward passes with its probes' hooks: its gradients land in its
    /// parameters (alone, at once).
    pub fn own_passes(&self, job: OwnPassesJob<'_>) -> Done<BackwardPass> {
        match self.alone(Job::OwnPasses(job)) {
            Done { value: Outcome::Train(value), seconds, runs } => Done { value, seconds, runs },
            _ => unreachable!("own passes' outcome"),
        }
    }

    /// The completions re-scored by the policy as it is now, no gradient (alone, at once).
    pub fn rescore(&self, job: RescoreJob<'_>) -> Done<TokenLogprobs> {
        match self.alone(Job::Rescore(job)) {
            Done { value: Outcome::Rescore(value), seconds, runs } => Done { value, seconds, runs },
            _ => unreachable!("a re-scoring job's outcome"),
        }
    }

    /// The sketches of the sequences' gradients (alone, at once).
    pub fn sketch(&self, job: SketchJob<'_>) -> Done<Tensor> {
        match self.alone(Job::Sketch(job)) {
            Done { value: Outcome::Sketch(value), seconds, runs } => Done { value, seconds, runs },
            _ => unreachable!("a sketch job's outcome"),
        }
    }

    /// A job that never stacks, counted and run on this thread now.
    fn alone(&self, job: Job<'_>) -> Done<Outcome> {
        self.engine.count(self.run, &job);
        run_alone(job)
    }

    /// The jobs this run handed the engine so far, by kind (`sample`, `score`, `train`,
    /// `own_passes`, `rescore`, `sketch`), sorted by kind.
    pub fn jobs(&self) -> Vec<(&'static str, usize)> {
        self.engine.lock().jobs.iter().filter(|((run, _), _)| *run == self.run).map(|((_, kind), count)| (*kind, *count)).collect()
    }
}

/// Runs a scoring job of `run` (see [`run_job`]).
fn score(engine: &Engine, run: usize, working: &mut bool, job: ScoreJob<'_>) -> Result<Done<Tensor>> {
    let stacks = engine.stacks_passes(job.model);
    let done = run_job(engine, run, working, stacks, Job::Score(job))?;
    match done.value {
        Outcome::Score(value) => Ok(Done { value: value?, seconds: done.seconds, runs: done.runs }),
        _ => unreachable!("a scoring job's outcome"),
    }
}

/// Takes one of the engine's worker permits (waiting for one), unless `working` already holds one.
fn start_working(engine: &Engine, working: &mut bool) {
    if *working {
        return;
    }
    let mut state = engine.lock();
    while state.permits == 0 {
        state = engine.changed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    state.permits -= 1;
    *working = true;
}

fn stop_working(engine: &Engine, working: &mut bool) {
    if *working {
        engine.lock().permits += 1;
        engine.changed.notify_all();
        *working = false;
    }
}

/// A job run by itself: the one place each kind of job has its solo implementation (a run
/// that does not stack, and a group of one at the rendezvous).
fn run_alone(job: Job) -> Done<Outcome> {
    let (value, seconds) = timed(1, || match job {
        Job::Sample(job) => Outcome::Sample(generate(job.decoder, job.prompts, job.params, job.seed)),
        Job::Score(job) => Outcome::Score(score_alone(&job)),
        Job::Train(job) => Outcome::Train(backward_micro_batches(job.model, &job.batch, job.temperature, job.objective, 1, &mut |_, _| {})),
        Job::OwnPasses(job) => Outcome::Train(backward_passes(job.model, &job.batch, job.temperature, job.objective, job.passes, job.before_backward, job.after_backward)),
        Job::Rescore(job) => Outcome::Rescore(tch::no_grad(|| completion_logprobs(job.model, job.seqs, job.temperature, job.ctl))),
        Job::Sketch(job) => Outcome::Sketch(sequence_gradient_sketches(job.model, job.seqs, job.counted, job.temperature, job.ctl, job.params, job.project)),
    });
    Done { value, seconds, runs: 1 }
}

/// Runs `job` of `run` now on this thread, or when it `stacks` at the rendezvous with the other
/// runs' jobs, giving up the run's worker permit while it waits.
fn run_job(engine: &Engine, run: usize, working: &mut bool, stacks: bool, job: Job<'_>) -> Result<Done<Outcome>> {
    engine.count(run, &job);
    if !stacks {
        return Ok(run_alone(job));
    }
    let was_working = *working;
    stop_working(engine, working);
    let done = engine.rendezvous(run, job);
    if was_working {
        start_working(engine, working);
    }
    done
}

impl Drop for Seat {
    fn drop(&mut self) {
        stop_working(&self.engine, &mut self.working);
        let mut state = self.engine.lock();
        state.live -= 1;
        // A stack holding this run is never used again: free it (and its CUDA graphs).
        let run = self.run;
        state.stacked_decoders.retain(|key, _| key.iter().all(|(r, _)| *r != run));
        // The runs still waiting may now be all the live ones: the last to leave runs them.
        if state.live > 0 && state.posted.len() == state.live {
            drop(self.engine.run_posted(state));
        }
    }
}
