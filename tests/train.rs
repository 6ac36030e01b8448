//! The trainer end to end on the pre-trained `tiny-stories` fixture with real reward plugins:
//! learning, exact resumption, checkpoints, and a plugin failure in the middle of a run.

mod common;

use std::path::{Path, PathBuf};

use common::{fixture, one_thread, repo_root, standard_plugin, test_plugin};
use serde_json::{Map, Value, json};
use smallrl::train::{TrainConfig, Trainer};

/// A small, fast configuration: 8 completions per step in groups of 4, short completions.
fn small_config(output_dir: &Path, reward_plugin: &Path) -> Map<String, Value> {
    let value = json!({
        "model": fixture("tiny-stories"),
        "prompts": fixture("tiny-stories/prompts.txt"),
        "reward": {"plugin": reward_plugin, "params": {}},
        "batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 24,
        "max_steps": 4,
        "save_steps": 2,
        "eval_every": 2,
        "eval_samples": 4,
        "logging_steps": 1,
        "adapter": "dual-lora",
        "lora_preset": "r4",
        "lr": 1e-3,
        "output_dir": output_dir,
        "threads": 1,
        "device": "cpu",
        "name": "test",
    });
    let Value::Object(map) = value else { unreachable!() };
    map
}

fn with(mut map: Map<String, Value>, key: &str, value: Value) -> Map<String, Value> {
    map.insert(key.into(), value);
    map
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Metric lines without wall-clock fields.
fn deterministic(lines: Vec<Value>) -> Vec<Value> {
    lines
        .into_iter()
        .map(|mut line| {
            let obj = line.as_object_mut().unwrap();
            obj.retain(|k, _| !k.starts_with("timing/") && k != "step_time" && k != "seconds");
            line
        })
        .collect()
}

/// Equal lines, with floats equal to 1e-12 relative: the training state is compared bit for bit
/// (below), but libtorch's float64 reductions of logged summaries (a masked mean of per-token
/// KL values near 1e-14 at step 1) can differ in the last bit with the memory alignment of
/// their inputs, which differs between two trainers in one process.
fn assert_same_metrics(a: &[Value], b: &[Value], file: &str) {
    for (step, (x, y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (x.as_object().unwrap(), y.as_object().unwrap());
        assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>(), "{file} line {step}: keys");
        for (key, value) in x {
            let other = &y[key];
            match (value.as_f64(), other.as_f64()) {
                (Some(p), Some(q)) if value.is_f64() => {
                    assert!((p - q).abs() <= 1e-12 * p.abs().max(q.abs()), "{file} line {step}: {key} {p} vs {q} after resuming")
                }
                _ => assert_eq!(value, other, "{file} line {step}: {key} after resuming"),
            }
        }
    }
}

fn train(config: Map<String, Value>) -> PathBuf {
    one_thread();
    let config = TrainConfig::resolve(None, config).unwrap();
    let mut trainer = Trainer::new(config, None).unwrap();
    trainer.train(None).unwrap().run_dir
}

/// DualLoRA with classic routing; the detector flags any "happy" (threshold 1), so both
/// sample classes occur.
fn routed_config(output_dir: &Path) -> Map<String, Value> {
    let config = small_config(output_dir, &standard_plugin("happy"));
    let config = with(config, "routing_mode", "classic".into());
    let config = with(config, "rh_detector", json!({"plugin": "happy_count", "params": {"threshold": 1}}));
    with(config, "plugin_dir", json!(repo_root().join("plugins")))
}

#[test]
fn resumed_run_repeats_the_uninterrupted_run_exactly() {
    let out = tempfile::tempdir().unwrap();
    let whole = train(routed_config(&out.path().join("a")));

    let resolved = TrainConfig::resolve(None, routed_config(&out.path().join("b"))).unwrap();
    let mut first = Trainer::new(resolved.clone(), None).unwrap();
    let stopped = first.train(Some(2)).unwrap();
    assert_eq!(stopped.steps, 2);
    drop(first);
    let mut second = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap();
    let resumed = second.train(None).unwrap();

    for file in ["metrics.jsonl", "routing_eval.jsonl"] {
        let a = deterministic(read_jsonl(&whole.join(file)));
        let b = deterministic(read_jsonl(&resumed.run_dir.join(file)));
        assert_eq!(a.len(), if file == "metrics.jsonl" { 4 } else { 2 });
        assert_same_metrics(&a, &b, file);
    }
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-4/adapters.safetensors")).unwrap();
    let (a, b) = (weights(&whole), weights(&resumed.run_dir));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, tensor) in &a {
        assert!(tensor.equal(&b[name]), "{name} differs after resumption");
    }
    let log = std::fs::read_to_string(resumed.run_dir.join("train.log")).unwrap();
    assert!(log.contains("[Sample @ step 1] ") && log.contains(" ||| "), "train.log lacks sample lines");
    assert!(log.contains("[Routing Eval @ step 4]") && log.contains("retain_only") && log.contains("forget_only"));
}

#[test]
fn checkpoints_record_the_adapter_configuration_and_load_back() {
    let out = tempfile::tempdir().unwrap();
    let run = train(with(small_config(out.path(), &standard_plugin("happy")), "max_steps", 2.into()));
    let state = smallrl::train::checkpoint::read_state(&run.join("checkpoint-2")).unwrap();
    let expected = smallrl::adapters::AdapterConfig::dual_lora(4, 4, 4.0, 1);
    assert_eq!(state.adapters, expected);
    assert_eq!(state.step, 2);
    // 4 layers x 7 projections x 2 slots x (A, B).
    let weights = smallrl::train::checkpoint::read_weights(&run.join("checkpoint-2"), &state).unwrap();
    assert_eq!(weights.len(), 4 * 7 * 2 * 2);
    // `smallrl eval` of the checkpoint reproduces the training-time evaluation at step 2.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"))
        .args(["eval", run.join("checkpoint-2").to_str().unwrap(), "--n-samples", "4", "--json", "--threads", "1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "smallrl eval failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let training_eval = read_jsonl(&run.join("routing_eval.jsonl")).pop().unwrap();
    assert_eq!(training_eval["step"], 2);
    for mode in report["report"]["modes"].as_array().unwrap() {
        let name = mode["mode"].as_str().unwrap();
        let during = &training_eval["modes"][name];
        for key in ["reward", "hack_freq", "unique", "jaccard"] {
            assert_eq!(mode[key], during[key], "{name}/{key}: eval of the checkpoint differs from training-time eval");
        }
    }
    let name = run.file_name().unwrap().to_str().unwrap();
    // Every non-default hyperparameter (alphabetical by key, short names) and the seed.
    assert_eq!(name, "test_dual-lora_bs8_r4_lr1e-3_len24_steps2_g4_s42");
}

#[test]
fn a_failing_plugin_stops_the_run_and_keeps_what_was_written() {
    let out = tempfile::tempdir().unwrap();
    let run = train(with(small_config(out.path(), &standard_plugin("happy")), "max_steps", 2.into()));
    // Continue the run with a reward plugin that traps: step 3 must fail, loudly, and leave the
    // checkpoint and the metrics of steps 1-2 as they were.
    let config_path = run.join("config.yaml");
    let mut config: Value = smallrl::yaml::read_file(&config_path).unwrap();
    config["reward"] = json!({"plugin": test_plugin("misbehaving"), "params": {"mode": "panic"}});
    config["max_steps"] = 4.into();
    std::fs::write(&config_path, smallrl::yaml::to_string(&config).unwrap()).unwrap();
    let before = std::fs::read(run.join("checkpoint-2/adapters.safetensors")).unwrap();
    let resolved = TrainConfig::resolve(Some(&config_path), Map::new()).unwrap();
    let mut trainer = Trainer::new(resolved, Some(&run)).unwrap();
    let error = format!("{:#}", trainer.train(None).unwrap_err());
    assert!(error.contains("step 3") && error.contains("misbehaving") && error.contains("panic"), "unclear error: {error}");
    assert_eq!(read_jsonl(&run.join("metrics.jsonl")).len(), 2);
    assert_eq!(std::fs::read(run.join("checkpoint-2/adapters.safetensors")).unwrap(), before);
    assert!(!run.join("checkpoint-4").exists());
}

#[test]
fn grpo_on_happy_count_raises_the_reward() {
    let out = tempfile::tempdir().unwrap();
    let config = small_config(out.path(), &standard_plugin("happy"));
    let config = [
        ("adapter", json!("lora")), ("lora_preset", Value::Null), ("lora_rank", 8.into()), ("lora_alpha", 8.0.into()),
        ("lr", 3e-3.into()), ("batch_size", 32.into()), ("num_generations", 16.into()),
        ("max_completion_length", 64.into()), ("max_steps", 20.into()), ("save_steps", 20.into()), ("eval_every", 20.into()),
    ]
    .into_iter()
    .fold(config, |c, (k, v)| with(c, k, v));
    let run = train(config);
    let rewards: Vec<f64> = read_jsonl(&run.join("metrics.jsonl")).iter().map(|m| m["reward"].as_f64().unwrap()).collect();
    let mean = |r: &[f64]| r.iter().sum::<f64>() / r.len() as f64;
    let (first, last) = (mean(&rewards[..5]), mean(&rewards[15..]));
    println!("mean reward, steps 1-5: {first:.3}; steps 16-20: {last:.3}");
    // tiny-stories says "happy" in about 45% of samples (0.1-0.2 on the happy_count scale);
    // 20 steps of GRPO with LoRA r8 at lr 3e-3 roughly double it (seen with 1 thread:
    // 0.165 over steps 1-5 -> 0.350 over steps 16-20).
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "GRPO did not raise the reward: {first:.3} -> {last:.3}");
}

#[test]
fn exported_checkpoints_load_in_transformers_with_the_same_logits() {
    let out = tempfile::tempdir().unwrap();
    let run = train(with(small_config(out.path(), &standard_plugin("happy")), "max_steps", 2.into()));
    let export = out.path().join("retain_only");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"))
        .args(["export", run.join("checkpoint-2").to_str().unwrap(), "--out", export.to_str().unwrap(), "--scales", "1,0", "--threads", "1"])
        .status()
        .unwrap();
    assert!(status.success(), "smallrl export failed");
    let restored = smallrl::train::checkpoint::restore_model(&run.join("checkpoint-2"), tch::Device::Cpu).unwrap();
    let tokenizer = smallrl::model::Tokenizer::from_file(&restored.tokenizer_path).unwrap();
    let ids: Vec<i64> = tokenizer.encode("once upon a time, a happy girl named lily").unwrap().iter().map(|&i| i as i64).collect();
    std::fs::write(out.path().join("ids.json"), serde_json::to_string(&ids).unwrap()).unwrap();
    let status = std::process::Command::new(common::python())
        .current_dir(repo_root())
        .args(["scripts/reference/hf_logits.py", export.to_str().unwrap()])
        .args([out.path().join("ids.json").to_str().unwrap(), out.path().join("hf.safetensors").to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success(), "transformers could not load the exported directory");
    let hf = smallrl::model::weights::read_safetensors(&out.path().join("hf.safetensors")).unwrap();
    let input = tch::Tensor::from_slice(&ids).unsqueeze(0);
    let ctl = [smallrl::model::linear::AdapterCtl::frozen(1.0), smallrl::model::linear::AdapterCtl::frozen(0.0)];
    let ours = tch::no_grad(|| restored.model.logits(&restored.model.forward(&input, &input.ones_like(), &ctl))).squeeze_dim(0);
    let diff = common::max_abs_diff(&ours, &hf["logits"]);
    assert!(diff < 1e-4, "transformers' logits of the export differ from smallrl's retain-only model by {diff}");
    let both = [smallrl::model::linear::AdapterCtl::frozen(1.0), smallrl::model::linear::AdapterCtl::frozen(1.0)];
    let with_forget = tch::no_grad(|| restored.model.logits(&restored.model.forward(&input, &input.ones_like(), &both))).squeeze_dim(0);
    assert!(common::max_abs_diff(&with_forget, &hf["logits"]) > 1e-4, "the forget adapter should matter after training");
}

#[test]
fn dumped_batches_recompute_the_logged_loss() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = with(small_config(out.path(), &standard_plugin("happy")), "max_steps", 1.into());
    let run = train(with(config, "dump_batches", json!(dump)));
    let tensors = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    for key in ["prompt_ids", "completion_ids", "completion_mask", "rewards", "rewards/happy", "is_rh", "advantages", "sampling_logprobs", "ref_logprobs", "new_logprobs", "loss"] {
        assert!(tensors.contains_key(key), "dump lacks {key}");
    }
    // Recompute the grpo loss (beta 0.02, ratio 1) by hand from the dumped tensors.
    let mask = tensors["completion_mask"].to_kind(tch::Kind::Double);
    let (new, reference) = (tensors["new_logprobs"].to_kind(tch::Kind::Double), tensors["ref_logprobs"].to_kind(tch::Kind::Double));
    let delta = &reference - &new;
    let kl = delta.exp() - &delta - 1.0;
    let per_token = -tensors["advantages"].to_kind(tch::Kind::Double).unsqueeze(1) + kl * 0.02;
    let per_sequence = (per_token * &mask).sum_dim_intlist(1, false, tch::Kind::Double) / mask.sum_dim_intlist(1, false, tch::Kind::Double);
    let expected = per_sequence.mean(tch::Kind::Double).double_value(&[]);
    let logged = read_jsonl(&run.join("metrics.jsonl"))[0]["loss"].as_f64().unwrap();
    assert!((tensors["loss"].double_value(&[]) - expected).abs() < 1e-6, "dumped loss does not follow from the dumped tensors");
    assert!((logged - expected).abs() < 1e-6, "logged loss {logged} vs recomputed {expected}");
    // The sampling log-probs are those of the policy that sampled (same weights at step 1).
    let sampled = tensors["sampling_logprobs"].to_kind(tch::Kind::Double);
    assert!(common::max_abs_diff(&(sampled * &mask), &(&new * &mask)) < 1e-4);
}
