//! Sampling ahead: the asynchronous sampler of off-policy training (`max_steps_off_policy`).
//! A run's sampler thread decodes from a snapshot of the policy's weights (a decoder folded
//! from them when the job is posted) while the run trains, and hands the generations back in
//! the order they were asked for.
//!
//! A job either samples prompts (`generate`) or plays them ([`Play`]: a caller's closure given
//! the snapshot's decoder; a run on an episode environment plays a chunk's episodes with the
//! thread's own instance of the environment, `train/episodes.rs`), whose other output comes
//! back beside the generation, type-erased (`engine` knows no episodes).
//!
//! Architecture invariant: a job's generation depends only on its snapshot, prompts, settings
//! and seed (and a played job's environment, whose answers are functions of their inputs),
//! never on when the thread runs it, so a run with the sampler ahead is
//! reproducible (and resumable: the run saves what it has not taken yet). On CUDA the thread
//! decodes eagerly (no graph capture while the training thread launches kernels).

use std::any::Any;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};

use super::Done;
use crate::model::Llama;
use crate::model::decode::DecodeModel;
use crate::model::folded::{FoldedWeights, SamplerDtype};
use crate::model::generate::{Decoder, Generation, SamplingParams, default_decoder, generate_with};

/// What a job's caller gets back beside the generation it played (downcast by the caller).
pub type Extra = Box<dyn Any + Send>;

/// A job that plays its rows itself with the decoder it is given (the snapshot's, and how to
/// decode with it), returning the generation and what else the caller needs back.
pub type Play = Box<dyn FnOnce(Decoder, &DecodeModel) -> Result<(Generation, Extra)> + Send>;

/// What the thread does with a job's snapshot.
pub enum Work {
    /// Samples `prompts` (as `generate` does).
    Sample { prompts: Vec<Vec<u32>>, params: SamplingParams, seed: u64 },
    Play(Play),
}

struct Job {
    decoder: DecodeModel,
    scales: Vec<f64>,
    work: Work,
}

struct Finished {
    generation: Result<(Generation, Option<Extra>)>,
    decoder: DecodeModel,
    scales: Vec<f64>,
    /// Seconds the thread decoded this job, and sat idle before it.
    seconds: f64,
    idle_seconds: f64,
}

/// A generation sampled ahead (with a [`Work::Play`] job's other output), the time the thread
/// spent on it, and the time the thread had waited for the job (the sampler waiting for weights).
pub struct Ahead {
    pub done: Done<Generation>,
    pub extra: Option<Extra>,
    pub sampler_idle_seconds: f64,
}

/// A run's sampler thread and its queue of jobs (see the module's documentation).
pub struct AheadSampler {
    jobs: Option<Sender<Job>>,
    finished: Receiver<Finished>,
    thread: Option<JoinHandle<()>>,
    /// Decoders of finished jobs, refolded for the next ones (their buffers reused).
    spare: Vec<(Vec<f64>, DecodeModel)>,
    posted: usize,
}

impl AheadSampler {
    pub fn new() -> Self {
        let (jobs, inbox) = channel::<Job>();
        let (outbox, finished) = channel::<Finished>();
        let thread = std::thread::spawn(move || {
            let mut idle_since = Instant::now();
            while let Ok(job) = inbox.recv() {
                let idle_seconds = idle_since.elapsed().as_secs_f64();
                let started = Instant::now();
                let decoding = match job.decoder.device.is_cuda() {
                    true => Decoder::Libtorch,
                    false => default_decoder(&job.decoder),
                };
                let generation = match job.work {
                    Work::Sample { prompts, params, seed } => generate_with(decoding, &job.decoder, &prompts, &params, seed).map(|generation| (generation, None)),
                    Work::Play(play) => play(decoding, &job.decoder).map(|(generation, extra)| (generation, Some(extra))),
                };
                let finished = Finished { generation, decoder: job.decoder, scales: job.scales, seconds: started.elapsed().as_secs_f64(), idle_seconds };
                idle_since = Instant::now();
                if outbox.send(finished).is_err() {
                    return;
                }
            }
        });
        Self { jobs: Some(jobs), finished, thread: Some(thread), spare: Vec::new(), posted: 0 }
    }

    /// Posts a job: its `work` done in `dtype` with `model` as its weights are now, at adapter
    /// `scales` (`broken_refresh`: the test hook of [`super::Seat`], a spare decoder is not
    /// refreshed). Returns the fingerprint of the snapshot, checked against the weights folded now.
    pub fn post(&mut self, model: &Llama, scales: &[f64], dtype: SamplerDtype, work: Work, broken_refresh: bool) -> Result<f64> {
        // A native decoder copies what it reads; a libtorch one keeps the fold, whose views of
        // the model's embeddings and norms the training thread updates while this job decodes.
        let fresh = match DecodeModel::native_available(model.device, model.kind) {
            true => FoldedWeights::new(model, scales),
            false => FoldedWeights::new(model, scales).owned(),
        };
        let (decoder, fingerprint) = match self.spare.iter().position(|(at, _)| at == scales) {
            Some(index) => {
                let (_, mut decoder) = self.spare.swap_remove(index);
                let fingerprint = super::delivery::delivered(decoder.deliver(fresh, !broken_refresh), "the run's sampler thread")?;
                (decoder, fingerprint)
            }
            None => {
                let decoder = DecodeModel::from_folded(fresh, model.device, model.kind, dtype);
                let fingerprint = decoder.delivered_fingerprint();
                (decoder, fingerprint)
            }
        };
        let job = Job { decoder, scales: scales.to_vec(), work };
        self.jobs.as_ref().expect("the sampler thread runs until dropped").send(job).map_err(|_| anyhow!("the sampler thread stopped (it panicked)"))?;
        self.posted += 1;
        Ok(fingerprint)
    }

    /// The oldest job's generation, waiting for it if the thread has not finished it.
    pub fn take(&mut self) -> Result<Ahead> {
        anyhow::ensure!(self.posted > 0, "internal error: a generation taken from the sampler thread that was never asked for");
        let finished = self.finished.recv().context("the sampler thread stopped (it panicked)")?;
        self.posted -= 1;
        self.spare.push((finished.scales, finished.decoder));
        let (generation, extra) = finished.generation?;
        Ok(Ahead { done: Done { value: generation, seconds: finished.seconds, runs: 1 }, extra, sampler_idle_seconds: finished.idle_seconds })
    }
}

impl Drop for AheadSampler {
    fn drop(&mut self) {
        // Closing the queue ends the thread after its current job.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
