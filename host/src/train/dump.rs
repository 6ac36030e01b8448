//! `dump_batches`: every step's tensors in `<dir>/step-<N>.safetensors`, enough to recompute the
//! step's loss outside smallrl (`tests/train/` does).

use std::path::Path;

use anyhow::{Context, Result};
use tch::Tensor;

use super::rollout::Rollout;

/// Writes `<dir>/step-<N>.safetensors` with everything needed to recompute the step's loss.
pub(super) fn write_step(dir: &Path, step: usize, rollout: &Rollout, logprobs: &Tensor, loss: &Tensor) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let g = &rollout.generation;
    let mut tensors: Vec<(String, Tensor)> = vec![
        ("prompt_ids".into(), g.prompt_ids.shallow_clone()),
        ("prompt_mask".into(), g.prompt_mask.shallow_clone()),
        ("completion_ids".into(), g.completion_ids.shallow_clone()),
        ("completion_mask".into(), g.completion_mask.shallow_clone()),
        ("loss_mask".into(), rollout.loss_mask.shallow_clone()),
        ("advantages".into(), rollout.advantages.shallow_clone()),
        ("sampling_logprobs".into(), g.sampling_logprobs.shallow_clone()),
        // Which rows stopped on EOS: with the tensors above, the generation `replay_rollouts`
        // trains on again (`Generation::from_saved`).
        ("ended_with_eos".into(), Tensor::from_slice(&g.rows.iter().map(|r| i64::from(r.ended_with_eos)).collect::<Vec<_>>())),
        ("new_logprobs".into(), logprobs.detach()),
        ("loss".into(), loss.detach()),
    ];
    // Episodes: 1 on the model's tokens, 0 on observation tokens (which the loss mask leaves out).
    tensors.extend(g.model_mask.iter().map(|t| ("model_mask".to_string(), t.shallow_clone())));
    // Sampling replay: the kept sets, read back by `Generation::from_saved`.
    tensors.extend(g.kept.iter().map(|t| ("kept".to_string(), t.shallow_clone())));
    tensors.extend(rollout.ref_logprobs.iter().map(|t| ("ref_logprobs".to_string(), t.shallow_clone())));
    tensors.extend(rollout.old_logprobs.iter().map(|t| ("old_logprobs".to_string(), t.shallow_clone())));
    tensors.extend(rollout.dump.iter().map(|(n, t)| (n.clone(), t.shallow_clone())));
    crate::model::weights::write_safetensors(&dir.join(format!("step-{step}.safetensors")), &tensors)
}
