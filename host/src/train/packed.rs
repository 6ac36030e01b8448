//! Packed runs: several runs of one architecture trained by one process. Each run is a whole
//! solo [`Trainer`] (its own weights or adapters, optimizer state, clipping, random streams,
//! reward plugins, `metrics.jsonl`, evaluations and checkpoints), so a packed run's directory is
//! exactly a solo run's and `eval`, `sweep --collect`, `--resume` and export read it unchanged.
//! Each run steps on its own thread through the one step path a solo run takes
//! ([`Trainer::train`]); the runs share an [`Engine`], which samples, scores and trains their
//! jobs, stacked on a leading run axis where that is faster ([`Stacking`]), and decides so in
//! one place. A run that fails (a plugin error, a non-finite loss) records why in its train.log
//! and leaves the pack; the others go on.
//!
//! Architecture invariant: this module only checks which runs may share an engine and starts
//! their threads; it computes nothing of a run's and knows nothing of stacking.

use std::path::PathBuf;

use anyhow::{Result, bail};
use serde_json::Value;

use super::{RunSummary, TrainConfig, Trainer};
use crate::engine::Engine;
use crate::hyperparams::{Hyperparameters, Prop};

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

pub use crate::engine::Stacking;

/// How a pack runs; neither choice changes what a run computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackOptions {
    pub stacking: Stacking,
    /// Runs that work at once between the engine's jobs (plugin scoring, the optimizer; 1: one
    /// after another). Each run has its own thread either way.
    pub workers: usize,
}

impl Default for PackOptions {
    fn default() -> Self {
        Self { stacking: Stacking::Auto, workers: 1 }
    }
}

/// Trains the runs together, each to its `max_steps` (or `stop_after` steps from where it
/// starts, for tests of resumption), stacked where that is faster ([`Stacking::Auto`]), one run
/// working at a time between the engine's jobs. Returns each run's outcome in the given
/// order: a run that cannot start or fails at a step is an `Err` (recorded in its train.log
/// once its directory exists); the others are unaffected.
pub fn train_packed(runs: Vec<PackedRun>, stop_after: Option<usize>) -> Result<Vec<Result<RunSummary>>> {
    train_packed_with(runs, stop_after, PackOptions::default())
}

/// [`train_packed`] with the stacking and the worker threads chosen.
pub fn train_packed_with(runs: Vec<PackedRun>, stop_after: Option<usize>, options: PackOptions) -> Result<Vec<Result<RunSummary>>> {
    anyhow::ensure!(options.workers >= 1, "a pack needs at least one worker thread");
    check_packable(&runs.iter().map(|r| &r.config).collect::<Vec<_>>())?;
    let engine = Engine::new(options.stacking, options.workers);
    // Every run takes its seat before any run steps, so the engine waits for all of them; a
    // run that cannot start leaves at once. The seats are all taken first, so each run's memory
    // plan knows how many runs share the device.
    let seats: Vec<_> = runs.iter().map(|_| Engine::seat(&engine)).collect();
    let trainers: Vec<Result<Trainer>> = runs.into_iter().zip(seats).map(|(run, seat)| Trainer::start_seated(run.config, run.resume.as_deref(), false, seat)).collect();
    Ok(std::thread::scope(|scope| {
        // Each thread owns its run and drops it (leaving the engine) as soon as the run ends.
        let threads: Vec<_> = trainers.into_iter().map(|trainer| scope.spawn(move || trainer?.train(stop_after))).collect();
        threads.into_iter().map(|thread| thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    }))
}
