//! Offline repair (`replay_rollouts`): a run that trains on a finished run's recorded rollouts
//! (the `step-<N>.safetensors` its `dump_batches` wrote) instead of sampling. Each batch is
//! scored by this run's reward and detector and its advantages made by this run's recipe (its
//! intervention: a filter, a penalty, verified-only, ...), so a run that hacked can be repaired
//! from its own rollouts with corrected advantages; the loss's ratio is taken to the recorded
//! sampler's log-probabilities, the policy that drew them, as with batches sampled ahead.
//!
//! Architecture invariant: a replayed step trains on the rows that step recorded and only if
//! their prompts are, token for token, the prompts this run draws for the step (the same
//! prompts, seed and batch keys), so a replay never pairs one step's completions with another
//! step's prompts.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use tch::{Device, Kind};

use crate::model::generate::Generation;

/// The recorded rollout of optimizer step `step` (0-based), on `device`, after checking that its
/// prompts are `prompt_ids` (one per row, unpadded).
pub(super) fn generation(dir: &Path, step: usize, prompt_ids: &[Vec<u32>], device: Device) -> Result<Generation> {
    let file = recorded(dir, step);
    let tensors = crate::model::weights::read_safetensors(&file).with_context(|| format!("replay_rollouts: cannot read {}", file.display()))?;
    let generation = Generation::from_saved(&tensors, "", device).with_context(|| {
        format!("replay_rollouts: {} is not a rollout that can be replayed (dumps written before replays recorded ended_with_eos lack it)", file.display())
    })?;
    let recorded_prompts = unpadded_prompts(&generation)?;
    ensure!(
        recorded_prompts.len() == prompt_ids.len(),
        "replay_rollouts: {} holds {} completions where step {} of this run draws {}: replay with the recorded run's batch_size, num_generations and coherence rows",
        file.display(),
        recorded_prompts.len(),
        step + 1,
        prompt_ids.len()
    );
    if let Some(row) = recorded_prompts.iter().zip(prompt_ids).position(|(recorded, drawn)| recorded != drawn) {
        anyhow::bail!(
            "replay_rollouts: row {row} of {} was sampled from another prompt than the one step {} of this run draws: replay with the recorded run's prompts, seed and batch keys",
            file.display(),
            step + 1
        );
    }
    Ok(generation)
}

/// Each recorded rollout a run of `max_steps` steps reads, rollouts starting every
/// `steps_per_rollout` steps: all must be there before the run starts.
pub fn check_recorded(dir: &Path, max_steps: usize, steps_per_rollout: usize) -> Result<()> {
    for step in (0..max_steps).step_by(steps_per_rollout) {
        let file = recorded(dir, step);
        ensure!(
            file.is_file(),
            "replay_rollouts: {} is missing: the directory must hold the dump_batches of a run of at least {max_steps} steps (step {} starts a rollout)",
            file.display(),
            step + 1
        );
    }
    Ok(())
}

/// The file `dump_batches` wrote for optimizer step `step` (0-based).
fn recorded(dir: &Path, step: usize) -> PathBuf {
    dir.join(format!("step-{}.safetensors", step + 1))
}

/// Each row's prompt ids without its left padding.
fn unpadded_prompts(generation: &Generation) -> Result<Vec<Vec<u32>>> {
    let ids = Vec::<Vec<i64>>::try_from(generation.prompt_ids.to_device(Device::Cpu).to_kind(Kind::Int64))?;
    let mask = Vec::<Vec<i64>>::try_from(generation.prompt_mask.to_device(Device::Cpu).to_kind(Kind::Int64))?;
    Ok(ids.iter().zip(&mask).map(|(row, keep)| row.iter().zip(keep).filter(|(_, k)| **k == 1).map(|(id, _)| *id as u32).collect()).collect())
}
