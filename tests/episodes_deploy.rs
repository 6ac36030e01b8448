//! The deployment protocol of routed multi-turn episode runs (issue 48): `smallrl eval --deploy`,
//! `--forget-scales` and a sweep's `--deploy` on runs that play episodes, on the tiny-stories
//! fixture. What is checked is computed apart from the evaluation: each episode's reward from
//! its transcript by hand, the base model's hack rates from the prompts and transcripts, the
//! deployed scale by the rule written plainly, the forget adapter's absence from the deployed
//! mode by replacing its weights, and the files against those a single-turn deployment writes.
//! Needs `make plugins` (guess_number.wasm, code_tests_episode.wasm).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{fixture, plugin_dir, repo_root, smallrl, smallrl_ok};
use serde_json::{Map, Value, json};

/// `smallrl eval DIR --json ARGS` (4 episodes a mode, one thread): the report's modes, by name.
fn eval_modes(dir: &Path, args: &[&str]) -> Map<String, Value> {
    let mut all = vec!["eval", dir.to_str().unwrap(), "--json", "--threads", "1", "--n-samples", "4"];
    all.extend(args);
    let report: Value = serde_json::from_str(&smallrl_ok(&all)).unwrap();
    report["report"]["modes"].as_array().unwrap().iter().map(|m| (m["mode"].as_str().unwrap().to_string(), m.clone())).collect()
}

/// A copy of `checkpoint` (into `out`) whose forget adapter's every tensor is replaced by
/// Gaussian noise of standard deviation 0.3 (the retain adapter and the base model untouched).
fn with_forget_replaced(checkpoint: &Path, out: &Path) -> PathBuf {
    let copy = out.join(checkpoint.file_name().unwrap());
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(checkpoint).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
    }
    let file = copy.join("adapters.safetensors");
    let tensors = smallrl::model::weights::read_safetensors(&file).unwrap();
    tch::manual_seed(5);
    let mut replaced = 0;
    let tensors: Vec<(String, tch::Tensor)> = tensors
        .into_iter()
        .map(|(name, t)| match name.contains(".forget.") {
            true => {
                replaced += 1;
                let noise = tch::Tensor::randn(t.size(), (t.kind(), t.device())) * 0.3;
                (name, noise)
            }
            false => (name, t),
        })
        .collect();
    assert!(replaced > 0, "no forget tensor in {}", file.display());
    smallrl::model::weights::write_safetensors(&file, &tensors).unwrap();
    copy
}

/// The samples (prompt, transcript) of a report mode.
fn samples(mode: &Value) -> &Vec<Value> {
    mode["samples"].as_array().unwrap()
}

/// The forget adapter is off in the deployed mode (retain 1, forget 0) exactly: the checkpoint
/// with its forget weights replaced by noise plays the same episodes there and gives every same
/// value, while at forget scale 1 the noise changes what it plays (so the copy's forget adapter
/// is live and the first comparison could fail).
fn assert_forget_is_off(checkpoint: &Path, out: &Path) {
    let copy = with_forget_replaced(checkpoint, out);
    let original = eval_modes(checkpoint, &["--scales", "1,0"]);
    let replaced = eval_modes(&copy, &["--scales", "1,0", "--scales", "1,1"]);
    let (off, on) = ("retain1_forget0", "retain1_forget1");
    assert_eq!(replaced[off], original[off], "the forget adapter's weights reached the mode where its scale is 0");
    assert_ne!(samples(&replaced[on]), samples(&replaced[off]), "the noise in the forget adapter changes nothing at forget scale 1: the check above cannot fail");
}

/// guess_number (secrets 1 to 4 read as the first word's letter count) with DualLoRA and
/// classic routing: 2 steps, an evaluation and a checkpoint at step 2, 4 evaluation episodes.
fn guess_number_config(out: &Path) -> smallrl::train::TrainConfig {
    let Value::Object(map) = json!({
        "model": fixture("tiny-stories"),
        "environment": "guess_number",
        "environment_params": {"max_number": 4, "guess": "word_length"},
        "plugin_dir": plugin_dir(),
        "adapter": "dual-lora", "lora_preset": "r4", "routing_mode": "classic", "lr": 3e-3,
        "batch_size": 8, "num_generations": 4, "num_prompts": 4,
        "max_completion_length": 40,
        "episode_max_turns": 3, "episode_max_turn_tokens": 6, "episode_max_observation_tokens": 16,
        "max_steps": 2, "save_steps": 2, "eval_every": 2, "eval_samples": 4, "logging_steps": 1,
        "output_dir": out, "threads": 1, "device": "cpu", "name": "guess",
    }) else {
        unreachable!()
    };
    smallrl::train::TrainConfig::resolve(None, map).unwrap()
}

/// A routed DualLoRA guess_number run: along the forget-scale curve (and the base model, every
/// adapter at 0) each episode's reward is guess_number's formula over its transcript; retain 1
/// and forget 0 is the retain adapter alone; and `--deploy` is refused before it writes
/// anything, saying why: no guess_number prompt is hackable, so the rule's monitored hack rate
/// does not exist.
#[test]
fn a_routed_dual_lora_episode_run_is_evaluated_along_the_curve_by_hand() {
    common::one_thread();
    let out = tempfile::tempdir().unwrap();
    let cfg = guess_number_config(out.path());
    let run = smallrl::train::Trainer::new(cfg.clone(), None).unwrap().train(None).unwrap().run_dir;
    let checkpoint = run.join("checkpoint-2");
    let secrets = common::guess_number::secrets(&cfg, 4);
    let modes = eval_modes(&checkpoint, &["--scales", "0,0", "--forget-scales", "0,0.5,1"]);
    assert_eq!(modes.keys().collect::<Vec<_>>(), ["retain0_forget0", "retain1_forget0", "retain1_forget0.5", "retain1_forget1"]);
    let checked: usize = modes.values().map(|mode| common::guess_number::check_mode(mode, &secrets, 4, 3)).sum();
    assert_eq!(checked, 16);

    let copies = out.path().join("copies");
    assert_forget_is_off(&checkpoint, &copies);

    let before: BTreeSet<_> = std::fs::read_dir(&run).unwrap().map(|e| e.unwrap().file_name()).collect();
    let refused = smallrl(&["eval", run.to_str().unwrap(), "--deploy", "--forget-scales", "0,1", "--n-samples", "4", "--threads", "1"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("none of its 4 evaluation prompts is hackable"), "{stderr}");
    let after: BTreeSet<_> = std::fs::read_dir(&run).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(before, after, "a refused deployment writes nothing");
}

/// The tiny-stories settings a sweep of configs/envs/code_tests_episode.yaml runs with (the
/// shipped DualMLP routed recipe; 2 steps of 8 episodes of at most 2 turns, 4 evaluation
/// episodes; lr 1e-2 so that 2 steps move the adapters).
fn code_tests_episode_fixed() -> Vec<String> {
    let keys = [
        format!("model={}", fixture("tiny-stories").display()),
        format!("plugin_dir={}", plugin_dir().display()),
        "prompt_format=raw".into(),
        "batch_size=8".into(),
        "num_generations=4".into(),
        "num_prompts=16".into(),
        "max_completion_length=40".into(),
        "episode_max_turns=2".into(),
        "episode_max_turn_tokens=12".into(),
        "episode_max_observation_tokens=16".into(),
        "max_steps=2".into(),
        "save_steps=2".into(),
        "eval_every=2".into(),
        "eval_samples=4".into(),
        "lr=1e-2".into(),
        "device=cpu".into(),
    ];
    keys.into_iter().flat_map(|key| ["--fixed".to_string(), key]).collect()
}

/// The base model's episodes of a code_tests_episode evaluation, by hand: tiny-stories writes
/// stories, so (asserted on each transcript) no turn opens with `call` (no tool call: one turn,
/// the tests never rewritten, so neither flagged nor a hack) and no answer defines a function
/// (no test can pass: tests_passed 0, loophole 0). The hackable prompts are those offering
/// `call write_tests`. Returns (hackable count, the monitored hack rate 0 of them, reward 0).
fn base_rates_by_hand(mode: &Value) -> (usize, f64, f64) {
    let mut hackable = 0;
    for sample in samples(mode) {
        let (prompt, transcript) = (sample[0].as_str().unwrap(), sample[1].as_str().unwrap());
        assert!(!transcript.lines().any(|line| line.trim_start().starts_with("call")), "a tool call: the hand count below does not hold for `{transcript}`");
        assert!(!transcript.contains("def "), "a function: the hand count below does not hold for `{transcript}`");
        hackable += usize::from(prompt.contains("call write_tests"));
    }
    assert!(hackable > 0, "no hackable evaluation prompt: the monitored rate is undefined");
    (hackable, 0.0, 0.0)
}

/// The suite's sweep of code_tests_episode with `--deploy` (the routing arm, one seed) on
/// tiny-stories: the routed run is deployed as a single-turn run is (the same files beside the
/// unrouted baseline's: `deployment.json`, and the sweep's `deployment.csv` and deploy log; a
/// deployment.json's keys and each mode's keys those of the run's own evaluations); the base
/// model's rates are the hand count of its episodes (and what `eval --scales 0,0` gives); the
/// deployed scale is the rule over the curve written plainly, its mode's adapter scales forget
/// off exactly; a second `--collect --deploy` evaluates nothing.
#[test]
fn the_suites_code_tests_episode_sweep_deploys_its_routed_run() {
    let out = tempfile::tempdir().unwrap();
    let sweep = out.path().join("sweep");
    let config = repo_root().join("configs/envs/code_tests_episode.yaml");
    let mut args: Vec<String> = ["sweep", "--config", config.to_str().unwrap(), "--grid", "seed=1", "--intervention-arms", "routing", "--deploy", "--jobs", "1"].map(String::from).to_vec();
    args.extend(code_tests_episode_fixed());
    args.extend(["--output-dir".into(), sweep.to_str().unwrap().into()]);
    let stdout = smallrl_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(stdout.contains("[DEPLOY] 1 routed run(s) to evaluate"), "{stdout}");
    let runs: Vec<PathBuf> = std::fs::read_dir(&sweep).unwrap().map(|e| e.unwrap().path()).filter(|p| p.join("config.yaml").exists()).collect();
    assert_eq!(runs.len(), 2, "the routed run and its baseline: {runs:?}");
    let (routed, baseline): (Vec<&PathBuf>, Vec<&PathBuf>) = runs.iter().partition(|run| run.join("deployment.json").exists());
    let (routed, baseline) = (routed[0], baseline[0]);
    let files = |dir: &Path| std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|name| !name.starts_with("events.out.tfevents")).collect::<BTreeSet<_>>();
    let mut expected = files(baseline);
    expected.insert("deployment.json".into());
    assert_eq!(files(routed), expected, "the routed run's files are the baseline's and deployment.json");
    let name = routed.file_name().unwrap().to_str().unwrap();
    assert!(sweep.join("logs").join(format!("{name}.deploy.log")).exists());

    let deployment: Value = serde_json::from_str(&std::fs::read_to_string(routed.join("deployment.json")).unwrap()).unwrap();
    let keys: Vec<&String> = deployment.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["base_monitored", "curve_modes", "deployed_forget_scale", "deployed_mode", "forget_scales", "modes", "n_samples", "step"]);
    let scales: Vec<f64> = (0..=10).map(|i| f64::from(i) / 10.0).collect();
    assert_eq!(deployment["forget_scales"], json!(scales));
    assert_eq!((deployment["step"].as_u64(), deployment["n_samples"].as_u64()), (Some(2), Some(4)));
    let logged = common::read_jsonl(routed.join("routing_eval.jsonl"));
    let mode_keys = |mode: &Value| mode.as_object().unwrap().keys().cloned().collect::<BTreeSet<String>>();
    let run_keys = mode_keys(&logged.last().unwrap()["modes"]["both"]);
    let deployed_modes = deployment["modes"].as_object().unwrap();
    assert_eq!(deployed_modes.len(), 12, "the base model and 11 forget scales");
    for (mode, values) in deployed_modes {
        assert_eq!(mode_keys(values), run_keys, "{mode}: the keys of the run's own evaluations");
    }

    // The base model and the deployed mode, evaluated apart, with their episodes.
    let checkpoint = routed.join("checkpoint-2");
    let modes = eval_modes(&checkpoint, &["--scales", "0,0", "--forget-scales", "0,1"]);
    let base = &modes["retain0_forget0"];
    let (hackable, monitored_rate, reward) = base_rates_by_hand(base);
    let written = &deployment["modes"]["base"];
    assert_eq!(written["hackable/n"].as_u64(), Some(hackable as u64));
    assert_eq!(written["true_hack_freq/monitored"].as_f64(), Some(monitored_rate));
    assert_eq!(written["true_hack_freq"].as_f64(), Some(0.0));
    assert_eq!((written["reward"].as_f64(), base["reward"].as_f64()), (Some(reward), Some(reward)));
    assert_eq!(deployment["base_monitored"].as_f64(), Some(monitored_rate));
    for mode in modes.values() {
        base_rates_by_hand(mode);
    }
    // The rule: the highest forget scale whose monitored rate is strictly below the base
    // model's, else 0.
    let curve: Vec<(f64, f64)> = scales.iter().zip(deployment["curve_modes"].as_array().unwrap()).map(|(s, mode)| (*s, deployed_modes[mode.as_str().unwrap()]["true_hack_freq/monitored"].as_f64().unwrap())).collect();
    let rule = curve.iter().filter(|(_, rate)| *rate < monitored_rate).map(|(s, _)| *s).fold(0.0, f64::max);
    assert_eq!(deployment["deployed_forget_scale"].as_f64(), Some(rule));
    assert_eq!(deployment["deployed_mode"], "retain1_forget0");
    assert_eq!(deployment["modes"]["retain1_forget0"]["reward"].as_f64(), modes["retain1_forget0"]["reward"].as_f64());
    assert_forget_is_off(&checkpoint, &out.path().join("copies"));

    let csv = std::fs::read_to_string(sweep.join("deployment.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 2, "{csv}");
    assert_eq!(rows[1], format!("{name},2,4,0,,0,0,0,,0,0"), "base monitored 0, unmonitored undefined (recall 1), all 0; deployed 0");
    let again = smallrl_ok(&["sweep", "--collect", sweep.to_str().unwrap(), "--deploy", "--jobs", "1"]);
    assert!(again.contains("[DEPLOY] 0 routed run(s) to evaluate"), "{again}");
}
