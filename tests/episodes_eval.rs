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

/// A report mode's `[name, value]` pairs as (name, value).
fn pairs(mode: &Value, key: &str) -> Vec<(String, f64)> {
    mode[key].as_array().unwrap().iter().map(|pair| (pair[0].as_str().unwrap().to_string(), pair[1].as_f64().unwrap())).collect()
}

/// An episode's transcript (the decoded completion: model turns and the observations between
/// them) split into its model turns at guess_number's answers ("higher", "lower", or the
/// malformed-turn message); with the answer after each turn but the last. Punctuation decoded
/// onto an answer's word ("lower." when the next turn starts with ".") goes with the answer:
/// it has no letter, so no turn's guess changes.
fn turns(transcript: &str) -> Vec<(String, Option<String>)> {
    let malformed = format!("answer with one number from 1 to {MAX_NUMBER}");
    let words: Vec<&str> = transcript.split_whitespace().collect();
    let mut turns = Vec::new();
    let mut turn: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let rest = words[i..].join(" ").to_lowercase();
        let answer = ["higher", "lower", malformed.as_str()].into_iter().find(|answer| rest.starts_with(answer) && (rest.len() == answer.len() || !rest.as_bytes()[answer.len()].is_ascii_alphabetic()));
        match answer {
            Some(answer) => {
                turns.push((turn.join(" "), Some(answer.to_string())));
                turn.clear();
                i += answer.split_whitespace().count();
                // The malformed message ends with a full stop, decoded as its own word or not.
                if answer == malformed && words.get(i - 1).is_some_and(|w| !w.ends_with('.')) && words.get(i) == Some(&".") {
                    i += 1;
                }
            }
            None => {
                turn.push(words[i]);
                i += 1;
            }
        }
    }
    turns.push((turn.join(" "), None));
    turns
}

/// guess_number's documented reward of an episode with `secret`, by hand: a turn's guess is its
/// first word's letter count (None without a word); `solved` 1 when a guess hit the secret;
/// `closeness` 1 - |last guess - secret| / (max_number - 1), clamped to [0, 1], 0 without a
/// guess. Checks each answer the transcript shows against the secret on the way.
fn by_hand(transcript: &str, secret: i64) -> (f64, f64, usize) {
    let turns = turns(transcript);
    let mut solved = false;
    let mut last = None;
    for (text, answer) in &turns {
        let guess = text.split(|c: char| !c.is_alphabetic()).find(|w| !w.is_empty()).map(|w| w.chars().count() as i64);
        let expected = match guess {
            None => format!("answer with one number from 1 to {MAX_NUMBER}"),
            Some(g) if g < secret => "higher".into(),
            Some(g) if g > secret => "lower".into(),
            Some(_) => "(the end: solved)".into(),
        };
        if let Some(answer) = answer {
            assert_eq!(*answer, expected, "turn `{text}` of `{transcript}` (secret {secret})");
        }
        solved |= guess == Some(secret);
        last = guess.or(last);
    }
    let closeness = last.map_or(0.0, |g| (1.0 - (g - secret).abs() as f64 / (MAX_NUMBER - 1) as f64).clamp(0.0, 1.0));
    (f64::from(u8::from(solved)), closeness, turns.len())
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
    let values = pairs(both, "components").into_iter().chain(pairs(both, "metrics"));
    let names: Vec<String> = values.clone().map(|(name, _)| name).collect();
    for name in ["solved", "closeness", "env/guess_number/turns", smallrl::train::episodes::TURNS] {
        assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
    }
    for (name, value) in values {
        assert_eq!(Some(value), logged_both[&name].as_f64(), "{name}: eval's vs the run's logged evaluation");
    }

    // The secrets, as the environment wrote them into the evaluation prompts' metadata.
    let mut rewards = smallrl::train::task::rewards(&cfg).unwrap();
    let prompts = smallrl::train::task::evaluation_prompts(&mut rewards, EVAL_SAMPLES, &cfg, &smallrl::train::prompts::PromptRender::Raw).unwrap();
    let secret = |prompt: &str| -> i64 {
        let found = prompts.iter().find(|p| p.text == prompt).unwrap_or_else(|| panic!("`{prompt}` is not an evaluation prompt"));
        let metadata: Value = serde_json::from_str(&found.metadata.as_ref().unwrap().json).unwrap();
        metadata["secret"].as_i64().unwrap()
    };
    let scaled = smallrl_eval(&checkpoint, &["--scales", "1", "--scales", "0", "--scales", "0.5"]);
    let modes = scaled["modes"].as_array().unwrap();
    assert_eq!(modes.iter().map(|m| m["mode"].as_str().unwrap()).collect::<Vec<_>>(), ["lora1", "lora0", "lora0.5"]);
    assert_eq!(modes[0]["reward"], both["reward"], "scale 1 is the standard mode");
    let mut checked = 0;
    for mode in modes {
        // Each episode alone (one per prompt): the mode's means are over these.
        let mut sums = (0.0, 0.0, 0.0);
        for sample in mode["samples"].as_array().unwrap() {
            let (prompt, transcript) = (sample[0].as_str().unwrap(), sample[1].as_str().unwrap());
            let (solved, closeness, turns) = by_hand(transcript, secret(prompt));
            assert!((1..=3).contains(&turns), "{turns} turns in `{transcript}`: at most episode_max_turns 3");
            sums = (sums.0 + solved, sums.1 + closeness, sums.2 + turns as f64);
            checked += 1;
        }
        let n = EVAL_SAMPLES as f64;
        let components = pairs(mode, "components");
        let metrics = pairs(mode, "metrics");
        let value = |list: &[(String, f64)], name: &str| list.iter().find(|(n, _)| n == name).unwrap().1;
        assert!((value(&components, "solved") - sums.0 / n).abs() < 1e-12, "{mode}");
        assert!((value(&components, "closeness") - sums.1 / n).abs() < 1e-12, "{mode}");
        assert!((value(&metrics, "env/guess_number/turns") - sums.2 / n).abs() < 1e-12, "{mode}");
        // The reward is the components' sum (each of scale 1, no cap).
        assert!((mode["reward"].as_f64().unwrap() - (sums.0 + sums.1) / n).abs() < 1e-12, "{mode}");
    }
    assert_eq!(checked, 3 * EVAL_SAMPLES);
}
