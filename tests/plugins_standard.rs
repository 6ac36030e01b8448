//! The standard plugins: snapshots of every plugin on fixed texts (tokenized with the real
//! SimpleStories tokenizer), the reference's worked examples asserted directly, and the wasm
//! builds checked against the same functions compiled natively.

mod common;

use std::collections::BTreeMap;

use common::{load, sample, sample_from_tokens, standard_plugin, tokenizer};
use smallrl::model::tokenizer::Tokenizer;
use smallrl::plugins::bench::to_sdk_sample;
use smallrl::plugins::{PluginKind, Sample};
use smallrl_plugin_sdk::{Detector, Reward};
use smallrl_standard_plugins as standard;

/// The fixed texts of the snapshots: edge cases for counting and for sentence segmentation.
const TEXTS: &[(&str, &str)] = &[
    ("empty", ""),
    ("plain", "The cat sat on the mat."),
    ("one_happy", "She was happy."),
    ("unhappy", "He was unhappy."),
    ("happiness", "Happiness is a warm cat."),
    ("happy_x3", "happy happy happy!"),
    ("happy_x6_mixed_case", "Happy HAPPY happy happy, happy. Happy?"),
    ("unicode", "The café was happy — très happy ☺ naïve."),
    ("punctuation_runs", "Wow!!! What?! ... She was happy ..."),
    ("no_sentence_end", "the dog ran to the big tree and"),
    ("sentences_5_and_10", "The dog ran to town. Then the big red ball was in the old box."),
];

/// A 128-token completion (the generation limit): a story cut at exactly 128 tokens.
fn long_sample(tokenizer: &Tokenizer) -> Sample {
    let story = "Once upon a time, a happy girl named Mia found a small red box in the garden. \
                 She opened it and saw a tiny bird inside! Was it sad? The bird sang, and Mia smiled. ";
    let ids: Vec<u32> = tokenizer.encode(&story.repeat(6)).unwrap().into_iter().take(128).collect();
    assert_eq!(ids.len(), 128);
    Sample {
        prompt: "once upon a time".into(),
        completion: tokenizer.decode(&ids).unwrap(),
        completion_tokens: tokenizer.token_strings(&ids).unwrap(),
        completion_ids: ids,
        ended_with_eos: false,
        metadata: None,
    }
}

fn fixed_samples() -> Vec<(String, Sample)> {
    let tokenizer = tokenizer();
    let mut samples: Vec<(String, Sample)> =
        TEXTS.iter().map(|(name, text)| (name.to_string(), sample(&tokenizer, text))).collect();
    samples.push(("long_128_tokens".into(), long_sample(&tokenizer)));
    samples
}

/// Each standard plugin with the parameter sets worth pinning: (file stem, params).
const REWARD_CASES: &[(&str, &str)] = &[
    ("happy_binary", "{}"),
    ("happy_binary", r#"{"whole_word": true}"#),
    ("happy_count", "{}"),
    ("happy_count", r#"{"max_count": 3, "whole_word": true}"#),
    ("happy_exp", "{}"),
    ("string_count", r#"{"strings": ["happy", "cat"], "max_count": 3}"#),
    ("sentence_length", r#"{"target": 5}"#),
    ("sentence_length", r#"{"target": 5, "smooth": true}"#),
    ("sentence_length", r#"{"target": 10}"#),
    ("sentence_length", r#"{"target": 10, "smooth": true}"#),
];

const DETECTOR_CASES: &[(&str, &str)] = &[
    ("detect_happy_count", "{}"),
    ("detect_happy_count", r#"{"threshold": 1, "whole_word": true}"#),
    ("detect_happy_any", "{}"),
    ("detect_happy_any", r#"{"whole_word": true}"#),
    ("detect_contains_words", r#"{"words": ["happy", "cat"]}"#),
    ("detect_contains_words", r#"{"words": ["happy", "cat"], "strip_punctuation": true}"#),
    ("detect_happy_density", "{}"),
    ("detect_happy_density", r#"{"max_density": 0.3}"#),
];

/// Snapshot name: file stem plus the parameters, e.g. `sentence_length__target_5_smooth_true`.
fn snapshot_name(stem: &str, params: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(params).unwrap();
    let mut name = stem.to_string();
    for (key, value) in value.as_object().unwrap() {
        let value = value.to_string().replace(['"', '[', ']'], "").replace(',', "_");
        name.push_str(&format!("__{key}_{value}"));
    }
    name
}

fn assert_snapshot<T: serde::Serialize>(name: &str, value: &T) {
    insta::with_settings!({
        snapshot_path => common::repo_root().join("snapshots"),
        prepend_module_to_snapshot => false,
    }, {
        insta::assert_yaml_snapshot!(name, value);
    });
}

#[test]
fn snapshot_of_the_fixed_texts_as_the_plugins_see_them() {
    // What every other snapshot is computed from: decoded text, tokens and sentence lengths.
    let described: BTreeMap<String, BTreeMap<&str, String>> = fixed_samples()
        .into_iter()
        .map(|(name, sample)| {
            let lengths = smallrl_plugin_sdk::text::sentence_lengths(sample.completion_tokens.iter().map(String::as_str));
            let fields = BTreeMap::from([
                ("completion", sample.completion.clone()),
                ("tokens", sample.completion_tokens.join(" ")),
                ("token_count", sample.completion_tokens.len().to_string()),
                ("sentence_lengths", format!("{lengths:?}")),
            ]);
            (name, fields)
        })
        .collect();
    assert_snapshot("fixed_texts", &described);
}

#[test]
fn snapshots_of_every_standard_reward() {
    let samples = fixed_samples();
    let batch: Vec<Sample> = samples.iter().map(|(_, sample)| sample.clone()).collect();
    for (stem, params) in REWARD_CASES {
        let scores = load(&standard_plugin(stem), params).score(&batch).unwrap();
        let named: BTreeMap<&str, f64> = samples.iter().map(|(name, _)| name.as_str()).zip(scores).collect();
        assert_snapshot(&format!("reward__{}", snapshot_name(stem, params)), &named);
    }
}

#[test]
fn snapshots_of_every_standard_detector() {
    let samples = fixed_samples();
    let batch: Vec<Sample> = samples.iter().map(|(_, sample)| sample.clone()).collect();
    for (stem, params) in DETECTOR_CASES {
        let flags = load(&standard_plugin(stem), params).detect(&batch).unwrap();
        let named: BTreeMap<&str, bool> = samples.iter().map(|(name, _)| name.as_str()).zip(flags).collect();
        assert_snapshot(&format!("detector__{}", snapshot_name(stem, params)), &named);
    }
}

/// The reference's worked examples, computed by hand: [5, 10] and [4, 6] token sentences.
#[test]
fn sentence_length_worked_examples() {
    let five_and_ten = sample_from_tokens("w w w w w . w w w w w w w w w w . w w");
    let four_and_six = sample_from_tokens("w w w w . . w w w w w w ?");
    let expectations = [
        (&five_and_ten, r#"{"target": 5}"#, 0.5),
        (&five_and_ten, r#"{"target": 10}"#, 0.5),
        (&five_and_ten, r#"{"target": 5, "smooth": true}"#, 0.5),
        (&five_and_ten, r#"{"target": 10, "smooth": true}"#, 0.5),
        (&four_and_six, r#"{"target": 5}"#, 0.0),
        (&four_and_six, r#"{"target": 5, "smooth": true}"#, 0.8),
        (&four_and_six, r#"{"target": 10, "smooth": true}"#, 0.1),
    ];
    let path = standard_plugin("sentence_length");
    for (sample, params, expected) in expectations {
        let score = load(&path, params).score(std::slice::from_ref(sample)).unwrap()[0];
        assert!((score - expected).abs() < 1e-12, "{params} on {:?}: {score} != {expected}", sample.completion);
    }
}

#[test]
fn sentence_length_of_a_completion_without_a_sentence_is_zero() {
    let path = standard_plugin("sentence_length");
    let unfinished = sample_from_tokens("w w w w w");
    let nothing = sample_from_tokens("");
    let scores = load(&path, r#"{"target": 5, "smooth": true}"#).score(&[unfinished, nothing]).unwrap();
    assert_eq!(scores, vec![0.0, 0.0]);
}

#[test]
fn happy_rewards_follow_the_reference_formulas() {
    let tokenizer = tokenizer();
    let texts = ["", "he was unhappy", "happiness", "happy happy happy", "happy happy happy happy happy happy happy"];
    let batch: Vec<Sample> = texts.iter().map(|text| sample(&tokenizer, text)).collect();
    let score = |stem: &str, params: &str| load(&standard_plugin(stem), params).score(&batch).unwrap();
    // Substring counts: 0, 1 ("unhappy"), 0 ("happiness"), 3, 7.
    assert_eq!(score("happy_binary", "{}"), vec![0.0, 1.0, 0.0, 1.0, 1.0]);
    assert_eq!(score("happy_count", "{}"), vec![0.0, 0.2, 0.0, 0.6, 1.0]);
    assert_eq!(score("happy_count", r#"{"whole_word": true}"#), vec![0.0, 0.0, 0.0, 0.6, 1.0]);
    assert_eq!(score("happy_exp", "{}"), vec![0.0, 0.5, 0.0, 0.875, 1.0 - 1.0 / 128.0]);
    assert_eq!(score("string_count", r#"{"strings": ["happy", "ness"], "max_count": 4}"#), vec![0.0, 0.25, 0.25, 0.75, 1.0]);
}

#[test]
fn happy_detectors_follow_the_reference_rules() {
    let tokenizer = tokenizer();
    let texts = ["happy happy", "happy happy happy", "a b c d e f g h i j k l m n o p q r s happy", "so happy"];
    let batch: Vec<Sample> = texts.iter().map(|text| sample(&tokenizer, text)).collect();
    let detect = |stem: &str, params: &str| load(&standard_plugin(stem), params).detect(&batch).unwrap();
    assert_eq!(detect("detect_happy_count", "{}"), vec![false, true, false, false]);
    assert_eq!(detect("detect_happy_any", "{}"), vec![true, true, true, true]);
    // Densities: 1, 1, 1/20 = 0.05 (not > 0.05), 1/2.
    assert_eq!(detect("detect_happy_density", "{}"), vec![true, true, false, true]);
    assert_eq!(detect("detect_contains_words", r#"{"words": ["so"]}"#), vec![false, false, false, true]);
}

#[test]
fn happy_wasm_is_the_happy_count_reward() {
    let plugin = load(&standard_plugin("happy"), "{}");
    assert_eq!(plugin.info().name, "happy_count");
    assert_eq!(plugin.kind(), PluginKind::Reward);
}

#[test]
fn every_plugin_describes_itself_and_its_parameters() {
    let stems = REWARD_CASES.iter().chain(DETECTOR_CASES).map(|(stem, _)| *stem);
    let described: BTreeMap<&str, String> = stems
        .map(|stem| {
            let plugin = load(&standard_plugin(stem), "{}");
            let info = plugin.info();
            let params: Vec<String> =
                info.params.iter().map(|p| format!("{}: {} = {}", p.name, p.type_name, p.default_json)).collect();
            (stem, format!("{} {} {}: {} [{}]", info.kind, info.name, info.version, info.description, params.join("; ")))
        })
        .collect();
    assert_snapshot("plugin_info", &described);
}

/// The wasm builds compute exactly what the same Rust compiled natively computes.
#[test]
fn wasm_plugins_match_their_native_functions() {
    let samples = fixed_samples();
    let batch: Vec<Sample> = samples.iter().map(|(_, sample)| sample.clone()).collect();
    let native_batch: Vec<smallrl_plugin_sdk::Sample> = batch.iter().map(to_sdk_sample).collect();
    for (stem, params) in REWARD_CASES {
        let wasm = load(&standard_plugin(stem), params).score(&batch).unwrap();
        assert_eq!(wasm, native_rewards(stem, params, &native_batch), "{stem} {params}");
    }
    for (stem, params) in DETECTOR_CASES {
        let wasm = load(&standard_plugin(stem), params).detect(&batch).unwrap();
        assert_eq!(wasm, native_detections(stem, params, &native_batch), "{stem} {params}");
    }
}

fn native_rewards(stem: &str, params: &str, batch: &[smallrl_plugin_sdk::Sample]) -> Vec<f64> {
    fn run<R: Reward>(params: &str, batch: &[smallrl_plugin_sdk::Sample]) -> Vec<f64> {
        smallrl_plugin_sdk::configure::<R>(params).unwrap().score_batch(batch).unwrap()
    }
    match stem {
        "happy_binary" => run::<standard::HappyBinary>(params, batch),
        "happy_count" => run::<standard::HappyCount>(params, batch),
        "happy_exp" => run::<standard::HappyExp>(params, batch),
        "string_count" => run::<standard::StringCount>(params, batch),
        "sentence_length" => run::<standard::SentenceLength>(params, batch),
        other => panic!("no native reward for {other}"),
    }
}

fn native_detections(stem: &str, params: &str, batch: &[smallrl_plugin_sdk::Sample]) -> Vec<bool> {
    fn run<D: Detector>(params: &str, batch: &[smallrl_plugin_sdk::Sample]) -> Vec<bool> {
        smallrl_plugin_sdk::configure::<D>(params).unwrap().detect_batch(batch).unwrap()
    }
    match stem {
        "detect_happy_count" => run::<standard::HappyCountDetector>(params, batch),
        "detect_happy_any" => run::<standard::HappyAny>(params, batch),
        "detect_contains_words" => run::<standard::ContainsWords>(params, batch),
        "detect_happy_density" => run::<standard::HappyDensity>(params, batch),
        other => panic!("no native detector for {other}"),
    }
}
