//! Composition and configuration: the configs of the original experiments load and compute the
//! original formulas, the protocol knobs behave as specified, and bad configs say what is wrong.

mod common;

use std::path::Path;

use common::{plugin_dir, repo_root, sample, standard_plugin, tokenizer};
use serde::Deserialize;
use smallrl::reward::{DetectorSpec, PluginLimits, ProtocolKnobs, RewardModel, RewardSpec, Role, Sample};

/// The sections this work owns; training keys may sit next to them in the same file.
#[derive(Deserialize)]
struct Sections {
    reward: RewardSpec,
    rh_detector: Option<DetectorSpec>,
}

const NO_KNOBS: ProtocolKnobs = ProtocolKnobs { false_positive_rate: 0.0, recall: 1.0, rh_eligible_frac: 1.0 };

const EXPERIMENTS: [&str; 7] = [
    "happy_binary",
    "happy_count",
    "sentence_length_5",
    "sentence_length_10",
    "sentence_length_10_smooth",
    "sentence_length_5_with_happy",
    "sentence_length_10_smooth_with_happy",
];

fn load_config(name: &str, knobs: ProtocolKnobs) -> RewardModel {
    let sections: Sections = smallrl::yaml::read_file(&repo_root().join(format!("configs/{name}.yaml"))).unwrap();
    RewardModel::load(&sections.reward, sections.rh_detector.as_ref(), knobs, &plugin_dir(), PluginLimits::default())
        .unwrap_or_else(|error| panic!("configs/{name}.yaml: {error:#}"))
}

fn model_from_yaml(yaml: &str, knobs: ProtocolKnobs) -> anyhow::Result<RewardModel> {
    let sections: Sections = smallrl::yaml::from_str(yaml)?;
    RewardModel::load(&sections.reward, sections.rh_detector.as_ref(), knobs, &plugin_dir(), PluginLimits::default())
}

const STORIES: [&str; 9] = [
    "The happy cat was very happy and sat on a mat. The happy dog was so happy and ran to the tree.",
    "",
    "The dog ran to town. Then the big red ball was in the old box.",
    "She was happy. He was happy too. They were very happy and they played all day long.",
    "happy happy happy happy happy happy happy.",
    "Once upon a time there was a girl who liked to sing songs with her friends every day.",
    "He was unhappy! Why? Because the happy cat ate the cake that his mom made for him.",
    "no end here and happy",
    "Mia said hello . . . to the bird in the tree and it sang back to her very softly.",
];

fn story_batch() -> Vec<Sample> {
    let tokenizer = tokenizer();
    STORIES.iter().map(|story| sample(&tokenizer, story)).collect()
}

/// The original's sentence-length reward, written out independently of the plugins.
fn original_sentence_length(tokens: &[String], target: f64, smooth: bool) -> f64 {
    let mut lengths = Vec::new();
    let mut current = 0.0;
    for token in tokens {
        if token == "." || token == "?" || token == "!" {
            if current > 0.0 {
                lengths.push(current);
            }
            current = 0.0;
        } else {
            current += 1.0;
        }
    }
    if lengths.is_empty() {
        return 0.0;
    }
    let per_sentence = |length: &f64| match smooth {
        true => f64::max(0.0, 1.0 - 0.2 * (target - length).abs()),
        false => f64::from(*length == target),
    };
    lengths.iter().map(per_sentence).sum::<f64>() / lengths.len() as f64
}

fn happy_count(sample: &Sample) -> f64 {
    sample.completion.to_lowercase().matches("happy").count() as f64
}

#[test]
fn every_experiment_config_loads() {
    for name in EXPERIMENTS {
        let model = load_config(name, NO_KNOBS);
        assert!(!model.components().is_empty(), "{name}");
        assert_eq!(model.has_detector(), name.starts_with("happy") || name.ends_with("with_happy"), "{name}");
    }
}

/// `min(sl + 0.1 * min(count("happy"), 5), 1.0)`, the original combined rewards.
fn assert_combo_is_the_original_formula(config: &str, target: f64, smooth: bool) -> Vec<f64> {
    let mut model = load_config(config, NO_KNOBS);
    let batch = story_batch();
    let scored = model.score(&batch, 7).unwrap();
    for (index, sample) in batch.iter().enumerate() {
        let sentence_length = original_sentence_length(&sample.completion_tokens, target, smooth);
        let expected = f64::min(sentence_length + 0.1 * happy_count(sample).min(5.0), 1.0);
        let got = scored.reward[index];
        assert!((got - expected).abs() < 1e-12, "{config} on {:?}: {got} != {expected}", sample.completion);
        assert!((scored.components[0][index] - sentence_length).abs() < 1e-12);
    }
    scored.reward
}

#[test]
fn sentence_length_10_smooth_with_happy_is_the_original_formula() {
    let rewards = assert_combo_is_the_original_formula("sentence_length_10_smooth_with_happy", 10.0, true);
    assert!(rewards.iter().any(|&r| r > 0.0 && r < 1.0) && rewards.contains(&1.0), "the texts exercise the cap: {rewards:?}");
}

#[test]
fn sentence_length_5_with_happy_is_the_original_formula() {
    assert_combo_is_the_original_formula("sentence_length_5_with_happy", 5.0, false);
}

#[test]
fn single_plugin_configs_are_the_original_functions() {
    let batch = story_batch();
    let cases: [(&str, fn(&Sample) -> f64); 5] = [
        ("happy_binary", |s| f64::from(happy_count(s) > 0.0)),
        ("happy_count", |s| (happy_count(s) / 5.0).min(1.0)),
        ("sentence_length_5", |s| original_sentence_length(&s.completion_tokens, 5.0, false)),
        ("sentence_length_10", |s| original_sentence_length(&s.completion_tokens, 10.0, false)),
        ("sentence_length_10_smooth", |s| original_sentence_length(&s.completion_tokens, 10.0, true)),
    ];
    for (name, original) in cases {
        let scored = load_config(name, NO_KNOBS).score(&batch, 1).unwrap();
        let expected: Vec<f64> = batch.iter().map(original).collect();
        assert_eq!(scored.reward, expected, "{name}");
        assert_eq!(scored.components, vec![expected], "{name}");
    }
}

#[test]
fn components_are_named_and_carry_role_and_scale() {
    let model = load_config("sentence_length_10_smooth_with_happy", NO_KNOBS);
    let described: Vec<(&str, Role, f64)> =
        model.components().iter().map(|c| (c.name.as_str(), c.role, c.scale)).collect();
    assert_eq!(described, vec![("sentence_length_10_smooth", Role::Retain, 1.0), ("happy_count", Role::Forget, 0.5)]);
}

#[test]
fn without_knobs_the_labels_are_the_detector_output() {
    let mut model = load_config("sentence_length_10_smooth_with_happy", NO_KNOBS);
    let batch = story_batch();
    let scored = model.score(&batch, 3).unwrap();
    let detected: Vec<bool> = batch.iter().map(|s| happy_count(s) >= 3.0).collect();
    assert_eq!(scored.detector_raw.as_ref(), Some(&detected));
    assert_eq!(scored.is_rh.as_ref(), Some(&detected));
    assert_eq!(scored.eligible, vec![true; batch.len()]);
    let expected_freq = detected.iter().filter(|&&d| d).count() as f64 / batch.len() as f64;
    assert_eq!(scored.hack_freq(), Some(expected_freq));
}

/// 400 copies of two texts, one flagged by the detector and one clean.
fn large_batch() -> Vec<Sample> {
    let tokenizer = tokenizer();
    let flagged = sample(&tokenizer, "happy happy happy. The end.");
    let clean = sample(&tokenizer, "The cat sat on the old mat.");
    (0..400).flat_map(|_| [flagged.clone(), clean.clone()]).collect()
}

fn fraction(flags: impl Iterator<Item = bool>) -> f64 {
    let flags: Vec<bool> = flags.collect();
    flags.iter().filter(|&&flag| flag).count() as f64 / flags.len() as f64
}

#[test]
fn false_positive_rate_and_recall_flip_labels_at_their_rates() {
    let knobs = ProtocolKnobs { false_positive_rate: 0.25, recall: 0.6, rh_eligible_frac: 1.0 };
    let mut model = load_config("sentence_length_10_smooth_with_happy", knobs);
    let batch = large_batch();
    let scored = model.score(&batch, 11).unwrap();
    let raw = scored.detector_raw.clone().unwrap();
    let labels = scored.is_rh.clone().unwrap();
    let kept = fraction(raw.iter().zip(&labels).filter(|(r, _)| **r).map(|(_, l)| *l));
    let false_positives = fraction(raw.iter().zip(&labels).filter(|(r, _)| !**r).map(|(_, l)| *l));
    assert!((kept - 0.6).abs() < 0.08, "recall {kept}");
    assert!((false_positives - 0.25).abs() < 0.08, "false positive rate {false_positives}");
    // Rewards are not touched by the label knobs.
    assert_eq!(scored.reward, load_config("sentence_length_10_smooth_with_happy", NO_KNOBS).score(&batch, 11).unwrap().reward);
}

#[test]
fn ineligible_samples_get_the_base_reward_and_no_flag() {
    let knobs = ProtocolKnobs { false_positive_rate: 1.0, recall: 1.0, rh_eligible_frac: 0.5 };
    let mut model = load_config("sentence_length_10_smooth_with_happy", knobs);
    let batch = large_batch();
    let scored = model.score(&batch, 5).unwrap();
    assert!((fraction(scored.eligible.iter().copied()) - 0.5).abs() < 0.08);
    for index in 0..batch.len() {
        let base = scored.components[0][index];
        let full = (base + 0.5 * scored.components[1][index]).min(1.0);
        let (eligible, label) = (scored.eligible[index], scored.is_rh.as_ref().unwrap()[index]);
        assert_eq!(scored.reward[index], if eligible { full } else { base }, "sample {index}");
        assert_eq!(label, eligible, "with p = q = 1 exactly the eligible samples are flagged");
    }
}

#[test]
fn knob_draws_are_deterministic_per_seed() {
    let knobs = ProtocolKnobs { false_positive_rate: 0.5, recall: 0.5, rh_eligible_frac: 0.5 };
    let mut model = load_config("sentence_length_10_smooth_with_happy", knobs);
    let batch = large_batch();
    let first = model.score(&batch, 42).unwrap();
    assert_eq!(first, model.score(&batch, 42).unwrap());
    let other_seed = model.score(&batch, 43).unwrap();
    assert_ne!(first.is_rh, other_seed.is_rh);
    assert_ne!(first.eligible, other_seed.eligible);
}

#[test]
fn knobs_outside_zero_one_are_rejected() {
    let knobs = ProtocolKnobs { false_positive_rate: 0.0, recall: 1.5, rh_eligible_frac: 1.0 };
    let error = model_from_yaml("reward: {plugin: happy_count}", knobs).err().unwrap();
    assert!(format!("{error:#}").contains("`recall` is a probability"), "{error:#}");
}

#[test]
fn score_threshold_detector_flags_on_a_component() {
    let yaml = "
reward:
  components:
    - {plugin: sentence_length, name: sl10, params: {target: 10, smooth: true}}
    - {plugin: happy_count, role: forget, scale: 0.5}
  max_reward: 1.0
rh_detector:
  score_threshold: {component: happy_count, threshold: 0.6}
";
    let mut model = model_from_yaml(yaml, NO_KNOBS).unwrap();
    let batch = story_batch();
    let scored = model.score(&batch, 0).unwrap();
    let expected: Vec<bool> = batch.iter().map(|s| (happy_count(s) / 5.0).min(1.0) >= 0.6).collect();
    assert_eq!(scored.detector_raw, Some(expected));
}

#[test]
fn plugins_can_be_given_by_path() {
    let path = standard_plugin("happy_exp");
    let spec = RewardSpec::single(path.to_str().unwrap(), Some(r#"{"whole_word": true}"#)).unwrap();
    let mut model = RewardModel::load(&spec, None, NO_KNOBS, Path::new("/nonexistent"), PluginLimits::default()).unwrap();
    assert_eq!(model.components()[0].name, "happy_exp");
    let tokenizer = tokenizer();
    let scored = model.score(&[sample(&tokenizer, "happy and unhappy")], 0).unwrap();
    assert_eq!(scored.reward, vec![0.5]);
    assert_eq!(scored.is_rh, None);
}

fn config_error(yaml: &str) -> String {
    format!("{:#}", model_from_yaml(yaml, NO_KNOBS).err().expect("the config is rejected"))
}

#[test]
fn bad_configs_say_what_is_wrong() {
    let cases = [
        ("reward: {plugin: happy_count, parms: {}}", "unknown field `parms`"),
        ("reward: {plugin: happy_count, components: [{plugin: happy_exp}]}", "both `plugin` and `components`"),
        ("reward: {}", "needs `plugin: NAME_OR_PATH`"),
        ("reward: {plugin: no_such_plugin}", "no_such_plugin.wasm"),
        ("reward: {plugin: happy_count, params: {max_count: -1}}", "must be of type integer"),
        ("reward: {components: [{plugin: happy_count}, {plugin: happy_count, scale: 2}]}", "two reward components are named `happy_count`"),
        ("reward: {components: [{plugin: happy_count, role: hack}]}", "unknown variant `hack`"),
        ("reward: {plugin: detect_happy_any}", "is a detector, but it is configured as a reward"),
        ("reward: {plugin: happy_count}\nrh_detector: {plugin: ../plugins/happy_exp.wasm}", "is a reward, but it is configured as a detector"),
        ("reward: {plugin: happy_count}\nrh_detector: {score_threshold: {component: happy, threshold: 1}}", "reward components are: happy_count"),
        ("reward: {plugin: happy_count, max_reward: 1}", "caps a sum of `components`"),
    ];
    // Relative plugin paths are relative to the current directory (host/ under `cargo test`).
    for (yaml, expected) in cases {
        let error = config_error(yaml);
        assert!(error.contains(expected), "{yaml}\nexpected {expected:?} in:\n{error}");
    }
}

#[test]
fn specs_round_trip_through_yaml() {
    let sections: Sections = smallrl::yaml::read_file(&repo_root().join("configs/sentence_length_10_smooth_with_happy.yaml")).unwrap();
    let text = smallrl::yaml::to_string(&sections.reward).unwrap();
    let again: RewardSpec = smallrl::yaml::from_str(&text).unwrap();
    assert_eq!(again, sections.reward);
}

#[test]
fn a_failing_plugin_fails_the_batch_and_recovers_only_when_asked() {
    let misbehaving = common::test_plugin("misbehaving");
    let yaml = format!(
        "reward:\n  components:\n    - {{plugin: happy_count}}\n    - {{plugin: {}, name: flaky, params: {{mode: panic}}}}\n",
        misbehaving.display()
    );
    let mut model = model_from_yaml(&yaml, NO_KNOBS).unwrap();
    let batch = story_batch();
    let error = format!("{:#}", model.score(&batch, 0).unwrap_err());
    assert!(error.contains("reward component `flaky` failed") && error.contains("it panicked"), "{error}");
    // Still failed on the next batch: nothing recovers behind the caller's back.
    let again = format!("{:#}", model.score(&batch, 1).unwrap_err());
    assert!(again.contains("re-instantiated explicitly"), "{again}");
    let recovered = model.reinstantiate_failed().unwrap();
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert!(recovered[0].contains("re-instantiated plugin misbehaving") && recovered[0].contains("panicked"), "{recovered:?}");
    assert!(model.reinstantiate_failed().unwrap().is_empty(), "nothing left to recover");
}

/// Issue 47.4: a standard plugin's name with a plugin_dir that lacks it (a config run outside
/// the checkout) names the file looked for and `--plugin-dir`, the fix.
#[test]
fn a_missing_standard_plugin_names_the_plugin_dir_flag() {
    let empty = tempfile::tempdir().unwrap();
    let spec = RewardSpec::single("happy_count", None).unwrap();
    let error = format!("{:#}", RewardModel::load(&spec, None, NO_KNOBS, empty.path(), PluginLimits::default()).err().expect("no happy_count.wasm there"));
    let file = empty.path().join("happy_count.wasm");
    assert!(error.contains(&file.display().to_string()) && error.contains("`--plugin-dir`") && error.contains("make plugins"), "{error}");
    let detector = DetectorSpec::single("happy_count", None).unwrap();
    let spec = RewardSpec::single(standard_plugin("happy_count").to_str().unwrap(), None).unwrap();
    let error = format!("{:#}", RewardModel::load(&spec, Some(&detector), NO_KNOBS, empty.path(), PluginLimits::default()).err().expect("no detector there"));
    assert!(error.contains("detect_happy_count.wasm") && error.contains("`--plugin-dir`"), "{error}");
}
