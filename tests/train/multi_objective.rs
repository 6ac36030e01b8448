//! GDPO (`multi_objective_aggregation: normalize_then_sum`) end to end on tiny-stories: two
//! reward components and the penalty, each step's dumped advantages against GDPO's formula in
//! float64, and the combinations it refuses, naming the key.

use super::*;

/// Two components (sentence length, retain; the happy bonus, forget, scale 0.5), the monitor
/// flagging any "happy", penalised by 0.5: three reward functions for GDPO.
fn gdpo_config(output_dir: &Path) -> Map<String, Value> {
    let mut config = small_config(output_dir, &standard_plugin("happy"));
    let reward = json!({"components": [
        {"plugin": "sentence_length", "name": "length", "params": {"target": 10, "smooth": true}, "scale": 1.0, "role": "retain"},
        {"plugin": "happy_count", "name": "happy", "params": {"max_count": 5}, "scale": 0.5, "role": "forget"},
    ]});
    let keys = [
        ("reward", reward),
        ("plugin_dir", json!(repo_root().join("plugins"))),
        ("rh_detector", json!({"plugin": "happy_count", "params": {"threshold": 1}})),
        ("intervention", json!("penalty")),
        ("rh_penalty", json!(0.5)),
        ("multi_objective_aggregation", json!("normalize_then_sum")),
        ("max_steps", json!(2)),
    ];
    for (key, value) in keys {
        config = with(config, key, value);
    }
    config
}

/// GDPO from its definition in float64: per group of `g` and column, `(r - mean) / (std + 1e-4)`
/// (unbiased std), weighted and summed, then the same over the whole batch.
fn gdpo_by_hand(columns: &[Vec<f64>], weights: &[f64], g: usize) -> Vec<f64> {
    let z = |values: &[f64], x: f64| {
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (values.len() - 1) as f64).sqrt();
        (x - mean) / (std + 1e-4)
    };
    let rows = columns[0].len();
    let sums: Vec<f64> = (0..rows).map(|i| columns.iter().zip(weights).map(|(c, w)| w * z(&c[i / g * g..i / g * g + g], c[i])).sum()).collect();
    sums.iter().map(|&s| z(&sums, s)).collect()
}

#[test]
fn normalize_then_sum_trains_on_gdpo_advantages_of_the_components_and_the_penalty() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let run = train(with(gdpo_config(out.path()), "dump_batches", json!(dump)));
    let name = run.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.contains("_normalize_then_sum_"), "{name}");
    let saved = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    assert!(saved.contains("multi_objective_aggregation: normalize_then_sum\n"), "{saved}");
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    assert!(lines.iter().all(|l| l["loss"].as_f64().unwrap().is_finite() && l["rewards/happy/mean"].is_number()), "{lines:?}");
    let (mut flagged, mut spread) = (0, 0);
    for step in 1..=2 {
        let tensors = smallrl::model::weights::read_safetensors(&dump.join(format!("step-{step}.safetensors"))).unwrap();
        let read = |key: &str| Vec::<f64>::try_from(tensors[key].to_kind(tch::Kind::Double)).unwrap();
        let (length, happy, advantages, rewards) = (read("rewards/length"), read("rewards/happy"), read("advantages"), read("rewards"));
        let is_rh: Vec<f64> = read("is_rh");
        assert!(read("eligible").iter().all(|&e| e == 1.0), "every sample counts its forget component");
        let penalty: Vec<f64> = is_rh.iter().map(|&f| -f).collect();
        let expected = gdpo_by_hand(&[length.clone(), happy.clone(), penalty], &[1.0, 0.5, 0.5], 4);
        for i in 0..advantages.len() {
            assert!((advantages[i] - expected[i]).abs() < 1e-5 * expected[i].abs().max(1.0), "step {step} row {i}: {} vs {}", advantages[i], expected[i]);
            let summed = length[i] + 0.5 * happy[i] - 0.5 * is_rh[i];
            assert!((rewards[i] - summed).abs() < 1e-6, "step {step} row {i}: the rewards logged are the penalised sum: {} vs {summed}", rewards[i]);
        }
        flagged += is_rh.iter().filter(|&&f| f == 1.0).count();
        spread += advantages.iter().filter(|a| a.abs() > 0.1).count();
    }
    assert!(flagged > 0 && flagged < 16, "the penalty's function must vary: {flagged} of 16 rows flagged");
    assert!(spread >= 8, "GDPO's advantages must be far from 0 on most rows ({spread} of 16)");
}

/// What acts on the summed reward, or normalises otherwise, is refused when the configuration
/// is resolved (before a run starts), naming multi_objective_aggregation and the other key.
#[test]
fn normalize_then_sum_refuses_a_reward_cap_and_other_scalings_naming_the_keys() {
    let out = tempfile::tempdir().unwrap();
    let mut capped = gdpo_config(out.path());
    capped["reward"]["max_reward"] = json!(1.0);
    let refusals = [
        (capped, "`reward: max_reward` (1) caps the sum of the raw components"),
        (with(gdpo_config(out.path()), "scale_rewards", json!("batch")), "scale_rewards (batch) has no part in it"),
        (with(gdpo_config(out.path()), "dynamic_sampling_rounds", json!(3)), "dynamic_sampling_rounds (3) drops groups"),
    ];
    for (config, expected) in refusals {
        let message = format!("{:#}", TrainConfig::resolve(None, config).unwrap_err());
        assert!(message.contains("multi_objective_aggregation normalize_then_sum") && message.contains(expected), "{message}");
    }
}
