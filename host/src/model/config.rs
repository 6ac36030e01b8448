//! `config.json` of an HF `LlamaForCausalLM`, `Qwen2ForCausalLM` or `Qwen3ForCausalLM`: every
//! shape the model uses is read from here, and the family ([`ModelType`]) says which of the
//! Qwen additions (q/k/v biases, per-head q/k RMSNorm) the one model description carries.
//!
//! The rule for every key is in one table, [`KEYS`]: keys read into [`LlamaConfig`] (and checked
//! for range: positive sizes and eps/theta, heads that divide, an even head_dim), keys that do not
//! change the forward pass (accepted with any value), and keys accepted only with the value smallrl
//! implements (refused otherwise, naming key, value and reason). Any other key is refused: a new
//! transformers option must be looked at before it is trusted.

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
    /// Stop tokens besides `eos_token_id`: generation_config.json's other `eos_token_id`s
    /// (Llama-3 and Qwen list several); empty for most models (and absent from older files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_stop_ids: Vec<u32>,
    /// The architecture's family (`model_type`); LLaMA in configurations written before Qwen.
    #[serde(default, skip_serializing_if = "ModelType::is_llama")]
    pub model_type: ModelType,
}

/// The families smallrl implements: one LLaMA block, with Qwen's additions where `model_type`
/// says so. Qwen2: biases on the q, k and v projections (not o). Qwen3: no biases
/// (`attention_bias: false`), an RMSNorm over each head of q and k (weights `q_norm`, `k_norm`
/// of size head_dim) after the projection and before RoPE, and a head_dim that may differ from
/// hidden / heads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelType {
    #[default]
    Llama,
    Qwen2,
    Qwen3,
}

impl ModelType {
    /// `model_type` as config.json writes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }

    /// The `architectures` entry transformers writes for it.
    pub fn architecture(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Llama, Self::Qwen2, Self::Qwen3].into_iter().find(|t| t.name() == name)
    }

    fn is_llama(&self) -> bool {
        *self == Self::Llama
    }

    /// Whether the q, k and v projections carry biases (Qwen2).
    pub fn qkv_bias(self) -> bool {
        self == Self::Qwen2
    }

    /// Whether q and k are RMS-normalised per head before RoPE (Qwen3).
    pub fn qk_norm(self) -> bool {
        self == Self::Qwen3
    }
}

/// How one `config.json` key is treated. Every key smallrl accepts is in [`KEYS`]; a key not
/// there is refused, since a new transformers option must be looked at before it is trusted.
#[derive(Debug, Clone, Copy)]
pub enum KeyRule {
    /// A shape or constant of the forward pass, read (and range-checked) by [`LlamaConfig::from_json`].
    Read,
    /// Does not enter the forward pass, whatever its value (token ids of the tokenizer, dtype
    /// hints, writers' bookkeeping, inference-runtime options); the reason is said here.
    Inert(&'static str),
    /// Accepted only with one of these values (JSON), which are what smallrl computes; any other
    /// value would change the maths and is refused with the reason given.
    Only(&'static [&'static str], &'static str),
    /// Accepted with any value when the configuration satisfies the condition (a function of
    /// the key's value and the whole config.json; it says what it needs), otherwise refused with
    /// the reason given: sliding-window sizes, which matter only with sliding windows on.
    When(fn(&Value, &Map<String, Value>) -> bool, &'static str),
}

use KeyRule::{Inert, Only, Read, When};

/// Sliding windows are off: `use_sliding_window` is false (Qwen2/Qwen3 write it; transformers
/// then attends to every earlier position whatever `sliding_window` and `max_window_layers`
/// say), or the value is null.
fn sliding_windows_off(value: &Value, raw: &Map<String, Value>) -> bool {
    value.is_null() || raw.get("use_sliding_window") == Some(&Value::Bool(false))
}

/// Every layer is `full_attention` (what transformers 5 writes for Qwen2/Qwen3 without sliding
/// windows).
fn all_full_attention(value: &Value, _: &Map<String, Value>) -> bool {
    value.is_null() || value.as_array().is_some_and(|layers| layers.iter().all(|l| l == "full_attention"))
}

/// The one list of `config.json` keys smallrl knows, and the rule for each (see [`KeyRule`]).
/// Configs as transformers writes them and as the HuggingFace Hub publishes them (for example
/// SmolLM2-135M-Instruct's, with `is_llama_config`, `rope_interleaved` and `transformers.js_config`)
/// load; a value that would change the forward pass is refused by key, value and reason.
pub const KEYS: &[(&str, KeyRule)] = &[
    ("vocab_size", Read),
    ("hidden_size", Read),
    ("intermediate_size", Read),
    ("num_hidden_layers", Read),
    ("num_attention_heads", Read),
    ("num_key_value_heads", Read),
    ("head_dim", Read),
    ("rms_norm_eps", Read),
    ("rope_theta", Read),
    ("rope_parameters", Read),
    ("tie_word_embeddings", Read),
    ("max_position_embeddings", Read),
    ("eos_token_id", Read),
    ("model_type", Only(&[r#""llama""#, r#""qwen2""#, r#""qwen3""#], "smallrl implements the LLaMA, Qwen2 and Qwen3 architectures only")),
    ("architectures", Only(&[r#"["LlamaForCausalLM"]"#, r#"["Qwen2ForCausalLM"]"#, r#"["Qwen3ForCausalLM"]"#], "smallrl implements LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM only")),
    ("hidden_act", Only(&[r#""silu""#], "the MLP's activation is SiLU (SwiGLU) in smallrl")),
    ("attention_bias", Only(&["false"], "smallrl's q/k/v/o projections have no bias (Qwen2's q/k/v biases come with model_type qwen2, which has no such key)")),
    ("mlp_bias", Only(&["false"], "smallrl's gate/up/down projections have no bias")),
    ("rope_scaling", Only(&["null"], "smallrl implements plain RoPE only (no scaled or extended positions)")),
    ("rope_interleaved", Only(&["false"], "smallrl rotates the two halves of each head (HF's layout), not interleaved pairs")),
    ("sliding_window", When(sliding_windows_off, "smallrl attends to every earlier position (no sliding window): accepted when null or when use_sliding_window is false")),
    ("max_window_layers", When(sliding_windows_off, "smallrl attends to every earlier position (no sliding window): accepted when use_sliding_window is false")),
    ("layer_types", When(all_full_attention, "smallrl attends to every earlier position in every layer: accepted when every entry is \"full_attention\"")),
    ("use_sliding_window", Only(&["false"], "smallrl attends to every earlier position (no sliding window)")),
    ("attention_dropout", Only(&["0", "0.0"], "smallrl has no dropout in attention")),
    ("pretraining_tp", Only(&["1"], "smallrl runs each projection as one matrix product (no tensor-parallel slicing)")),
    ("bos_token_id", Inert("a tokenizer id; smallrl adds no BOS of its own")),
    ("pad_token_id", Inert("a tokenizer id; padded positions are masked")),
    ("unk_token_id", Inert("a tokenizer id")),
    ("sep_token_id", Inert("a tokenizer id")),
    ("dtype", Inert("a storage hint; smallrl computes in the dtype it is asked for")),
    ("torch_dtype", Inert("a storage hint (transformers < 5); smallrl computes in the dtype it is asked for")),
    ("transformers_version", Inert("which transformers wrote the file")),
    ("_name_or_path", Inert("where the writer loaded the model from")),
    ("_from_model_config", Inert("a transformers bookkeeping flag")),
    ("use_cache", Inert("an inference option; the KV cache does not change the maths")),
    ("initializer_range", Inert("the initialisation of fresh weights; the weights are loaded")),
    ("is_llama_config", Inert("a marker of Hugging Face's training code (nanotron)")),
    ("transformers.js_config", Inert("options of transformers.js (dtypes of its KV cache)")),
    ("output_attentions", Inert("what transformers returns, not how it computes")),
    ("output_hidden_states", Inert("what transformers returns, not how it computes")),
    ("return_dict", Inert("what transformers returns, not how it computes")),
];

/// The rule of `key`, if smallrl knows it.
pub fn key_rule(key: &str) -> Option<KeyRule> {
    KEYS.iter().find(|(name, _)| *name == key).map(|(_, rule)| *rule)
}

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
                    "key \"hidden_size\" = {hidden_size} is not divisible by num_attention_heads = \
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
            "key \"num_key_value_heads\" = {num_key_value_heads} does not divide num_attention_heads = \
             {num_attention_heads} (each key/value head serves a whole group of query heads)"
        );
        let vocab_size = usize_key(raw, "vocab_size")?;
        // Checked against KEYS above; absent is LLaMA (configs written before `model_type`).
        let model_type = match raw.get("model_type").and_then(Value::as_str) {
            None => ModelType::Llama,
            Some(name) => ModelType::from_name(name).with_context(|| format!("key \"model_type\" = {name:?} is not implemented"))?,
        };
        let (eos_token_id, extra_stop_ids) = parse_stop_ids(raw.get("eos_token_id").context("eos_token_id is missing")?, vocab_size)?;
        let config = Self {
            vocab_size,
            hidden_size,
            intermediate_size: usize_key(raw, "intermediate_size")?,
            num_hidden_layers: usize_key(raw, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: positive_f64_key(raw, "rms_norm_eps", "RMSNorm divides by sqrt(mean square + eps)")?,
            rope_theta: rope_theta(raw)?,
            // transformers' default for LLaMA is tied = false.
            tie_word_embeddings: match raw.get("tie_word_embeddings") {
                None => false,
                Some(v) => v.as_bool().context("tie_word_embeddings must be true or false")?,
            },
            max_position_embeddings: usize_key(raw, "max_position_embeddings")?,
            eos_token_id,
            extra_stop_ids,
            model_type,
        };
        ensure!(
            config.head_dim % 2 == 0,
            "key \"head_dim\" = {} is out of range: RoPE rotates pairs of features, so it must be even",
            config.head_dim
        );
        Ok(config)
    }

    /// Every token that ends a completion: `eos_token_id` first, then the others.
    pub fn stop_ids(&self) -> Vec<u32> {
        std::iter::once(self.eos_token_id).chain(self.extra_stop_ids.iter().copied()).collect()
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
            "architectures": [self.model_type.architecture()],
            "model_type": self.model_type.name(),
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

/// Checks every key against [`KEYS`]: unknown keys and values of `Only` keys that change the
/// maths are refused, naming the key, the value and why; then the `When` keys, whose conditions
/// read the others (so `use_sliding_window: true` is named before the window sizes it makes
/// matter), and `architectures` against `model_type`.
fn check_supported(raw: &Map<String, Value>) -> Result<()> {
    for (key, value) in raw {
        match key_rule(key) {
            None => bail!(
                "key {key:?} (= {value}) is not understood by smallrl: it may change the model's maths. \
                 If it does not, add it to KEYS in host/src/model/config.rs as Inert"
            ),
            Some(Only(allowed, why)) => {
                let accepted = allowed.iter().any(|a| serde_json::from_str::<Value>(a).expect("KEYS values are JSON") == *value)
                    // 0 and 0.0 are the same number.
                    || allowed.iter().any(|a| a.parse::<f64>().is_ok_and(|x| value.as_f64() == Some(x)));
                ensure!(accepted, "key {key:?} = {value} is refused: {why} (accepted: {})", allowed.join(" or "));
            }
            Some(Read | Inert(_) | When(..)) => {}
        }
    }
    for (key, value) in raw {
        if let Some(When(accepted, why)) = key_rule(key) {
            ensure!(accepted(value, raw), "key {key:?} = {value} is refused: {why}");
        }
    }
    let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or("llama");
    if let Some(architectures) = raw.get("architectures").filter(|v| !v.is_null()) {
        let expected = ModelType::from_name(model_type).map(ModelType::architecture);
        ensure!(
            expected.is_some_and(|name| *architectures == serde_json::json!([name])),
            "key \"architectures\" = {architectures} is refused: it does not match model_type {model_type:?} (expected [{:?}])",
            expected.unwrap_or("?")
        );
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
            if let Some((unknown, v)) = params.iter().find(|(k, _)| !["rope_theta", "rope_type"].contains(&k.as_str())) {
                bail!("key \"rope_parameters.{unknown}\" = {v} is refused: smallrl implements plain RoPE only (rope_theta and rope_type \"default\")");
            }
            if let Some(kind) = params.get("rope_type") {
                ensure!(
                    kind == "default",
                    "key \"rope_parameters.rope_type\" = {kind} is refused: smallrl implements plain RoPE only (accepted: \"default\")"
                );
            }
            Some(params.get("rope_theta").and_then(Value::as_f64).context("rope_parameters.rope_theta is missing")?)
        }
    };
    match (top_level, nested) {
        (Some(a), Some(b)) if a != b => bail!("rope_theta {a} and rope_parameters.rope_theta {b} disagree"),
        (Some(theta), _) | (None, Some(theta)) => {
            ensure!(theta.is_finite() && theta > 0.0, "key \"rope_theta\" = {theta} is out of range: RoPE's base must be a positive number");
            Ok(theta)
        }
        (None, None) => bail!("no rope_theta (neither top-level nor in rope_parameters)"),
    }
}

/// The tokens that end a completion, from `generation_config.json` (what transformers'
/// `generate` stops on): its `eos_token_id` ([`parse_stop_ids`]), else config.json's stop ids.
pub fn stop_token_ids(path: &Path, config: &LlamaConfig) -> Result<(u32, Vec<u32>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let raw: Map<String, Value> =
        serde_json::from_str(&text).with_context(|| format!("{} is not a JSON object", path.display()))?;
    match raw.get("eos_token_id").filter(|v| !v.is_null()) {
        Some(value) => parse_stop_ids(value, config.vocab_size).with_context(|| path.display().to_string()),
        None => Ok((config.eos_token_id, config.extra_stop_ids.clone())),
    }
}

/// An `eos_token_id` value (config.json's or generation_config.json's): one token id or a list
/// of them, each in the vocabulary. Returns the first (the padding token too) and the other
/// different ids, in order; the decoders stop on any of them.
fn parse_stop_ids(value: &Value, vocab_size: usize) -> Result<(u32, Vec<u32>)> {
    let ids: Vec<&Value> = match value {
        Value::Array(ids) => ids.iter().collect(),
        one => vec![one],
    };
    let ids: Vec<u32> = ids
        .iter()
        .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
        .collect::<Option<_>>()
        .with_context(|| format!("key \"eos_token_id\" = {value} is not a token id or a list of them"))?;
    let (&first, rest) = ids.split_first().with_context(|| format!("key \"eos_token_id\" = [] names no stop token"))?;
    for &id in &ids {
        ensure!(
            (id as usize) < vocab_size,
            "key \"eos_token_id\" names token {id}, out of range: the vocabulary has {vocab_size} tokens (vocab_size)"
        );
    }
    let mut others: Vec<u32> = Vec::new();
    for &id in rest {
        if id != first && !others.contains(&id) {
            others.push(id);
        }
    }
    Ok((first, others))
}

fn usize_key(raw: &Map<String, Value>, key: &str) -> Result<usize> {
    let value = raw.get(key).with_context(|| format!("{key} is missing"))?;
    let n = value.as_u64().filter(|&n| n > 0);
    let n = n.with_context(|| format!("key {key:?} = {value} is out of range: a size must be a positive integer"))?;
    Ok(usize::try_from(n)?)
}

fn positive_f64_key(raw: &Map<String, Value>, key: &str, why: &str) -> Result<f64> {
    let value = raw.get(key).with_context(|| format!("{key} is missing"))?;
    let x = value.as_f64().with_context(|| format!("key {key:?} = {value} is not a number"))?;
    ensure!(x.is_finite() && x > 0.0, "key {key:?} = {value} is out of range: it must be a positive number ({why})");
    Ok(x)
}
