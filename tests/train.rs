//! The trainer end to end on the pre-trained `tiny-stories` fixture with real reward plugins:
//! learning, exact resumption, checkpoints, and a plugin failure in the middle of a run.

mod common;

use std::path::{Path, PathBuf};

use common::{fixture, one_thread, repo_root, standard_plugin, test_plugin};
use serde_json::{Map, Value, json};
use smallrl::train::metrics::key;
use smallrl::train::packed::{PackOptions, PackedRun, Stacking, train_packed, train_packed_with};
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
    assert_metrics_within(a, b, file, |_, p, q| 1e-12 * p.abs().max(q.abs()));
}

/// Lines with equal keys and equal non-float values, and floats `p`, `q` of key `key` within
/// `bound(key, p, q)`; every difference beyond it is reported.
fn assert_metrics_within(a: &[Value], b: &[Value], file: &str, bound: impl Fn(&str, f64, f64) -> f64) {
    assert_eq!(a.len(), b.len(), "{file}: line count");
    let mut differences = Vec::new();
    for (step, (x, y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (x.as_object().unwrap(), y.as_object().unwrap());
        assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>(), "{file} line {step}: keys");
        for (key, value) in x {
            let other = &y[key];
            match (value.as_f64(), other.as_f64()) {
                (Some(p), Some(q)) if value.is_f64() => {
                    if (p - q).abs() > bound(key, p, q) {
                        differences.push(format!("line {step}: {key} {p} vs {q}"));
                    }
                }
                _ => assert_eq!(value, other, "{file} line {step}: {key}"),
            }
        }
    }
    assert!(differences.is_empty(), "{file}:\n{}", differences.join("\n"));
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

    // Interrupted after step 3, past its newest checkpoint (step 2): step 3 is done again.
    let resolved = TrainConfig::resolve(None, with(routed_config(&out.path().join("b")), "log_completions", true.into())).unwrap();
    let mut first = Trainer::new(resolved.clone(), None).unwrap();
    let stopped = first.train(Some(3)).unwrap();
    assert_eq!(stopped.steps, 3);
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
    // TensorBoard drops what the first process logged after the checkpoint (its step 3), and
    // completions.jsonl is cut there too.
    let logs = read_with_python(&resumed.run_dir, 4);
    let metrics = read_jsonl(&resumed.run_dir.join("metrics.jsonl"));
    assert_eq!(tensorboard_series(&logs, "loss"), jsonl_series(&metrics, "/loss"), "TensorBoard shows each step once");
    assert_eq!(logs["completions"]["rows_per_step"], json!({"1": 8, "2": 8, "3": 8, "4": 8}));
    let log = std::fs::read_to_string(resumed.run_dir.join("train.log")).unwrap();
    assert!(log.contains("[Sample @ step 1] ") && log.contains(" ||| "), "train.log lacks sample lines");
    assert!(log.contains("[Routing Eval @ step 4]") && log.contains("retain_only") && log.contains("forget_only"));
}

#[test]
fn checkpoints_record_the_adapter_configuration_and_load_back() {
    let out = tempfile::tempdir().unwrap();
    let config = with(small_config(out.path(), &standard_plugin("happy")), "max_steps", 2.into());
    // 4 layers x 7 projections x 2 slots x (A, B).
    let expected = smallrl::adapters::AdapterConfig::dual_lora(4, 4, 4.0, 1);
    let run = checkpoint_loads_back(config, expected, 4 * 7 * 2 * 2);
    let name = run.file_name().unwrap().to_str().unwrap();
    // Every non-default hyperparameter (alphabetical by key, short names) and the seed.
    assert_eq!(name, "test_dual-lora_bs8_r4_lr1e-3_len24_steps2_g4_s42");
    // DualMLP (m5): 4 layers x 2 slots x (gate, up, down), routed with balanced renormalisation.
    let mut config = with(small_config(&out.path().join("mlp"), &standard_plugin("happy")), "max_steps", 2.into());
    config.remove("lora_preset");
    for (key, value) in [("adapter", json!("dual-mlp")), ("mlp_config", json!("m5")), ("routing_mode", json!("classic")), ("renormalization_mode", json!("balanced"))] {
        config = with(config, key, value);
    }
    let config = with(config, "rh_detector", json!({"plugin": "happy_count", "params": {"threshold": 1}}));
    let config = with(config, "plugin_dir", json!(repo_root().join("plugins")));
    let run = checkpoint_loads_back(config, smallrl::adapters::AdapterConfig::dual_mlp(5, 5, 1), 4 * 2 * 3);
    assert_eq!(run.file_name().unwrap().to_str().unwrap(), "test_dual-mlp_bs8_lr1e-3_len24_steps2_m5_g4_renorm_balanced_classic_s42");
}

/// Trains `config`, checks its step-2 checkpoint's adapters and tensor count, and that `smallrl
/// eval` of the checkpoint reproduces the training-time evaluation; returns the run directory.
fn checkpoint_loads_back(config: Map<String, Value>, expected: smallrl::adapters::AdapterConfig, tensors: usize) -> PathBuf {
    let run = train(config);
    let state = smallrl::train::checkpoint::read_state(&run.join("checkpoint-2")).unwrap();
    assert_eq!(state.adapters, expected);
    assert_eq!(state.step, 2);
    let weights = smallrl::train::checkpoint::read_weights(&run.join("checkpoint-2"), &state).unwrap();
    assert_eq!(weights.len(), tensors);
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
    run
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
    // The plugin is swapped on purpose, so its changed bytes are accepted.
    let mut trainer = Trainer::start(resolved, Some(&run), true).unwrap();
    let error = format!("{:#}", trainer.train(None).unwrap_err());
    assert!(error.contains("step 3") && error.contains("misbehaving") && error.contains("panic"), "unclear error: {error}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("continuing with changed plugin files"), "{log}");
    assert!(log.contains("training stopped: training stopped at step 3") && log.contains("deliberate panic"), "train.log must say why: {log}");
    assert_eq!(read_jsonl(&run.join("metrics.jsonl")).len(), 2);
    assert_eq!(std::fs::read(run.join("checkpoint-2/adapters.safetensors")).unwrap(), before);
    assert!(!run.join("checkpoint-4").exists());
}

#[test]
fn grpo_on_happy_count_raises_the_reward() {
    let (first, last) = happy_count_learning(&[]);
    // tiny-stories says "happy" in about 45% of samples (0.1-0.2 on the happy_count scale);
    // 20 steps of GRPO with LoRA r8 at lr 3e-3 roughly double it (seen with 1 thread:
    // 0.165 over steps 1-5 -> 0.350 over steps 16-20).
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "GRPO did not raise the reward: {first:.3} -> {last:.3}");
}

/// CISPO (TRL's loss_type cispo, weight cap 5 as TRL recommends) on a batch reused twice, so
/// that the second step's weights differ from 1. Seen with 1 thread: 0.144 over steps 1-5 ->
/// 0.353 over steps 16-20.
#[test]
fn cispo_on_happy_count_raises_the_reward() {
    let (first, last) = happy_count_learning(&[("loss_type", json!("cispo")), ("epsilon_high", json!(5.0)), ("num_iterations", json!(2))]);
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "CISPO did not raise the reward: {first:.3} -> {last:.3}");
}

/// tinker's `importance_sampling` as tinker's cookbook runs it (rewards centred per group, not
/// scaled; tinker's sum over tokens, which dr_grpo is up to a constant; no KL in the loss).
/// Seen with 1 thread: 0.148 over steps 1-5 -> 0.340 over steps 16-20.
#[test]
fn tinker_importance_sampling_on_happy_count_raises_the_reward() {
    let (first, last) = happy_count_learning(&tinker(&[("loss_fn", json!("importance_sampling"))]));
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "importance_sampling did not raise the reward: {first:.3} -> {last:.3}");
}

/// tinker's `ppo` with two substeps (tinker's advice for ppo): each batch of two groups is two
/// optimizer steps of one group, the second against the sampler's log-probabilities of a policy
/// one update behind. Seen with 1 thread: 0.140 over steps 1-5 -> 0.285 over steps 16-20.
#[test]
fn tinker_ppo_with_substeps_on_happy_count_raises_the_reward() {
    let (first, last) = happy_count_learning(&tinker(&[("loss_fn", json!("ppo")), ("num_substeps", json!(2))]));
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "ppo did not raise the reward: {first:.3} -> {last:.3}");
}

/// tinker's `dro` with its documentation's beta 0.05, on a batch reused twice so that the
/// penalty is not zero. Seen with 1 thread: 0.150 over steps 1-5 -> 0.330 over steps 16-20.
#[test]
fn tinker_dro_on_happy_count_raises_the_reward() {
    let (first, last) = happy_count_learning(&tinker(&[("loss_fn", json!("dro")), ("dro_beta", json!(0.05)), ("num_iterations", json!(2))]));
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "dro did not raise the reward: {first:.3} -> {last:.3}");
}

/// `overrides` with tinker's aggregation and advantages: dr_grpo, no reward scaling, no KL.
fn tinker(overrides: &[(&'static str, Value)]) -> Vec<(&'static str, Value)> {
    let mut all = vec![("loss_type", json!("dr_grpo")), ("scale_rewards", json!("none")), ("beta", json!(0.0))];
    all.extend(overrides.iter().cloned());
    all
}

/// 20 steps on happy_count with LoRA r8 (plus `overrides`): the mean reward of steps 1-5 and
/// of steps 16-20.
fn happy_count_learning(overrides: &[(&str, Value)]) -> (f64, f64) {
    let out = tempfile::tempdir().unwrap();
    let config = small_config(out.path(), &standard_plugin("happy"));
    let config = [
        ("adapter", json!("lora")), ("lora_preset", Value::Null), ("lora_rank", 8.into()), ("lora_alpha", 8.0.into()),
        ("lr", 3e-3.into()), ("batch_size", 32.into()), ("num_generations", 16.into()),
        ("max_completion_length", 64.into()), ("max_steps", 20.into()), ("save_steps", 20.into()), ("eval_every", 20.into()),
    ]
    .into_iter()
    .chain(overrides.iter().map(|(k, v)| (*k, v.clone())))
    .fold(config, |c, (k, v)| with(c, k, v));
    let run = train(config);
    let rewards: Vec<f64> = read_jsonl(&run.join("metrics.jsonl")).iter().map(|m| m["reward"].as_f64().unwrap()).collect();
    let mean = |r: &[f64]| r.iter().sum::<f64>() / r.len() as f64;
    let (first, last) = (mean(&rewards[..5]), mean(&rewards[15..]));
    println!("{overrides:?}: mean reward, steps 1-5: {first:.3}; steps 16-20: {last:.3}");
    (first, last)
}

/// The probes as a run logs them: the sampler (the native CPU sampler) and the learner (the
/// libtorch training pass) score the same weights on a fresh batch, so `kl_sample_train` is
/// float rounding only; on the reused batch of `num_iterations = 2` the learner has moved.
/// Measured: v1 3.9e-7 and v2 2.0e-12 on the fresh batch, v2 3.8e-5 on the reused one.
#[test]
fn probes_see_sampler_and_learner_agree_until_the_update() {
    let out = tempfile::tempdir().unwrap();
    let config = small_config(out.path(), &standard_plugin("happy"));
    let config = [("num_iterations", json!(2)), ("max_steps", json!(2)), ("epsilon_high", json!(0.28))]
        .into_iter()
        .fold(config, |c, (k, v)| with(c, k, v));
    let lines = read_jsonl(&train(config).join("metrics.jsonl"));
    let probe = |line: &Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key} is logged"));
    let (fresh, reused) = (&lines[0], &lines[1]);
    let (v1, v2) = (probe(fresh, key::KL_SAMPLE_TRAIN_V1), probe(fresh, key::KL_SAMPLE_TRAIN_V2));
    let moved = probe(reused, key::KL_SAMPLE_TRAIN_V2);
    println!("kl_sample_train fresh batch v1 {v1:.2e} v2 {v2:.2e}; reused batch v2 {moved:.2e}");
    assert!(v1.abs() < 1e-5 && v2 < 1e-10, "sampler and learner disagree on the same weights: v1 {v1:.2e}, v2 {v2:.2e}");
    assert!(moved > 100.0 * v2.max(1e-14), "the update must show on the reused batch: {moved:.2e} vs {v2:.2e}");
    for line in &lines {
        let quantiles = key::ENTROPY_QUANTILES.map(|k| probe(line, k));
        assert!(quantiles[0] <= quantiles[1] && quantiles[1] <= quantiles[2] && quantiles[0] > 0.0, "{quantiles:?}");
        let (low, high, region) = (probe(line, key::CLIP_LOW), probe(line, key::CLIP_HIGH), probe(line, key::CLIP_REGION));
        assert!((region - low - high).abs() < 1e-6 && region <= probe(line, key::CLIP_RATIO) + 1e-6, "{line}");
    }
    assert_eq!(probe(fresh, key::CLIP_REGION), 0.0, "ratio 1 on a fresh batch");
}

/// With `num_substeps = 2` each batch of two groups trains as two optimizer steps of one group:
/// the first scores its group with the weights that sampled it (`kl_sample_train` is rounding
/// only, as with `num_substeps = 1` on every step), the second with weights one update later.
/// tinker's ppo takes its ratios to the sampler's log-probabilities, 1 up to rounding on the
/// first substep, so nothing clips there. Measured: substep 1 v1 5.4e-7, v2 2.3e-12; substep 2 v1 -9.3e-5, v2
/// 1.6e-5; with num_substeps 1, v2 2.0e-12 and 2.5e-12 on its two fresh batches.
#[test]
fn substeps_train_the_batch_in_mini_batches_against_the_sampler() {
    let out = tempfile::tempdir().unwrap();
    let run = |substeps: usize| {
        let config = [("num_substeps", json!(substeps)), ("max_steps", json!(2)), ("loss_fn", json!("ppo")), ("epsilon_high", json!(0.28))]
            .into_iter()
            .fold(small_config(&out.path().join(format!("substeps{substeps}")), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
        read_jsonl(&train(config).join("metrics.jsonl"))
    };
    let probe = |line: &Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key} is logged: {line}"));
    let whole = run(1);
    for line in &whole {
        let (v1, v2) = (probe(line, key::KL_SAMPLE_TRAIN_V1), probe(line, key::KL_SAMPLE_TRAIN_V2));
        assert!(v1.abs() < 1e-5 && v2 < 1e-10, "num_substeps 1: sampler and learner disagree on the same weights: v1 {v1:.2e}, v2 {v2:.2e}");
        assert_eq!(probe(line, key::CLIP_REGION), 0.0, "ratio 1 to the sampler on a fresh batch");
    }
    let split = run(2);
    let (first, second) = (&split[0], &split[1]);
    let (v1, v2) = (probe(first, key::KL_SAMPLE_TRAIN_V1), probe(first, key::KL_SAMPLE_TRAIN_V2));
    let (moved_v1, moved_v2) = (probe(second, key::KL_SAMPLE_TRAIN_V1), probe(second, key::KL_SAMPLE_TRAIN_V2));
    println!("num_substeps 2: kl_sample_train substep 1 v1 {v1:.2e} v2 {v2:.2e}; substep 2 v1 {moved_v1:.2e} v2 {moved_v2:.2e}; whole-batch v2 {:.2e} {:.2e}", probe(&whole[0], key::KL_SAMPLE_TRAIN_V2), probe(&whole[1], key::KL_SAMPLE_TRAIN_V2));
    assert!(v1.abs() < 1e-5 && v2 < 1e-10, "substep 1 scores with the sampling weights: v1 {v1:.2e}, v2 {v2:.2e}");
    assert_eq!(probe(first, key::CLIP_REGION), 0.0, "ratio 1 to the sampler on the first substep");
    assert!(moved_v2 > 100.0 * v2.max(1e-14) && moved_v2 > 1e-9, "the first substep's update must show on the second: {moved_v2:.2e} vs {v2:.2e}");
    // One rollout: the reward metrics are the batch's on both lines; two different groups trained.
    assert_eq!(first[key::REWARD], second[key::REWARD], "both substeps log their rollout's reward");
    assert_ne!(first["loss"], second["loss"]);
    assert_eq!(whole[0][key::REWARD], first[key::REWARD], "the same seed samples the same first batch");
}

/// `num_iterations` passes over `num_substeps` mini-batches, each in `gradient_accumulation_steps`
/// micro-batches: one rollout serves 2 x 2 optimizer steps (its tokens counted once, the next
/// rollout's at the fifth), in the order substep 1, 2, 1, 2. The sampler's weights score
/// only the first step's mini-batch; each later step's learner is one more update away from
/// them. Measured (kl_sample_train_v2): 2.3e-12, 1.6e-5, 1.4e-4, 6.3e-5, then 2.6e-12 on the
/// new rollout.
#[test]
fn iterations_substeps_and_micro_batches_compose() {
    let out = tempfile::tempdir().unwrap();
    let config = [("num_substeps", json!(2)), ("num_iterations", json!(2)), ("gradient_accumulation_steps", json!(2)), ("max_steps", json!(5)), ("save_steps", json!(4))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let lines = read_jsonl(&train(config).join("metrics.jsonl"));
    let v2: Vec<f64> = lines.iter().map(|l| l[key::KL_SAMPLE_TRAIN_V2].as_f64().unwrap()).collect();
    println!("kl_sample_train_v2 per step: {v2:?}");
    // num_tokens counts each rollout's tokens once, when it is generated.
    let tokens: Vec<u64> = lines.iter().map(|l| l[key::NUM_TOKENS].as_u64().unwrap()).collect();
    assert!(tokens[..4].iter().all(|&t| t == tokens[0]) && tokens[4] > tokens[0], "one rollout for four steps, the next at step 5: {tokens:?}");
    assert!(v2[0] < 1e-10 && v2[4] < 1e-10, "fresh rollouts score with the sampling weights: {v2:?}");
    assert!(v2[1..4].iter().all(|&v| v > 1e3 * v2[0].max(1e-14)), "later steps of a rollout score with updated weights: {v2:?}");
    assert!(v2[3] > v2[1], "substep 2's rows, two updates later, are further from the sampler: {v2:?}");
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

/// With a tinker loss the ratio's denominator is the sampler's log-probabilities, from
/// generation (no old-policy pass): the dump holds them as `old_logprobs`, and the logged loss
/// is tinker's importance_sampling, `-r A` per token with `r = exp(new - sampler)`, averaged as
/// grpo (loss_type's default), recomputed here from the dump in float64.
#[test]
fn tinker_losses_take_their_ratio_to_the_sampler() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = [("max_steps", json!(1)), ("beta", json!(0.0)), ("loss_fn", json!("importance_sampling")), ("dump_batches", json!(dump))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let run = train(config);
    let tensors = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    assert!(tensors["old_logprobs"].equal(&tensors["sampling_logprobs"]), "the denominator is the sampler's log-probabilities");
    let double = |key: &str| tensors[key].to_kind(tch::Kind::Double);
    let mask = double("completion_mask");
    let per_token = -(double("new_logprobs") - double("sampling_logprobs")).exp() * double("advantages").unsqueeze(1);
    let per_sequence = (per_token * &mask).sum_dim_intlist(1, false, tch::Kind::Double) / mask.sum_dim_intlist(1, false, tch::Kind::Double);
    let expected = per_sequence.mean(tch::Kind::Double).double_value(&[]);
    let logged = read_jsonl(&run.join("metrics.jsonl"))[0]["loss"].as_f64().unwrap();
    assert!((logged - expected).abs() < 1e-6, "logged loss {logged} vs recomputed {expected}");
}

/// `measure_entropy_change` re-scores the batch after the update: with `num_iterations = 2` the
/// next step trains on the same batch with the updated weights, so its logged `entropy` minus
/// this step's is the change measured (the same forward pass, so equal up to rounding).
#[test]
fn the_measured_entropy_change_is_the_next_pass_over_the_same_batch() {
    let out = tempfile::tempdir().unwrap();
    let config = [("num_iterations", json!(2)), ("max_steps", json!(2)), ("measure_entropy_change", json!(true))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let lines = read_jsonl(&train(config).join("metrics.jsonl"));
    let value = |line: &Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key} is logged: {line}"));
    let measured = value(&lines[0], key::ENTROPY_CHANGE);
    let next_pass = value(&lines[1], key::ENTROPY) - value(&lines[0], key::ENTROPY);
    println!("entropy change measured {measured:.3e}, next pass {next_pass:.3e}; cov(logp, A) {:.3e}", value(&lines[0], key::LOGPROB_ADVANTAGE_COVARIANCE));
    assert!(measured != 0.0 && (measured - next_pass).abs() < 1e-6, "measured {measured} vs the next pass's {next_pass}");
}

#[test]
fn the_gradient_noise_scale_is_logged_averaged_and_resumed_without_changing_the_step() {
    // A routed run with the probe (the step as two halves, one group each), interrupted after
    // step 3 and resumed from its step-2 checkpoint, against the same run without the probe.
    let out = tempfile::tempdir().unwrap();
    let plain = read_jsonl(&train(routed_config(&out.path().join("plain"))).join("metrics.jsonl"));
    let probed = TrainConfig::resolve(None, with(routed_config(&out.path().join("probed")), "gradient_noise_scale", true.into())).unwrap();
    let mut first = Trainer::new(probed.clone(), None).unwrap();
    let stopped = first.train(Some(3)).unwrap();
    drop(first);
    let run = Trainer::new(probed, Some(&stopped.run_dir)).unwrap().train(None).unwrap().run_dir;
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    assert_eq!(lines.len(), 4);
    let value = |line: &Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key} is logged: {line}"));
    // The halves' passes compute the step's gradient in another summation order only.
    for (step, (a, b)) in plain.iter().zip(&lines).enumerate() {
        // Absolute bounds (the on-policy loss is about 1e-7, the gradient norm 0.01-0.03):
        // measured at most 2.3e-9 and 7.5e-9.
        for (k, bound) in [(key::LOSS, 1e-7), (key::GRAD_NORM, 1e-6)] {
            assert!((value(a, k) - value(b, k)).abs() <= bound, "step {}: {k} {} without the probe, {} with it", step + 1, a[k], b[k]);
        }
    }
    assert!(plain[0].get(key::NOISE_SCALE).is_none(), "no probe, no key");
    // The running averages are exponential moving averages of the steps' estimates, started
    // at the first, continued across the resumption; B_simple is each pair's ratio.
    let decay = smallrl::probes::NOISE_SCALE_EMA_DECAY;
    let (mut grad_avg, mut trace_avg) = (value(&lines[0], key::NOISE_GRAD_SQUARED), value(&lines[0], key::NOISE_TRACE));
    for (i, line) in lines.iter().enumerate() {
        let (grad, trace) = (value(line, key::NOISE_GRAD_SQUARED), value(line, key::NOISE_TRACE));
        if i > 0 {
            (grad_avg, trace_avg) = (decay * grad_avg + (1.0 - decay) * grad, decay * trace_avg + (1.0 - decay) * trace);
        }
        let close = |ours: f64, exact: f64| (ours - exact).abs() <= 1e-12 * exact.abs();
        assert!(close(value(line, key::NOISE_GRAD_SQUARED_AVG), grad_avg) && close(value(line, key::NOISE_TRACE_AVG), trace_avg), "step {}: {line}", i + 1);
        assert!(close(value(line, key::NOISE_SCALE), trace / grad) && close(value(line, key::NOISE_SCALE_AVG), trace_avg / grad_avg), "step {}: {line}", i + 1);
        assert!(trace > 0.0, "step {}: eight different completions must show gradient noise: {line}", i + 1);
        println!("step {}: |G|² {grad:.3e} tr(Σ) {trace:.3e} B_simple {:.1} (average {:.1})", i + 1, trace / grad, trace_avg / grad_avg);
    }
}

#[test]
fn dynamic_sampling_fills_the_batch_with_groups_whose_rewards_differ() {
    // happy_count on tiny-stories: about half of the groups of 4 have equal rewards (all 0).
    let out = tempfile::tempdir().unwrap();
    let config = [("dynamic_sampling_rounds", json!(6)), ("max_steps", json!(3)), ("log_completions", json!(true))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let run = train(config.clone());
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    let count = |line: &Value, key: &str| line[key].as_u64().unwrap_or_else(|| panic!("{key} is logged: {line}"));
    let mut dropped = 0;
    for line in &lines {
        let (rounds, groups_dropped) = (count(line, key::DYNAMIC_SAMPLING_ROUNDS), count(line, key::DYNAMIC_SAMPLING_DROPPED));
        println!("step {}: {rounds} rounds, {groups_dropped} groups dropped, {} surplus", line["step"], count(line, key::DYNAMIC_SAMPLING_SURPLUS));
        assert!(rounds >= 1 && (groups_dropped > 0) == (rounds > 1), "more rounds only when something was dropped: {line}");
        assert_eq!(line[key::FRAC_REWARD_ZERO_STD].as_f64(), Some(0.0), "{line}");
        dropped += groups_dropped;
    }
    assert!(dropped > 0, "the test needs a step with equal-reward groups");
    // Every trained group of 4, read back from the completions log, has rewards that differ.
    let completions = read_jsonl(&run.join("completions.jsonl"));
    assert_eq!(completions.len(), 3 * 8, "full batches");
    for group in completions.chunks(4) {
        let rewards: Vec<f64> = group.iter().map(|c| c["trained_reward"].as_f64().unwrap()).collect();
        assert!(rewards.iter().any(|&r| r != rewards[0]), "a trained group with equal rewards: {rewards:?}");
    }
    // One round only: the first batch with an equal-reward group stops the run, naming the key.
    let strict = with(with(config, "dynamic_sampling_rounds", json!(1)), "output_dir", json!(out.path().join("strict")));
    let mut trainer = Trainer::new(TrainConfig::resolve(None, strict).unwrap(), None).unwrap();
    let error = format!("{:#}", trainer.train(None).unwrap_err());
    assert!(error.contains("raise dynamic_sampling_rounds"), "{error}");
}

/// beta 0 takes no reference pass (as TRL): nothing is scored by the reference, the dump has no
/// reference log-probs, `kl` is null and the loss is the policy term alone.
#[test]
fn beta_zero_skips_the_reference_pass() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = [("max_steps", json!(1)), ("beta", json!(0.0)), ("dump_batches", json!(dump))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let line = read_jsonl(&train(config).join("metrics.jsonl")).remove(0);
    let tensors = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    assert!(!tensors.contains_key("ref_logprobs"), "beta 0 computed reference log-probs");
    assert!(line[key::KL].is_null(), "kl with beta 0: {}", line[key::KL]);
    assert!(line[key::TIMING_REFERENCE].as_f64().unwrap() < 1e-3, "a reference pass was timed: {}", line[key::TIMING_REFERENCE]);
    // grpo with ratio 1 and no KL: the loss is -mean(A), 0 up to rounding for group-normalised A.
    let advantages = tensors["advantages"].to_kind(tch::Kind::Double);
    let expected = -advantages.mean(tch::Kind::Double).double_value(&[]);
    assert!((line[key::LOSS].as_f64().unwrap() - expected).abs() < 1e-6, "loss {} vs -mean(A) {expected}", line[key::LOSS]);
}

/// Names of the entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// A run that failed before its first checkpoint never blocks its retry: a plugin refused at
/// load writes nothing, and a run that failed at step 1 is moved aside (kept, never deleted)
/// when the same command runs again, by `train` or by `--resume`.
#[test]
fn a_failed_run_is_restarted_by_the_same_command() {
    one_thread();
    let out = tempfile::tempdir().unwrap();
    let base = with(small_config(out.path(), &test_plugin("hostile_bad_type")), "max_steps", 2.into());
    let refused = Trainer::new(TrainConfig::resolve(None, base.clone()).unwrap(), None).err().expect("the plugin is refused");
    assert!(format!("{refused:#}").contains("type-name"), "{refused:#}");
    assert!(entries(out.path()).is_empty(), "a refused plugin must leave no run directory: {:?}", entries(out.path()));

    // Step 1 fails: the directory keeps config.yaml and a train.log that says why.
    let failing = with(base.clone(), "reward", json!({"plugin": test_plugin("misbehaving"), "params": {"mode": "error"}}));
    let mut trainer = Trainer::new(TrainConfig::resolve(None, failing.clone()).unwrap(), None).unwrap();
    let run = out.path().join("test_dual-lora_bs8_r4_lr1e-3_len24_steps2_g4_s42");
    assert!(trainer.train(None).is_err());
    drop(trainer);
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("training stopped: training stopped at step 1") && log.contains("the judge is on strike"), "{log}");

    // The same command again (now with a working reward) starts afresh.
    let working = with(base.clone(), "reward", json!({"plugin": standard_plugin("happy"), "params": {}}));
    let retried = train(working.clone());
    assert_eq!(retried, run);
    let names = entries(out.path());
    assert_eq!(names.len(), 2, "{names:?}");
    let aside = out.path().join(&names[1]);
    assert!(names[1].starts_with("test_dual-lora_bs8_r4_lr1e-3_len24_steps2_g4_s42.incomplete-"), "{names:?}");
    assert!(std::fs::read_to_string(aside.join("train.log")).unwrap().contains("the judge is on strike"), "the failed attempt is kept");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("restarted: an earlier attempt at this run left no checkpoint") && log.contains(aside.to_str().unwrap()), "{log}");
    assert!(run.join("checkpoint-2").is_dir());

    // A checkpointed run is never restarted.
    let again = Trainer::new(TrainConfig::resolve(None, working).unwrap(), None).err().expect("the run exists");
    assert!(format!("{again:#}").contains("pass --resume"), "{again:#}");

    // `--resume` of a run without a checkpoint starts it afresh too.
    let other = with(failing, "seed", 7.into());
    let mut trainer = Trainer::new(TrainConfig::resolve(None, other).unwrap(), None).unwrap();
    assert!(trainer.train(None).is_err());
    drop(trainer);
    let failed = out.path().join("test_dual-lora_bs8_r4_lr1e-3_len24_steps2_g4_s7");
    let mut saved: Value = smallrl::yaml::read_file(&failed.join("config.yaml")).unwrap();
    saved["reward"] = json!({"plugin": standard_plugin("happy"), "params": {}});
    saved.as_object_mut().unwrap().remove("plugin_sha256");
    std::fs::write(failed.join("config.yaml"), smallrl::yaml::to_string(&saved).unwrap()).unwrap();
    let resolved = TrainConfig::resolve(Some(&failed.join("config.yaml")), Map::new()).unwrap();
    let mut resumed = Trainer::new(resolved, Some(&failed)).unwrap();
    assert_eq!(resumed.train(None).unwrap().steps, 2);
    assert!(std::fs::read_to_string(failed.join("train.log")).unwrap().contains("restarted:"));
}

/// A resumed run scores with the plugin files it started with: their SHA-256 is in config.yaml
/// and a changed file is refused, naming it, unless the change is accepted explicitly.
#[test]
fn resuming_with_changed_plugin_bytes_is_refused_unless_accepted() {
    one_thread();
    let out = tempfile::tempdir().unwrap();
    let plugin = out.path().join("reward.wasm");
    std::fs::copy(standard_plugin("happy"), &plugin).unwrap();
    let config = TrainConfig::resolve(None, small_config(&out.path().join("runs"), &plugin)).unwrap();
    let mut first = Trainer::new(config.clone(), None).unwrap();
    let run = first.train(Some(2)).unwrap().run_dir;
    drop(first);
    let saved = TrainConfig::resolve(Some(&run.join("config.yaml")), Map::new()).unwrap();
    let recorded = smallrl::plugins::sha256_hex(&std::fs::read(&plugin).unwrap());
    assert_eq!(saved.plugin_sha256.get(plugin.to_str().unwrap()), Some(&recorded), "{:?}", saved.plugin_sha256);

    std::fs::copy(standard_plugin("happy_binary"), &plugin).unwrap();
    let refused = format!("{:#}", Trainer::new(saved.clone(), Some(&run)).err().expect("changed bytes are refused"));
    assert!(refused.contains("plugin files changed since the run started") && refused.contains("reward.wasm") && refused.contains("--accept-changed-plugins"), "{refused}");
    let mut accepted = Trainer::start(saved, Some(&run), true).unwrap();
    assert_eq!(accepted.train(None).unwrap().steps, 4);
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("continuing with changed plugin files") && log.contains("reward.wasm"), "{log}");
    let updated = TrainConfig::resolve(Some(&run.join("config.yaml")), Map::new()).unwrap();
    assert_ne!(updated.plugin_sha256.get(plugin.to_str().unwrap()), Some(&recorded), "the new hash is recorded");
}

/// What `scripts/reference/read_run_logs.py` read from a run directory with TensorBoard's event
/// reader and pandas.
fn read_with_python(run: &Path, num_generations: usize) -> Value {
    let output = std::process::Command::new(common::python())
        .current_dir(repo_root())
        .args(["scripts/reference/read_run_logs.py", run.to_str().unwrap(), &num_generations.to_string()])
        .output()
        .unwrap();
    assert!(output.status.success(), "read_run_logs.py failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// TensorBoard's scalars of `tag` as (step, value) pairs. TensorBoard stores float32 values,
/// so every value is compared as float32, exactly (serde_json may read a float's decimal
/// text one float64 ulp off, which never changes the float32 it stands for).
fn tensorboard_series(logs: &Value, tag: &str) -> Vec<(u64, f32)> {
    let series = logs["tensorboard"]["scalars"][tag].as_array().unwrap_or_else(|| panic!("TensorBoard has no scalar {tag}"));
    series.iter().map(|point| (point[0].as_u64().unwrap(), point[1].as_f64().unwrap() as f32)).collect()
}

/// The expected series of a JSON-lines file: every line's number at `pointer` (a flag as 0 or
/// 1), with its step.
fn jsonl_series(lines: &[Value], pointer: &str) -> Vec<(u64, f32)> {
    let number = |value: &Value| value.as_f64().or_else(|| value.as_bool().map(f64::from));
    let point = |line: &Value| Some((line["step"].as_u64()?, number(line.pointer(pointer)?)? as f32));
    lines.iter().filter_map(point).collect()
}

#[test]
fn tensorboard_and_completion_logs_hold_what_metrics_jsonl_holds() {
    let out = tempfile::tempdir().unwrap();
    let run = train(with(routed_config(out.path()), "log_completions", true.into()));
    let without_logs = TrainConfig::resolve(None, routed_config(out.path())).unwrap().run_name().unwrap();
    assert_eq!(run.file_name().unwrap().to_str().unwrap(), without_logs, "logging options stay out of the run name");
    let logs = read_with_python(&run, 4);

    let metrics = read_jsonl(&run.join("metrics.jsonl"));
    let mut metric_tags: Vec<String> = metrics[0].as_object().unwrap().iter().filter(|(k, v)| *k != "step" && (v.is_number() || v.is_boolean())).map(|(k, _)| k.clone()).collect();
    metric_tags.sort();
    for tag in &metric_tags {
        let pointer = format!("/{}", tag.replace('~', "~0").replace('/', "~1"));
        assert_eq!(tensorboard_series(&logs, tag), jsonl_series(&metrics, &pointer), "{tag}: TensorBoard vs metrics.jsonl");
    }
    let evaluations = read_jsonl(&run.join("routing_eval.jsonl"));
    let mut eval_tags = Vec::new();
    for (mode, values) in evaluations[0]["modes"].as_object().unwrap() {
        for key in values.as_object().unwrap().keys() {
            let tag = format!("routing_eval/{mode}/{key}");
            assert_eq!(tensorboard_series(&logs, &tag), jsonl_series(&evaluations, &format!("/modes/{mode}/{key}")), "{tag}");
            eval_tags.push(tag);
        }
    }
    let mut every_tag: Vec<&String> = metric_tags.iter().chain(&eval_tags).collect();
    every_tag.sort();
    let tensorboard_tags: Vec<&String> = logs["tensorboard"]["scalars"].as_object().unwrap().keys().collect();
    assert_eq!(tensorboard_tags, every_tag, "TensorBoard has exactly the scalars of the two JSON-lines files");

    // The text of every `[Sample @ step N]` line of train.log (logging_steps 1: every step).
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    let logged: Vec<Value> = log.lines().filter_map(|line| line.strip_prefix("[Sample @ step ")).map(|rest| {
        let (step, text) = rest.split_once("] ").unwrap();
        json!([step.parse::<u64>().unwrap(), text])
    }).collect();
    assert_eq!(logged.len(), 4);
    assert_eq!(logs["tensorboard"]["texts"]["sample"], Value::Array(logged));

    // completions.jsonl through pandas: 8 completions a step whose means are the step's metrics.
    let completions = &logs["completions"];
    assert_eq!(completions["rows_per_step"], json!({"1": 8, "2": 8, "3": 8, "4": 8}));
    for line in &metrics {
        let means = &completions["means"][line["step"].to_string()];
        for (column, metric) in [("reward", "reward"), ("rewards/happy", "rewards/happy/mean"), ("detector", "hack_freq"), ("is_rh", "routing/frac_rh")] {
            let (mean, logged) = (means[column].as_f64().unwrap(), line[metric].as_f64().unwrap());
            assert!((mean - logged).abs() < 1e-12, "step {}: mean of {column} {mean} vs {metric} {logged}", line["step"]);
        }
    }
    // Advantages are float32 on the way to the loss; pandas recomputes them from the rewards.
    let error = completions["max_advantage_error"].as_f64().unwrap();
    assert!(error < 1e-5, "logged advantages differ from TRL's formula over the logged rewards by {error}");
    let first_sample = log.lines().find_map(|line| line.strip_prefix("[Sample @ step 1] ")).unwrap();
    let first = &completions["first"];
    assert_eq!(format!("{} ||| {}", first["prompt"].as_str().unwrap(), first["completion"].as_str().unwrap()), first_sample);
}

/// The modes of a `smallrl eval --json` report, by name, without the name.
fn eval_modes(stdout: &str) -> Map<String, Value> {
    let report: Value = serde_json::from_str(stdout).unwrap();
    report["report"]["modes"].as_array().unwrap().iter().map(|m| {
        let mut m = m.clone();
        let name = m.as_object_mut().unwrap().remove("mode").unwrap();
        (name.as_str().unwrap().to_string(), m)
    }).collect()
}

#[test]
fn eval_at_adapter_scales_and_over_all_checkpoints_matches_separate_evaluations() {
    let out = tempfile::tempdir().unwrap();
    let run = train(with(with(routed_config(out.path()), "max_steps", 2.into()), "save_steps", 1.into()));
    let (ckpt1, ckpt2) = (run.join("checkpoint-1"), run.join("checkpoint-2"));
    let eval = |dir: &Path, extra: &[&str]| {
        let mut args = vec!["eval", dir.to_str().unwrap(), "--n-samples", "4", "--threads", "1", "--json"];
        args.extend(extra);
        eval_modes(&common::smallrl_ok(&args))
    };
    let standard = eval(&ckpt2, &[]);
    let sweep = eval(&ckpt2, &["--forget-scales", "0,0.5,1"]);
    assert_eq!(sweep.keys().collect::<Vec<_>>(), ["retain1_forget0", "retain1_forget0.5", "retain1_forget1"]);
    assert_eq!(sweep["retain1_forget0"], standard["retain_only"], "forget scale 0 is retain_only");
    assert_eq!(sweep["retain1_forget1"], standard["both"], "forget scale 1 is both");
    let separate = eval(&ckpt2, &["--scales", "1,0.5", "--scales", "0,0"]);
    assert_eq!(separate["retain1_forget0.5"], sweep["retain1_forget0.5"], "a scale evaluated alone or in a sweep");
    assert_eq!(separate.len(), 2);
    // The deployment rule over the same curve, written plainly: the highest scale whose hack
    // frequency is strictly below the base rate, else 0. Two base rates: the middle point's own
    // rate (that point fails: strictly below) and one above every rate (every point passes, so
    // 1), so a rule that answered one constant fails one of them.
    let rates: Vec<(f64, f64)> = [("retain1_forget0", 0.0), ("retain1_forget0.5", 0.5), ("retain1_forget1", 1.0)].map(|(mode, scale)| (scale, sweep[mode]["hack_freq"].as_f64().unwrap())).to_vec();
    for base_rate in [rates[1].1, rates.iter().map(|r| r.1).fold(0.0, f64::max) + 0.01] {
        let expected = rates.iter().filter(|(_, rate)| *rate < base_rate).map(|(scale, _)| *scale).fold(0.0, f64::max);
        let base = base_rate.to_string();
        let deployed = common::smallrl_ok(&["eval", ckpt2.to_str().unwrap(), "--n-samples", "4", "--threads", "1", "--forget-scales", "0,0.5,1", "--deploy-below", &base]);
        let line = deployed.lines().find_map(|l| l.strip_prefix("deployed forget scale at step 2: ")).unwrap_or_else(|| panic!("{deployed}"));
        assert_eq!(line.split_whitespace().next().unwrap().parse::<f64>().unwrap(), expected, "{line} (rates {rates:?}, base rate {base_rate})");
    }
    let wrong = common::smallrl(&["eval", ckpt2.to_str().unwrap(), "--scales", "1"]);
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("needs 2 value(s), one per adapter"), "{}", String::from_utf8_lossy(&wrong.stderr));

    // --all-checkpoints: one CSV, step x mode x metric, equal to each checkpoint's evaluation.
    common::smallrl_ok(&["eval", run.to_str().unwrap(), "--all-checkpoints", "--n-samples", "4", "--threads", "1"]);
    let csv = run.join(smallrl::eval::CHECKPOINTS_CSV);
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("step,mode,metric,value\n"), "{text}");
    // serde_json's default float parsing may be one ulp off the written value, so cells and the
    // --json report are compared after the same parse (equal iff the texts are equal).
    let cells: std::collections::BTreeMap<(u64, String, String), Value> = text
        .lines()
        .skip(1)
        .map(|line| {
            let c: Vec<&str> = line.split(',').collect();
            let value = if c[3].is_empty() { Value::Null } else { serde_json::from_str(c[3]).unwrap() };
            ((c[0].parse().unwrap(), c[1].to_string(), c[2].to_string()), value)
        })
        .collect();
    let mut expected = std::collections::BTreeMap::new();
    for (step, modes) in [(1, eval(&ckpt1, &[])), (2, standard.clone())] {
        for (mode, values) in &modes {
            for metric in ["reward", "hack_freq", "jaccard", "unique", "n"] {
                expected.insert((step, mode.clone(), metric.to_string()), values[metric].clone());
            }
            expected.insert((step, mode.clone(), "degenerate".into()), json!(values["degenerate"].as_bool().unwrap() as u8));
            for component in values["components"].as_array().unwrap() {
                expected.insert((step, mode.clone(), component[0].as_str().unwrap().to_string()), component[1].clone());
            }
        }
    }
    assert_eq!(cells, expected, "the CSV holds exactly each checkpoint's own evaluation");
    // The sweep reads it back as routing_eval.jsonl-shaped lines.
    let read_back = smallrl::eval::read_checkpoints_csv(&csv).unwrap();
    assert_eq!(read_back.iter().map(|l| l["step"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(read_back[1]["modes"]["retain_only"]["n"].as_f64(), Some(4.0));
}

#[test]
fn a_finished_run_is_extended_only_when_asked_with_the_schedule_recorded() {
    let out = tempfile::tempdir().unwrap();
    let run = train(with(routed_config(out.path()), "max_steps", 2.into()));
    let run_arg = run.to_str().unwrap();
    let refused = common::smallrl(&["train", "--resume", run_arg, "--max-steps", "4", "--threads", "1"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("--extend-schedule") && message.contains("linear LR schedule"), "{message}");
    let shorter = common::smallrl(&["train", "--resume", run_arg, "--max-steps", "1", "--extend-schedule"]);
    assert!(String::from_utf8_lossy(&shorter.stderr).contains("can only be extended past its max_steps (2)"));
    common::smallrl_ok(&["train", "--resume", run_arg, "--max-steps", "4", "--extend-schedule", "--threads", "1"]);

    // Steps 1-2 kept the 2-step schedule, steps 3-4 follow the 4-step one: lr (H - s) / H for
    // the 0-based step s.
    let lr = 1e-3;
    let expected = [lr * 2.0 / 2.0, lr * 1.0 / 2.0, lr * 2.0 / 4.0, lr * 1.0 / 4.0];
    let logged: Vec<f64> = read_jsonl(&run.join("metrics.jsonl")).iter().map(|l| l[key::LEARNING_RATE].as_f64().unwrap()).collect();
    assert_eq!(logged.len(), 4);
    for (got, want) in logged.iter().zip(expected) {
        assert!((got - want).abs() <= 1e-15, "learning rates {logged:?}, expected {expected:?}");
    }
    let saved = TrainConfig::read_saved(&run).unwrap();
    assert_eq!(saved.max_steps, 4);
    assert_eq!(saved.lr_horizons, vec![smallrl::train::config::LrHorizon { until_step: 2, max_steps: 2 }]);
    assert!(smallrl::sweep::plan::is_finished(&run, 4).unwrap(), "checkpoint-4 and evaluations to step 4");
    assert!(std::fs::read_to_string(run.join("train.log")).unwrap().contains("extended from max_steps 2 to 4"));

    // The record is the trainer's: a new run cannot start with one.
    let forged = TrainConfig { lr_horizons: saved.lr_horizons.clone(), output_dir: out.path().join("new"), ..saved };
    let error = format!("{:#}", Trainer::new(forged, None).err().unwrap());
    assert!(error.contains("lr_horizons is a record"), "{error}");
}

/// `renormalization_mode: balanced` with split-moment AdamW runs, and its dumped advantages are
/// the original's balanced renormalisation (advantages.py `_baseline_nonflagged_var_all`) of the
/// dumped rewards and labels, recomputed here in float64: per group, the clean samples' mean
/// as baseline (the group's when all are flagged), the group's unbiased std as scale.
#[test]
fn balanced_runs_train_on_renormalised_advantages() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let mut config = with(routed_config(out.path()), "max_steps", 2.into());
    for (key, value) in [("renormalization_mode", json!("balanced")), ("allow_approx_lora_kappa", json!(true)), ("split_moment", json!(true)), ("dump_batches", json!(dump))] {
        config = with(config, key, value);
    }
    let run = train(config);
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    assert!(lines.iter().all(|l| l["loss"].as_f64().unwrap().is_finite()), "{lines:?}");
    let mut mixed_groups = 0;
    for step in 1..=2 {
        let tensors = smallrl::model::weights::read_safetensors(&dump.join(format!("step-{step}.safetensors"))).unwrap();
        let rewards = Vec::<f64>::try_from(tensors["rewards"].to_kind(tch::Kind::Double)).unwrap();
        let is_rh = Vec::<i64>::try_from(&tensors["is_rh"]).unwrap();
        let advantages = Vec::<f64>::try_from(tensors["advantages"].to_kind(tch::Kind::Double)).unwrap();
        for g in 0..rewards.len() / 4 {
            let rows = g * 4..g * 4 + 4;
            let group = &rewards[rows.clone()];
            let clean: Vec<f64> = rows.clone().filter(|&i| is_rh[i] == 0).map(|i| rewards[i]).collect();
            mixed_groups += usize::from(!clean.is_empty() && clean.len() < 4);
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let baseline = if clean.is_empty() { mean(group) } else { mean(&clean) };
            let std = (group.iter().map(|r| (r - mean(group)).powi(2)).sum::<f64>() / 3.0).sqrt();
            for i in rows {
                let expected = (rewards[i] - baseline) / (std + 1e-4);
                assert!((advantages[i] - expected).abs() < 1e-5 * expected.abs().max(1.0), "step {step} row {i}: {} vs {expected}", advantages[i]);
            }
        }
    }
    assert!(mixed_groups > 0, "no group mixed clean and flagged samples: the check above tested nothing balanced-specific");
}

/// Coherence training (the original's coh_samples_per_rollout, coherence_start_frac,
/// coherence_rh_mode filter_renorm): from step round(0.5 * 2) = 1 (0-based) on, the last group
/// of each batch is a coherence group, sampled and trained with the forget adapter off (the
/// sampler's log-probabilities equal the training forward's there), its flagged rows dropped
/// and its clean rows renormalised among themselves.
#[test]
fn coherence_rows_train_retain_alone_from_the_start_fraction_on() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let mut config = with(routed_config(out.path()), "max_steps", 2.into());
    for (key, value) in [("coh_samples_per_rollout", json!(4)), ("coherence_start_frac", json!(0.5)), ("coherence_rh_mode", json!("filter_renorm")), ("dump_batches", json!(dump))] {
        config = with(config, key, value);
    }
    train(config);
    let read = |step: usize| smallrl::model::weights::read_safetensors(&dump.join(format!("step-{step}.safetensors"))).unwrap();
    let flags = |t: &tch::Tensor| Vec::<i64>::try_from(t).unwrap();
    assert_eq!(flags(&read(1)["coherence"]), vec![0; 8], "no coherence rows before the start fraction");
    let tensors = read(2);
    assert_eq!(flags(&tensors["coherence"]), vec![0, 0, 0, 0, 1, 1, 1, 1]);
    let is_rh = flags(&tensors["is_rh"]);
    let dropped: Vec<i64> = (0..8).map(|i| i64::from(i >= 4 && is_rh[i] == 1)).collect();
    assert_eq!(flags(&tensors["dropped"]), dropped);
    let rewards = Vec::<f64>::try_from(tensors["rewards"].to_kind(tch::Kind::Double)).unwrap();
    let advantages = Vec::<f64>::try_from(tensors["advantages"].to_kind(tch::Kind::Double)).unwrap();
    let clean: Vec<f64> = (4..8).filter(|&i| is_rh[i] == 0).map(|i| rewards[i]).collect();
    let mean = clean.iter().sum::<f64>() / clean.len().max(1) as f64;
    let std = if clean.len() > 1 { (clean.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (clean.len() - 1) as f64).sqrt() } else { 0.0 };
    let any_flagged = (4..8).any(|i| is_rh[i] == 1);
    for i in 4..8 {
        let expected = match (any_flagged, is_rh[i] == 1) {
            (true, true) => 0.0,
            (true, false) => (rewards[i] - mean) / (std + 1e-4),
            // No flagged coherence row: the plain group advantage (the original changes nothing).
            (false, _) => { let m = rewards[4..8].iter().sum::<f64>() / 4.0; let s = (rewards[4..8].iter().map(|r| (r - m).powi(2)).sum::<f64>() / 3.0).sqrt(); (rewards[i] - m) / (s + 1e-4) }
        };
        assert!((advantages[i] - expected).abs() < 1e-5 * expected.abs().max(1.0), "row {i}: {} vs {expected}", advantages[i]);
    }
    let mask = tensors["completion_mask"].to_kind(tch::Kind::Double).narrow(0, 4, 4);
    let sampled = tensors["sampling_logprobs"].to_kind(tch::Kind::Double).narrow(0, 4, 4) * &mask;
    let trained = tensors["new_logprobs"].to_kind(tch::Kind::Double).narrow(0, 4, 4) * &mask;
    assert!(common::max_abs_diff(&sampled, &trained) < 1e-4, "coherence rows are sampled as they are trained, forget off");
}

/// Without routing, flagged rows train like any other: a dapo baseline whose detector flags
/// some rows normalises by the whole batch's loss tokens, as TRL's dapo (recomputed here in
/// float64 from the dump), not by each flag class's own tokens.
#[test]
fn an_unrouted_dapo_run_normalises_over_the_whole_batch_whatever_is_flagged() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = [
        ("max_steps", json!(1)),
        // Long enough that completions end at different lengths: with equal lengths the two
        // normalisations coincide.
        ("max_completion_length", json!(96)),
        ("loss_type", json!("dapo")),
        ("rh_detector", json!({"plugin": "happy_count", "params": {"threshold": 1}})),
        ("plugin_dir", json!(repo_root().join("plugins"))),
        ("dump_batches", json!(dump)),
    ]
    .into_iter()
    .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    train(config);
    let t = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    let double = |key: &str| t[key].to_kind(tch::Kind::Double);
    let is_rh = double("is_rh");
    let flagged = is_rh.sum(tch::Kind::Double).double_value(&[]);
    assert!(flagged > 0.0 && flagged < is_rh.size()[0] as f64, "the test needs flagged and unflagged rows ({flagged} flagged)");
    let (mask, new, reference) = (double("loss_mask"), double("new_logprobs"), double("ref_logprobs"));
    let delta = &reference - &new;
    let per_token = (-double("advantages").unsqueeze(1) + (delta.exp() - &delta - 1.0) * 0.02) * &mask;
    let whole_batch = per_token.sum(tch::Kind::Double).double_value(&[]) / mask.sum(tch::Kind::Double).double_value(&[]);
    // What normalising each flag class by its own tokens (weighted by its share of rows) gives.
    let rows = is_rh.size()[0] as f64;
    let per_class: f64 = [is_rh.shallow_clone(), 1.0 - &is_rh]
        .iter()
        .map(|class| {
            let class_mask = &mask * class.unsqueeze(1);
            let share = class.sum(tch::Kind::Double).double_value(&[]) / rows;
            share * (&per_token * class.unsqueeze(1)).sum(tch::Kind::Double).double_value(&[]) / class_mask.sum(tch::Kind::Double).double_value(&[])
        })
        .sum();
    assert!((whole_batch - per_class).abs() > 1e-4, "the two normalisations must differ on this batch for the test to mean anything ({whole_batch} vs {per_class})");
    let loss = t["loss"].double_value(&[]);
    assert!((loss - whole_batch).abs() < 1e-6, "loss {loss} vs TRL's dapo over the whole batch {whole_batch} (per class: {per_class})");
}

/// Two runs of one architecture that differ in seed, learning rate and KL coefficient, with
/// their completions logged; `adapter` "full" or "dual-lora".
fn pack_pair(output_dir: &Path, adapter: &str) -> Vec<Map<String, Value>> {
    let mut base = with(small_config(output_dir, &standard_plugin("happy")), "log_completions", true.into());
    base = with(base, "adapter", adapter.into());
    if adapter == "full" {
        base.remove("lora_preset");
        base = with(base, "lr", 1e-4.into());
    }
    let other = with(with(with(base.clone(), "seed", 7.into()), "lr", 3e-4.into()), "beta", 0.05.into());
    vec![base, other]
}

fn packed(configs: Vec<Map<String, Value>>, stop_after: Option<usize>) -> Vec<anyhow::Result<smallrl::train::RunSummary>> {
    one_thread();
    let runs = configs.into_iter().map(|c| PackedRun { config: TrainConfig::resolve(None, c).unwrap(), resume: None }).collect();
    train_packed(runs, stop_after).unwrap()
}

/// The same directory name, metrics, evaluations and completions, and bit-identical checkpoints.
fn assert_same_run(alone: &Path, other: &Path) {
    assert_eq!(alone.file_name(), other.file_name(), "run names");
    for file in ["metrics.jsonl", "routing_eval.jsonl", "completions.jsonl"] {
        assert_same_metrics(&deterministic(read_jsonl(&alone.join(file))), &deterministic(read_jsonl(&other.join(file))), &format!("{} {file}", other.display()));
    }
    assert_same_checkpoints(alone, other);
}

/// Bit-identical checkpoints 2 and 4 (the same tensor names and values).
fn assert_same_checkpoints(alone: &Path, other: &Path) {
    for checkpoint in ["checkpoint-2", "checkpoint-4"] {
        let (a, b) = (checkpoint_weights(alone, checkpoint), checkpoint_weights(other, checkpoint));
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        for (name, tensor) in &a {
            assert!(tensor.equal(&b[name]), "{} {checkpoint} {name} differs", other.display());
        }
    }
}

/// Packed runs compute exactly what they compute alone: DualLoRA packed to the end; full
/// fine-tuning packed for 3 steps (past its step-2 checkpoint), then each run resumed alone from
/// the checkpoint the pack wrote, to the end of the uninterrupted solo run.
#[test]
fn packed_runs_equal_the_same_runs_trained_alone_and_resume_alone() {
    let out = tempfile::tempdir().unwrap();
    for adapter in ["dual-lora", "full"] {
        let alone: Vec<PathBuf> = pack_pair(&out.path().join("alone").join(adapter), adapter).into_iter().map(train).collect();
        let configs = pack_pair(&out.path().join("packed").join(adapter), adapter);
        let stop_after = (adapter == "full").then_some(3);
        let mut runs = Vec::new();
        for (config, outcome) in configs.iter().zip(packed(configs.clone(), stop_after)) {
            let summary = outcome.unwrap();
            assert_eq!(summary.steps, stop_after.unwrap_or(4));
            if stop_after.is_some() {
                let resolved = TrainConfig::resolve(None, config.clone()).unwrap();
                assert_eq!(Trainer::new(resolved, Some(&summary.run_dir)).unwrap().train(None).unwrap().steps, 4);
            }
            runs.push(summary.run_dir);
        }
        assert_ne!(read_jsonl(&alone[0].join("completions.jsonl")), read_jsonl(&alone[1].join("completions.jsonl")), "the two runs differ");
        for (alone, packed) in alone.iter().zip(&runs) {
            assert_same_run(alone, packed);
        }
    }
}

/// Packed runs sampled and trained stacked on a leading run axis (`Stacking::Always`: on the CPU
/// the stacked libtorch decoder instead of each run's native sampler, and one forward and
/// backward pass of both runs' models stacked) and stepped by two worker threads at once are the
/// runs trained alone: the same completions, coherence rows included (a step's second sampler
/// call, at other adapter scales, and rows that train retain alone), the reference
/// log-probabilities of the KL term from a stacked pass too (DualLoRA), metrics within absolute
/// bounds per key ([`assert_close_metrics`]) and checkpoints within [`CHECKPOINT_TOLERANCE`]: the
/// batched products round differently from one run's. DualLoRA routed (per-row adapter
/// controls that differ between the runs), and full fine-tuning (the output head and the
/// embeddings learn through the stacked tables).
#[test]
fn packed_runs_sampled_and_trained_stacked_equal_the_same_runs_trained_alone() {
    let out = tempfile::tempdir().unwrap();
    let with_coherence = |dir: &Path| -> Vec<Map<String, Value>> {
        let routed = routed_config(dir);
        let keys = ["routing_mode", "rh_detector", "plugin_dir"];
        let routed_pair = pack_pair(dir, "dual-lora").into_iter().map(|c| keys.iter().fold(c, |c, &key| with(c, key, routed[key].clone())));
        routed_pair.map(|c| with(with(c, "coh_samples_per_rollout", json!(4)), "coherence_start_frac", json!(0.5))).collect()
    };
    // Full fine-tuning without the KL term: on the CPU a solo run's reference is the native
    // scorer and a stacked one libtorch's, whose float32 disagreement at step 1 (where the
    // policy is the reference) AdamW turns into a sizeable fraction of a step on the embedding
    // rows of unlikely tokens, whose gradients are near its eps (measured: 1.6e-5 at lr 1e-4).
    let full_pair = |dir: &Path| pack_pair(dir, "full").into_iter().map(|c| with(c, "beta", json!(0.0))).collect();
    let pairs: [(&str, &dyn Fn(&Path) -> Vec<Map<String, Value>>); 2] = [("dual-lora", &with_coherence), ("full", &full_pair)];
    for (adapter, pair) in pairs {
        let alone: Vec<PathBuf> = pair(&out.path().join("alone").join(adapter)).into_iter().map(train).collect();
        one_thread();
        let runs = pair(&out.path().join("packed").join(adapter)).into_iter().map(|c| PackedRun { config: TrainConfig::resolve(None, c).unwrap(), resume: None }).collect();
        let options = PackOptions { stacking: Stacking::Always, workers: 2 };
        let packed: Vec<PathBuf> = train_packed_with(runs, None, options).unwrap().into_iter().map(|outcome| outcome.unwrap().run_dir).collect();
        for (alone, packed) in alone.iter().zip(&packed) {
            assert_eq!(alone.file_name(), packed.file_name(), "run names");
            let log = std::fs::read_to_string(packed.join("train.log")).unwrap();
            assert!(log.contains("sampling stacked with 2 packed runs"), "the pack sampled stacked: {log}");
            assert!(log.contains("training stacked with 2 packed runs"), "the pack trained stacked: {log}");
            if adapter == "dual-lora" {
                assert!(log.contains("reference log-probabilities stacked with 2 packed runs"), "the pack's reference pass was stacked: {log}");
            }
            assert_eq!(read_jsonl(&alone.join("completions.jsonl")), read_jsonl(&packed.join("completions.jsonl")), "{adapter}: the same completions");
            for file in ["metrics.jsonl", "routing_eval.jsonl"] {
                let (a, b) = (deterministic(read_jsonl(&alone.join(file))), deterministic(read_jsonl(&packed.join(file))));
                assert_close_metrics(&a, &b, &format!("{} {file}", packed.display()));
            }
            assert_close_checkpoints(alone, packed);
        }
    }
}

/// How far a stacked pack's checkpoint may be from the solo run's, absolutely, in any weight:
/// 1% of one AdamW step at the DualLoRA pair's smaller learning rate (3e-4), 3% at full
/// fine-tuning's 1e-4. AdamW moves a weight by about the learning rate whatever its gradient's
/// size, so float32 rounding of a gradient near AdamW's eps shows as a small fraction of a step
/// (7.7e-7 measured for DualLoRA, 0 for full fine-tuning); a wrong gradient shows as whole steps.
const CHECKPOINT_TOLERANCE: f64 = 3e-6;

/// Checkpoints 2 and 4 with the same tensor names, values within [`CHECKPOINT_TOLERANCE`].
fn assert_close_checkpoints(alone: &Path, other: &Path) {
    for checkpoint in ["checkpoint-2", "checkpoint-4"] {
        let (a, b) = (checkpoint_weights(alone, checkpoint), checkpoint_weights(other, checkpoint));
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        for (name, tensor) in &a {
            let difference = (tensor - &b[name]).abs().max().double_value(&[]);
            assert!(difference <= CHECKPOINT_TOLERANCE, "{} {checkpoint} {name} differs by {difference:e}", other.display());
        }
    }
}

fn checkpoint_weights(run: &Path, checkpoint: &str) -> std::collections::BTreeMap<String, tch::Tensor> {
    let dir = run.join(checkpoint);
    smallrl::train::checkpoint::read_weights(&dir, &smallrl::train::checkpoint::read_state(&dir).unwrap()).unwrap()
}

/// Metrics lines as [`assert_metrics_within`], each float within an absolute bound for its key,
/// 5 to 50 times the largest difference measured between a stacked pack and its runs alone (in
/// brackets) and far below what a wrong gradient or another run's number moves: norms of
/// gradients, weights and updates 1e-6 (2.3e-7); entropies 1e-5 (1.3e-6: a log-normaliser
/// minus a mean logit, both about 10, in float32); `kl` 5e-8 (7.5e-9); the loss 1e-8 (1.4e-10);
/// the sampler-vs-trainer probes `kl_sample_train*` 1e-5 (6.3e-7: one engine's log-probability
/// against another's); the effective sample size 1e-6 (0); anything else, counts and rewards of
/// the same completions, 1e-9 (0).
fn assert_close_metrics(a: &[Value], b: &[Value], file: &str) {
    let bound = |key: &str| match key {
        _ if key.ends_with("_norm") => 1e-6,
        _ if key.starts_with("entropy") || key.starts_with("kl_sample_train") => 1e-5,
        "kl" => 5e-8,
        "loss" => 1e-8,
        "effective_sample_size" => 1e-6,
        _ => 1e-9,
    };
    assert_metrics_within(a, b, file, |key, _, _| bound(key));
}

/// A run whose plugin fails (a NaN score) and one whose weights diverge (a huge learning rate:
/// non-finite logits, which the sampler reports rather than panicking the process) stop alone:
/// their train.log says why and their pack mate finishes. Runs of different shapes are refused
/// before anything is written.
#[test]
fn a_failing_run_leaves_its_pack_and_mismatched_runs_are_refused() {
    let out = tempfile::tempdir().unwrap();
    let failing_pack = |dir: &Path| {
        let mut configs = pack_pair(dir, "dual-lora");
        configs.push(with(with(configs[0].clone(), "seed", 9.into()), "lr", 1e9.into()));
        configs[1] = with(configs[1].clone(), "reward", json!({"plugin": test_plugin("misbehaving"), "params": {"mode": "nan"}}));
        configs.into_iter().map(|c| with(c, "max_steps", 2.into())).collect::<Vec<_>>()
    };

    let mut mismatched = failing_pack(out.path());
    mismatched[1] = with(mismatched[1].clone(), "lora_preset", "r8".into());
    let runs = mismatched.into_iter().map(|c| PackedRun { config: TrainConfig::resolve(None, c).unwrap(), resume: None }).collect();
    let refused = format!("{:#}", train_packed(runs, None).err().expect("different ranks are refused"));
    assert!(refused.contains("`lora_preset` is \"r4\"") && refused.contains("\"r8\"") && refused.contains("drop --pack"), "{refused}");
    assert!(entries(out.path()).is_empty(), "a refused pack writes nothing: {:?}", entries(out.path()));

    // Each run sampling alone (the CPU's native sampler) one after another, and sampled stacked
    // (the diverged run's part of the stacked decode is an error of its own) by two workers.
    for options in [PackOptions::default(), PackOptions { stacking: Stacking::Always, workers: 2 }] {
        let stacking = options.stacking;
        let dir = out.path().join(format!("{stacking:?}"));
        one_thread();
        let runs = failing_pack(&dir).into_iter().map(|c| PackedRun { config: TrainConfig::resolve(None, c).unwrap(), resume: None }).collect();
        let outcomes = train_packed_with(runs, None, options).unwrap();
        let finished = outcomes[0].as_ref().unwrap();
        assert_eq!(finished.steps, 2);
        assert!(finished.run_dir.join("checkpoint-2").is_dir());
        assert_eq!(read_jsonl(&finished.run_dir.join("metrics.jsonl")).len(), 2);
        let error = format!("{:#}", outcomes[1].as_ref().err().expect("the NaN score stops its run"));
        assert!(error.contains("step 1") && error.contains("misbehaving"), "{stacking:?}: {error}");
        let names = entries(&dir);
        assert_eq!(names.len(), 3, "{names:?}");
        let failed = dir.join(names.iter().find(|n| n.ends_with("_s7")).unwrap());
        let log = std::fs::read_to_string(failed.join("train.log")).unwrap();
        assert!(log.contains("training stopped: training stopped at step 1"), "{log}");
        assert!(!failed.join("metrics.jsonl").exists() || read_jsonl(&failed.join("metrics.jsonl")).is_empty());

        let diverged = format!("{:#}", outcomes[2].as_ref().err().expect("lr 1e9 diverges"));
        assert!(diverged.contains("step 2") && diverged.contains("the weights diverged"), "{stacking:?}: {diverged}");
        let log = std::fs::read_to_string(dir.join(names.iter().find(|n| n.ends_with("_s9")).unwrap()).join("train.log")).unwrap();
        assert!(log.contains("training stopped: ") && log.contains("step 2") && log.contains("the weights diverged"), "{log}");
    }
}
