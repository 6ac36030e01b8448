//! `smallrl plugin new` writes crates that build into working plugins and whose own `cargo test`
//! passes, snapshot test included (real nested cargo builds, for wasm32 and native: a few
//! minutes the first time, seconds once `target/scaffold-check` is warm).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use smallrl::plugins::scaffold::scaffold;
use smallrl::plugins::{Plugin, PluginKind, PluginLimits, Sample};

/// Shared across runs and scaffolds so the SDK's and insta's dependencies compile once; offline,
/// because the workspace's build already fetched every crate a scaffold needs.
fn nested_cargo(command: &mut Command) -> &mut Command {
    command.env("CARGO_TARGET_DIR", common::repo_root().join("target/scaffold-check")).env("CARGO_NET_OFFLINE", "true")
}

fn build(crate_dir: &Path) {
    let status = nested_cargo(&mut Command::new(crate_dir.join("build.sh"))).status().expect("build.sh runs");
    assert!(status.success(), "{}/build.sh failed", crate_dir.display());
}

/// `cargo test` in the crate, as in CI (`CI=true`: insta compares and never writes).
fn cargo_test(crate_dir: &Path) -> Output {
    let mut command = Command::new("cargo");
    nested_cargo(command.arg("test").current_dir(crate_dir).env("CI", "true").env_remove("INSTA_UPDATE"));
    command.output().expect("cargo test runs")
}

fn passes(output: Output, crate_dir: &Path) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "cargo test failed in {}: {stdout}{}", crate_dir.display(), String::from_utf8_lossy(&output.stderr));
    stdout
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

    for crate_dir in [&reward_dir, &detector_dir] {
        let stdout = passes(cargo_test(crate_dir), crate_dir);
        assert!(stdout.contains("snapshot_of_fixed_texts ... ok") && stdout.contains("follows_the_formula ... ok"), "{stdout}");
    }
    // The shipped snapshot pins the formula: another default fails the test with insta's diff.
    let lib = reward_dir.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    let edited = source.replace(r#"Param::integer("max_count", 2,"#, r#"Param::integer("max_count", 4,"#);
    assert_ne!(edited, source, "the template declares max_count 2");
    std::fs::write(&lib, edited).unwrap();
    let failed = cargo_test(&reward_dir);
    assert!(!failed.status.success(), "a changed result fails the snapshot test");
    let stdout = String::from_utf8_lossy(&failed.stdout);
    assert!(stdout.contains("snapshot_of_fixed_texts ... FAILED"), "{stdout}");
}

/// `plugin new --environment`: the crate builds into an environment the host loads, generates
/// with and scores with, and its own tests (generator, formula, shipped snapshot) pass.
#[test]
fn new_environments_build_generate_and_score() {
    use smallrl::plugins::{Batch, EnvSplit};
    let dir = tempfile::tempdir().unwrap();
    let env_dir = scaffold("my_env", dir.path(), PluginKind::Environment).unwrap();
    build(&env_dir);
    let mut env = Plugin::load(&env_dir.join("my_env.wasm"), "{}", PluginLimits::default()).unwrap();
    assert_eq!((env.kind(), env.info().name.as_str()), (PluginKind::Environment, "my_env"));
    let prompts = env.generate(EnvSplit::Train, 10, 1, 0.5).unwrap();
    assert_eq!(prompts.iter().filter(|p| p.metadata["hackable"] == true).count(), 5);
    let mut sample = texts(&["the river river river"]).remove(0);
    sample.metadata = smallrl::train::prompts::metadata_from_columns(serde_json::from_str(r#"{"word":"river","hackable":true,"detectable":true}"#).unwrap()).unwrap();
    let batch = Batch::new(&[sample]);
    // Uses of "river": 3, so uses_word 1, word_stuffing 3/5, flagged by the monitor (>= 3).
    assert_eq!(env.score_environment(&batch).unwrap().components, vec![vec![Some(1.0)], vec![Some(0.6)]]);
    assert_eq!(env.monitor(&batch).unwrap(), [true]);
    let stdout = passes(cargo_test(&env_dir), &env_dir);
    for test in ["snapshot_of_fixed_texts ... ok", "follows_the_formula ... ok", "generates_exact_counts_and_disjoint_splits ... ok"] {
        assert!(stdout.contains(test), "{stdout}");
    }
}

/// `plugin new --episode` (the CLI, in a folder outside the checkout): the crate builds into an
/// episode environment the host loads, generates with and plays, each answer worked out by hand
/// from the template's rules, and its own tests (native `Episodes` play) pass.
#[test]
fn new_episode_environments_build_and_play() {
    use serde_json::json;
    use smallrl::plugins::{Batch, EnvPrompt, EnvPromptContent, EnvSplit, EpisodeBounds, EpisodeEnd, TurnResult};
    let dir = tempfile::tempdir().unwrap();
    let printed = common::smallrl_ok(&["plugin", "new", "my_game", "--episode", "--dir", dir.path().to_str().unwrap()]);
    let crate_dir = dir.path().join("my_game");
    assert!(printed.contains("created episode environment crate") && crate_dir.join("src/lib.rs").exists(), "{printed}");
    build(&crate_dir);
    let mut env = Plugin::load(&crate_dir.join("my_game.wasm"), "{}", PluginLimits::default()).unwrap();
    assert!(env.is_episodic() && env.info().name == "my_game");
    let prompts = env.generate(EnvSplit::Train, 10, 1, 0.0).unwrap();
    assert_eq!(prompts.len(), 10);
    assert!(prompts.iter().all(|p| p.metadata["hackable"] == false), "nothing to hack");
    let serde_json::Value::Object(metadata) = json!({"word": "apple", "hackable": false, "detectable": false}) else { unreachable!() };
    let prompt = EnvPrompt { content: EnvPromptContent::Text("Game 1. Say the word: apple.".into()), metadata };
    let bounds = EpisodeBounds::default();
    env.start_episodes(&[(1, &prompt), (2, &prompt)]).unwrap();
    let mut play = |id: u64, text: &str, last: bool| env.step_episodes(&[(id, last)], &Batch::new(&texts(&[text])), &bounds).unwrap().remove(0);
    let end = |said: f64, speed: f64, turns: f64| TurnResult::End(EpisodeEnd { components: vec![said, speed], metrics: vec![turns], monitor: false, ground_truth: false });
    assert_eq!(play(1, "a pear", false), TurnResult::Observation(vec![("user".into(), "No. Say the word: apple.".into())]));
    // Said (in capitals) at the second turn: said 1, speed 1/2, turns 2.
    assert_eq!(play(1, "An APPLE!", false), end(1.0, 0.5, 2.0));
    assert_eq!(play(2, "no", true), end(0.0, 0.0, 1.0), "the last turn ends it");
    let stdout = passes(cargo_test(&crate_dir), &crate_dir);
    for test in ["an_episode_played_by_hand ... ok", "prompts_are_exact_in_count_and_split_apart ... ok"] {
        assert!(stdout.contains(test), "{stdout}");
    }
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
