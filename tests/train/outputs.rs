//! What a run writes, read by other tools: exported checkpoints in transformers, TensorBoard and completion logs, smallrl eval.

use super::*;

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
            let pointer = format!("/modes/{mode}/{}", key.replace('~', "~0").replace('/', "~1"));
            assert_eq!(tensorboard_series(&logs, &tag), jsonl_series(&evaluations, &pointer), "{tag}");
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

/// `eval RUN --deploy` against `separate` (the final checkpoint evaluated at scales 0,0 and the
/// forget scales 0, 0.5, 1 by plain `eval`): the base model is every adapter at scale 0, each
/// mode's channels equal its flag rate (the ground truth is the detector, and without metadata
/// every prompt is hackable and monitored), and the deployed scale is the rule written plainly.
/// Then `sweep --collect --deploy` over the run's directory: deployment.csv and the arm table's
/// `base` and `deployed` modes read the same numbers, and a second call evaluates nothing.
fn deployment_of_the_run(run: &Path, separate: &Map<String, Value>) {
    let deployed_text = common::smallrl_ok(&["eval", run.to_str().unwrap(), "--deploy", "--forget-scales", "0,0.5,1", "--n-samples", "4", "--threads", "1"]);
    let deployment: Value = serde_json::from_str(&std::fs::read_to_string(run.join("deployment.json")).unwrap()).unwrap();
    let curve = [("retain1_forget0", 0.0), ("retain1_forget0.5", 0.5), ("retain1_forget1", 1.0)];
    let monitored = |mode: &str| -> f64 {
        let channels = &separate[mode]["channels"];
        let flag_rate = separate[mode]["hack_freq"].as_f64().unwrap();
        assert_eq!((channels["monitored"].as_f64(), channels["all"].as_f64()), (Some(flag_rate), Some(flag_rate)), "{mode}: {channels}");
        assert_eq!(deployment["modes"][if mode == "retain0_forget0" { "base" } else { mode }]["true_hack_freq/monitored"].as_f64(), Some(flag_rate), "{mode}");
        flag_rate
    };
    let base = monitored("retain0_forget0");
    let expected = curve.iter().filter(|(mode, _)| monitored(mode) < base).map(|(_, scale)| *scale).fold(0.0, f64::max);
    assert_eq!(deployment["base_monitored"].as_f64(), Some(base));
    assert_eq!(deployment["deployed_forget_scale"].as_f64(), Some(expected), "{deployed_text}");
    assert!(deployed_text.contains(&format!("deployed forget scale: {expected}")), "{deployed_text}");

    let sweep_dir = run.parent().unwrap().to_str().unwrap().to_string();
    let collected = common::smallrl_ok(&["sweep", "--collect", &sweep_dir, "--deploy", "--jobs", "1"]);
    assert!(collected.contains("[DEPLOY] 1 routed run(s) to evaluate"), "the 3-point curve is not the default 11-point one: {collected}");
    let deployment: Value = serde_json::from_str(&std::fs::read_to_string(run.join("deployment.json")).unwrap()).unwrap();
    assert_eq!(deployment["forget_scales"].as_array().unwrap().len(), 11);
    let csv = std::fs::read_to_string(run.parent().unwrap().join("deployment.csv")).unwrap();
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(row[0], run.file_name().unwrap().to_str().unwrap());
    assert_eq!(row[3].parse::<f64>().unwrap(), deployment["base_monitored"].as_f64().unwrap());
    assert_eq!(row[6].parse::<f64>().unwrap(), deployment["deployed_forget_scale"].as_f64().unwrap());
    let arms = std::fs::read_to_string(run.parent().unwrap().join("arms.csv")).unwrap();
    let arm_value = |metric: &str, mode: &str| -> f64 {
        let line = arms.lines().find(|l| l.split(',').nth(2) == Some(metric) && l.split(',').nth(3) == Some(mode)).unwrap_or_else(|| panic!("arms.csv has no {metric} {mode}:\n{arms}"));
        line.split(',').nth(5).unwrap().parse().unwrap()
    };
    let deployed_mode = deployment["deployed_mode"].as_str().unwrap();
    assert_eq!(arm_value("monitored_hack_freq", "base"), deployment["modes"]["base"]["true_hack_freq/monitored"].as_f64().unwrap());
    assert_eq!(arm_value("true_hack_freq", "deployed"), deployment["modes"][deployed_mode]["true_hack_freq"].as_f64().unwrap());
    assert_eq!(arm_value("task_reward", "deployed"), deployment["modes"][deployed_mode]["happy"].as_f64().unwrap(), "the task reward is the retain component, happy");
    let again = common::smallrl_ok(&["sweep", "--collect", &sweep_dir, "--deploy", "--jobs", "1"]);
    assert!(again.contains("[DEPLOY] 0 routed run(s) to evaluate"), "{again}");
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
    // The ground truth is the detector itself (any "happy"), so each mode's hack channels can be
    // checked against its flag rate, computed apart from them.
    let ground_truth = json!({"plugin": "happy_count", "params": {"threshold": 1}});
    let run = train(with(with(with(routed_config(out.path()), "max_steps", 2.into()), "save_steps", 1.into()), "rh_ground_truth", ground_truth));
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
    deployment_of_the_run(&run, &eval(&ckpt2, &["--scales", "0,0", "--forget-scales", "0,0.5,1"]));
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
            // The monitor against the ground truth, and the ground truth's hack channels.
            let monitor = [
                ("true_positives", "monitor/hacked_flagged"), ("false_positives", "monitor/clean_flagged"), ("false_negatives", "monitor/hacked_unflagged"),
                ("true_negatives", "monitor/clean_unflagged"), ("precision", "monitor/precision"), ("recall", "monitor/recall"),
                ("hack_freq_monitored", "hack_freq/monitored"), ("hack_freq_unmonitored", "hack_freq/unmonitored"),
            ];
            let channels = [("all", "true_hack_freq"), ("monitored", "true_hack_freq/monitored"), ("unmonitored", "true_hack_freq/unmonitored")];
            for (group, fields) in [("monitor", &monitor[..]), ("channels", &channels[..])] {
                for (field, key) in fields {
                    expected.insert((step, mode.clone(), key.to_string()), values[group][field].clone());
                }
            }
            // The hackable prompts' count, and their values when they are some but not all.
            let hackable = &values["hackable"];
            expected.insert((step, mode.clone(), "hackable/n".into()), hackable["n"].clone());
            if hackable["n"].as_u64().unwrap() > 0 && hackable["n"] != values["n"] {
                for component in hackable["components"].as_array().unwrap() {
                    expected.insert((step, mode.clone(), format!("hackable/{}", component[0].as_str().unwrap())), component[1].clone());
                }
                for key in ["hack_freq", "true_hack_freq"] {
                    expected.insert((step, mode.clone(), format!("hackable/{key}")), hackable[key].clone());
                }
            }
        }
    }
    assert_eq!(cells, expected, "the CSV holds exactly each checkpoint's own evaluation");
    // The sweep reads it back as routing_eval.jsonl-shaped lines.
    let read_back = smallrl::eval::read_checkpoints_csv(&csv).unwrap();
    assert_eq!(read_back.iter().map(|l| l["step"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(read_back[1]["modes"]["retain_only"]["n"].as_f64(), Some(4.0));
}

/// `smallrl eval` samples a checkpoint as its run did (`sampler_dtype`): a bfloat16-sampler
/// run's checkpoint 2, evaluated afterwards, draws the completions of the run's own evaluation
/// at step 2 (equal rewards, hack rates and diversity in every mode). Evaluated with a float32
/// sampler, as `eval` once did whatever the run, the completions differ.
#[test]
fn eval_samples_a_checkpoint_in_the_sampler_dtype_of_its_run() {
    let out = tempfile::tempdir().unwrap();
    let config = [
        ("max_steps", json!(2)), ("sampler_dtype", json!("bfloat16")), ("importance_sampling_correction", json!(true)),
        ("eval_samples", json!(16)), ("max_completion_length", json!(64)),
    ];
    let run = train(config.into_iter().fold(routed_config(out.path()), |c, (k, v)| with(c, k, v)));
    let trained = read_jsonl(&run.join("routing_eval.jsonl")).pop().unwrap();
    assert_eq!(trained["step"], json!(2));
    let checkpoint = run.join("checkpoint-2");
    let evaluated = eval_modes(&common::smallrl_ok(&["eval", checkpoint.to_str().unwrap(), "--n-samples", "16", "--threads", "1", "--json"]));
    assert_eq!(evaluated.len(), 3, "{evaluated:?}");
    for (mode, values) in &evaluated {
        for metric in ["reward", "hack_freq", "jaccard", "unique"] {
            assert_eq!(values[metric], trained["modes"][mode][metric], "{mode} {metric}: smallrl eval against the run's evaluation at step 2");
        }
    }
}

/// `bench train` prints a step's phases (issue 50, item 3) in both training dtypes: sampling
/// split into the sampler's set-up and the decode, scoring, reference and old log-probs,
/// forward + backward and the optimizer; with one timed step the rows are that step's own
/// seconds, so the top-level phases add up to at most the step (printed to the millisecond).
#[test]
fn bench_train_prints_each_phase_of_a_step_within_the_step() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"))
        .args(["bench", "train", "--model", common::fixture("tiny-stories").to_str().unwrap(), "--prompts", common::fixture("tiny-stories/prompts.txt").to_str().unwrap()])
        .args(["--reward-plugin", standard_plugin("happy").to_str().unwrap(), "--steps", "1", "--thread-counts", "1", "--train-dtypes", "float32,bfloat16", "--device", "cpu"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench train failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let top = ["sampling", "scoring", "reference log-probs", "old log-probs", "forward + backward", "optimizer"];
    let mut tables = 0;
    for block in stdout.split("threads 1: ").skip(1) {
        let row = |phase: &str| -> f64 {
            let line = block.lines().skip(1).find(|l| l.trim_start().starts_with(phase) && l.trim_start()[phase.len()..].starts_with(' ')).unwrap_or_else(|| panic!("no {phase:?} row in {block}"));
            line.trim().trim_end_matches(" s").rsplit(' ').next().unwrap().parse().unwrap()
        };
        let step = row("step");
        let phases: Vec<f64> = top.iter().map(|p| row(p)).collect();
        assert!(phases.iter().all(|&s| s >= 0.0), "a negative phase in {block}");
        assert!(phases.iter().sum::<f64>() <= step + 0.0005 * top.len() as f64, "the phases add up to more than the step in {block}");
        assert!((row("set-up") + row("decode") - row("sampling")).abs() <= 0.0015, "set-up and decode are not the sampling in {block}");
        tables += 1;
    }
    assert_eq!(tables, 4, "full and dual-lora, each in float32 and bfloat16: {stdout}");
}

/// The binary runs libtorch with idle OpenMP threads that spin 10,000 iterations before they
/// sleep (`device::short_openmp_spin`: it runs itself again with `GOMP_SPINCOUNT=10000`, which
/// libgomp reads only when it loads) unless the environment chose how they wait
/// (`GOMP_SPINCOUNT` or `OMP_WAIT_POLICY`, kept as set); train.log says which.
#[test]
fn train_runs_with_a_short_openmp_spin_unless_the_environment_sets_one() {
    let out = tempfile::tempdir().unwrap();
    let train_log = |name: &str, set: &[(&str, &str)]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"));
        command.args(["train", "--model", common::fixture("tiny-stories").to_str().unwrap(), "--prompts", common::fixture("tiny-stories/prompts.txt").to_str().unwrap()]);
        command.args(["--reward-plugin", standard_plugin("happy").to_str().unwrap(), "--max-steps", "1", "--batch-size", "4", "--num-generations", "2"]);
        command.args(["--max-completion-length", "8", "--eval-samples", "2", "--threads", "2", "--device", "cpu", "--name", name, "--output-dir", out.path().to_str().unwrap()]);
        // `cargo test` gives its processes OMP_WAIT_POLICY (.cargo/config.toml): each case sets its own.
        command.env_remove("OMP_WAIT_POLICY").env_remove("GOMP_SPINCOUNT").envs(set.iter().copied());
        let output = command.output().unwrap();
        assert!(output.status.success(), "smallrl train failed: {}", String::from_utf8_lossy(&output.stderr));
        let run = std::fs::read_dir(out.path()).unwrap().map(|e| e.unwrap().path()).find(|p| p.file_name().unwrap().to_str().unwrap().starts_with(name)).unwrap();
        let log = std::fs::read_to_string(run.join("train.log")).unwrap();
        log.lines().find(|l| l.starts_with("libtorch: ")).unwrap_or_else(|| panic!("no libtorch line in {log}")).to_string()
    };
    assert_eq!(train_log("unset", &[]), "libtorch: 2 threads, GOMP_SPINCOUNT=10000");
    assert_eq!(train_log("policy", &[("OMP_WAIT_POLICY", "ACTIVE")]), "libtorch: 2 threads, OMP_WAIT_POLICY=ACTIVE");
    assert_eq!(train_log("spin", &[("GOMP_SPINCOUNT", "5")]), "libtorch: 2 threads, GOMP_SPINCOUNT=5");
}
