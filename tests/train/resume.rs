//! Checkpoints, exact resumption, restarting a failed run, refusing changed plugins, extending a finished run.

use super::*;

#[test]
fn resumed_run_repeats_the_uninterrupted_run_exactly() {
    // With the gradient noise scale, whose running average the resumed run reads back from
    // metrics.jsonl and must continue bit for bit.
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str| with(routed_config(&out.path().join(dir)), "gradient_noise_scale", true.into());
    let whole = train(config("a"));

    // Interrupted after step 3, past its newest checkpoint (step 2): step 3 is done again.
    let resolved = TrainConfig::resolve(None, with(config("b"), "log_completions", true.into())).unwrap();
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

/// A run with the retain verifier (its own prompt stream and coins) and top_k sampling resumes
/// to the uninterrupted run's metrics and weights.
#[test]
fn a_resumed_verifier_run_repeats_the_uninterrupted_one() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str| {
        let mut config = routed_config(&out.path().join(dir));
        for (key, value) in [("coh_samples_per_rollout", json!(4)), ("rh_detector_verifies_retain_samples", json!(true)), ("rh_detector_retain_recall", json!(0.5)), ("top_k", json!(5))] {
            config = with(config, key, value);
        }
        config
    };
    let whole = train(config("a"));
    let resolved = TrainConfig::resolve(None, config("b")).unwrap();
    let mut first = Trainer::new(resolved.clone(), None).unwrap();
    let stopped = first.train(Some(3)).unwrap();
    drop(first);
    let resumed = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap().train(None).unwrap();
    let (a, b) = (deterministic(read_jsonl(&whole.join("metrics.jsonl"))), deterministic(read_jsonl(&resumed.run_dir.join("metrics.jsonl"))));
    assert_eq!(a.len(), 4);
    assert!(a.iter().all(|line| line["verifier/frac_verified"].is_number()), "{a:?}");
    assert_same_metrics(&a, &b, "metrics.jsonl");
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-4/adapters.safetensors")).unwrap();
    let (a, b) = (weights(&whole), weights(&resumed.run_dir));
    for (name, tensor) in &a {
        assert!(tensor.equal(&b[name]), "{name} differs after resumption");
    }
}

#[test]
fn resumption_keeps_the_logged_lines_byte_for_byte_and_reads_floats_exactly() {
    // A float serde_json's default parser reads one ulp off (Rust's parser, correctly rounded,
    // is the reference): step 1's kl of a routed run, where the rewrite was found. The crate
    // reads with `float_roundtrip`, which gets it right.
    let text = "-3.1044085080367267e-9";
    let exact: f64 = text.parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let lines = [
        format!(r#"{{"step":1,"kl":{text},"noise/grad_squared_avg":1.5}}"#),
        r#"{"step":2,"kl":0.25}"#.to_string(),
        r#"{"step":3,"kl":0.5}"#.to_string(),
    ];
    std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let log = smallrl::runlog::Jsonl::new(path.clone());
    let last = log.truncate_after(1).unwrap().unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{}\n", lines[0]));
    assert_eq!(last["kl"].as_f64().map(f64::to_bits), Some(exact.to_bits()));
    assert_eq!(last["noise/grad_squared_avg"].as_f64(), Some(1.5));
    assert_eq!(log.truncate_after(0).unwrap(), None);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
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
