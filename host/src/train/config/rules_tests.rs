//! The rows' own rules (`#[rule(..)]`) on the training configuration: each refuses its key's
//! bad value by name, whatever the other keys, and the key reference shows it.

use std::path::Path;

use super::*;
use crate::hyperparams::{self, Hyperparameters};

fn resolve(overrides: &[(&str, &str)]) -> anyhow::Result<TrainConfig> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/sentence_length_10_smooth_with_happy.yaml");
    let overrides = overrides.iter().map(|(k, v)| (k.to_string(), crate::yaml::from_str(v).unwrap())).collect();
    TrainConfig::resolve(Some(&file), overrides)
}

#[test]
fn a_keys_rule_refuses_its_bad_value_naming_the_key_the_rule_and_the_value() {
    let cases = [
        (("lr", "-1"), "lr must be positive, got -1"),
        (("beta", "-0.5"), "beta must be at least 0, got -0.5"),
        (("num_generations", "1"), "num_generations must be at least 2, got 1"),
        (("top_p", "0"), "top_p must be in (0, 1], got 0"),
        (("max_no_score_frac", "1"), "max_no_score_frac must be in [0, 1), got 1"),
        (("episode_max_turns", "0"), "episode_max_turns must be positive, got 0"),
        // Without coherence rows: the key's own rule comes before "set but unused".
        (("coherence_start_frac", "1.5"), "coherence_start_frac must be in [0, 1], got 1.5"),
        (("rp_extra_retain_advantage_multiplier", "0"), "rp_extra_retain_advantage_multiplier must be finite and above 0, got 0"),
    ];
    for ((key, value), expected) in cases {
        assert_eq!(format!("{:#}", resolve(&[(key, value)]).unwrap_err()), expected, "{key}={value}");
    }
    resolve(&[("lr", "1e-3"), ("beta", "0"), ("top_p", "1"), ("max_no_score_frac", "0.5")]).unwrap();
    // Values YAML through JSON cannot carry (they arrive as null), set on the struct.
    let valid = resolve(&[]).unwrap();
    let infinite = TrainConfig { rh_penalty: f64::INFINITY, ..valid.clone() };
    assert_eq!(infinite.validate().unwrap_err().to_string(), "rh_penalty must be finite, got inf");
    let nan = TrainConfig { temperature: f64::NAN, ..valid };
    assert_eq!(nan.validate().unwrap_err().to_string(), "temperature must be positive, got NaN");
}

#[test]
fn the_key_reference_shows_each_rule_in_its_rows_rule_column() {
    let reference = hyperparams::key_reference::<TrainConfig>();
    let rule_column = |key: &str| {
        let row = reference.lines().find(|line| line.starts_with(&format!("| `{key}` |"))).unwrap_or_else(|| panic!("no row for {key}"));
        row.split(" | ").nth(3).unwrap().to_string()
    };
    assert_eq!(rule_column("top_p"), "in (0, 1]");
    assert_eq!(rule_column("num_generations"), "at least 2");
    assert_eq!(rule_column("hack_frac"), "in [0, 1]");
    assert_eq!(rule_column("loss_type"), "", "a key without a rule of its own");
    for key in TrainConfig::KEYS {
        assert_eq!(rule_column(key.name), key.rules.iter().map(ToString::to_string).collect::<String>(), "{}", key.name);
    }
}

#[test]
fn the_recipe_reads_the_resolved_value_of_each_key_its_row_names() {
    let config = resolve(&[("ablated_frac", "0.25"), ("mask_truncated_completions", "true"), ("scale_rewards", "batch"), ("num_generations", "4")]).unwrap();
    let recipe = config.recipe(tch::Device::Cpu, &[]).unwrap();
    assert_eq!((recipe.ablated_frac(), recipe.mask_truncated_completions(), recipe.num_generations()), (0.25, true, 4));
    assert_eq!(recipe.scale_rewards(), crate::grpo::ScaleRewards::Batch);
    let read_by_recipe: Vec<&str> = TrainConfig::KEYS.iter().filter(|key| key.parts.contains(&"Recipe")).map(|key| key.name).collect();
    assert!(read_by_recipe.contains(&"intervention") && read_by_recipe.contains(&"split_moment"), "{read_by_recipe:?}");
}

#[test]
fn the_draw_reads_the_resolved_value_of_each_key_its_row_names() {
    let set = [("seed", "7"), ("num_generations", "4"), ("batch_size", "8"), ("dynamic_sampling_rounds", "3"), ("max_steps", "12")];
    let keys = resolve(&set).unwrap().draw_keys();
    assert_eq!((keys.seed(), keys.num_generations(), keys.batch_size(), keys.dynamic_sampling_rounds(), keys.max_steps()), (7, 4, 8, 3, 12));
    for (name, _) in set {
        assert!(TrainConfig::key(name).unwrap().parts.contains(&"DrawKeys"), "{name}'s row names DrawKeys");
    }
}
