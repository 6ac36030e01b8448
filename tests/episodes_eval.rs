//! `smallrl eval` of a multi-turn episode run (issue 48): a checkpoint of a guess_number run on
//! the tiny-stories fixture is evaluated by playing one episode per evaluation prompt at each
//! adapter scale, and gives what the run's own evaluation of that checkpoint logged; each
//! episode's reward is guess_number's documented formula over its transcript, worked out here
//! by hand. Needs `make plugins` (plugins/guess_number.wasm).

mod common;

use std::path::Path;

use common::{fixture, one_thread, plugin_dir};
use serde_json::{Value, json};
use smallrl::train::{TrainConfig, Trainer};

/// guess_number with secrets 1..=4 read as the first word's letter count (tiny-stories writes no
/// digit); one step, then an evaluation and a checkpoint; 2 evaluation episodes.
const MAX_NUMBER: i64 = 4;
const EVAL_SAMPLES: usize = 2;

fn config(out: &Path) -> TrainConfig {
    let Value::Object(map) = json!({
        "model": fixture("tiny-stories"),
        "environment": "guess_number",
        "environment_params": {"max_number": MAX_NUMBER, "guess": "word_length"},
        "plugin_dir": plugin_dir(),
        "adapter": "lora", "lora_rank": 8, "lora_alpha": 8.0, "lr": 3e-3,
        "batch_size": 8, "num_generations": 4, "num_prompts": 4,
        "max_completion_length": 40,
        "episode_max_turns": 3, "episode_max_turn_tokens": 6, "episode_max_observation_tokens": 16,
        "max_steps": 1, "save_steps": 1, "eval_every": 1, "eval_samples": EVAL_SAMPLES, "logging_steps": 1,
        "output_dir": out, "threads": 1, "device": "cpu", "name": "guess",
    }) else {
        unreachable!()
    };
    TrainConfig::resolve(None, map).unwrap()
}

/// `smallrl eval CHECKPOINT --json ARGS`: the report.
fn smallrl_eval(checkpoint: &Path, args: &[&str]) -> Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"))
        .arg("eval")
        .arg(checkpoint)
        .args(["--json", "--threads", "1", "--n-samples", &EVAL_SAMPLES.to_string()])
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "smallrl eval failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice::<Value>(&output.stdout).unwrap()["report"].clone()
}

/// One step of a guess_number run with an evaluation after it; `smallrl eval` of its checkpoint:
/// (1) at the standard modes it gives what the run's evaluation logged for that step (every
/// value of the mode: components, reward, the environment's and the host's episode metrics);
/// (2) at adapter scales 1, 0 and 0.5 (one episode per evaluation prompt each; scale 1 is the
/// standard mode again) each episode's reward is guess_number's formula over its transcript,
/// with the secret the environment wrote into the prompt's metadata.
#[test]
fn eval_of_an_episode_run_plays_and_scores_episodes_as_the_run_did() {
    one_thread();
    let out = tempfile::tempdir().unwrap();
    let cfg = config(out.path());
    let run_dir = Trainer::new(cfg.clone(), None).unwrap().train(None).unwrap().run_dir;
    let checkpoint = run_dir.join("checkpoint-1");
    let logged: Value = serde_json::from_str(std::fs::read_to_string(run_dir.join("routing_eval.jsonl")).unwrap().lines().last().unwrap()).unwrap();
    assert_eq!(logged["step"], 1);

    let report = smallrl_eval(&checkpoint, &[]);
    assert_eq!(report["step"], 1);
    let both = &report["modes"][0];
    let logged_both = &logged["modes"][both["mode"].as_str().unwrap()];
    assert_eq!(both["n"], EVAL_SAMPLES);
    assert_eq!(both["reward"].as_f64(), logged_both["reward"].as_f64(), "eval's reward vs the run's: {both} vs {logged_both}");
    let pairs = |key: &str| both[key].as_array().unwrap().iter().map(|pair| (pair[0].as_str().unwrap().to_string(), pair[1].as_f64().unwrap())).collect::<Vec<_>>();
    let values = pairs("components").into_iter().chain(pairs("metrics"));
    let names: Vec<String> = values.clone().map(|(name, _)| name).collect();
    for name in ["solved", "closeness", "env/guess_number/turns", smallrl::train::episodes::TURNS] {
        assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
    }
    for (name, value) in values {
        assert_eq!(Some(value), logged_both[&name].as_f64(), "{name}: eval's vs the run's logged evaluation");
    }

    // Each episode alone (one per prompt; the secrets as the environment wrote them into the
    // evaluation prompts' metadata): the mode's means are over these.
    let secrets = common::guess_number::secrets(&cfg, EVAL_SAMPLES);
    let scaled = smallrl_eval(&checkpoint, &["--scales", "1", "--scales", "0", "--scales", "0.5"]);
    let modes = scaled["modes"].as_array().unwrap();
    assert_eq!(modes.iter().map(|m| m["mode"].as_str().unwrap()).collect::<Vec<_>>(), ["lora1", "lora0", "lora0.5"]);
    assert_eq!(modes[0]["reward"], both["reward"], "scale 1 is the standard mode");
    let checked: usize = modes.iter().map(|mode| common::guess_number::check_mode(mode, &secrets, MAX_NUMBER, 3)).sum();
    assert_eq!(checked, 3 * EVAL_SAMPLES);
}
