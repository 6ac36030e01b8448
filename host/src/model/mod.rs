//! The LLaMA model (and its Qwen2/Qwen3 variants): configuration, weights, forward pass, KV-cached decoding, tokenizer.
//!
//! Architecture invariant: this module knows nothing about rewards, plugins or GRPO. Adapters
//! enter only as [`linear::Lora`] slots inside [`linear::Linear`], [`mlp_adapter::MlpAdapter`]
//! slots beside an MLP block (DualMLP), and per-row [`linear::AdapterCtl`]s chosen by the caller.

pub mod autocast;
pub mod batch;
pub mod chat;
pub mod config;
pub mod continuation;
pub mod cuda_graph;
pub mod decode;
pub mod export;
pub mod folded;
pub mod generate;
pub mod hub;
pub mod linear;
pub mod llama;
pub mod mlp_adapter;
pub mod native;
pub mod rope;
pub mod sampler;
pub mod stacked;
pub mod tokenizer;
pub mod tool_calls;
pub mod weights;
pub mod wordpiece;

use anyhow::{Context, Result};
use tch::{Device, Kind};

pub use config::LlamaConfig;
pub use hub::ModelFiles;
pub use llama::Llama;
pub use tokenizer::Tokenizer;

/// A loaded model with its tokenizer and where both came from.
pub struct LoadedModel {
    pub model: Llama,
    pub tokenizer: Tokenizer,
    pub files: ModelFiles,
}

/// Resolves `spec` (directory or Hub repo id) and loads config, weights and tokenizer.
pub fn load(spec: &str, revision: &str, device: Device, kind: Kind) -> Result<LoadedModel> {
    let files = hub::resolve(spec, revision)?;
    let mut config = LlamaConfig::from_file(&files.config)?;
    if let Some(path) = &files.generation_config {
        (config.eos_token_id, config.extra_stop_ids) = config::stop_token_ids(path, &config)?;
    }
    let model = weights::load_llama(config, &files.weights, device, kind)
        .with_context(|| format!("cannot load the weights of model {}", files.source))?;
    let tokenizer = Tokenizer::from_file(&files.tokenizer)?;
    // The first stop id also pads and is skipped when decoding, so it must be a special token;
    // the others (generation_config.json's list) may be any token of the vocabulary.
    tokenizer
        .check_eos(model.config.eos_token_id)
        .with_context(|| format!("the tokenizer and the stop token (config.json, generation_config.json) of model {} disagree", files.source))?;
    Ok(LoadedModel { model, tokenizer, files })
}
