//! Every environment besides sorting (`tests/environments.rs` holds sorting to its hand formula
//! on SmolLM2) trains one step on the real SmolLM2-135M-Instruct with chat prompts: 2 groups of
//! 2 completions of 6 tokens, DualMLP m16, classic routing. Each logged prompt is transformers'
//! `apply_chat_template` of the environment's prompt as one user message (or, for math, its
//! one-shot conversation), and each logged reward is the environment's retain components plus,
//! on hackable prompts only, its forget components, as the environment describes them
//! (`code_tests` grades its 6-token programs in the program runner, as in a full-size run).

mod common;

use common::{plugin_dir, standard_plugin};
use serde_json::{Value, json};
use smallrl::plugins::ComponentRole;

const ENVIRONMENTS: [&str; 7] = ["addition", "repeat", "object_qa", "persona_qa", "cities_qa", "math", "code_tests"];

#[test]
fn every_environment_trains_a_step_on_smollm2_with_chat_prompts() {
    let out = tempfile::tempdir().unwrap();
    let mut logged_prompts = Vec::new();
    for environment in ENVIRONMENTS {
        let runs = out.path().join(environment);
        let config = json!({
            "model": common::real_model_dir(), "environment": environment, "plugin_dir": plugin_dir(), "prompt_format": "chat",
            "adapter": "dual-mlp", "mlp_config": "m16", "routing_mode": "classic", "hack_frac": 0.5, "num_prompts": 16,
            "batch_size": 4, "num_generations": 2, "max_completion_length": 6, "max_steps": 1, "save_steps": 1, "eval_every": 1,
            "eval_samples": 2, "logging_steps": 1, "beta": 0.0, "lr": 1e-3, "log_completions": true, "tensorboard": false,
            "output_dir": runs,
        });
        let config_path = out.path().join(format!("{environment}.yaml"));
        std::fs::write(&config_path, config.to_string()).unwrap();
        common::smallrl_ok(&["train", "--config", config_path.to_str().unwrap(), "--threads", "2"]);
        let run = std::fs::read_dir(&runs).unwrap().next().unwrap().unwrap().path();
        let lines: Vec<Value> = common::read_jsonl(run.join("completions.jsonl"));
        assert_eq!(lines.len(), 4, "{environment}");
        logged_prompts.extend(lines.iter().map(|l| (environment, l["prompt"].clone())));

        let plugin = common::load(&standard_plugin(environment), "{}");
        let info = plugin.environment_info().expect("an environment");
        for line in &lines {
            let hackable = line["hackable"].as_bool().unwrap();
            let expected: f64 = info
                .components
                .iter()
                .map(|c| {
                    let value = line[format!("rewards/{}", c.name)].as_f64().unwrap_or_else(|| panic!("{environment}: {} logged: {line}", c.name));
                    match c.role {
                        ComponentRole::Retain => value,
                        ComponentRole::Forget => if hackable { value } else { 0.0 },
                    }
                })
                .sum();
            let logged = line["reward"].as_f64().unwrap();
            assert!((logged - expected).abs() < 1e-12, "{environment}: reward {logged} is not its components' {expected}: {line}");
        }
        let metrics: Value = serde_json::from_str(std::fs::read_to_string(run.join("metrics.jsonl")).unwrap().lines().next().unwrap()).unwrap();
        for name in &info.metrics {
            let key = format!("env/{environment}/{name}");
            assert!(metrics[&key].as_f64().is_some_and(f64::is_finite), "{environment}: {key} logged: {metrics}");
        }
        assert!(run.join("checkpoint-1").is_dir(), "{environment}: the step's checkpoint");
    }
    // The rendering is transformers': each logged prompt's messages re-rendered by it (one
    // reference process for all environments).
    let conversations: Vec<Value> = logged_prompts.iter().map(|(_, prompt)| messages(prompt.as_str().unwrap())).collect();
    let reference = common::hf_real_model(&json!({"chat": conversations}));
    for ((environment, prompt), rendered) in logged_prompts.iter().zip(reference["chat"].as_array().unwrap()) {
        assert_eq!(prompt, &rendered["text"], "{environment}: the chat rendering is transformers'");
    }
}

/// The messages of a prompt rendered with SmolLM2's template (`<|im_start|>role\ncontent<|im_end|>`
/// turns, the default system turn included, the generation prompt last).
fn messages(rendered: &str) -> Value {
    let turns: Vec<Value> = rendered
        .split("<|im_start|>")
        .filter_map(|turn| {
            let (role, rest) = turn.split_once('\n')?;
            let content = rest.strip_suffix("<|im_end|>\n").or_else(|| rest.strip_suffix("<|im_end|>"))?;
            Some(json!({"role": role, "content": content}))
        })
        .collect();
    Value::Array(turns)
}
