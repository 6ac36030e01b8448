//! A run directory's files while the run holds it: the lock, train.log, the live views
//! (TensorBoard, the completions log) and the metrics and evaluation records.

use std::path::PathBuf;

use anyhow::Result;

use super::TrainConfig;
use super::live::LiveLogs;
use crate::rundir;
use crate::runlog::{Jsonl, RunLog};

pub(super) struct RunFiles {
    pub dir: PathBuf,
    pub log: RunLog,
    pub live: LiveLogs,
    pub metrics: Jsonl,
    pub evals: Jsonl,
    /// Held for the run's life: no second process writes this run directory.
    _lock: std::fs::File,
}

impl RunFiles {
    /// Locks the run directory `dir` (already claimed or resumed) and opens its logs.
    pub fn open(dir: PathBuf, cfg: &TrainConfig) -> Result<Self> {
        let _lock = rundir::lock(&dir)?;
        let log = RunLog::open(&dir, cfg.max_steps as u64)?;
        let live = LiveLogs::open(&dir, cfg.tensorboard, cfg.log_completions)?;
        let (metrics, evals) = (Jsonl::new(dir.join("metrics.jsonl")), Jsonl::new(dir.join("routing_eval.jsonl")));
        Ok(Self { dir, log, live, metrics, evals, _lock })
    }

    /// Records in train.log why the run stopped (the full error, bounded), then returns it.
    pub fn log_failure<T>(&mut self, outcome: Result<T>) -> Result<T> {
        if let Err(error) = &outcome {
            let text = crate::plugins::text::bounded(&format!("{error:#}"), MAX_LOGGED_ERROR_BYTES);
            // The error is what the user needs; a log that cannot be written must not hide it.
            if let Err(log_error) = self.log.line(&format!("training stopped: {text}")) {
                eprintln!("warning: {log_error:#}");
            }
        }
        outcome
    }
}

/// The most of an error that train.log keeps (plugin-supplied parts are already bounded).
const MAX_LOGGED_ERROR_BYTES: usize = 64 << 10;
