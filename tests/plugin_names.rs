//! Issue 47, item 5: a new run is named by what its plugins declare, not by `run` or a file
//! path: an environment's run by the environment's name, `--reward-plugin PATH` by the reward's
//! declared name (`plugins/happy.wasm` declares `happy_count`, as a TRL function's component
//! declares the function's name), and a detector given by a path, over a config file, by its
//! declared name. Old run directories keep theirs (`tests/pre_layout_runs.rs`).

mod common;

use std::path::Path;

use common::{fixture, only_run, plugin_dir, smallrl_ok};

/// One tiny step on the tiny-stories fixture with `extra` flags; the run directory's name.
fn run_name(out: &Path, extra: &[&str]) -> String {
    let (model, plugins) = (fixture("tiny-stories"), plugin_dir());
    let mut args = vec![
        "train", "--model", model.to_str().unwrap(), "--plugin-dir", plugins.to_str().unwrap(), "--output-dir", out.to_str().unwrap(),
        "--max-steps", "1", "--batch-size", "4", "--num-generations", "2", "--max-completion-length", "8", "--eval-samples", "2",
        "--threads", "1", "--device", "cpu",
    ];
    args.extend_from_slice(extra);
    smallrl_ok(&args);
    only_run(out).file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn an_environment_run_is_named_by_the_environment() {
    let out = tempfile::tempdir().unwrap();
    let name = run_name(out.path(), &["--environment", "sorting", "--num-prompts", "16"]);
    assert!(name.starts_with("sorting_") && name.ends_with("_s42"), "{name}");
}

#[test]
fn a_reward_plugin_path_names_the_run_by_its_declared_name() {
    let out = tempfile::tempdir().unwrap();
    let happy = plugin_dir().join("happy.wasm");
    let prompts = fixture("tiny-stories/prompts.txt");
    let name = run_name(out.path(), &["--reward-plugin", happy.to_str().unwrap(), "--prompts", prompts.to_str().unwrap()]);
    assert!(name.starts_with("happy_count_"), "happy.wasm declares happy_count: {name}");
}

#[test]
fn a_detector_path_over_a_config_file_is_named_by_its_declared_name() {
    let out = tempfile::tempdir().unwrap();
    let config = out.path().join("tiny.yaml");
    let prompts = fixture("tiny-stories/prompts.txt");
    std::fs::write(&config, format!("prompts: {}\nreward: {{plugin: happy_count}}\nrh_detector: {{plugin: happy_count}}\n", prompts.display())).unwrap();
    let runs = out.path().join("runs");
    let detector = plugin_dir().join("detect_happy_any.wasm");
    let name = run_name(&runs, &["--config", config.to_str().unwrap(), "--rh-detector", detector.to_str().unwrap()]);
    assert!(name.starts_with("tiny_det-happy_any_"), "the detector's declared name, not its path: {name}");
}
