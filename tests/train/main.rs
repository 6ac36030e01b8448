//! The trainer end to end on the pre-trained `tiny-stories` fixture with real reward plugins:
//! learning, exact resumption, checkpoints, and a plugin failure in the middle of a run.

#[path = "../common/mod.rs"]
mod common;
mod resume;
mod learning;
mod steps;
mod routing;
mod interventions;
mod outputs;
mod packs;
mod off_policy;
mod pipeline;
mod memory;
mod entropy_bonus;
mod replay;
mod multi_objective;
mod train_dtype;
mod no_score;

use std::path::{Path, PathBuf};

use common::{one_thread, repo_root, standard_plugin, test_plugin};
use serde_json::{Map, Value, json};
use smallrl::train::metrics::key;
use smallrl::train::packed::{PackOptions, PackedRun, Stacking, train_packed, train_packed_with};
use smallrl::train::{TrainConfig, Trainer};

/// A small, fast configuration ([`common::tiny_stories_run`]).
fn small_config(output_dir: &Path, reward_plugin: &Path) -> Map<String, Value> {
    common::tiny_stories_run(output_dir, reward_plugin, "test")
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

/// Equal lines, floats bit for bit. (This once needed 1e-12 relative: a resumed run rewrote
/// the kept lines of metrics.jsonl through serde_json, whose float parser can be one ulp off,
/// e.g. step 1's `kl` -3.1044085080367267e-9 came back as ...7263e-9; runlog::Jsonl now keeps
/// the lines' text.)
fn assert_same_metrics(a: &[Value], b: &[Value], file: &str) {
    assert_metrics_within(a, b, file, |_, _, _| 0.0);
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
                        differences.push(format!("line {step}: {key} {p:e} vs {q:e} diff {:e}", p - q));
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

/// Names of the entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}
