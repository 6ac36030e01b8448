//! Hostile environments where the host takes their prompts and runs them (issue 36): purity
//! checked wherever a split is taken, messages that name the environment's file, and a hostile
//! environment inside `eval --deploy` and a sweep's deployment collection. The environment is
//! `plugins/testing/hostile_env`, built by `make plugins`.

mod common;

use std::time::{Duration, Instant};

use common::{plugin_dir, test_plugin};
use smallrl::plugins::{EnvSplit, PluginLimits};
use smallrl::reward::{ProtocolKnobs, RewardModel};

const KNOBS: ProtocolKnobs = ProtocolKnobs { false_positive_rate: 0.0, recall: 1.0, rh_eligible_frac: 1.0 };

/// Purity where it matters: an environment whose `generate` depends on how often it was called
/// (hostile_env "impure": "eval 0" in an instance's first call, "eval 0 call 2" in its second)
/// is refused where a run, `eval` (`evaluation_prompts`) or `--resume` takes its prompts, naming
/// the environment's file, the split and the first differing prompt; the pure mode passes.
#[test]
fn an_impure_environment_is_refused_where_its_prompts_are_taken() {
    let path = test_plugin("hostile_env");
    let cfg = smallrl::train::TrainConfig::default();
    let render = smallrl::train::prompts::PromptRender::Raw;
    let load = |mode: &str| RewardModel::load_environment(path.to_str().unwrap(), Some(&serde_json::json!({"mode": mode})), KNOBS, &plugin_dir(), PluginLimits::default()).unwrap();
    let mut impure = load("impure");
    let error = format!("{:#}", smallrl::train::task::evaluation_prompts(&mut impure, 3, &cfg, &render).unwrap_err());
    let want = format!(
        "environment hostile_env ({}) is not pure: its eval prompts (seed 99) differ when generated again, from prompt 0: \
         Text(\"eval 0\") the first time, Text(\"eval 0 call 2\") the second",
        path.display()
    );
    assert!(error.contains(&want), "{error}");
    let mut pure = load("ok");
    pure.generate(EnvSplit::Train, 2, 1, 0.5).unwrap();
    let prompts = smallrl::train::task::evaluation_prompts(&mut pure, 3, &cfg, &render).unwrap();
    assert_eq!(prompts.iter().map(|p| p.text.as_str()).collect::<Vec<_>>(), ["eval 0", "eval 1", "eval 2"]);
    // A run takes its training prompts, then its evaluation prompts: refused before any step.
    let out = tempfile::tempdir().unwrap();
    let output = common::smallrl(&[
        "train", "--environment", path.to_str().unwrap(), "--set", r#"environment_params={"mode": "impure"}"#, "--model",
        common::fixture("tiny-stories").to_str().unwrap(), "--output-dir", out.path().to_str().unwrap(), "--max-steps", "1", "--device", "cpu",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("is not pure: its train prompts (seed 42) differ") && stderr.contains("Text(\"train 0 call 2\")"), "{stderr}");
}

/// Chat messages in a raw-format run are refused naming the environment's file and what to set.
#[test]
fn chat_messages_in_a_raw_run_name_the_environments_file() {
    let path = test_plugin("hostile_env");
    let mut model = RewardModel::load_environment(path.to_str().unwrap(), Some(&serde_json::json!({"mode": "messages"})), KNOBS, &plugin_dir(), PluginLimits::default()).unwrap();
    let render = smallrl::train::prompts::PromptRender::Raw;
    let error = format!("{:#}", smallrl::train::task::evaluation_prompts(&mut model, 2, &smallrl::train::TrainConfig::default(), &render).unwrap_err());
    let want = format!("environment hostile_env ({}): its eval prompts: prompt 0: a `messages` conversation needs a chat template: set prompt_format: chat", path.display());
    assert!(error.contains(&want), "{error}");
}

/// A prompt in both splits stops the run naming the environment's file and the prompt.
#[test]
fn shared_splits_stop_a_run_naming_the_environments_file() {
    let path = test_plugin("hostile_env");
    let out = tempfile::tempdir().unwrap();
    let output = common::smallrl(&[
        "train", "--environment", path.to_str().unwrap(), "--set", r#"environment_params={"mode": "same_splits"}"#, "--model",
        common::fixture("tiny-stories").to_str().unwrap(), "--output-dir", out.path().to_str().unwrap(), "--max-steps", "1", "--device", "cpu",
        "--num-prompts", "8", "--eval-samples", "4",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    let want = format!("environment hostile_env ({}): 4 of its 4 evaluation prompts are also training prompts, e.g. \"train 0\"", path.display());
    assert!(stderr.contains(&want), "{stderr}");
}

/// `smallrl ARGS`, its exit success, stdout, stderr and peak resident memory in kB (wait4's
/// rusage of that child alone).
fn smallrl_measured(args: &[&str]) -> (bool, String, String, i64) {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"))
        .args(args)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: waits for this child alone; `status` and `usage` are valid for writes.
    let waited = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(waited, child.id() as libc::pid_t);
    let read = |path| std::fs::read_to_string(path).unwrap();
    (libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, read(&out), read(&err), usage.ru_maxrss)
}

/// A hostile environment inside `eval --deploy` and a sweep's deployment collection: two runs
/// of hostile_env, the second's checkpoint switched to mode "nan" (a NaN score). Its `eval
/// --deploy` fails naming the file and the cause; `sweep --collect --deploy` still deploys the
/// first run, then fails naming the second, its log and the cause. Bounded in time and memory.
#[test]
fn a_hostile_environment_in_eval_deploy_and_a_sweeps_collection_is_named_and_spares_the_others() {
    let out = tempfile::tempdir().unwrap();
    let sweep = out.path().join("sweep");
    let env = test_plugin("hostile_env");
    for seed in ["1", "2"] {
        common::smallrl_ok(&[
            "train", "--environment", env.to_str().unwrap(), "--set", "environment_params={mode: ok}", "--model",
            common::fixture("tiny-stories").to_str().unwrap(), "--output-dir", sweep.to_str().unwrap(), "--max-steps", "1", "--save-steps", "1",
            "--eval-every", "1", "--eval-samples", "4", "--num-prompts", "8", "--batch-size", "4", "--num-generations", "2",
            "--max-completion-length", "8", "--adapter", "dual-lora", "--lora-preset", "r4", "--routing-mode", "classic", "--device", "cpu",
            "--threads", "1", "--seed", seed,
        ]);
    }
    let run = |suffix: &str| std::fs::read_dir(&sweep).unwrap().map(|e| e.unwrap().path()).find(|p| p.to_str().unwrap().ends_with(suffix)).unwrap();
    let (good, hostile) = (run("_s1"), run("_s2"));
    for config in [hostile.join("config.yaml"), hostile.join("checkpoint-1/config.yaml")] {
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.contains("environment_params:\n  mode: ok\n"), "{text}");
        std::fs::write(&config, text.replace("environment_params:\n  mode: ok\n", "environment_params:\n  mode: nan\n")).unwrap();
    }
    let cause = format!("plugin hostile_env (environment, {}): score returned NaN as component `says_ok` of sample 0", env.display());
    let started = Instant::now();
    let (ok, _, stderr, peak_kb) = smallrl_measured(&["eval", hostile.to_str().unwrap(), "--deploy", "--forget-scales", "0,1", "--n-samples", "4", "--threads", "1"]);
    assert!(!ok && stderr.contains(&cause), "{stderr}");
    // An absolute ceiling far above the process's need (hundreds of MB) and far below what an
    // unbounded plugin would take: a bound on the hostile plugin, not a figure of this machine.
    assert!(peak_kb < 2_000_000, "peak {peak_kb} kB");
    let (ok, stdout, stderr, peak_kb) = smallrl_measured(&["sweep", "--collect", sweep.to_str().unwrap(), "--deploy", "--jobs", "1"]);
    assert!(!ok, "{stdout}");
    let name = hostile.file_name().unwrap().to_str().unwrap();
    assert!(stderr.contains(&format!("the deployment evaluation failed for {name} (exit status: 1; see ")) && stderr.contains(&cause), "{stderr}");
    assert!(good.join("deployment.json").exists() && !hostile.join("deployment.json").exists(), "{stdout}");
    assert!(stdout.contains(&format!("[DEPLOY] {name} FAILED")), "{stdout}");
    assert!(peak_kb < 2_000_000, "peak {peak_kb} kB");
    assert!(started.elapsed() < Duration::from_secs(120), "took {:?}", started.elapsed());
}
