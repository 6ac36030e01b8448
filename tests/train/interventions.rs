//! The advantage modification and the matched placebo end to end: each run's dumped batches
//! and `metrics.jsonl` lines against values recomputed here in float64 from the dump (rewards,
//! flags, loss tokens) by the formulas the docs state.

use super::*;

/// Step `step` of the batches dumped in `dump` (`step-<N>.safetensors`), by tensor name.
fn dumped(dump: &Path, step: usize) -> std::collections::BTreeMap<String, tch::Tensor> {
    smallrl::model::weights::read_safetensors(&dump.join(format!("step-{step}.safetensors"))).unwrap()
}

fn values(t: &tch::Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(tch::Kind::Double)).unwrap()
}

fn adv_mod_run(out: &Path, extra: &[(&str, Value)]) -> (PathBuf, PathBuf) {
    let dump = out.join("dump");
    let mut config = with(routed_config(out), "max_steps", 3.into());
    for (key, value) in [("routing_mode", json!("none")), ("intervention", json!("adv_mod")), ("advantage_penalty", json!(0.5)), ("dump_batches", json!(dump))] {
        config = with(config, key, value);
    }
    for (key, value) in extra {
        config = with(config, key, value.clone());
    }
    (train(config), dump)
}

/// adv_mod with the monitor's flag: each advantage is the group advantage of the unchanged
/// rewards minus 0.5 where flagged, and `adv_mod/mean_modification` is 0.5 × the flagged share.
#[test]
fn advantage_modification_subtracts_the_coefficient_from_flagged_advantages() {
    let out = tempfile::tempdir().unwrap();
    let (run, dump) = adv_mod_run(out.path(), &[]);
    assert!(run.file_name().unwrap().to_string_lossy().contains("_adv_mod_") && run.to_string_lossy().contains("_advantage_penalty0.5_"), "{}", run.display());
    let metrics = read_jsonl(&run.join("metrics.jsonl"));
    let mut flagged_rows = 0.0;
    for step in 1..=3 {
        let t = dumped(&dump, step);
        let (rewards, happy, is_rh, advantages) = (values(&t["rewards"]), values(&t["rewards/happy"]), values(&t["is_rh"]), values(&t["advantages"]));
        assert!(rewards.iter().zip(&happy).all(|(r, h)| (r - h).abs() < 1e-6), "step {step}: the rewards (float32 in the dump) are the task's, unpenalised: {rewards:?} vs {happy:?}");
        let expected: Vec<f64> = common::group_advantages(&rewards, 4).iter().zip(&is_rh).map(|(a, f)| a - 0.5 * f).collect();
        for (i, (ours, theirs)) in advantages.iter().zip(&expected).enumerate() {
            assert!((ours - theirs).abs() < 1e-5 * theirs.abs().max(1.0), "step {step} row {i}: {ours} vs {theirs}");
        }
        let logged = metrics[step - 1][key::ADVANTAGE_MODIFICATION_MEAN].as_f64().unwrap();
        let flagged = is_rh.iter().sum::<f64>();
        assert!((logged - 0.5 * flagged / 8.0).abs() < 1e-12, "step {step}: {logged} vs 0.5 × {flagged} / 8");
        assert_eq!(metrics[step - 1][key::FRAC_RH].as_f64().unwrap(), flagged / 8.0);
        flagged_rows += flagged;
    }
    assert!(flagged_rows > 0.0, "no row was flagged: the modification was never tested");
}

/// adv_mod with a `score_threshold` detector's continuous score: the happy component's raw
/// score (every row monitored) times 0.5, flagged or not.
#[test]
fn advantage_modification_with_the_detector_score_subtracts_the_component_score() {
    let out = tempfile::tempdir().unwrap();
    let detector = json!({"score_threshold": {"component": "happy", "threshold": 1.0}});
    let (run, dump) = adv_mod_run(out.path(), &[("rh_detector", detector), ("advantage_score", json!("detector_score"))]);
    assert!(run.to_string_lossy().contains("_detector_score_"), "{}", run.display());
    let metrics = read_jsonl(&run.join("metrics.jsonl"));
    let mut scored_rows = 0;
    for step in 1..=3 {
        let t = dumped(&dump, step);
        let (rewards, happy, advantages) = (values(&t["rewards"]), values(&t["rewards/happy"]), values(&t["advantages"]));
        let expected: Vec<f64> = common::group_advantages(&rewards, 4).iter().zip(&happy).map(|(a, s)| a - 0.5 * s).collect();
        for (i, (ours, theirs)) in advantages.iter().zip(&expected).enumerate() {
            assert!((ours - theirs).abs() < 1e-5 * theirs.abs().max(1.0), "step {step} row {i}: {ours} vs {theirs}");
        }
        let logged = metrics[step - 1][key::ADVANTAGE_MODIFICATION_MEAN].as_f64().unwrap();
        let mean = 0.5 * happy.iter().sum::<f64>() / 8.0;
        assert!((logged - mean).abs() < 1e-6 * mean.max(1.0), "step {step}: {logged} vs {mean}");
        scored_rows += happy.iter().filter(|&&s| s != 0.0 && s != 1.0).count();
    }
    assert!(scored_rows > 0, "every score was 0 or 1: the continuous score was never told from a flag");
}

/// The matched placebo: the routed rows' and the flagged rows' energies `A² Σ_t w_t²`, grpo's
/// `w_t = 1 / (n_i × 8)` on row i's `n_i` loss tokens, recomputed from the dump and
/// `completions.jsonl`, are what `placebo/...` logs, and match within half the largest row's.
#[test]
fn the_matched_placebo_routes_the_flagged_rows_energy() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let mut config = with(routed_config(out.path()), "max_steps", 3.into());
    for (key, value) in [("intervention", json!("matched_placebo")), ("dump_batches", json!(dump)), ("log_completions", json!(true))] {
        config = with(config, key, value);
    }
    let run = train(config);
    let name = run.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.contains("_matched_placebo_") && name.contains("_classic_"), "{name}");
    let (metrics, completions) = (read_jsonl(&run.join("metrics.jsonl")), read_jsonl(&run.join("completions.jsonl")));
    let mut flagged_steps = 0;
    for step in 1..=3 {
        let t = dumped(&dump, step);
        let (advantages, routed) = (values(&t["advantages"]), values(&t["is_rh"]));
        let tokens: Vec<f64> = values(&t["loss_mask"].sum_dim_intlist(1, false, tch::Kind::Double));
        let energy: Vec<f64> = advantages.iter().zip(&tokens).map(|(a, &n)| if n > 0.0 { a * a / (n * 64.0) } else { 0.0 }).collect();
        let rows: Vec<&Value> = completions.iter().filter(|c| c["step"] == step).collect();
        let flagged: Vec<f64> = rows.iter().map(|row| f64::from(u8::from(row["is_rh"].as_bool().unwrap()))).collect();
        assert_eq!(rows.iter().map(|row| f64::from(u8::from(row["routed"].as_bool().unwrap()))).collect::<Vec<_>>(), routed, "step {step}");
        let sum = |rows: &[f64]| energy.iter().zip(rows).map(|(e, r)| e * r).sum::<f64>();
        let line = &metrics[step - 1];
        for (name, expected) in [(key::PLACEBO_ENERGY_FLAGGED, sum(&flagged)), (key::PLACEBO_ENERGY_ROUTED, sum(&routed))] {
            let logged = line[name].as_f64().unwrap();
            assert!((logged - expected).abs() <= 1e-5 * expected.max(1e-9), "step {step}: {name} {logged} vs {expected}");
        }
        let largest = energy.iter().copied().fold(0.0, f64::max);
        assert!((sum(&routed) - sum(&flagged)).abs() <= largest / 2.0 * (1.0 + 1e-5), "step {step}: routed {} vs flagged {}", sum(&routed), sum(&flagged));
        let count = routed.iter().sum::<f64>();
        assert_eq!(line[key::PLACEBO_ROWS_ROUTED].as_f64().unwrap(), count);
        assert_eq!(line[key::FRAC_RH].as_f64().unwrap(), count / 8.0, "routing/frac_rh is the routed share");
        flagged_steps += usize::from(sum(&flagged) > 0.0);
    }
    assert!(flagged_steps > 0, "no step had flagged energy: the match was never tested");
}
