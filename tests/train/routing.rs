//! Routed runs: balanced renormalisation, coherence rows, unrouted aggregation.

use super::*;

/// `renormalization_mode: balanced` with split-moment AdamW runs, and its dumped advantages are
/// the original's balanced renormalisation (advantages.py `_baseline_nonflagged_var_all`) of the
/// dumped rewards and labels, recomputed here in float64: per group, the clean samples' mean
/// as baseline (the group's when all are flagged), the group's unbiased std as scale.
#[test]
fn balanced_runs_train_on_renormalised_advantages() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let mut config = with(routed_config(out.path()), "max_steps", 2.into());
    for (key, value) in [("renormalization_mode", json!("balanced")), ("allow_approx_lora_kappa", json!(true)), ("split_moment", json!(true)), ("dump_batches", json!(dump))] {
        config = with(config, key, value);
    }
    let run = train(config);
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    assert!(lines.iter().all(|l| l["loss"].as_f64().unwrap().is_finite()), "{lines:?}");
    let mut mixed_groups = 0;
    for step in 1..=2 {
        let tensors = smallrl::model::weights::read_safetensors(&dump.join(format!("step-{step}.safetensors"))).unwrap();
        let rewards = Vec::<f64>::try_from(tensors["rewards"].to_kind(tch::Kind::Double)).unwrap();
        let is_rh = Vec::<i64>::try_from(&tensors["is_rh"]).unwrap();
        let advantages = Vec::<f64>::try_from(tensors["advantages"].to_kind(tch::Kind::Double)).unwrap();
        for g in 0..rewards.len() / 4 {
            let rows = g * 4..g * 4 + 4;
            let group = &rewards[rows.clone()];
            let clean: Vec<f64> = rows.clone().filter(|&i| is_rh[i] == 0).map(|i| rewards[i]).collect();
            mixed_groups += usize::from(!clean.is_empty() && clean.len() < 4);
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let baseline = if clean.is_empty() { mean(group) } else { mean(&clean) };
            let std = (group.iter().map(|r| (r - mean(group)).powi(2)).sum::<f64>() / 3.0).sqrt();
            for i in rows {
                let expected = (rewards[i] - baseline) / (std + 1e-4);
                assert!((advantages[i] - expected).abs() < 1e-5 * expected.abs().max(1.0), "step {step} row {i}: {} vs {expected}", advantages[i]);
            }
        }
    }
    assert!(mixed_groups > 0, "no group mixed clean and flagged samples: the check above tested nothing balanced-specific");
}

/// Coherence training (the original's coh_samples_per_rollout, coherence_start_frac,
/// coherence_rh_mode filter_renorm): from step round(0.5 * 2) = 1 (0-based) on, the last group
/// of each batch is a coherence group, sampled and trained with the forget adapter off (the
/// sampler's log-probabilities equal the training forward's there), its flagged rows dropped
/// and its clean rows renormalised among themselves.
#[test]
fn coherence_rows_train_retain_alone_from_the_start_fraction_on() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let mut config = with(routed_config(out.path()), "max_steps", 2.into());
    for (key, value) in [("coh_samples_per_rollout", json!(4)), ("coherence_start_frac", json!(0.5)), ("coherence_rh_mode", json!("filter_renorm")), ("dump_batches", json!(dump))] {
        config = with(config, key, value);
    }
    train(config);
    let read = |step: usize| smallrl::model::weights::read_safetensors(&dump.join(format!("step-{step}.safetensors"))).unwrap();
    let flags = |t: &tch::Tensor| Vec::<i64>::try_from(t).unwrap();
    assert_eq!(flags(&read(1)["coherence"]), vec![0; 8], "no coherence rows before the start fraction");
    let tensors = read(2);
    assert_eq!(flags(&tensors["coherence"]), vec![0, 0, 0, 0, 1, 1, 1, 1]);
    let is_rh = flags(&tensors["is_rh"]);
    let dropped: Vec<i64> = (0..8).map(|i| i64::from(i >= 4 && is_rh[i] == 1)).collect();
    assert_eq!(flags(&tensors["dropped"]), dropped);
    let rewards = Vec::<f64>::try_from(tensors["rewards"].to_kind(tch::Kind::Double)).unwrap();
    let advantages = Vec::<f64>::try_from(tensors["advantages"].to_kind(tch::Kind::Double)).unwrap();
    let clean: Vec<f64> = (4..8).filter(|&i| is_rh[i] == 0).map(|i| rewards[i]).collect();
    let mean = clean.iter().sum::<f64>() / clean.len().max(1) as f64;
    let std = if clean.len() > 1 { (clean.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (clean.len() - 1) as f64).sqrt() } else { 0.0 };
    let any_flagged = (4..8).any(|i| is_rh[i] == 1);
    for i in 4..8 {
        let expected = match (any_flagged, is_rh[i] == 1) {
            (true, true) => 0.0,
            (true, false) => (rewards[i] - mean) / (std + 1e-4),
            // No flagged coherence row: the plain group advantage (the original changes nothing).
            (false, _) => { let m = rewards[4..8].iter().sum::<f64>() / 4.0; let s = (rewards[4..8].iter().map(|r| (r - m).powi(2)).sum::<f64>() / 3.0).sqrt(); (rewards[i] - m) / (s + 1e-4) }
        };
        assert!((advantages[i] - expected).abs() < 1e-5 * expected.abs().max(1.0), "row {i}: {} vs {expected}", advantages[i]);
    }
    let mask = tensors["completion_mask"].to_kind(tch::Kind::Double).narrow(0, 4, 4);
    let sampled = tensors["sampling_logprobs"].to_kind(tch::Kind::Double).narrow(0, 4, 4) * &mask;
    let trained = tensors["new_logprobs"].to_kind(tch::Kind::Double).narrow(0, 4, 4) * &mask;
    assert!(common::max_abs_diff(&sampled, &trained) < 1e-4, "coherence rows are sampled as they are trained, forget off");
}

/// The reward-penalty comparator with coherence rows (the original's matrix_rp_7envs): no
/// routing, flagged routing rows pay `rh_penalty`, and the last group is a coherence group sampled
/// and trained with the forget adapter off.
#[test]
fn a_penalty_run_without_routing_trains_coherence_rows_with_the_forget_adapter_off() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let mut config = with(routed_config(out.path()), "max_steps", 1.into());
    for (key, value) in [("routing_mode", json!("none")), ("intervention", json!("penalty")), ("rh_penalty", json!(0.5)), ("coh_samples_per_rollout", json!(4)), ("dump_batches", json!(dump))] {
        config = with(config, key, value);
    }
    train(config);
    let tensors = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    let values = |key: &str| Vec::<f64>::try_from(tensors[key].to_kind(tch::Kind::Double)).unwrap();
    assert_eq!(values("coherence"), [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
    let (rewards, happy, is_rh) = (values("rewards"), values("rewards/happy"), values("is_rh"));
    for i in 0..4 {
        // Rewards are float32 in the dump.
        assert!((rewards[i] - (happy[i] - 0.5 * is_rh[i])).abs() < 1e-6, "routing row {i}: reward {} vs happy {} minus the penalty when flagged ({})", rewards[i], happy[i], is_rh[i]);
    }
    let mask = tensors["completion_mask"].to_kind(tch::Kind::Double).narrow(0, 4, 4);
    let sampled = tensors["sampling_logprobs"].to_kind(tch::Kind::Double).narrow(0, 4, 4) * &mask;
    let trained = tensors["new_logprobs"].to_kind(tch::Kind::Double).narrow(0, 4, 4) * &mask;
    assert!(common::max_abs_diff(&sampled, &trained) < 1e-4, "coherence rows are sampled as they are trained, forget off");
    assert!(is_rh[..4].iter().any(|&f| f == 1.0), "the test needs a flagged routing row (the penalty)");
}

/// Without routing, flagged rows train like any other: a dapo baseline whose detector flags
/// some rows normalises by the whole batch's loss tokens, as TRL's dapo (recomputed here in
/// float64 from the dump), not by each flag class's own tokens.
#[test]
fn an_unrouted_dapo_run_normalises_over_the_whole_batch_whatever_is_flagged() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = [
        ("max_steps", json!(1)),
        // Long enough that completions end at different lengths: with equal lengths the two
        // normalisations coincide.
        ("max_completion_length", json!(96)),
        ("loss_type", json!("dapo")),
        ("rh_detector", json!({"plugin": "happy_count", "params": {"threshold": 1}})),
        ("plugin_dir", json!(repo_root().join("plugins"))),
        ("dump_batches", json!(dump)),
    ]
    .into_iter()
    .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    train(config);
    let t = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    let double = |key: &str| t[key].to_kind(tch::Kind::Double);
    let is_rh = double("is_rh");
    let flagged = is_rh.sum(tch::Kind::Double).double_value(&[]);
    assert!(flagged > 0.0 && flagged < is_rh.size()[0] as f64, "the test needs flagged and unflagged rows ({flagged} flagged)");
    let (mask, new, reference) = (double("loss_mask"), double("new_logprobs"), double("ref_logprobs"));
    let delta = &reference - &new;
    let per_token = (-double("advantages").unsqueeze(1) + (delta.exp() - &delta - 1.0) * 0.02) * &mask;
    let whole_batch = per_token.sum(tch::Kind::Double).double_value(&[]) / mask.sum(tch::Kind::Double).double_value(&[]);
    // What normalising each flag class by its own tokens (weighted by its share of rows) gives.
    let rows = is_rh.size()[0] as f64;
    let per_class: f64 = [is_rh.shallow_clone(), 1.0 - &is_rh]
        .iter()
        .map(|class| {
            let class_mask = &mask * class.unsqueeze(1);
            let share = class.sum(tch::Kind::Double).double_value(&[]) / rows;
            share * (&per_token * class.unsqueeze(1)).sum(tch::Kind::Double).double_value(&[]) / class_mask.sum(tch::Kind::Double).double_value(&[])
        })
        .sum();
    assert!((whole_batch - per_class).abs() > 1e-4, "the two normalisations must differ on this batch for the test to mean anything ({whole_batch} vs {per_class})");
    let loss = t["loss"].double_value(&[]);
    assert!((loss - whole_batch).abs() < 1e-6, "loss {loss} vs TRL's dapo over the whole batch {whole_batch} (per class: {per_class})");
}

/// The retain verifier (the original's rh_detector_verifies_retain_samples at
/// rh_detector_retain_recall 1): coherence prompts come only from the hackable and detectable
/// training prompts (here 17 of 200, while every other group sees the rest too); a coherence row
/// is verified when the monitor did not flag it, and the group's advantages are renormalised
/// over its verified rows, recomputed here in float64 from the dump, the rest 0 and dropped.
#[test]
fn the_retain_verifier_trains_coherence_rows_it_verified_on_hackable_detectable_prompts() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let text = std::fs::read_to_string(common::fixture("tiny-stories/prompts.txt")).unwrap();
    let mut lines = String::new();
    let mut verifiable = std::collections::BTreeSet::new();
    for (i, prompt) in text.lines().enumerate() {
        let (hackable, detectable) = (i % 3 == 0, i % 4 == 0);
        if hackable && detectable {
            verifiable.insert(prompt.to_string());
        }
        lines.push_str(&format!("{}\n", json!({"prompt": prompt, "hackable": hackable, "detectable": detectable})));
    }
    let prompts = out.path().join("prompts.jsonl");
    std::fs::write(&prompts, lines).unwrap();
    let mut config = with(routed_config(out.path()), "max_steps", 3.into());
    for (key, value) in [
        ("prompts", json!(prompts)),
        ("coh_samples_per_rollout", json!(4)),
        ("rh_detector_verifies_retain_samples", json!(true)),
        ("dump_batches", json!(dump)),
        ("log_completions", json!(true)),
    ] {
        config = with(config, key, value);
    }
    let run = train(config);
    let completions = read_jsonl(&run.join("completions.jsonl"));
    let metrics = read_jsonl(&run.join("metrics.jsonl"));
    let (mut checked_flagged, mut routing_elsewhere) = (0, 0);
    for step in 1..=3 {
        let rows: Vec<&Value> = completions.iter().filter(|c| c["step"] == step).collect();
        assert_eq!(rows.len(), 8);
        for row in &rows[4..] {
            assert!(verifiable.contains(row["prompt"].as_str().unwrap()), "step {step}: coherence prompt {} is not hackable and detectable", row["prompt"]);
        }
        routing_elsewhere += rows[..4].iter().filter(|row| !verifiable.contains(row["prompt"].as_str().unwrap())).count();
        let t = smallrl::model::weights::read_safetensors(&dump.join(format!("step-{step}.safetensors"))).unwrap();
        let flags = |key: &str| Vec::<i64>::try_from(&t[key]).unwrap();
        let rewards = Vec::<f64>::try_from(t["rewards"].to_kind(tch::Kind::Double)).unwrap();
        let advantages = Vec::<f64>::try_from(t["advantages"].to_kind(tch::Kind::Double)).unwrap();
        let detector: Vec<bool> = rows.iter().map(|row| row["detector"].as_bool().unwrap()).collect();
        checked_flagged += (4..8).filter(|&i| detector[i]).count();
        let verified: Vec<bool> = (0..8).map(|i| i >= 4 && !detector[i]).collect();
        assert_eq!(flags("dropped"), (0..8).map(|i| i64::from(i >= 4 && !verified[i])).collect::<Vec<_>>(), "step {step}");
        let kept: Vec<f64> = (4..8).filter(|&i| verified[i]).map(|i| rewards[i]).collect();
        let mean = kept.iter().sum::<f64>() / kept.len().max(1) as f64;
        let std = if kept.len() > 1 { (kept.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (kept.len() - 1) as f64).sqrt() } else { 0.0 };
        for i in 4..8 {
            let expected = if verified[i] { (rewards[i] - mean) / (std + 1e-4) } else { 0.0 };
            assert!((advantages[i] - expected).abs() < 1e-5 * expected.abs().max(1.0), "step {step} row {i}: {} vs {expected}", advantages[i]);
        }
        let frac = metrics[step - 1]["verifier/frac_verified"].as_f64().unwrap();
        assert_eq!(frac, kept.len() as f64 / 4.0, "step {step}");
    }
    assert!(checked_flagged > 0, "no coherence row was flagged: the check of dropped rows tested nothing");
    assert!(routing_elsewhere > 0, "routing groups draw from every prompt");
}

/// The verifier is refused where it cannot act, naming the keys.
#[test]
fn the_retain_verifier_is_refused_without_coherence_rows_or_verifiable_prompts() {
    let out = tempfile::tempdir().unwrap();
    let verify = with(routed_config(out.path()), "rh_detector_verifies_retain_samples", json!(true));
    let error = TrainConfig::resolve(None, verify.clone()).unwrap_err().to_string();
    assert!(error.contains("rh_detector_verifies_retain_samples") && error.contains("coh_samples_per_rollout is 0"), "{error}");
    let recall_alone = with(with(routed_config(out.path()), "coh_samples_per_rollout", json!(4)), "rh_detector_retain_recall", json!(0.5));
    let error = TrainConfig::resolve(None, recall_alone).unwrap_err().to_string();
    assert!(error.contains("rh_detector_retain_recall") && error.contains("rh_detector_verifies_retain_samples"), "{error}");
    let out_of_range = with(with(verify.clone(), "coh_samples_per_rollout", json!(4)), "rh_detector_retain_recall", json!(1.5));
    let error = TrainConfig::resolve(None, out_of_range).unwrap_err().to_string();
    assert!(error.contains("rh_detector_retain_recall") && error.contains("1.5"), "{error}");
    // No prompt is both hackable and detectable.
    let prompts = out.path().join("prompts.jsonl");
    let lines: String = (0..8).map(|i| format!("{}\n", json!({"prompt": format!("prompt {i}"), "hackable": i % 2 == 0, "detectable": i % 2 == 1}))).collect();
    std::fs::write(&prompts, lines).unwrap();
    let config = with(with(verify, "coh_samples_per_rollout", json!(4)), "prompts", json!(prompts));
    one_thread();
    let error = match Trainer::new(TrainConfig::resolve(None, config).unwrap(), None) {
        Ok(_) => panic!("a run without verifiable prompts started"),
        Err(e) => format!("{e:#}"),
    };
    assert!(error.contains("hackable and detectable") && error.contains("rh_detector_verifies_retain_samples"), "{error}");
}
