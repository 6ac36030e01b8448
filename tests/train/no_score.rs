//! Samples without a score in a training run (`max_no_score_frac`, issue 45 item 2): the
//! test plugin `no_score` gives none to the batch positions it is told (here row 1 of the first
//! group and the whole second group) and scores the others by their length in characters. The
//! dumped loss and advantages are recomputed in float64 with those rows left out (the rewards
//! from `completions.jsonl`'s texts, the token counts from the dump's completion mask), and the
//! step fails naming plugin, step and samples when the bound is passed.

use super::*;

/// The batch positions given no score: one row of group 0 and all of group 1 (groups of 4).
const UNSCORED: [usize; 5] = [1, 4, 5, 6, 7];

/// A tiny-stories run scored by `no_score` (no score at `UNSCORED`, characters elsewhere) with
/// dapo's aggregation (the loss divides by the counted rows' tokens, so a row left in the
/// normaliser shows) and no KL term, for `steps` steps. Completions of up to 64 tokens, so that
/// most end with EOS at lengths of their own (with equal lengths every aggregation's loss of an
/// on-policy step is minus the mean advantage, 0 in every group).
fn no_score_config(out: &Path, steps: usize) -> Map<String, Value> {
    let plugin = test_plugin("no_score");
    let none_at: Vec<String> = UNSCORED.iter().map(|row| row.to_string()).collect();
    let mut config = small_config(out, &plugin);
    let reward = json!({"plugin": plugin, "params": {"none_at": none_at, "score": "chars"}});
    for (key, value) in [("reward", reward), ("loss_type", json!("dapo")), ("beta", json!(0.0)), ("max_completion_length", json!(64)), ("max_steps", json!(steps)), ("log_completions", json!(true))] {
        config = with(config, key, value);
    }
    config
}

fn values(t: &tch::Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(tch::Kind::Double)).unwrap()
}

/// Group advantages in float64 over the scored members of each group of `g`:
/// `(r - mean) / (std + 1e-4)`, the standard deviation unbiased; 0 for the unscored rows and
/// for every row of a group with fewer than two scored members.
fn scored_group_advantages(rewards: &[f64], scored: &[bool], g: usize) -> Vec<f64> {
    let mut advantages = vec![0.0; rewards.len()];
    for start in (0..rewards.len()).step_by(g) {
        let members: Vec<usize> = (start..start + g).filter(|&i| scored[i]).collect();
        if members.len() < 2 {
            continue;
        }
        let mean = members.iter().map(|&i| rewards[i]).sum::<f64>() / members.len() as f64;
        let std = (members.iter().map(|&i| (rewards[i] - mean).powi(2)).sum::<f64>() / (members.len() - 1) as f64).sqrt();
        for &i in &members {
            advantages[i] = (rewards[i] - mean) / (std + 1e-4);
        }
    }
    advantages
}

#[test]
fn samples_without_a_score_leave_the_loss_and_every_statistic_exactly() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = with(with(no_score_config(out.path(), 2), "max_no_score_frac", json!(0.7)), "dump_batches", json!(dump));
    let run = train(config);
    assert!(run.file_name().unwrap().to_string_lossy().contains("_len64_noscore0.7_"), "{}", run.display());
    let (metrics, completions) = (read_jsonl(&run.join("metrics.jsonl")), read_jsonl(&run.join("completions.jsonl")));
    let scored: Vec<bool> = (0..8).map(|row| !UNSCORED.contains(&row)).collect();
    for step in 1..=2 {
        let t = smallrl::model::weights::read_safetensors(&dump.join(format!("step-{step}.safetensors"))).unwrap();
        let rows: Vec<&Value> = completions.iter().filter(|c| c["step"] == step).collect();
        assert_eq!(rows.len(), 8);
        // The plugin's score, by hand: the completion's length in characters.
        let rewards: Vec<f64> = rows.iter().map(|row| row["completion"].as_str().unwrap().chars().count() as f64).collect();
        let no_score: Vec<bool> = rows.iter().map(|row| row.get("no_score") == Some(&json!(true))).collect();
        assert_eq!(no_score, scored.iter().map(|s| !s).collect::<Vec<_>>(), "step {step}: completions.jsonl's no_score");
        assert_eq!(values(&t["no_score"]), no_score.iter().map(|&u| f64::from(u8::from(u))).collect::<Vec<_>>(), "step {step}: the dump's no_score");
        let expected = scored_group_advantages(&rewards, &scored, 4);
        let (advantages, dumped_rewards) = (values(&t["advantages"]), values(&t["rewards"]));
        for row in 0..8 {
            assert!((advantages[row] - expected[row]).abs() < 1e-5 * expected[row].abs().max(1.0), "step {step} row {row}: advantage {} vs {}", advantages[row], expected[row]);
            let reward = if scored[row] { rewards[row] } else { 0.0 };
            assert_eq!(dumped_rewards[row], reward, "step {step} row {row}: the dump's reward (placeholder 0 without a score)");
        }
        assert!(UNSCORED.iter().all(|&row| advantages[row] == 0.0), "step {step}: placeholders are 0, never NaN: {advantages:?}");
        // dapo with the ratio 1 of an on-policy step and no KL: -Σ A_i L_i / Σ L_i over the scored rows.
        let tokens = values(&t["completion_mask"].sum_dim_intlist(1, false, tch::Kind::Double));
        let counted: Vec<usize> = (0..8).filter(|&row| scored[row]).collect();
        let loss = -counted.iter().map(|&i| expected[i] * tokens[i]).sum::<f64>() / counted.iter().map(|&i| tokens[i]).sum::<f64>();
        assert!(loss.abs() > 1e-3, "step {step}: the reference loss {loss} is about 0, so it tells nothing: choose other rows");
        let dumped = t["loss"].double_value(&[]);
        assert!((dumped - loss).abs() < 1e-5 * loss.abs().max(1.0), "step {step}: dumped loss {dumped} vs float64 {loss} (scored rows alone)");
        assert!((metrics[step - 1][key::LOSS].as_f64().unwrap() - loss).abs() < 1e-5 * loss.abs().max(1.0), "step {step}: the logged loss");
        // Every statistic over the scored rows alone.
        let line = &metrics[step - 1];
        let mean = counted.iter().map(|&i| rewards[i]).sum::<f64>() / counted.len() as f64;
        assert_eq!(line[key::NO_SCORE_COUNT].as_f64().unwrap(), 5.0, "step {step}");
        assert!((line[key::REWARD].as_f64().unwrap() - mean).abs() < 1e-9 * mean, "step {step}: reward {} vs {mean}", line[key::REWARD]);
        assert!((line[key::component("no_score").as_str()].as_f64().unwrap() - mean).abs() < 1e-9 * mean, "step {step}");
        let lengths: Vec<f64> = counted.iter().map(|&i| tokens[i]).collect();
        assert!((line[key::MEAN_LENGTH].as_f64().unwrap() - lengths.iter().sum::<f64>() / 3.0).abs() < 1e-9, "step {step}: mean length over the scored rows");
    }
    // The evaluation at step 2 (4 prompts, one without a score) counts it and leaves it out.
    let evaluation = read_jsonl(&run.join("routing_eval.jsonl"));
    assert!(evaluation.iter().all(|line| line["modes"].as_object().unwrap().values().all(|mode| mode["no_score_count"] == json!(1))), "{evaluation:?}");
}

/// The same step with the bound at its default 0 fails as runs always have, naming the plugin,
/// the step and the sample; with a bound below the batch's share (5 of 8), naming every sample.
#[test]
fn a_step_with_more_samples_without_a_score_than_allowed_fails_naming_them() {
    one_thread();
    let out = tempfile::tempdir().unwrap();
    let fails = |config: Map<String, Value>| {
        let config = TrainConfig::resolve(None, config).unwrap();
        format!("{:#}", Trainer::new(config, None).unwrap().train(None).unwrap_err())
    };
    let error = fails(no_score_config(out.path(), 1));
    assert!(error.contains("step 1") && error.contains("plugin no_score (reward,") && error.contains("gave sample 1 no score"), "{error}");
    let error = fails(with(no_score_config(out.path(), 1), "max_no_score_frac", json!(0.5)));
    assert!(
        error.contains("step 1") && error.contains("plugin no_score (reward,") && error.contains("gave samples 1, 4, 5, 6, 7 no score") && error.contains("5 of 8 samples have no score, above max_no_score_frac 0.5"),
        "{error}"
    );
}

/// A bound above 0 is refused with what reads every row's reward or flag.
#[test]
fn max_no_score_frac_is_refused_with_what_reads_every_rows_reward() {
    let out = tempfile::tempdir().unwrap();
    let base = with(no_score_config(out.path(), 1), "max_no_score_frac", json!(0.25));
    for (key, value, named) in [
        ("coh_samples_per_rollout", json!(4), "coh_samples_per_rollout"),
        ("intervention", json!("placebo"), "placebo"),
        ("renormalization_mode", json!("retain_only"), "renormalization_mode"),
    ] {
        let error = format!("{:#}", TrainConfig::resolve(None, with(base.clone(), key, value)).unwrap_err());
        assert!(error.contains("max_no_score_frac 0.25") && error.contains(named), "{key}: {error}");
    }
    let error = format!("{:#}", TrainConfig::resolve(None, with(base, "max_no_score_frac", json!(1.0))).unwrap_err());
    assert!(error.contains("must be in [0, 1)"), "{error}");
}
