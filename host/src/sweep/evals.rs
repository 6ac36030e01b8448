//! A run's routing evaluations as the charts and the arms table read them: (step, mode, task
//! reward, total reward, hack frequency), from the training-time evaluations or from
//! `smallrl eval --all-checkpoints`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use super::RunEntry;
use crate::eval::{self, key as eval_key};
use crate::reward::Role;
use crate::runlog::Jsonl;

/// One evaluation of one mode of one run: [task reward, total reward, hack frequency].
pub type ModeValues = [Option<f64>; 3];

/// Where a run's evaluations are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalSource {
    /// `routing_eval.jsonl`: the evaluations the run made while training (every `eval_every`).
    Training,
    /// `eval_checkpoints.csv`: `smallrl eval RUN --all-checkpoints` (every checkpoint).
    Checkpoints,
}

impl EvalSource {
    pub fn path(self, entry: &RunEntry) -> PathBuf {
        match self {
            Self::Training => entry.dir.join("routing_eval.jsonl"),
            Self::Checkpoints => entry.dir.join(eval::CHECKPOINTS_CSV),
        }
    }

    /// The checkpoints' evaluations when every run has them, else the training-time ones (a
    /// chart never mixes the two: they differ in steps and in samples per mode).
    pub fn of_runs(runs: &[&RunEntry]) -> Self {
        match !runs.is_empty() && runs.iter().all(|r| Self::Checkpoints.path(r).is_file()) {
            true => Self::Checkpoints,
            false => Self::Training,
        }
    }
}

/// Every (step, mode, values) in a run's evaluations from `source`.
pub fn run_evaluations(entry: &RunEntry, source: EvalSource) -> Result<Vec<(usize, String, ModeValues)>> {
    let path = source.path(entry);
    let weights = task_weights(entry)?;
    let lines = match source {
        EvalSource::Training => Jsonl::new(path.clone()).read()?,
        EvalSource::Checkpoints => eval::read_checkpoints_csv(&path)?,
    };
    let mut out = Vec::new();
    for line in lines {
        let step = line[eval_key::STEP].as_u64().with_context(|| format!("{}: a line has no step", path.display()))? as usize;
        let modes = line[eval_key::MODES].as_object().with_context(|| format!("{}: step {step} has no `modes`", path.display()))?;
        for (mode, values) in modes {
            out.push((step, mode.clone(), mode_values(values, &weights, &path, step)?));
        }
    }
    Ok(out)
}

/// One mode's values (as a `routing_eval.jsonl` line holds them) read as [`ModeValues`]; `path`
/// and `step` name where they came from in errors.
pub fn mode_values(values: &Value, weights: &[(String, f64)], path: &Path, step: usize) -> Result<ModeValues> {
    let task = weights.iter().map(|(name, scale)| component(values, name, path, step).map(|v| scale * v)).sum::<Result<f64>>()?;
    Ok([Some(task), values[eval_key::REWARD].as_f64(), values[eval_key::HACK_FREQ].as_f64()])
}

fn component(values: &Value, name: &str, path: &Path, step: usize) -> Result<f64> {
    values[name].as_f64().with_context(|| format!("{}: step {step} lacks reward component `{name}` named in the run's config.yaml", path.display()))
}

/// (component name, scale) of the retain components: the task part of the reward.
pub fn task_weights(entry: &RunEntry) -> Result<Vec<(String, f64)>> {
    if entry.config.environment.is_some() {
        // An environment declares its components (each of scale 1): load it to read them.
        let rewards = crate::train::task::rewards(&entry.config).with_context(|| format!("{}: the run's environment", entry.dir.display()))?;
        return Ok(rewards.components().iter().filter(|c| c.role == Role::Retain).map(|c| (c.name.clone(), c.scale)).collect());
    }
    let reward = entry.config.reward.as_ref().with_context(|| format!("{}: the run has no reward configuration", entry.dir.display()))?;
    let specs = reward.component_specs();
    Ok(specs.iter().filter(|c| c.role == Role::Retain).map(|c| (c.display_name(), c.scale)).collect())
}

