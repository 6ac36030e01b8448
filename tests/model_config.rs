//! `config.json` as transformers writes it and as the Hub publishes it: every key of
//! `smallrl::model::config::KEYS` is checked on both sides (accepted values load to the same
//! configuration; refused values and out-of-range values fail naming the key and the value), and
//! the stop token of `generation_config.json`.

mod common;

use common::fixture;
use serde_json::{Map, Value, json};
use smallrl::model::LlamaConfig;
use smallrl::model::config::{KEYS, KeyRule, stop_token_ids};

/// tiny-random's config.json as transformers 5 wrote it.
fn base() -> Map<String, Value> {
    let text = std::fs::read_to_string(fixture("tiny-random/config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn with(key: &str, value: Value) -> Map<String, Value> {
    let mut raw = base();
    raw.insert(key.to_string(), value);
    raw
}

fn error(raw: &Map<String, Value>) -> String {
    match LlamaConfig::from_json(raw) {
        Ok(config) => panic!("{} loaded as {config:?}", Value::Object(raw.clone())),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn every_accepted_key_and_value_loads_to_the_same_model() {
    let reference = LlamaConfig::from_json(&base()).unwrap();
    // Values of every JSON type: an inert key must not care which.
    let anything = [json!(null), json!(0), json!(12345), json!(-1), json!(true), json!("bfloat16"), json!([1, 2]), json!({"kv_cache_dtype": {"q4f16": "float16"}})];
    let mut checked = 0;
    for (key, rule) in KEYS {
        let values: Vec<Value> = match rule {
            KeyRule::Read => continue,
            KeyRule::Inert(_) => anything.to_vec(),
            // model_type and architectures name the family: the other families are loaded below.
            KeyRule::Only(..) if ["model_type", "architectures"].contains(key) => vec![base()[*key].clone()],
            KeyRule::Only(allowed, _) => allowed.iter().map(|a| serde_json::from_str(a).unwrap()).collect(),
            // Sliding-window sizes: null, or anything once sliding windows are off (below).
            KeyRule::When(..) => vec![json!(null)],
        };
        for value in values {
            let loaded = LlamaConfig::from_json(&with(key, value.clone())).unwrap_or_else(|e| panic!("{key} = {value}: {e:#}"));
            assert_eq!(loaded, reference, "{key} = {value} changed the configuration");
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} key/value pairs checked");
    // The keys people meet in published configs (SmolLM2-135M-Instruct's on the Hub, and what
    // transformers writes) are all in the list.
    for key in ["unk_token_id", "bos_token_id", "pad_token_id", "torch_dtype", "dtype", "is_llama_config", "rope_interleaved",
        "rope_scaling", "transformers.js_config", "transformers_version", "use_cache", "tie_word_embeddings", "pretraining_tp"] {
        assert!(KEYS.iter().any(|(k, _)| *k == key), "{key} is not in KEYS");
    }
}

#[test]
fn rope_theta_is_read_either_way_and_both_ways_must_agree() {
    let nested = LlamaConfig::from_json(&base()).unwrap();
    let mut top = base();
    top.remove("rope_parameters");
    top.insert("rope_theta".into(), json!(10000));
    assert_eq!(LlamaConfig::from_json(&top).unwrap(), nested);
    let mut both = base();
    both.insert("rope_theta".into(), json!(10000.0));
    assert_eq!(LlamaConfig::from_json(&both).unwrap(), nested, "rope_parameters equal to the plain rope_theta");
    both.insert("rope_theta".into(), json!(500000.0));
    assert!(error(&both).contains("disagree"));
}

#[test]
fn every_value_that_changes_the_maths_is_refused_by_name() {
    let refused: &[(&str, Value)] = &[
        ("model_type", json!("mistral")),
        ("model_type", json!("qwen2_moe")),
        ("architectures", json!(["MistralForCausalLM"])),
        ("hidden_act", json!("gelu")),
        ("attention_bias", json!(true)),
        ("mlp_bias", json!(true)),
        ("rope_scaling", json!({"rope_type": "linear", "factor": 2.0})),
        ("rope_scaling", json!({"type": "dynamic", "factor": 4.0})),
        ("rope_scaling", json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
        ("rope_interleaved", json!(true)),
        ("sliding_window", json!(4096)),
        ("max_window_layers", json!(2)),
        ("layer_types", json!(["full_attention", "sliding_attention", "full_attention", "full_attention"])),
        ("use_sliding_window", json!(true)),
        ("attention_dropout", json!(0.1)),
        ("pretraining_tp", json!(2)),
    ];
    for (key, value) in refused {
        let message = error(&with(key, value.clone()));
        assert!(
            message.contains(&format!("{key:?}")) && message.contains(&value.to_string()) && message.contains("refused"),
            "{key} = {value}: {message}"
        );
    }
    // Every key accepted with fixed values only has a refused value above.
    for (key, rule) in KEYS {
        if matches!(rule, KeyRule::Only(..) | KeyRule::When(..)) {
            assert!(refused.iter().any(|(k, _)| k == key), "no refused value of {key} is tested");
        }
    }
    for params in [json!({"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0}), json!({"rope_theta": 10000.0, "rope_type": "linear"})] {
        let message = error(&with("rope_parameters", params.clone()));
        assert!(message.contains("rope_parameters.") && message.contains("refused"), "{params}: {message}");
    }
    let unknown = error(&with("logit_soft_cap", json!(30.0)));
    assert!(unknown.contains("\"logit_soft_cap\"") && unknown.contains("30.0") && unknown.contains("KEYS"), "{unknown}");
}

#[test]
fn values_out_of_range_are_refused_by_name() {
    let cases: Vec<(&str, Map<String, Value>)> = vec![
        ("rms_norm_eps", with("rms_norm_eps", json!(-1))),
        ("rms_norm_eps", with("rms_norm_eps", json!(0))),
        ("rope_theta", with("rope_parameters", json!({"rope_theta": -5.0, "rope_type": "default"}))),
        ("rope_theta", with("rope_parameters", json!({"rope_theta": 0.0, "rope_type": "default"}))),
        ("rope_theta", {
            let mut raw = base();
            raw.remove("rope_parameters");
            raw.insert("rope_theta".into(), json!(-5));
            raw
        }),
        ("hidden_size", with("hidden_size", json!(0))),
        ("vocab_size", with("vocab_size", json!(-3))),
        ("intermediate_size", with("intermediate_size", json!(0))),
        ("num_hidden_layers", with("num_hidden_layers", json!(1.5))),
        ("num_attention_heads", with("num_attention_heads", json!(0))),
        ("num_key_value_heads", with("num_key_value_heads", json!(3))),
        ("head_dim", with("head_dim", json!(31))),
        ("max_position_embeddings", with("max_position_embeddings", json!(0))),
        ("eos_token_id", with("eos_token_id", json!(4096))),
        ("hidden_size", {
            let mut raw = with("hidden_size", json!(130));
            raw.remove("head_dim");
            raw
        }),
    ];
    for (key, raw) in cases {
        let message = error(&raw);
        assert!(message.contains(&format!("\"{key}\"")), "{key}: {message}");
    }
}

#[test]
fn the_stop_token_comes_from_generation_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("generation_config.json");
    // tiny-random: eos_token_id 1, a vocabulary of 4096.
    let config = LlamaConfig::from_json(&base()).unwrap();
    assert_eq!((config.eos_token_id, config.vocab_size), (1, 4096));
    let stop = |document: Value| {
        std::fs::write(&path, document.to_string()).unwrap();
        stop_token_ids(&path, &config)
    };
    assert_eq!(stop(json!({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})).unwrap(), (2, vec![]));
    assert_eq!(stop(json!({"eos_token_id": [7]})).unwrap(), (7, vec![]));
    assert_eq!(stop(json!({"eos_token_id": [7, 7]})).unwrap(), (7, vec![]));
    // Several ids (Llama-3, Qwen): the first, then the others in order, each once.
    assert_eq!(stop(json!({"eos_token_id": [2, 7, 2, 9, 7]})).unwrap(), (2, vec![7, 9]));
    assert_eq!(stop(json!({"do_sample": true})).unwrap(), (1, vec![]), "absent: config.json's id");
    assert_eq!(stop(json!({"eos_token_id": null})).unwrap(), (1, vec![]), "null: config.json's id");
    for bad in [json!({"eos_token_id": "2"}), json!({"eos_token_id": []}), json!({"eos_token_id": -1}), json!({"eos_token_id": [2, "7"]}), json!({"eos_token_id": [2, 4096]})] {
        let message = format!("{:#}", stop(bad.clone()).unwrap_err());
        assert!(message.contains("generation_config.json") && message.contains("eos_token_id"), "{bad}: {message}");
    }
}

/// config.json's `eos_token_id` follows the same rule as generation_config.json's: one id or a
/// list (Llama-3's config.json lists several), each in the vocabulary.
#[test]
fn config_json_stop_ids_follow_the_same_rule() {
    let config = LlamaConfig::from_json(&with("eos_token_id", json!([3, 9, 3]))).unwrap();
    assert_eq!((config.eos_token_id, config.extra_stop_ids.clone()), (3, vec![9]));
    assert_eq!(config.stop_ids(), vec![3, 9]);
    let message = error(&with("eos_token_id", json!([3, 4096])));
    assert!(message.contains("eos_token_id") && message.contains("4096"), "{message}");
}

/// Qwen2's and Qwen3's config.json as the Hub publishes them (Qwen2.5-0.5B-Instruct's keys:
/// `sliding_window` 32768 with `use_sliding_window: false`, `max_window_layers`; Qwen3-0.6B's:
/// `attention_bias`, a head_dim of 128 with 16 heads of a 1024-wide model), shrunk to
/// tiny-random's vocabulary. The family decides the biases and q/k norms; what would turn a
/// sliding window on, or name another architecture, is refused by key and value.
#[test]
fn qwen_configs_as_published_load_and_sliding_windows_are_refused() {
    let qwen2 = json!({
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 1,
        "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 14,
        "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.43.1",
        "use_cache": true, "use_sliding_window": false, "vocab_size": 4096
    });
    let qwen3 = json!({
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
        "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
        "vocab_size": 4096, "layer_types": vec!["full_attention"; 28]
    });
    let load = |v: &Value| LlamaConfig::from_json(v.as_object().unwrap());
    let config = load(&qwen2).unwrap();
    assert_eq!((config.model_type.name(), config.head_dim, config.num_key_value_heads), ("qwen2", 64, 2));
    assert!(config.model_type.qkv_bias() && !config.model_type.qk_norm());
    let config = load(&qwen3).unwrap();
    assert_eq!((config.model_type.name(), config.head_dim, config.q_size()), ("qwen3", 128, 2048));
    assert!(!config.model_type.qkv_bias() && config.model_type.qk_norm());
    // Sliding windows on, in either family; biases on Qwen3's o projection; a family mismatch.
    let edit = |base: &Value, key: &str, value: Value| {
        let mut raw = base.as_object().unwrap().clone();
        raw.insert(key.into(), value);
        raw
    };
    let refused = [
        (edit(&qwen2, "use_sliding_window", json!(true)), "use_sliding_window", "true"),
        (edit(&qwen3, "use_sliding_window", json!(true)), "use_sliding_window", "true"),
        (edit(&qwen3, "attention_bias", json!(true)), "attention_bias", "true"),
        (edit(&qwen3, "layer_types", json!(vec!["sliding_attention"; 28])), "layer_types", "sliding_attention"),
        (edit(&qwen2, "architectures", json!(["Qwen3ForCausalLM"])), "architectures", "Qwen3ForCausalLM"),
        (edit(&qwen3, "architectures", json!(["LlamaForCausalLM"])), "architectures", "LlamaForCausalLM"),
    ];
    for (raw, key, value) in refused {
        let message = error(&raw);
        assert!(message.contains(&format!("{key:?}")) && message.contains(value) && message.contains("refused"), "{key} = {value}: {message}");
    }
    // Without use_sliding_window: false, a window size is not known to be inert.
    let mut raw = qwen2.as_object().unwrap().clone();
    raw.remove("use_sliding_window");
    let message = error(&raw);
    assert!(message.contains("\"max_window_layers\" = 21") && message.contains("use_sliding_window is false"), "{message}");
    raw.remove("max_window_layers");
    let message = error(&raw);
    assert!(message.contains("\"sliding_window\" = 32768") && message.contains("refused"), "{message}");
    // The family is written back on export, and a checkpoint's serialised config keeps it.
    let config = load(&qwen3).unwrap();
    assert_eq!(config.to_hf_json()["model_type"], "qwen3");
    assert_eq!(config.to_hf_json()["architectures"], json!(["Qwen3ForCausalLM"]));
    let back: LlamaConfig = serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
    assert_eq!(back, config);
    let llama = LlamaConfig::from_json(&base()).unwrap();
    assert!(!serde_json::to_string(&llama).unwrap().contains("model_type"), "LLaMA configs serialise as before");
}
