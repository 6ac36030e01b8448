//! Writing a model as an HF directory (`LlamaForCausalLM`, `Qwen2ForCausalLM` or `Qwen3ForCausalLM`: config.json, model.safetensors,
//! tokenizer.json) that transformers and every smallrl command can load, with adapters merged
//! into the base weights at chosen scales.

use std::path::Path;

use anyhow::{Context, Result};
use tch::Tensor;

use super::{Llama, LlamaConfig};
use super::weights::write_safetensors;

/// Files that travel with `tokenizer.json` when they are beside it: the chat template (its own
/// file, or inside tokenizer_config.json) and the special tokens its context names.
pub const TOKENIZER_COMPANIONS: [&str; 2] = ["tokenizer_config.json", "chat_template.jinja"];

/// Writes `config.json` and a copy of `tokenizer.json` (and of its [`TOKENIZER_COMPANIONS`]
/// where they exist) into `dir`: with a `model.safetensors` beside them, an HF model directory.
/// `config.json`'s `eos_token_id` is the stop token the model was loaded with (from
/// generation_config.json where it had one), which transformers also stops on without a
/// generation_config.json.
pub fn write_hf_metadata(dir: &Path, config: &LlamaConfig, tokenizer: &Path) -> Result<()> {
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config.to_hf_json())?)
        .with_context(|| format!("cannot write {}", dir.join("config.json").display()))?;
    // Several stop tokens: generation_config.json lists them all (config.json keeps the first).
    if !config.extra_stop_ids.is_empty() {
        let path = dir.join("generation_config.json");
        std::fs::write(&path, serde_json::to_string_pretty(&serde_json::json!({"eos_token_id": config.stop_ids()}))?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    std::fs::copy(tokenizer, dir.join("tokenizer.json")).with_context(|| format!("cannot copy {}", tokenizer.display()))?;
    for name in TOKENIZER_COMPANIONS {
        let source = tokenizer.with_file_name(name);
        if source.is_file() {
            std::fs::copy(&source, dir.join(name)).with_context(|| format!("cannot copy {}", source.display()))?;
        }
    }
    Ok(())
}

/// Writes `model` with its adapters folded in at `scales` (one per slot) into a new directory
/// `dir` (atomically: a crash leaves no half-written model).
pub fn save_hf_dir(model: &Llama, scales: &[f64], tokenizer: &Path, dir: &Path) -> Result<()> {
    let _guard = tch::no_grad_guard();
    // DualMLP adapters widen every MLP block (`mlp_adapter.rs`), which config.json records.
    let width = model.folded_intermediate_size(scales);
    let config = LlamaConfig { intermediate_size: width, ..model.config.clone() };
    let mut merged: Vec<(String, Tensor)> = model
        .projections()
        .into_iter()
        .filter(|(name, _)| !name.contains(".mlp."))
        .map(|(name, linear)| (format!("{name}.weight"), linear.merged_weight(scales)))
        .collect();
    for (i, block) in model.layers.iter().enumerate() {
        let folded = block.mlp.folded(scales, width as i64);
        for (projection, weight) in ["gate_proj", "up_proj", "down_proj"].into_iter().zip(folded) {
            merged.push((format!("model.layers.{i}.mlp.{projection}.weight"), weight));
        }
    }
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
        write_hf_metadata(tmp, &config, tokenizer)
    })
    .with_context(|| format!("cannot write model directory {}", dir.display()))
}
