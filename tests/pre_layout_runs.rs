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

/// How far a float the old binary wrote may be from ours: 1e-5 of its size, or 1e-7 absolutely
/// near 0. The fixtures were written on another processor, whose float32 arithmetic (MKL's and
/// ATen's code paths) differs from this one's in the last bits, and step 2 is computed here: its
/// `entropy`, a mean over 128 tokens of sums over a 4096-token vocabulary, came out 8e-8 relative
/// from the old binary's on an Intel Xeon with AMX and 1.1e-6 on an AMD EPYC (AVX2); the run's
/// rewards are all 0, so its `loss`, `kl` and `grad_norm` are rounding noise of order 1e-8
/// (`grad_norm` 1.63e-8 against 1.67e-8 there). A wrong resumption (another prompt, step,
/// learning rate) moves the entropy by 1e-3 or more. Integers, strings, booleans and keys are
/// compared exactly. Every difference is listed.
fn assert_close_json(old: &Value, ours: &Value, at: &str) {
    let mut differences = Vec::new();
    close_json(old, ours, at, &mut differences);
    assert!(differences.is_empty(), "{}{}", differences.join("\n"), common::machine_note());
}

fn close_json(old: &Value, ours: &Value, at: &str, differences: &mut Vec<String>) {
    match (old, ours) {
        (Value::Object(a), Value::Object(b)) => {
            assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "{at}: keys");
            a.iter().for_each(|(k, v)| close_json(v, &b[k], &format!("{at}.{k}"), differences));
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{at}: length");
            a.iter().zip(b).enumerate().for_each(|(i, (x, y))| close_json(x, y, &format!("{at}[{i}]"), differences));
        }
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            if (x - y).abs() > (1e-5 * x.abs()).max(1e-7) {
                differences.push(format!("{at}: {y} here, {x} from the old binary"));
            }
        }
        _ => assert_eq!(old, ours, "{at}"),
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
        // Step 1 is not recomputed: the resumed run keeps the stopped run's line (written by the
        // old binary, copied with the directory), so its numbers are the file's own: equal. Step 2
        // was computed here, on this processor.
        assert_eq!(resumed[0], old[0], "{file}: the old run's first line, kept");
        assert_close_json(&old[1], &resumed[1], &format!("{file} step 2"));
    }
    // The weights after step 2: its gradient is rounding noise (above), which AdamW normalises to
    // steps of up to about the learning rate (5e-4 at step 2) in directions that rounding
    // decides, so across processors they agree to that only; each weight must still be within
    // one such step of the old binary's, and the tensors the same (names, shapes). On one
    // machine a resumption is bit for bit (tests/train/resume.rs).
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-2/adapters.safetensors")).unwrap();
    let (old, resumed) = (weights(&finished), weights(&copy));
    assert_eq!(old.keys().collect::<Vec<_>>(), resumed.keys().collect::<Vec<_>>());
    let mut largest = 0.0f64;
    for (name, tensor) in &old {
        assert_eq!(tensor.size(), resumed[name].size(), "{name}");
        let difference = common::max_abs_diff(tensor, &resumed[name]);
        assert!(difference <= 5e-4, "{name} is {difference:e} from the old binary's after resuming the old run{}", common::machine_note());
        largest = largest.max(difference);
    }
    println!("weights after step 2: at most {largest:e} from the old binary's");
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
    assert_close_json(&old, &only_keys_of(without_timings(ours), &old), "eval --json");
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
