//! Run directories written by the code before the hyperparameters were declared in one table
//! still `--resume`, `eval` and `sweep --collect`. The fixtures in
//! `tests/fixtures/pre-layout-runs/` were made by that code's binary, from `host/` (the directory
//! tests run in), with relative paths to the `tiny-stories` model in `../shared/fixtures` and to
//! the built plugins: a finished 2-step routed DualLoRA run, the same run stopped after step 1,
//! and the old binary's `eval --json` of the finished run's final checkpoint.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{fixture, read_jsonl, repo_root, standard_plugin};
use serde_json::Value;

const RUN: &str = "dual-lora_bs4_r1_lr1e-3_len8_steps2_g2_classic_s42";

fn fixtures() -> PathBuf {
    // The runs reach the model and plugins through relative paths; fail clearly if they are absent.
    fixture("tiny-stories");
    standard_plugin("happy");
    repo_root().join("tests/fixtures/pre-layout-runs")
}

fn run_dir(kind: &str) -> PathBuf {
    fixtures().join(kind).join(format!("{kind}_{RUN}"))
}

fn smallrl(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_smallrl")).args(args).env_remove("RUST_BACKTRACE").output().unwrap();
    assert!(output.status.success(), "smallrl {args:?} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    output
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}


/// A JSON value without its wall-clock fields.
fn without_timings(mut value: Value) -> Value {
    if let Some(obj) = value.as_object_mut() {
        obj.retain(|k, _| !k.starts_with("timing/") && k != "step_time" && k != "seconds");
        for child in obj.values_mut() {
            *child = without_timings(child.take());
        }
    }
    value
}

/// `line` with only the keys that `like` has, at every depth (objects, and arrays of them
/// element by element): what the old code wrote, without what was added since.
fn only_keys_of(line: Value, like: &Value) -> Value {
    match (line, like) {
        (Value::Object(obj), Value::Object(like)) => {
            Value::Object(obj.into_iter().filter_map(|(k, v)| like.get(&k).map(|l| (k, only_keys_of(v, l)))).collect())
        }
        (Value::Array(items), Value::Array(like)) if items.len() == like.len() => {
            Value::Array(items.into_iter().zip(like).map(|(v, l)| only_keys_of(v, l)).collect())
        }
        (line, _) => line,
    }
}

#[test]
fn an_old_stopped_run_resumes_to_what_the_old_code_finished() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join(format!("stopped_{RUN}"));
    copy_dir(&run_dir("stopped"), &copy);
    smallrl(&["train", "--resume", copy.to_str().unwrap(), "--threads", "1"]);

    let finished = run_dir("finished");
    for file in ["metrics.jsonl", "routing_eval.jsonl"] {
        let old: Vec<Value> = read_jsonl(&finished.join(file)).into_iter().map(without_timings).collect();
        let resumed: Vec<Value> = read_jsonl(&copy.join(file)).into_iter().map(without_timings).collect();
        assert_eq!(old.len(), 2, "{file}");
        // Metrics added since (probes) are new keys; every key the old code wrote keeps its value.
        let resumed: Vec<Value> = resumed.into_iter().zip(&old).map(|(line, old_line)| only_keys_of(line, old_line)).collect();
        assert_eq!(resumed, old, "{file}: the resumed old run differs from the old code's uninterrupted run");
    }
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-2/adapters.safetensors")).unwrap();
    let (old, resumed) = (weights(&finished), weights(&copy));
    assert_eq!(old.keys().collect::<Vec<_>>(), resumed.keys().collect::<Vec<_>>());
    for (name, tensor) in &old {
        assert!(tensor.equal(&resumed[name]), "{name} differs after resuming the old run");
    }
    let saved = std::fs::read_to_string(copy.join("checkpoint-2/config.yaml")).unwrap();
    let reread: smallrl::train::TrainConfig = smallrl::yaml::from_str(&saved).unwrap();
    assert_eq!(reread.run_name().unwrap(), format!("stopped_{RUN}"), "the run keeps its name");
}

#[test]
fn an_old_checkpoint_evaluates_as_the_old_binary_did() {
    let checkpoint = run_dir("finished").join("checkpoint-2");
    let output = smallrl(&["eval", checkpoint.to_str().unwrap(), "--n-samples", "2", "--json", "--threads", "1"]);
    let ours: Value = serde_json::from_slice(&output.stdout).unwrap();
    let old: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("eval-checkpoint-2.json")).unwrap()).unwrap();
    // Keys added since (the hackable prompts' cells) are new; every key the old binary wrote
    // keeps its value.
    let old = without_timings(old);
    assert_eq!(only_keys_of(without_timings(ours), &old), old);
}

#[test]
fn an_old_run_directory_is_collected_by_a_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    let finished = run_dir("finished");
    copy_dir(&finished, &tmp.path().join(finished.file_name().unwrap()));
    let output = smallrl(&["sweep", "--collect", tmp.path().to_str().unwrap()]);
    let csv = std::fs::read_to_string(tmp.path().join("summary.csv")).unwrap();
    let row = csv.lines().find(|l| l.starts_with(&format!("finished_{RUN},"))).unwrap_or_else(|| panic!("no row for the run:\n{csv}"));
    let last = read_jsonl(&finished.join("metrics.jsonl")).pop().unwrap();
    let fields: Vec<&str> = row.split(',').collect();
    let reward: f64 = fields[2].parse().unwrap();
    assert_eq!(reward, last["reward"].as_f64().unwrap(), "{row}");
    assert!(row.contains(",2,"), "the final step: {row}");
    assert!(String::from_utf8_lossy(&output.stdout).contains(&format!("finished_{RUN}")));
}
