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
use tch::Device;

use crate::model::generate::Generation;

/// The recorded rollout of optimizer step `step` (0-based), on `device`, after checking that its
/// prompts are `prompt_ids` (one per row, unpadded).
pub(super) fn generation(dir: &Path, step: usize, prompt_ids: &[Vec<u32>], device: Device) -> Result<Generation> {
    let file = recorded(dir, step);
    let generation = load(dir, step, device)?;
    let recorded_prompts = crate::model::batch::masked_rows(&generation.prompt_ids, &generation.prompt_mask)?;
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

/// The recorded rollout of optimizer step `step` (0-based), on `device`, its prompts unchecked:
/// an episode run checks them as it replays its episodes (`episode::replay_episodes`, which
/// knows the prompts as the model saw them, with their tools).
pub(super) fn load(dir: &Path, step: usize, device: Device) -> Result<Generation> {
    let file = recorded(dir, step);
    let tensors = crate::model::weights::read_safetensors(&file).with_context(|| format!("replay_rollouts: cannot read {}", file.display()))?;
    Generation::from_saved(&tensors, "", device)
        .with_context(|| format!("replay_rollouts: {} is not a rollout that can be replayed (dumps written before replays recorded ended_with_eos lack it)", file.display()))
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
pub(super) fn recorded(dir: &Path, step: usize) -> PathBuf {
    dir.join(format!("step-{}.safetensors", step + 1))
}
