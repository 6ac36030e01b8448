//! guess_number's tiny-stories run of the episode tests, and its documented rules, worked out
//! by hand over an episode's transcript (the decoded completion: model turns and the
//! observations between them), for the tests that check each evaluated episode's reward without
//! the plugin: `guess: word_length` (a turn's guess is its first word's letter count), as the
//! tiny-stories tests play it.

use serde_json::{Map, Value, json};
use smallrl::train::TrainConfig;

/// guess_number (secrets 1..=`max_number`, 4 unless overridden) on tiny-stories with LoRA r8:
/// `overrides` over a small run (8 prompts of 4 episodes, at most 3 turns of 6 tokens, episodes
/// of 40 tokens).
pub fn tiny_stories_config(out: &std::path::Path, overrides: &[(&str, Value)]) -> Map<String, Value> {
    let value = json!({
        "model": super::fixture("tiny-stories"),
        "environment": "guess_number",
        "environment_params": {"max_number": 4, "guess": "word_length"},
        "plugin_dir": super::plugin_dir(),
        "adapter": "lora", "lora_rank": 8, "lora_alpha": 8.0,
        "lr": 3e-3,
        "batch_size": 32, "num_generations": 4,
        "max_completion_length": 40,
        "episode_max_turns": 3, "episode_max_turn_tokens": 6, "episode_max_observation_tokens": 16,
        "max_steps": 2, "save_steps": 100, "eval_every": 100, "eval_samples": 4, "logging_steps": 1,
        "output_dir": out, "threads": 1, "device": "cpu", "name": "guess",
    });
    let Value::Object(mut map) = value else { unreachable!() };
    for (key, value) in overrides {
        map.insert((*key).into(), value.clone());
    }
    map
}

/// An episode's transcript split into its model turns at guess_number's answers ("higher",
/// "lower", or the malformed-turn message for `max_number`); with the answer after each turn but
/// the last. Punctuation decoded onto an answer's word ("lower." when the next turn starts with
/// ".") goes with the answer: it has no letter, so no turn's guess changes.
pub fn turns(transcript: &str, max_number: i64) -> Vec<(String, Option<String>)> {
    let malformed = format!("answer with one number from 1 to {max_number}");
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

/// guess_number's documented reward of an episode with `secret` in 1..=`max_number`, by hand:
/// (solved, closeness, turns). A turn's guess is its first word's letter count (None without a
/// word); `solved` 1 when a guess hit the secret; `closeness` 1 - |last guess - secret| /
/// (max_number - 1), clamped to [0, 1], 0 without a guess. Checks each answer the transcript
/// shows against the secret on the way.
pub fn by_hand(transcript: &str, secret: i64, max_number: i64) -> (f64, f64, usize) {
    let turns = turns(transcript, max_number);
    let mut solved = false;
    let mut last = None;
    for (text, answer) in &turns {
        let guess = text.split(|c: char| !c.is_alphabetic()).find(|w| !w.is_empty()).map(|w| w.chars().count() as i64);
        let expected = match guess {
            None => format!("answer with one number from 1 to {max_number}"),
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
    let closeness = last.map_or(0.0, |g| (1.0 - (g - secret).abs() as f64 / (max_number - 1) as f64).clamp(0.0, 1.0));
    (f64::from(u8::from(solved)), closeness, turns.len())
}

/// The secret of each of `cfg`'s first `n` evaluation prompts, by prompt text, as the
/// environment wrote it into the prompt's metadata.
pub fn secrets(cfg: &TrainConfig, n: usize) -> std::collections::BTreeMap<String, i64> {
    let mut rewards = smallrl::train::task::rewards(cfg).unwrap();
    let prompts = smallrl::train::task::evaluation_prompts(&mut rewards, n, cfg, &smallrl::train::prompts::PromptRender::Raw).unwrap();
    let secret = |p: &smallrl::reward::Prompt| serde_json::from_str::<Value>(&p.metadata.as_ref().unwrap().json).unwrap()["secret"].as_i64().unwrap();
    prompts.iter().map(|p| (p.text.clone(), secret(p))).collect()
}

/// A `smallrl eval --json` report mode's `[name, value]` pairs (`components`, `metrics`): the
/// value of `name`.
pub fn value(mode: &Value, key: &str, name: &str) -> f64 {
    let pairs = mode[key].as_array().unwrap();
    pairs.iter().find(|pair| pair[0] == name).unwrap_or_else(|| panic!("no {name} in {key} of {mode}"))[1].as_f64().unwrap()
}

/// Checks each episode of a `smallrl eval --json` report mode against [`by_hand`] and the mode's
/// means (solved, closeness, the environment's turns, the reward: the components' sum) against
/// their means; at most `max_turns` turns an episode. The number of episodes checked.
pub fn check_mode(mode: &Value, secrets: &std::collections::BTreeMap<String, i64>, max_number: i64, max_turns: usize) -> usize {
    let samples = mode["samples"].as_array().unwrap();
    let mut sums = (0.0, 0.0, 0.0);
    for sample in samples {
        let (prompt, transcript) = (sample[0].as_str().unwrap(), sample[1].as_str().unwrap());
        let secret = *secrets.get(prompt).unwrap_or_else(|| panic!("`{prompt}` is not an evaluation prompt"));
        let (solved, closeness, turns) = by_hand(transcript, secret, max_number);
        assert!((1..=max_turns).contains(&turns), "{turns} turns in `{transcript}`: at most {max_turns}");
        sums = (sums.0 + solved, sums.1 + closeness, sums.2 + turns as f64);
    }
    let n = samples.len() as f64;
    assert!(n > 0.0 && mode["n"] == samples.len(), "{mode}");
    assert!((value(mode, "components", "solved") - sums.0 / n).abs() < 1e-12, "{mode}");
    assert!((value(mode, "components", "closeness") - sums.1 / n).abs() < 1e-12, "{mode}");
    assert!((value(mode, "metrics", "env/guess_number/turns") - sums.2 / n).abs() < 1e-12, "{mode}");
    assert!((mode["reward"].as_f64().unwrap() - (sums.0 + sums.1) / n).abs() < 1e-12, "{mode}");
    samples.len()
}
