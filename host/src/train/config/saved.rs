//! A run's saved configuration (`config.yaml`) read back, and what differs from a fresh
//! resolution: runs started before a key existed read back as they ran; and a saved run
//! extended (`--extend-schedule`).

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::{Map, Value};

use super::TrainConfig;
use crate::grpo::SamplingReplay;

/// Steps `0..until_step` of a run were trained with the linear schedule over `max_steps`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrHorizon {
    pub until_step: usize,
    pub max_steps: usize,
}

/// The key of [`TrainConfig::sampling_replay`] in config.yaml.
const SAMPLING_REPLAY: &str = "sampling_replay";

impl TrainConfig {
    /// A run directory's resolved configuration (`config.yaml`, written when the run started).
    pub fn read_saved(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join("config.yaml");
        ensure!(path.exists(), "{} has no config.yaml: is it a smallrl run directory?", run_dir.display());
        Self::resolve_saved(&path, Map::new()).with_context(|| format!("cannot read the run configuration {}", path.display()))
    }

    /// A run's saved configuration (`config.yaml`) with `overrides`. A run started before
    /// `sampling_replay` existed compared the full softmax with the sampler's
    /// log-probabilities: if it sampled with truncation it reads back (and resumes) as
    /// `trl_1_16`; without truncation the key changes nothing, so it keeps the default and the
    /// run keeps its name.
    pub fn resolve_saved(path: &Path, mut overrides: Map<String, Value>) -> Result<Self> {
        let saved: Map<String, Value> = crate::yaml::read_file(path)?;
        let fresh = Self::resolve(Some(path), overrides.clone())?;
        if !saved.contains_key(SAMPLING_REPLAY) && fresh.sampling_truncates() {
            overrides.insert(SAMPLING_REPLAY.into(), serde_json::to_value(SamplingReplay::Trl116)?);
            return Self::resolve(Some(path), overrides);
        }
        Ok(fresh)
    }

    /// Whether sampling truncates (`top_k` or `top_p`), so that `sampling_replay` matters.
    pub fn sampling_truncates(&self) -> bool {
        self.top_k > 0 || self.top_p < 1.0
    }

    /// This run continued to `max_steps` from a checkpoint at `resume_step`: the steps before
    /// it keep the horizon they were trained with. Only a longer run is an extension.
    pub fn extended(&self, max_steps: usize, resume_step: usize) -> Result<Self> {
        ensure!(
            max_steps > self.max_steps,
            "--max-steps {max_steps} with --extend-schedule: a run can only be extended past its max_steps ({})",
            self.max_steps
        );
        let per_rollout = self.steps_per_rollout();
        ensure!(
            resume_step % per_rollout == 0,
            "the checkpoint at step {resume_step} is inside a rollout of num_iterations * num_substeps = {per_rollout} steps, whose batch no checkpoint keeps: only runs whose max_steps is a multiple of {per_rollout} can be extended"
        );
        let mut lr_horizons = self.lr_horizons.clone();
        lr_horizons.retain(|h| h.until_step < resume_step);
        lr_horizons.push(LrHorizon { until_step: resume_step, max_steps: self.max_steps });
        let extended = Self { max_steps, lr_horizons, ..self.clone() };
        extended.validate()?;
        Ok(extended)
    }
}
