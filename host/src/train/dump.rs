//! `dump_batches`: every step's tensors in `<dir>/step-<N>.safetensors`, enough to recompute the
//! step's loss outside smallrl (`tests/train.rs` does).

use std::path::Path;

use anyhow::{Context, Result};
use tch::Tensor;

use super::rollout::Rollout;
use crate::reward::ScoredBatch;
use crate::routing::Labels;

/// The rollout's per-sample tensors that the generation does not hold: rewards (combined and
/// per component) and the routing labels.
pub(super) fn rollout_tensors(scored: &ScoredBatch, component_names: &[String], rewards: &Tensor, labels: &Labels) -> Vec<(String, Tensor)> {
    let flags = |v: &[bool]| Tensor::from_slice(&v.iter().map(|&b| b as i64).collect::<Vec<_>>());
    let mut out = vec![
        ("rewards".to_string(), rewards.shallow_clone()),
        ("is_rh".to_string(), flags(&labels.is_rh)),
        ("ablated".to_string(), flags(&labels.ablated)),
        ("coherence".to_string(), flags(&labels.coherence)),
        ("dropped".to_string(), flags(&labels.dropped)),
        ("eligible".to_string(), flags(&scored.eligible)),
    ];
    for (name, scores) in component_names.iter().zip(&scored.components) {
        out.push((format!("rewards/{name}"), Tensor::from_slice(scores)));
    }
    out
}

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
        ("new_logprobs".into(), logprobs.detach()),
        ("loss".into(), loss.detach()),
    ];
    tensors.extend(rollout.ref_logprobs.iter().map(|t| ("ref_logprobs".to_string(), t.shallow_clone())));
    tensors.extend(rollout.old_logprobs.iter().map(|t| ("old_logprobs".to_string(), t.shallow_clone())));
    tensors.extend(rollout.dump.iter().map(|(n, t)| (n.clone(), t.shallow_clone())));
    crate::model::weights::write_safetensors(&dir.join(format!("step-{step}.safetensors")), &tensors)
}
