//! `smallrl plugin new` writes crates that build into working plugins (a real nested cargo
//! build for wasm32: about a minute the first time, seconds once `target/scaffold-check` is warm).

mod common;

use std::process::Command;

use smallrl::plugins::scaffold::scaffold;
use smallrl::plugins::{Plugin, PluginKind, PluginLimits, Sample};

fn build(crate_dir: &std::path::Path) {
    let status = Command::new(crate_dir.join("build.sh"))
        // Shared across runs and scaffolds so the SDK's dependencies compile once.
        .env("CARGO_TARGET_DIR", common::repo_root().join("target/scaffold-check"))
        .status()
        .expect("build.sh runs");
    assert!(status.success(), "{}/build.sh failed", crate_dir.display());
}

fn texts(completions: &[&str]) -> Vec<Sample> {
    let sample = |completion: &&str| Sample { completion: completion.to_string(), ..Sample::default() };
    completions.iter().map(sample).collect()
}

#[test]
fn new_plugins_build_and_score() {
    let dir = tempfile::tempdir().unwrap();
    let batch = texts(&["a happy happy day", "a happy day", "a day"]);

    let reward_dir = scaffold("my_reward", dir.path(), PluginKind::Reward).unwrap();
    build(&reward_dir);
    let mut reward = Plugin::load(&reward_dir.join("my_reward.wasm"), "{}", PluginLimits::default()).unwrap();
    assert_eq!(reward.info().name, "my_reward");
    assert_eq!(reward.score(&batch).unwrap(), vec![1.0, 0.5, 0.0]);

    let detector_dir = scaffold("my_detector", dir.path(), PluginKind::Detector).unwrap();
    build(&detector_dir);
    let mut detector = Plugin::load(&detector_dir.join("my_detector.wasm"), r#"{"word": "day"}"#, PluginLimits::default()).unwrap();
    assert_eq!(detector.kind(), PluginKind::Detector);
    assert_eq!(detector.detect(&batch).unwrap(), vec![false, false, false]);
}

#[test]
fn names_must_be_snake_case_and_new() {
    let dir = tempfile::tempdir().unwrap();
    let error = scaffold("My-Reward", dir.path(), PluginKind::Reward).unwrap_err();
    assert!(error.to_string().contains("must be snake_case"), "{error}");
    scaffold("taken", dir.path(), PluginKind::Reward).unwrap();
    let error = scaffold("taken", dir.path(), PluginKind::Reward).unwrap_err();
    assert!(error.to_string().contains("already exists"), "{error}");
}
