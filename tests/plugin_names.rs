//! Issue 47, item 5: a new run is named by what its plugins declare, not by `run` or a file
//! path: an environment's run by the environment's name, `--reward-plugin PATH` by the reward's
//! declared name (`plugins/happy.wasm` declares `happy_count`, as a TRL function's component
//! declares the function's name), and a detector given by a path, over a config file, by its
//! declared name; a Python reward component given by a path is named by its declared name in
//! metrics too. Standard plugins keep the names their metrics had, and old run directories
//! keep theirs (here and `tests/pre_layout_runs.rs`).

mod common;

use std::path::Path;

use common::{fixture, only_run, plugin_dir, read_jsonl, repo_root, smallrl_ok};

/// One tiny step on the tiny-stories fixture with `extra` flags; the run directory's name.
fn run_name(out: &Path, extra: &[&str]) -> String {
    train(out, &[&["--max-steps", "1"], extra].concat());
    only_run(out).file_name().unwrap().to_string_lossy().into_owned()
}

/// A tiny run on the tiny-stories fixture with `extra` flags.
fn train(out: &Path, extra: &[&str]) {
    let (model, plugins) = (fixture("tiny-stories"), plugin_dir());
    let mut args = vec![
        "train", "--model", model.to_str().unwrap(), "--plugin-dir", plugins.to_str().unwrap(), "--output-dir", out.to_str().unwrap(),
        "--batch-size", "4", "--num-generations", "2", "--max-completion-length", "8", "--eval-samples", "2", "--threads", "1", "--device", "cpu",
    ];
    args.extend_from_slice(extra);
    smallrl_ok(&args);
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

/// The `rewards/` keys of a run's metrics.jsonl line.
fn reward_keys(line: &serde_json::Value) -> Vec<String> {
    line.as_object().unwrap().keys().filter(|k| k.starts_with("rewards/")).cloned().collect()
}

/// A TRL reward function given by a path (`trl_length.py`, whose function is `reward_len`)
/// names its component by the function, as `plugin info` shows it, in metrics.jsonl and in the
/// config.yaml the run records (so a resumed run keeps it); a run recorded without the name, as
/// runs before were, resumes with its file stem's.
#[test]
fn a_trl_reward_given_by_a_path_is_named_by_its_function_and_old_runs_keep_their_stems() {
    let out = tempfile::tempdir().unwrap();
    let component = out.path().join("trl_length.wasm");
    let module = repo_root().join("plugins/python/testing/trl_length.py");
    smallrl_ok(&["plugin", "build", module.to_str().unwrap(), "-o", component.to_str().unwrap()]);
    assert!(smallrl_ok(&["plugin", "info", component.to_str().unwrap()]).starts_with("reward_len "), "the declared name");
    let runs = out.path().join("runs");
    let prompts = fixture("tiny-stories/prompts.txt");
    let flags = ["--reward-plugin", component.to_str().unwrap(), "--prompts", prompts.to_str().unwrap(), "--max-steps", "2", "--save-steps", "1", "--stop-after", "1"];
    train(&runs, &flags);
    let run = only_run(&runs);
    assert!(run.file_name().unwrap().to_string_lossy().starts_with("reward_len_"), "{}", run.display());
    assert_eq!(reward_keys(&read_jsonl(run.join("metrics.jsonl"))[0]), ["rewards/reward_len/mean"], "the function's name, not the file's");
    let recorded: serde_json::Value = smallrl::yaml::read_file(&run.join("config.yaml")).unwrap();
    assert_eq!(recorded["reward"]["components"][0]["name"], "reward_len", "{recorded}");

    // The run as the code before recorded it: `reward: {plugin: PATH}`, no name.
    let configs: Vec<_> = [run.join("config.yaml"), run.join("checkpoint-1/config.yaml")].into_iter().filter(|config| config.is_file()).collect();
    assert!(configs.contains(&run.join("config.yaml")));
    for config in configs {
        let mut saved: serde_json::Value = smallrl::yaml::read_file(&config).unwrap();
        saved["reward"] = serde_json::json!({"plugin": component.to_str().unwrap()});
        std::fs::write(&config, smallrl::yaml::to_string(&saved).unwrap()).unwrap();
    }
    smallrl_ok(&["train", "--resume", run.to_str().unwrap(), "--threads", "1"]);
    let lines = read_jsonl(run.join("metrics.jsonl"));
    assert_eq!((lines.len(), reward_keys(&lines[1])), (2, vec!["rewards/trl_length/mean".to_string()]), "the old run's component keeps its stem");
}

/// The lead's rule for issue 47: standard plugins' metric names and standard runs' names do not
/// change. `plugins/happy.wasm` (a Rust plugin declaring `happy_count`) still logs
/// `rewards/happy`, and a standard config's components keep theirs; the lists are written here.
#[test]
fn standard_runs_keep_their_metric_names_and_run_names() {
    let out = tempfile::tempdir().unwrap();
    let prompts = fixture("tiny-stories/prompts.txt");
    let happy = plugin_dir().join("happy.wasm");
    let name = run_name(&out.path().join("happy"), &["--reward-plugin", happy.to_str().unwrap(), "--prompts", prompts.to_str().unwrap()]);
    assert!(name.starts_with("happy_count_"), "{name}");
    let lines = read_jsonl(only_run(&out.path().join("happy")).join("metrics.jsonl"));
    assert_eq!(reward_keys(&lines[0]), ["rewards/happy/mean"]);

    let config = repo_root().join("configs/sentence_length_10_smooth_with_happy.yaml");
    let runs = out.path().join("config");
    let name = run_name(&runs, &["--config", config.to_str().unwrap(), "--prompts", prompts.to_str().unwrap()]);
    assert!(name.starts_with("sentence_length_10_smooth_with_happy_"), "{name}");
    let lines = read_jsonl(only_run(&runs).join("metrics.jsonl"));
    assert_eq!(reward_keys(&lines[0]), ["rewards/happy_count/mean", "rewards/sentence_length_10_smooth/mean"]);
}
