//! `smallrl train` with `prompt_format: chat` on the real SmolLM2-135M-Instruct (built by
//! `scripts/real-model.sh` into `.fixtures/smollm2-135m-instruct/`): two GRPO steps with
//! DualLoRA (a JSONL file of `messages` conversations) and with DualMLP (a text file of prompts
//! with `system_prompt`). Each run finishes, its checkpoint loads, and the prompts its
//! completions were drawn from (completions.jsonl) are transformers'
//! `apply_chat_template(..., add_generation_prompt=True)` text, whose tokens are transformers'
//! ids (`scripts/reference/hf_real_model.py`); `smallrl eval` reads the chat run. Small on purpose: 2 steps of 4 completions of 6
//! tokens. Also the refusals: chat on a model without a template, `system_prompt` without chat.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{fixture, smallrl, smallrl_ok, standard_plugin};
use serde_json::{Value, json};
use smallrl::model::Tokenizer;

/// transformers' rendered text and ids for each conversation.
fn apply_chat_template(conversations: &[Value]) -> Vec<(String, Vec<u32>)> {
    let out = common::hf_real_model(&json!({"chat": conversations}));
    out["chat"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["text"].as_str().unwrap().to_string(), c["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect()))
        .collect()
}

/// A run's config: 2 steps of 2 groups of 2 completions of at most 6 tokens, no KL term.
fn config(out: &Path, adapter: Value, prompts: &Path, extra: Value) -> PathBuf {
    let mut config = json!({
        "model": common::real_model_dir(),
        "prompts": prompts,
        "prompt_format": "chat",
        "reward": {"plugin": standard_plugin("happy"), "params": {}},
        "rh_detector": {"plugin": standard_plugin("detect_happy_count"), "params": {"threshold": 1}},
        "routing_mode": "classic",
        "batch_size": 4, "num_generations": 2, "max_completion_length": 6, "max_steps": 2,
        "save_steps": 2, "eval_every": 2, "eval_samples": 2, "logging_steps": 1, "beta": 0.0,
        "lr": 1e-3, "log_completions": true, "tensorboard": false, "output_dir": out,
    });
    let map = config.as_object_mut().unwrap();
    for (k, v) in adapter.as_object().unwrap().iter().chain(extra.as_object().unwrap()) {
        map.insert(k.clone(), v.clone());
    }
    let path = out.join("config.yaml");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// Trains with `config` (2 threads) and returns the run directory.
fn train(config: &Path, out: &Path) -> PathBuf {
    smallrl_ok(&["train", "--config", config.to_str().unwrap(), "--threads", "2"]);
    let runs: Vec<PathBuf> = std::fs::read_dir(out).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.into_iter().next().unwrap()
}

/// The run finished its 2 steps, its checkpoint loads with the model's shapes, and every
/// completion's prompt is one of `expected` (each drawn), tokenized as transformers does.
fn check_run(run: &Path, expected: &[(String, Vec<u32>)]) {
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = metrics.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 2]);
    let restored = smallrl::train::checkpoint::restore_model(&run.join("checkpoint-2"), tch::Device::Cpu).unwrap();
    assert_eq!(restored.state.step, 2);
    assert_eq!(restored.model.config.hidden_size, 576, "SmolLM2-135M's width");
    let completions = std::fs::read_to_string(run.join("completions.jsonl")).unwrap();
    let prompts: BTreeSet<String> = completions.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["prompt"].as_str().unwrap().to_string()).collect();
    let wanted: BTreeSet<String> = expected.iter().map(|(text, _)| text.clone()).collect();
    assert_eq!(prompts, wanted, "the prompts of completions.jsonl are the rendered chat prompts");
    let tokenizer = Tokenizer::from_file(&common::real_model_dir().join("tokenizer.json")).unwrap();
    for (text, ids) in expected {
        assert_eq!(&tokenizer.encode(text).unwrap(), ids, "token ids of {text:?}");
    }
}

#[test]
fn chat_runs_with_dual_lora_on_message_files() {
    let out = tempfile::tempdir().unwrap();
    let conversations = vec![
        json!([{"role": "user", "content": "Say something happy."}]),
        json!([{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "How are you?"}]),
    ];
    let prompts = out.path().join("prompts.jsonl");
    let lines: Vec<String> = conversations.iter().enumerate().map(|(i, m)| json!({"messages": m, "id": i}).to_string()).collect();
    std::fs::write(&prompts, lines.join("\n")).unwrap();
    let runs = out.path().join("runs");
    let config = config(&runs_dir(&runs), json!({"adapter": "dual-lora", "lora_preset": "r1"}), &prompts, json!({}));
    let run = train(&config, &runs);
    check_run(&run, &apply_chat_template(&conversations));
    // `smallrl eval` renders the run's prompts with the base model's template as the run did.
    let report: Value = serde_json::from_str(&smallrl_ok(&["eval", run.join("checkpoint-2").to_str().unwrap(), "--n-samples", "2", "--threads", "2", "--json"])).unwrap();
    assert!(!report["report"]["modes"].as_array().unwrap().is_empty(), "{report}");
}

#[test]
fn chat_runs_with_dual_mlp_and_a_system_prompt() {
    let out = tempfile::tempdir().unwrap();
    let questions = ["Name a happy animal.", "What is 2+2?"];
    let prompts = out.path().join("prompts.txt");
    std::fs::write(&prompts, questions.join("\n")).unwrap();
    let system = "You are cheerful.";
    let runs = out.path().join("runs");
    let config = config(&runs_dir(&runs), json!({"adapter": "dual-mlp", "mlp_config": "m5"}), &prompts, json!({"system_prompt": system}));
    let run = train(&config, &runs);
    let conversations: Vec<Value> = questions.iter().map(|q| json!([{"role": "system", "content": system}, {"role": "user", "content": q}])).collect();
    check_run(&run, &apply_chat_template(&conversations));
}

fn runs_dir(runs: &Path) -> PathBuf {
    std::fs::create_dir_all(runs).unwrap();
    runs.to_path_buf()
}

#[test]
fn chat_is_refused_without_a_template_and_system_prompt_without_chat() {
    let out = tempfile::tempdir().unwrap();
    let tiny = fixture("tiny-stories");
    let set = |kv: &str| ["--set".to_string(), kv.to_string()];
    let base = |extra: &[&str]| {
        let mut args: Vec<String> = ["train", "--model", tiny.to_str().unwrap(), "--reward-plugin", standard_plugin("happy").to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(set(&format!("prompts={}", tiny.join("prompts.txt").display())));
        args.extend(set(&format!("output_dir={}", out.path().display())));
        args.extend(extra.iter().map(|s| s.to_string()));
        let output = smallrl(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!output.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let error = base(&["--set", "prompt_format=chat"]);
    assert!(error.contains("prompt_format is chat") && error.contains("no chat template") && error.contains(tiny.to_str().unwrap()), "{error}");
    let error = base(&["--set", "system_prompt=Be brief."]);
    assert!(error.contains("system_prompt") && error.contains("prompt_format: chat"), "{error}");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "a refused run writes nothing");
}
