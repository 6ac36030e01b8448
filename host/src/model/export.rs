//! Writing a model as an HF `LlamaForCausalLM` directory (config.json, model.safetensors,
//! tokenizer.json) that transformers and every smallrl command can load, with adapters merged
//! into the base weights at chosen scales.

use std::path::Path;

use anyhow::{Context, Result};
use tch::Tensor;

use super::Llama;
use super::weights::write_safetensors;

/// Writes `model` with its adapters folded in at `scales` (one per slot) into a new directory
/// `dir` (atomically: a crash leaves no half-written model).
pub fn save_hf_dir(model: &Llama, scales: &[f64], tokenizer: &Path, dir: &Path) -> Result<()> {
    let _guard = tch::no_grad_guard();
    let merged: Vec<(String, Tensor)> = model
        .projections()
        .into_iter()
        .map(|(name, linear)| (format!("{name}.weight"), linear.merged_weight(scales)))
        .collect();
    let tensors: Vec<(String, Tensor)> = model
        .base_tensors()
        .into_iter()
        .map(|(name, tensor)| {
            let value = merged.iter().find(|(n, _)| *n == name).map_or_else(|| tensor.detach(), |(_, t)| t.shallow_clone());
            (name, value.to_kind(tch::Kind::Float))
        })
        .collect();
    crate::fsutil::create_dir_atomic(dir, |tmp| {
        write_safetensors(&tmp.join("model.safetensors"), &tensors)?;
        std::fs::write(tmp.join("config.json"), serde_json::to_string_pretty(&model.config.to_hf_json())?)?;
        std::fs::copy(tokenizer, tmp.join("tokenizer.json")).with_context(|| format!("cannot copy {}", tokenizer.display()))?;
        Ok(())
    })
    .with_context(|| format!("cannot write model directory {}", dir.display()))
}
