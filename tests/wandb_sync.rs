//! `smallrl wandb-sync` copies a run directory into a wandb run with the official SDK. Tested
//! offline (`WANDB_MODE=offline`, everything of wandb's in a temporary directory): the offline
//! run is read back with wandb's own `.wandb` reader (`scripts/reference/read_wandb_offline.py`)
//! and every logged value is compared with the run's metrics.jsonl, routing_eval.jsonl,
//! train.log samples, completions.jsonl and config.yaml.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{fixture, one_thread, python, read_jsonl, repo_root, standard_plugin};
use serde_json::{Map, Value, json};
use smallrl::train::{TrainConfig, Trainer};

/// A routed DualLoRA run of 4 steps with evaluations at steps 2 and 4 and completions logged.
fn train_run(output_dir: &Path) -> PathBuf {
    one_thread();
    let mut config = common::tiny_stories_run(output_dir, &standard_plugin("happy"), "wandb");
    let Value::Object(extra) = json!({
        "rh_detector": {"plugin": "happy_count", "params": {"threshold": 1}},
        "plugin_dir": repo_root().join("plugins"),
        "routing_mode": "classic",
        "log_completions": true,
    }) else { unreachable!() };
    config.extend(extra);
    let config = TrainConfig::resolve(None, config).unwrap();
    Trainer::new(config, None).unwrap().train(None).unwrap().run_dir
}

/// wandb's directories, all inside `home` so that nothing outside the test is read or written.
fn sync(run_dir: &Path, home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_smallrl"));
    command.arg("wandb-sync").arg(run_dir).args(args);
    for (name, dir) in [("WANDB_DIR", "runs"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")] {
        std::fs::create_dir_all(home.join(dir)).unwrap();
        command.env(name, home.join(dir));
    }
    // No error reports to wandb's servers from a test.
    command.env_remove("WANDB_MODE").env_remove("WANDB_API_KEY").env_remove("RUST_BACKTRACE").env("WANDB_ERROR_REPORTING", "false");
    command.envs(env.iter().copied()).output().unwrap()
}

fn succeeded(output: Output) -> String {
    assert!(output.status.success(), "smallrl wandb-sync failed:\n{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// The offline runs under `home`'s WANDB_DIR, as wandb's reader reads them.
fn read_back(home: &Path) -> Vec<Value> {
    let output = Command::new(python()).arg(repo_root().join("scripts/reference/read_wandb_offline.py")).arg(home.join("runs")).output().unwrap();
    assert!(output.status.success(), "read_wandb_offline.py failed: {}", String::from_utf8_lossy(&output.stderr));
    let read: Value = serde_json::from_slice(&output.stdout).unwrap();
    read["runs"].as_array().unwrap().clone()
}


/// Every file of a directory tree with its bytes.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.insert(path.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// `smallrl-` and 24 hex digits of the SHA-256 of the run directory's absolute path, by coreutils.
fn expected_id(run_dir: &Path) -> String {
    let path = run_dir.canonicalize().unwrap();
    let mut child = Command::new("sha256sum").stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), path.as_os_str().as_encoded_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    format!("smallrl-{}", &String::from_utf8(output.stdout).unwrap()[..24])
}

/// The wandb history as {step: row}; each step is logged once.
fn rows_by_step(run: &Value) -> BTreeMap<u64, Map<String, Value>> {
    let mut rows = BTreeMap::new();
    for row in run["history"].as_array().unwrap() {
        let row = row.as_object().unwrap().clone();
        let step = row["_step"].as_u64().unwrap();
        assert!(rows.insert(step, row).is_none(), "step {step} is logged twice");
    }
    rows
}

/// `key` of `row` equals `expected` exactly: numbers as f64 bit for bit (wandb writes floats
/// with their shortest round-trip text; a float with an integral value, such as 0.0, comes
/// back as the JSON integer 0, as wandb's JSON numbers do not keep that distinction), integers
/// exactly, flags and text as they are.
fn assert_logged(row: &Map<String, Value>, key: &str, expected: &Value, step: u64) {
    let logged = row.get(key).unwrap_or_else(|| panic!("step {step}: wandb has no {key}"));
    match (logged.as_f64(), expected.as_f64()) {
        (Some(a), Some(b)) => {
            assert_eq!(a.to_bits(), b.to_bits(), "step {step}: {key}: wandb {a} vs {b}");
            if expected.is_i64() || expected.is_u64() {
                assert_eq!(logged, expected, "step {step}: {key}: an integer stays one");
            }
        }
        _ => assert_eq!(logged, expected, "step {step}: {key}"),
    }
}

#[test]
fn an_offline_sync_holds_every_value_of_the_run_and_a_resync_continues_its_run() {
    let out = tempfile::tempdir().unwrap();
    let run_dir = train_run(out.path());
    let before = contents(&run_dir);
    let home = tempfile::tempdir().unwrap();

    // WANDB_MODE is honoured when --mode is not given.
    let stdout = succeeded(sync(&run_dir, home.path(), &["--project", "smallrl-test", "--group", "g1"], &[("WANDB_MODE", "offline")]));
    assert!(stdout.contains("4 steps logged"), "{stdout}");
    let runs = read_back(home.path());
    assert_eq!(runs.len(), 1, "one offline run");
    let run = &runs[0];
    assert_eq!(run["run_id"], json!(expected_id(&run_dir)));
    assert_eq!(run["name"], json!(run_dir.file_name().unwrap().to_str().unwrap()));
    assert_eq!((run["project"].as_str(), run["group"].as_str()), (Some("smallrl-test"), Some("g1")));
    let config: Value = serde_yaml::from_str(&std::fs::read_to_string(run_dir.join("config.yaml")).unwrap()).unwrap();
    assert_eq!(run["config"], config, "the wandb config is config.yaml");

    let rows = rows_by_step(run);
    let metrics = read_jsonl(&run_dir.join("metrics.jsonl"));
    let evaluations = read_jsonl(&run_dir.join("routing_eval.jsonl"));
    let mut expected_keys: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for line in &metrics {
        let step = line["step"].as_u64().unwrap();
        for (key, value) in line.as_object().unwrap().iter().filter(|(key, value)| *key != "step" && !value.is_null()) {
            assert_logged(&rows[&step], key, value, step);
            expected_keys.entry(step).or_default().push(key.clone());
        }
    }
    assert_eq!(evaluations.len(), 2, "evaluations at steps 2 and 4");
    for line in &evaluations {
        let step = line["step"].as_u64().unwrap();
        for (mode, values) in line["modes"].as_object().unwrap() {
            for (key, value) in values.as_object().unwrap().iter().filter(|(_, value)| !value.is_null()) {
                let tag = format!("routing_eval/{mode}/{key}");
                assert_logged(&rows[&step], &tag, value, step);
                expected_keys.entry(step).or_default().push(tag);
            }
        }
        assert_logged(&rows[&step], "routing_eval/seconds", &line["seconds"], step);
        expected_keys.entry(step).or_default().push("routing_eval/seconds".into());
    }

    // The tables, with the last step: train.log's samples (each step's first completion, with
    // logging_steps 1, read here from completions.jsonl) and completions.jsonl.
    let completions = read_jsonl(&run_dir.join("completions.jsonl"));
    let samples: Vec<Value> = completions.iter().filter(|c| c["index"] == 0).map(|c| json!([c["step"], c["prompt"], c["completion"]])).collect();
    assert_eq!(samples.len(), 4);
    assert_eq!(rows[&4]["samples"], json!({"columns": ["step", "prompt", "completion"], "data": samples}));
    assert_eq!(completions.len(), 32, "8 completions a step");
    let table = &rows[&4]["completions"];
    let columns: Vec<&str> = table["columns"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    let data = table["data"].as_array().unwrap();
    assert_eq!(data.len(), completions.len());
    for (line, row) in completions.iter().zip(data) {
        let line = line.as_object().unwrap();
        assert_eq!(columns.len(), line.len(), "every column of completions.jsonl");
        for (column, value) in columns.iter().zip(row.as_array().unwrap()) {
            let step = line["step"].as_u64().unwrap();
            assert_logged(&Map::from_iter([(column.to_string(), value.clone())]), column, &line[*column], step);
        }
    }
    expected_keys.get_mut(&4).unwrap().extend(["samples".to_string(), "completions".to_string()]);

    // Nothing else: the history has exactly these keys per step (and wandb's own `_` keys).
    for (step, row) in &rows {
        let mut logged: Vec<&String> = row.keys().filter(|key| !key.starts_with('_')).collect();
        logged.sort();
        let mut expected: Vec<&String> = expected_keys[step].iter().collect();
        expected.sort();
        assert_eq!(logged, expected, "step {step}: the logged keys");
    }
    assert_eq!(rows.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4]);

    // A second sync (--mode this time) is the same wandb run: same id and name.
    succeeded(sync(&run_dir, home.path(), &["--project", "smallrl-test", "--mode", "offline"], &[]));
    let runs = read_back(home.path());
    assert_eq!(runs.len(), 2, "offline, each sync writes its own record of the run");
    assert!(runs.iter().all(|r| r["run_id"] == json!(expected_id(&run_dir)) && r["name"] == run["name"]), "{runs:?}");

    // A copy of the directory elsewhere is another wandb run (with the same name).
    let copy_parent = tempfile::tempdir().unwrap();
    let copy = copy_parent.path().join(run_dir.file_name().unwrap());
    std::fs::create_dir(&copy).unwrap();
    for (path, bytes) in &before {
        std::fs::create_dir_all(copy.join(path).parent().unwrap()).unwrap();
        std::fs::write(copy.join(path), bytes).unwrap();
    }
    succeeded(sync(&copy, home.path(), &["--project", "smallrl-test", "--mode", "offline"], &[]));
    let ids: std::collections::BTreeSet<String> = read_back(home.path()).iter().map(|r| r["run_id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, [expected_id(&run_dir), expected_id(&copy)].into_iter().collect());
    assert_ne!(expected_id(&run_dir), expected_id(&copy));

    assert!(before == contents(&run_dir), "the run directory is only read");
}

#[test]
fn errors_name_what_is_missing_and_what_to_do() {
    let home = tempfile::tempdir().unwrap();
    let not_a_run = tempfile::tempdir().unwrap();
    let output = sync(not_a_run.path(), home.path(), &["--mode", "offline"], &[]);
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("is not a smallrl run directory: it has no config.yaml"), "{message}");

    std::fs::write(not_a_run.path().join("config.yaml"), "seed: 1\n").unwrap();
    let output = sync(not_a_run.path(), home.path(), &["--mode", "offline"], &[("SMALLRL_PYTHON", "/nonexistent/python")]);
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("SMALLRL_PYTHON=/nonexistent/python does not exist"), "{message}");
    assert!(message.contains("1 of 1 runs were not synced"), "{message}");
    assert!(std::fs::read_dir(home.path().join("runs")).unwrap().next().is_none(), "nothing was written to wandb");
}

/// `smallrl train ... --wandb PROJECT`: the finished run is synced (the same wandb run as
/// `wandb-sync` of its directory); a sync that cannot run is a warning, and the run stands.
#[test]
fn train_with_wandb_syncs_the_finished_run_and_survives_a_failed_sync() {
    let tiny = fixture("tiny-stories");
    let out = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let train = |output_dir: &Path, extra: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_smallrl"));
        command.args(["train", "--model"]).arg(&tiny).arg("--prompts").arg(tiny.join("prompts.txt"));
        command.arg("--reward-plugin").arg(standard_plugin("happy")).arg("--output-dir").arg(output_dir);
        command.args(["--batch-size", "4", "--num-generations", "2", "--max-completion-length", "8", "--max-steps", "2", "--save-steps", "2"]);
        command.args(["--eval-every", "2", "--eval-samples", "2", "--threads", "1", "--device", "cpu"]);
        command.args(["--wandb", "smallrl-train-test", "--wandb-group", "g2", "--wandb-mode", "offline"]);
        for (name, dir) in [("WANDB_DIR", "runs"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")] {
            std::fs::create_dir_all(home.path().join(dir)).unwrap();
            command.env(name, home.path().join(dir));
        }
        command.env_remove("WANDB_MODE").env_remove("RUST_BACKTRACE").env("WANDB_ERROR_REPORTING", "false");
        command.envs(extra.iter().copied()).output().unwrap()
    };
    let output = train(&out.path().join("a"), &[]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let run_dir = std::fs::read_dir(out.path().join("a")).unwrap().next().unwrap().unwrap().path();
    let runs = read_back(home.path());
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["run_id"], json!(expected_id(&run_dir)));
    assert_eq!((runs[0]["project"].as_str(), runs[0]["group"].as_str()), (Some("smallrl-train-test"), Some("g2")));
    let steps: Vec<u64> = rows_by_step(&runs[0]).into_keys().collect();
    assert_eq!(steps, [1, 2]);

    let output = train(&out.path().join("b"), &[("SMALLRL_PYTHON", "/nonexistent/python")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "a failed sync does not fail the run: {stderr}");
    assert!(stderr.contains("the run finished, but its wandb sync failed") && stderr.contains("smallrl wandb-sync"), "{stderr}");
    let run_dir = std::fs::read_dir(out.path().join("b")).unwrap().next().unwrap().unwrap().path();
    assert_eq!(read_jsonl(&run_dir.join("metrics.jsonl")).len(), 2, "the run is complete");
    assert_eq!(read_back(home.path()).len(), 1, "nothing more was written to wandb");
}

/// The script's readers on hand-made inputs: a sample record whose prompt and completion span
/// lines (a chat prompt does) runs to the `[Step N]` line after it and splits at the first
/// ` ||| `; a step whose routing evaluation is due but not yet written (a run syncing while it
/// trains) waits, with the steps after it.
#[test]
fn the_sync_reads_multi_line_samples_and_holds_back_a_step_whose_evaluation_is_due() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("train.log"), "header\n[Sample @ step 1] <|im_start|>user\nHi<|im_end|> ||| a ||| b\nend\n[Step 1] reward=1\n[Sample @ step 2] p ||| c\n[Step 2] r\n").unwrap();
    let script = r#"
import importlib.util, json, pathlib, sys
spec = importlib.util.spec_from_file_location("sync", sys.argv[1]); sync = importlib.util.module_from_spec(spec); spec.loader.exec_module(sync)
rows = {1: {"loss": 1}, 2: {"loss": 1, "routing_eval/both/reward": 0.5}, 3: {"loss": 1}, 4: {"loss": 2}}
done = dict(rows); done[4] = {"loss": 2, "routing_eval/both/reward": 0.7}
config = {"eval_every": 2, "max_steps": 4}
print(json.dumps([sync.samples(pathlib.Path(sys.argv[2])), sync.first_incomplete(rows, config), str(sync.first_incomplete(done, config))]))
"#;
    let output = Command::new(python()).args(["-c", script]).arg(repo_root().join("scripts/wandb_sync.py")).arg(dir.path()).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let read: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(read, json!([[[1, "<|im_start|>user\nHi<|im_end|>", "a ||| b\nend"], [2, "p", "c"]], 4, "inf"]));
}
