//! Packed runs: several runs of one architecture trained by one process, in lockstep. Each run
//! is a whole solo [`Trainer`] (its own weights or adapters, optimizer state, clipping, random
//! streams, reward plugins, `metrics.jsonl`, evaluations and checkpoints), so a packed run's
//! directory is exactly a solo run's and `eval`, `sweep --collect`, `--resume` and export read
//! it unchanged. The pack advances every live run by one [`Trainer::advance`] per round; a run
//! that fails (a plugin error, a non-finite loss) records why in its train.log and leaves the
//! pack, the others go on.
//!
//! What this is not (yet): the runs' tensors are not stacked on a leading axis, so each run
//! still costs its own matmuls; packing saves the per-process start-up (libtorch, model load,
//! plugin compilation) and keeps one sweep in one process. The architecture check below is the
//! contract a stacked model needs (equal shapes), so a pack accepted now stays valid then.

use std::path::PathBuf;

use anyhow::{Result, bail};
use serde_json::Value;

use super::{RunSummary, TrainConfig, Trainer};

/// Keys that fix a run's tensor shapes and its schedule of steps: packed runs must agree on
/// every one (they may differ in anything else: seed, learning rate, KL coefficient, loss and
/// routing settings, rewards, detectors).
pub const SAME_IN_A_PACK: &[&str] = &[
    "model",
    "revision",
    "adapter",
    "lora_preset",
    "mlp_config",
    "retain_rank",
    "forget_rank",
    "lora_rank",
    "lora_alpha",
    "layer_stride",
    "dtype",
    "device",
    "threads",
    "prompt_length",
    "batch_size",
    "num_generations",
    "max_completion_length",
    "gradient_accumulation_steps",
    "num_iterations",
    "max_steps",
];

/// One run of a pack: a configuration, and the run directory it resumes (if any).
pub struct PackedRun {
    pub config: TrainConfig,
    pub resume: Option<PathBuf>,
}

/// Refuses, before any work, runs that differ in a key of [`SAME_IN_A_PACK`], naming the key,
/// both values and what to do.
pub fn check_packable(configs: &[&TrainConfig]) -> Result<()> {
    let Some((first, rest)) = configs.split_first() else { return Ok(()) };
    let first_keys = serde_json::to_value(first)?;
    for other in rest {
        let other_keys = serde_json::to_value(other)?;
        for &key in SAME_IN_A_PACK {
            let (a, b) = (first_keys.get(key).unwrap_or(&Value::Null), other_keys.get(key).unwrap_or(&Value::Null));
            if a != b {
                bail!(
                    "packed runs must share their architecture and shapes, but `{key}` is {a} in run {} and {b} in run {}; \
                     drop --pack, or sweep `{key}` in separate sweeps (keys packed runs must share: {})",
                    first.run_name()?,
                    other.run_name()?,
                    SAME_IN_A_PACK.join(", ")
                );
            }
        }
    }
    Ok(())
}

/// Trains the runs together, in lockstep, each to its `max_steps` (or `stop_after` steps from
/// where it starts, for tests of resumption). Returns each run's outcome in the given order:
/// a run that cannot start or fails at a step is an `Err` (recorded in its train.log once its
/// directory exists); the others are unaffected.
pub fn train_packed(runs: Vec<PackedRun>, stop_after: Option<usize>) -> Result<Vec<Result<RunSummary>>> {
    check_packable(&runs.iter().map(|r| &r.config).collect::<Vec<_>>())?;
    let mut members: Vec<Member> = runs
        .into_iter()
        .map(|run| match Trainer::start(run.config, run.resume.as_deref(), false) {
            Ok(trainer) => {
                let end = trainer.end_step(stop_after);
                trainer.log.progress(trainer.optimizer.step as u64, String::new());
                Member::Training { trainer: Box::new(trainer), end }
            }
            Err(error) => Member::Done(Err(error)),
        })
        .collect();
    while members.iter().any(Member::is_training) {
        for member in &mut members {
            member.advance();
        }
    }
    Ok(members.into_iter().map(Member::outcome).collect())
}

enum Member {
    Training { trainer: Box<Trainer>, end: usize },
    Done(Result<RunSummary>),
}

impl Member {
    fn is_training(&self) -> bool {
        matches!(self, Member::Training { .. })
    }

    /// One step of a training run (or its end once it reached its last step); a failure is
    /// logged to its train.log, and the trainer (its lock included) is dropped.
    fn advance(&mut self) {
        let Member::Training { trainer, end } = self else { return };
        if trainer.optimizer.step >= *end {
            trainer.log.finish();
            *self = Member::Done(Ok(RunSummary { run_dir: trainer.run_dir.clone(), steps: *end }));
            return;
        }
        let outcome = trainer.advance();
        if let Err(error) = trainer.log_failure(outcome) {
            *self = Member::Done(Err(error));
        }
    }

    fn outcome(self) -> Result<RunSummary> {
        match self {
            Member::Done(outcome) => outcome,
            Member::Training { .. } => unreachable!("the pack loop ends when no run is training"),
        }
    }
}
