//! Checkpoints: `checkpoint-N/` with the trainable weights, the optimizer moments, the full
//! adapter configuration and the trainer state. Written into a temporary directory and renamed,
//! so a checkpoint directory that exists is complete.
//!
//! Layout: `adapters.safetensors` (adapter runs; names like
//! `model.layers.0.self_attn.q_proj.lora_A.retain.weight`) or, for full fine-tuning,
//! `model.safetensors` + `config.json` + `tokenizer.json` (an HF model directory);
//! `optimizer.safetensors` (`exp_avg.<name>`, `exp_avg_sq.<name>`); `trainer_state.json`;
//! `config.yaml` (the run's resolved configuration); with `max_steps_off_policy`,
//! `in_flight.safetensors` + `in_flight.json` (the batches sampled ahead, not yet trained on).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::adapters::{AdapterConfig, AdapterKind};
use crate::model::weights::{read_safetensors, write_safetensors};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps completed.
    pub step: usize,
    pub adapters: AdapterConfig,
    /// The base model the adapters apply to (a directory or Hub repo id) and its revision.
    pub base_model: String,
    pub revision: String,
    pub seed: u64,
}

pub fn dir_name(step: usize) -> String {
    format!("checkpoint-{step}")
}

pub struct Snapshot<'a> {
    pub state: TrainerState,
    /// The run's resolved configuration as YAML (`config.yaml` of the checkpoint).
    pub config_yaml: String,
    pub trainable: &'a [(String, Tensor)],
    pub optimizer: Vec<(String, Tensor)>,
    /// For full fine-tuning: the model configuration and tokenizer file written alongside, so
    /// the checkpoint is an HF model directory.
    pub hf_files: Option<(&'a crate::model::LlamaConfig, &'a Path)>,
    /// Writes whatever else the checkpoint holds into its (temporary) directory: the batches
    /// sampled ahead of off-policy training (`in_flight.*`).
    pub extra: &'a dyn Fn(&Path) -> Result<()>,
}

pub fn save(run_dir: &Path, snapshot: Snapshot) -> Result<PathBuf> {
    let dir = run_dir.join(dir_name(snapshot.state.step));
    crate::fsutil::create_dir_atomic(&dir, |tmp| {
        let weights = weights_file(snapshot.state.adapters.kind);
        let trainable: Vec<(String, Tensor)> = snapshot.trainable.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        write_safetensors(&tmp.join(weights), &trainable)?;
        write_safetensors(&tmp.join("optimizer.safetensors"), &snapshot.optimizer)?;
        if let Some((config, tokenizer)) = snapshot.hf_files {
            crate::model::export::write_hf_metadata(tmp, config, tokenizer)?;
        }
        std::fs::write(tmp.join("trainer_state.json"), serde_json::to_string_pretty(&snapshot.state)?)?;
        std::fs::write(tmp.join("config.yaml"), &snapshot.config_yaml)?;
        (snapshot.extra)(tmp)
    })
    .with_context(|| format!("cannot write checkpoint {}", dir.display()))?;
    Ok(dir)
}

/// The trainer state of a checkpoint (step, adapter configuration, base model, seed).
pub fn read_state(dir: &Path) -> Result<TrainerState> {
    let state_path = dir.join("trainer_state.json");
    let text = std::fs::read_to_string(&state_path).with_context(|| format!("{} is not a checkpoint: cannot read trainer_state.json", dir.display()))?;
    let state: TrainerState = serde_json::from_str(&text).with_context(|| format!("{} is corrupt", state_path.display()))?;
    state.adapters.validate().with_context(|| format!("{}: bad adapter configuration", state_path.display()))?;
    Ok(state)
}

/// The trained tensors of a checkpoint, by the names of [`AdapterConfig::trainable`].
pub fn read_weights(dir: &Path, state: &TrainerState) -> Result<std::collections::BTreeMap<String, Tensor>> {
    read_safetensors(&dir.join(weights_file(state.adapters.kind)))
}

fn weights_file(kind: AdapterKind) -> &'static str {
    if kind == AdapterKind::Full { "model.safetensors" } else { "adapters.safetensors" }
}

pub fn load_optimizer(dir: &Path) -> Result<std::collections::BTreeMap<String, Tensor>> {
    read_safetensors(&dir.join("optimizer.safetensors"))
}

/// The newest complete checkpoint of a run directory.
pub fn latest(run_dir: &Path) -> Result<PathBuf> {
    let (_, path) = all(run_dir)?.pop().with_context(|| format!("{} has no checkpoint to resume from", run_dir.display()))?;
    Ok(path)
}

/// Every complete checkpoint of a run directory (`checkpoint-N` with its trainer state), by step.
pub fn all(run_dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(run_dir).with_context(|| format!("cannot read run directory {}", run_dir.display()))? {
        let path = entry?.path();
        let step = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix("checkpoint-")).and_then(|s| s.parse::<usize>().ok());
        if let Some(step) = step.filter(|_| path.join("trainer_state.json").exists()) {
            found.push((step, path));
        }
    }
    found.sort();
    Ok(found)
}

/// Checks that a checkpoint's adapter configuration is the one a run expects.
pub fn check_adapters(state: &TrainerState, expected: &AdapterConfig, dir: &Path) -> Result<()> {
    ensure!(
        &state.adapters == expected,
        "{}: its adapters ({:?}) differ from the run's configuration ({:?})",
        dir.display(),
        state.adapters,
        expected
    );
    Ok(())
}

/// A model rebuilt from a checkpoint: the base model it names, the adapters exactly as the
/// checkpoint's configuration describes them, and the trained weights.
pub struct RestoredModel {
    pub model: crate::model::Llama,
    pub adapters: AdapterConfig,
    pub tokenizer_path: PathBuf,
    pub state: TrainerState,
}

pub fn restore_model(dir: &Path, device: tch::Device) -> Result<RestoredModel> {
    let state = read_state(dir)?;
    let adapters = state.adapters.clone();
    // A full fine-tuning checkpoint is itself an HF model directory; an adapter checkpoint
    // names the base model its adapters apply to.
    let (spec, revision) = match adapters.kind {
        AdapterKind::Full => (dir.to_str().context("checkpoint path is not UTF-8")?, crate::defaults::REVISION),
        _ => (state.base_model.as_str(), state.revision.as_str()),
    };
    let base = crate::model::load(spec, revision, device, tch::Kind::Float)
        .with_context(|| format!("{}: cannot load the model it was trained from ({spec})", dir.display()))?;
    let mut model = base.model;
    if adapters.kind != AdapterKind::Full {
        adapters.attach(&mut model, 0)?;
        crate::adapters::load_trainable(&adapters.trainable(&model), &read_weights(dir, &state)?, &dir.display().to_string())?;
    }
    Ok(RestoredModel { model, adapters, tokenizer_path: base.files.tokenizer, state })
}
