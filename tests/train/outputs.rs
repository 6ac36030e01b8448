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
