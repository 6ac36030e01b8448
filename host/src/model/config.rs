//! `config.json` of an HF `LlamaForCausalLM`: every shape the model uses is read from here.
//!
//! Keys that would change the maths but are not implemented (rope scaling, biases, other
//! activations, other architectures) are rejected, and so is any key this module does not know:
//! a new transformers option must be looked at before it is trusted.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The resolved model configuration (what the forward pass needs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub eos_token_id: u32,
}

/// Keys that are read below, or that do not affect the forward pass.
const KNOWN_KEYS: &[&str] = &[
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling", "tie_word_embeddings",
    "max_position_embeddings", "eos_token_id", "bos_token_id", "pad_token_id", "hidden_act",
    "attention_bias", "mlp_bias", "attention_dropout", "initializer_range", "pretraining_tp",
    "use_cache", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
];

/// The name of the SimpleStories-1.25M architecture for `--arch`.
pub const SIMPLESTORIES_1_25M: &str = "simplestories-1.25m";

impl LlamaConfig {
    /// A named architecture with `vocab_size` tokens (the one shape that follows the
    /// tokenizer). `simplestories-1.25m` is SimpleStories-1.25M (1,245,824 parameters at 4096
    /// tokens): 4 layers, 128 wide, MLP 341, 4 heads and 2 key/value heads of 32, tied
    /// embeddings, RMSNorm eps 1e-6, RoPE theta 10000, context 512, `[EOS]` = 1.
    pub fn architecture(name: &str, vocab_size: usize) -> Result<Self> {
        ensure!(name == SIMPLESTORIES_1_25M, "unknown architecture {name:?}: use {SIMPLESTORIES_1_25M} or --config config.json");
        let raw = serde_json::json!({
            "vocab_size": vocab_size, "hidden_size": 128, "intermediate_size": 341, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "tie_word_embeddings": true, "max_position_embeddings": 512, "eos_token_id": 1,
        });
        Self::from_json(raw.as_object().expect("a JSON object"))
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read model config {}", path.display()))?;
        let raw: Map<String, Value> = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON object", path.display()))?;
        Self::from_json(&raw).with_context(|| format!("unsupported model config {}", path.display()))
    }

    pub fn from_json(raw: &Map<String, Value>) -> Result<Self> {
        check_supported(raw)?;
        let hidden_size = usize_key(raw, "hidden_size")?;
        let num_attention_heads = usize_key(raw, "num_attention_heads")?;
        let head_dim = match raw.get("head_dim") {
            Some(Value::Null) | None => {
                ensure!(
                    hidden_size % num_attention_heads == 0,
                    "hidden_size {hidden_size} is not divisible by num_attention_heads \
                     {num_attention_heads} and no head_dim is given"
                );
                hidden_size / num_attention_heads
            }
            Some(_) => usize_key(raw, "head_dim")?,
        };
        let num_key_value_heads = match raw.get("num_key_value_heads") {
            Some(Value::Null) | None => num_attention_heads,
            Some(_) => usize_key(raw, "num_key_value_heads")?,
        };
        ensure!(
            num_attention_heads % num_key_value_heads == 0,
            "num_attention_heads {num_attention_heads} is not a multiple of num_key_value_heads \
             {num_key_value_heads}"
        );
        let config = Self {
            vocab_size: usize_key(raw, "vocab_size")?,
            hidden_size,
            intermediate_size: usize_key(raw, "intermediate_size")?,
            num_hidden_layers: usize_key(raw, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: f64_key(raw, "rms_norm_eps")?,
            rope_theta: rope_theta(raw)?,
            // transformers' default for LLaMA is tied = false.
            tie_word_embeddings: match raw.get("tie_word_embeddings") {
                None => false,
                Some(v) => v.as_bool().context("tie_word_embeddings must be true or false")?,
            },
            max_position_embeddings: usize_key(raw, "max_position_embeddings")?,
            eos_token_id: eos_token_id(raw)?,
        };
        ensure!(config.eos_token_id < config.vocab_size as u32, "eos_token_id is outside the vocabulary");
        Ok(config)
    }

    /// Output features of the query projection.
    pub fn q_size(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Output features of each of the key and value projections.
    pub fn kv_size(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// The HF `config.json` for this configuration (export writes it; transformers 5 layout).
    pub fn to_hf_json(&self) -> Value {
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.eos_token_id,
            "bos_token_id": null,
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
            "dtype": "float32",
        })
    }
}

fn check_supported(raw: &Map<String, Value>) -> Result<()> {
    if let Some(unknown) = raw.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
        bail!("key {unknown:?} is not understood by smallrl; it may change the model's maths");
    }
    if let Some(model_type) = raw.get("model_type") {
        ensure!(model_type == "llama", "model_type is {model_type}, only \"llama\" is supported");
    }
    if let Some(archs) = raw.get("architectures") {
        ensure!(
            archs == &serde_json::json!(["LlamaForCausalLM"]),
            "architectures is {archs}, only [\"LlamaForCausalLM\"] is supported"
        );
    }
    for flag in ["attention_bias", "mlp_bias"] {
        ensure!(!raw.get(flag).and_then(Value::as_bool).unwrap_or(false), "{flag} = true is not supported");
    }
    if let Some(act) = raw.get("hidden_act") {
        ensure!(act == "silu", "hidden_act is {act}, only \"silu\" is supported");
    }
    if let Some(scaling) = raw.get("rope_scaling") {
        ensure!(scaling.is_null(), "rope_scaling {scaling} is not supported (only plain RoPE)");
    }
    if let Some(dropout) = raw.get("attention_dropout") {
        ensure!(dropout.as_f64() == Some(0.0), "attention_dropout {dropout} is not supported");
    }
    Ok(())
}

/// transformers < 5 writes a top-level `rope_theta`; transformers 5 writes
/// `rope_parameters: {rope_theta, rope_type}`. Both are read; two different values are an error.
fn rope_theta(raw: &Map<String, Value>) -> Result<f64> {
    let top_level = match raw.get("rope_theta") {
        Some(v) => Some(v.as_f64().context("rope_theta must be a number")?),
        None => None,
    };
    let nested = match raw.get("rope_parameters") {
        None | Some(Value::Null) => None,
        Some(params) => {
            let params = params.as_object().context("rope_parameters must be an object")?;
            if let Some(unknown) = params.keys().find(|k| !["rope_theta", "rope_type"].contains(&k.as_str())) {
                bail!("rope_parameters.{unknown} is not supported (only plain RoPE)");
            }
            if let Some(kind) = params.get("rope_type") {
                ensure!(kind == "default", "rope_type {kind} is not supported (only \"default\")");
            }
            Some(params.get("rope_theta").and_then(Value::as_f64).context("rope_parameters.rope_theta is missing")?)
        }
    };
    match (top_level, nested) {
        (Some(a), Some(b)) if a != b => bail!("rope_theta {a} and rope_parameters.rope_theta {b} disagree"),
        (Some(theta), _) | (None, Some(theta)) => Ok(theta),
        (None, None) => bail!("no rope_theta (neither top-level nor in rope_parameters)"),
    }
}

fn eos_token_id(raw: &Map<String, Value>) -> Result<u32> {
    let value = raw.get("eos_token_id").context("eos_token_id is missing")?;
    let id = match value {
        Value::Array(ids) if ids.len() == 1 => ids[0].as_u64(),
        Value::Array(_) => bail!("eos_token_id {value}: several end-of-sequence ids are not supported"),
        other => other.as_u64(),
    };
    let id = id.with_context(|| format!("eos_token_id {value} is not a token id"))?;
    Ok(u32::try_from(id)?)
}

fn usize_key(raw: &Map<String, Value>, key: &str) -> Result<usize> {
    let value = raw.get(key).with_context(|| format!("{key} is missing"))?;
    let n = value.as_u64().with_context(|| format!("{key} = {value} is not a positive integer"))?;
    ensure!(n > 0, "{key} must be positive");
    Ok(n as usize)
}

fn f64_key(raw: &Map<String, Value>, key: &str) -> Result<f64> {
    let value = raw.get(key).with_context(|| format!("{key} is missing"))?;
    value.as_f64().with_context(|| format!("{key} = {value} is not a number"))
}
