//! What one step computes: probes, substeps and iterations, dumped batches, the reference pass, dynamic sampling.

use super::*;

/// The probes as a run logs them: the sampler (the native CPU sampler) and the learner (the
/// libtorch training pass) score the same weights on a fresh batch, so `kl_sample_train` is
/// float rounding only; on the reused batch of `num_iterations = 2` the learner has moved.
/// Measured: v1 3.9e-7 and v2 2.0e-12 on the fresh batch, v2 3.8e-5 on the reused one.
#[test]
fn probes_see_sampler_and_learner_agree_until_the_update() {
    let out = tempfile::tempdir().unwrap();
    let config = small_config(out.path(), &standard_plugin("happy"));
    let config = [("num_iterations", json!(2)), ("max_steps", json!(2)), ("epsilon_high", json!(0.28))]
        .into_iter()
        .fold(config, |c, (k, v)| with(c, k, v));
    let lines = read_jsonl(&train(config).join("metrics.jsonl"));
    let probe = |line: &Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key} is logged"));
    let (fresh, reused) = (&lines[0], &lines[1]);
    let (v1, v2) = (probe(fresh, key::KL_SAMPLE_TRAIN_V1), probe(fresh, key::KL_SAMPLE_TRAIN_V2));
    let moved = probe(reused, key::KL_SAMPLE_TRAIN_V2);
    println!("kl_sample_train fresh batch v1 {v1:.2e} v2 {v2:.2e}; reused batch v2 {moved:.2e}");
    assert!(v1.abs() < 1e-5 && v2 < 1e-10, "sampler and learner disagree on the same weights: v1 {v1:.2e}, v2 {v2:.2e}");
    assert!(moved > 100.0 * v2.max(1e-14), "the update must show on the reused batch: {moved:.2e} vs {v2:.2e}");
    for line in &lines {
        let quantiles = key::ENTROPY_QUANTILES.map(|k| probe(line, k));
        assert!(quantiles[0] <= quantiles[1] && quantiles[1] <= quantiles[2] && quantiles[0] > 0.0, "{quantiles:?}");
        let (low, high, region) = (probe(line, key::CLIP_LOW), probe(line, key::CLIP_HIGH), probe(line, key::CLIP_REGION));
        assert!((region - low - high).abs() < 1e-6 && region <= probe(line, key::CLIP_RATIO) + 1e-6, "{line}");
    }
    assert_eq!(probe(fresh, key::CLIP_REGION), 0.0, "ratio 1 on a fresh batch");
}

/// With `num_substeps = 2` each batch of two groups trains as two optimizer steps of one group:
/// the first scores its group with the weights that sampled it (`kl_sample_train` is rounding
/// only, as with `num_substeps = 1` on every step), the second with weights one update later.
/// tinker's ppo takes its ratios to the sampler's log-probabilities, 1 up to rounding on the
/// first substep, so nothing clips there. Measured: substep 1 v1 5.4e-7, v2 2.3e-12; substep 2 v1 -9.3e-5, v2
/// 1.6e-5; with num_substeps 1, v2 2.0e-12 and 2.5e-12 on its two fresh batches.
#[test]
fn substeps_train_the_batch_in_mini_batches_against_the_sampler() {
    let out = tempfile::tempdir().unwrap();
    let run = |substeps: usize| {
        let config = [("num_substeps", json!(substeps)), ("max_steps", json!(2)), ("loss_fn", json!("ppo")), ("epsilon_high", json!(0.28))]
            .into_iter()
            .fold(small_config(&out.path().join(format!("substeps{substeps}")), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
        read_jsonl(&train(config).join("metrics.jsonl"))
    };
    let probe = |line: &Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key} is logged: {line}"));
    let whole = run(1);
    for line in &whole {
        let (v1, v2) = (probe(line, key::KL_SAMPLE_TRAIN_V1), probe(line, key::KL_SAMPLE_TRAIN_V2));
        assert!(v1.abs() < 1e-5 && v2 < 1e-10, "num_substeps 1: sampler and learner disagree on the same weights: v1 {v1:.2e}, v2 {v2:.2e}");
        assert_eq!(probe(line, key::CLIP_REGION), 0.0, "ratio 1 to the sampler on a fresh batch");
    }
    let split = run(2);
    let (first, second) = (&split[0], &split[1]);
    let (v1, v2) = (probe(first, key::KL_SAMPLE_TRAIN_V1), probe(first, key::KL_SAMPLE_TRAIN_V2));
    let (moved_v1, moved_v2) = (probe(second, key::KL_SAMPLE_TRAIN_V1), probe(second, key::KL_SAMPLE_TRAIN_V2));
    println!("num_substeps 2: kl_sample_train substep 1 v1 {v1:.2e} v2 {v2:.2e}; substep 2 v1 {moved_v1:.2e} v2 {moved_v2:.2e}; whole-batch v2 {:.2e} {:.2e}", probe(&whole[0], key::KL_SAMPLE_TRAIN_V2), probe(&whole[1], key::KL_SAMPLE_TRAIN_V2));
    assert!(v1.abs() < 1e-5 && v2 < 1e-10, "substep 1 scores with the sampling weights: v1 {v1:.2e}, v2 {v2:.2e}");
    assert_eq!(probe(first, key::CLIP_REGION), 0.0, "ratio 1 to the sampler on the first substep");
    assert!(moved_v2 > 100.0 * v2.max(1e-14) && moved_v2 > 1e-9, "the first substep's update must show on the second: {moved_v2:.2e} vs {v2:.2e}");
    // One rollout: the reward metrics are the batch's on both lines; two different groups trained.
    assert_eq!(first[key::REWARD], second[key::REWARD], "both substeps log their rollout's reward");
    assert_ne!(first["loss"], second["loss"]);
    assert_eq!(whole[0][key::REWARD], first[key::REWARD], "the same seed samples the same first batch");
}

/// `num_iterations` passes over `num_substeps` mini-batches, each in `gradient_accumulation_steps`
/// micro-batches: one rollout serves 2 x 2 optimizer steps (its tokens counted once, the next
/// rollout's at the fifth), in the order substep 1, 2, 1, 2. The sampler's weights score
/// only the first step's mini-batch; each later step's learner is one more update away from
/// them. Measured (kl_sample_train_v2): 2.3e-12, 1.6e-5, 1.4e-4, 6.3e-5, then 2.6e-12 on the
/// new rollout.
#[test]
fn iterations_substeps_and_micro_batches_compose() {
    let out = tempfile::tempdir().unwrap();
    let config = [("num_substeps", json!(2)), ("num_iterations", json!(2)), ("gradient_accumulation_steps", json!(2)), ("max_steps", json!(5)), ("save_steps", json!(4))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let lines = read_jsonl(&train(config).join("metrics.jsonl"));
    let v2: Vec<f64> = lines.iter().map(|l| l[key::KL_SAMPLE_TRAIN_V2].as_f64().unwrap()).collect();
    println!("kl_sample_train_v2 per step: {v2:?}");
    // num_tokens counts each rollout's tokens once, when it is generated.
    let tokens: Vec<u64> = lines.iter().map(|l| l[key::NUM_TOKENS].as_u64().unwrap()).collect();
    assert!(tokens[..4].iter().all(|&t| t == tokens[0]) && tokens[4] > tokens[0], "one rollout for four steps, the next at step 5: {tokens:?}");
    assert!(v2[0] < 1e-10 && v2[4] < 1e-10, "fresh rollouts score with the sampling weights: {v2:?}");
    assert!(v2[1..4].iter().all(|&v| v > 1e3 * v2[0].max(1e-14)), "later steps of a rollout score with updated weights: {v2:?}");
    assert!(v2[3] > v2[1], "substep 2's rows, two updates later, are further from the sampler: {v2:?}");
}

#[test]
fn dumped_batches_recompute_the_logged_loss() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = with(small_config(out.path(), &standard_plugin("happy")), "max_steps", 1.into());
    let run = train(with(config, "dump_batches", json!(dump)));
    let tensors = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    for key in ["prompt_ids", "completion_ids", "completion_mask", "rewards", "rewards/happy", "is_rh", "advantages", "sampling_logprobs", "ref_logprobs", "new_logprobs", "loss"] {
        assert!(tensors.contains_key(key), "dump lacks {key}");
    }
    // Recompute the grpo loss (beta 0.02, ratio 1) by hand from the dumped tensors.
    let mask = tensors["completion_mask"].to_kind(tch::Kind::Double);
    let (new, reference) = (tensors["new_logprobs"].to_kind(tch::Kind::Double), tensors["ref_logprobs"].to_kind(tch::Kind::Double));
    let delta = &reference - &new;
    let kl = delta.exp() - &delta - 1.0;
    let per_token = -tensors["advantages"].to_kind(tch::Kind::Double).unsqueeze(1) + kl * 0.02;
    let per_sequence = (per_token * &mask).sum_dim_intlist(1, false, tch::Kind::Double) / mask.sum_dim_intlist(1, false, tch::Kind::Double);
    let expected = per_sequence.mean(tch::Kind::Double).double_value(&[]);
    let logged = read_jsonl(&run.join("metrics.jsonl"))[0]["loss"].as_f64().unwrap();
    assert!((tensors["loss"].double_value(&[]) - expected).abs() < 1e-6, "dumped loss does not follow from the dumped tensors");
    assert!((logged - expected).abs() < 1e-6, "logged loss {logged} vs recomputed {expected}");
    // The sampling log-probs are those of the policy that sampled (same weights at step 1).
    let sampled = tensors["sampling_logprobs"].to_kind(tch::Kind::Double);
    assert!(common::max_abs_diff(&(sampled * &mask), &(&new * &mask)) < 1e-4);
}

/// A run's top_k reaches its sampler: the sampler's log-probabilities are those of the
/// truncated, renormalised distribution (tests/model.rs recomputes them in float64), at least
/// the policy's full-softmax ones and above them on some tokens; the policy, the loss and the
/// reference keep the full softmax. top_k and top_p name the run.
#[test]
fn top_k_runs_sample_from_the_truncated_distribution() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = with(with(small_config(out.path(), &standard_plugin("happy")), "max_steps", 1.into()), "top_k", 3.into());
    let run = train(with(with(config, "top_p", json!(0.95)), "dump_batches", json!(dump)));
    let name = run.file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.contains("top_k3") && name.contains("top_p0.95"), "{name}");
    let tensors = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    let mask = tensors["completion_mask"].to_kind(tch::Kind::Double);
    let sampled = tensors["sampling_logprobs"].to_kind(tch::Kind::Double) * &mask;
    let policy = tensors["new_logprobs"].to_kind(tch::Kind::Double) * &mask;
    let gap = &sampled - &policy;
    assert!(gap.min().double_value(&[]) > -1e-4, "a truncated distribution gives every kept token at least its full probability");
    assert!(gap.max().double_value(&[]) > 1e-2, "top_k 3 changed no sampled token's probability: the sampler ignored it");
}

/// With a tinker loss the ratio's denominator is the sampler's log-probabilities, from
/// generation (no old-policy pass): the dump holds them as `old_logprobs`, and the logged loss
/// is tinker's importance_sampling, `-r A` per token with `r = exp(new - sampler)`, averaged as
/// grpo (loss_type's default), recomputed here from the dump in float64.
#[test]
fn tinker_losses_take_their_ratio_to_the_sampler() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = [("max_steps", json!(1)), ("beta", json!(0.0)), ("loss_fn", json!("importance_sampling")), ("dump_batches", json!(dump))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let run = train(config);
    let tensors = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    assert!(tensors["old_logprobs"].equal(&tensors["sampling_logprobs"]), "the denominator is the sampler's log-probabilities");
    let double = |key: &str| tensors[key].to_kind(tch::Kind::Double);
    let mask = double("completion_mask");
    let per_token = -(double("new_logprobs") - double("sampling_logprobs")).exp() * double("advantages").unsqueeze(1);
    let per_sequence = (per_token * &mask).sum_dim_intlist(1, false, tch::Kind::Double) / mask.sum_dim_intlist(1, false, tch::Kind::Double);
    let expected = per_sequence.mean(tch::Kind::Double).double_value(&[]);
    let logged = read_jsonl(&run.join("metrics.jsonl"))[0]["loss"].as_f64().unwrap();
    assert!((logged - expected).abs() < 1e-6, "logged loss {logged} vs recomputed {expected}");
}

/// `loss_type: vespo` in a run: the second pass over a rollout (`num_iterations` 2) trains with
/// the rollout's old log-probabilities, and the logged `vespo/phi_seq_mean` is the mean over
/// completions of `w^k e^(lambda (1 - w))`, `w = exp(Σ_t (new - old))` over each completion's
/// tokens, TRL's (k, lambda) = (2, 3) for `A >= 0` and (3, 2) below, recomputed here in float64
/// from the dump; the first pass is on policy (`phi` 1).
#[test]
fn a_vespo_run_logs_the_gamma_weight_of_its_sequences() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = [("max_steps", json!(2)), ("num_iterations", json!(2)), ("loss_type", json!("vespo")), ("lr", json!(3e-3)), ("dump_batches", json!(dump))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let lines = read_jsonl(&train(config).join("metrics.jsonl"));
    let logged: Vec<f64> = lines.iter().map(|l| l[key::VESPO_PHI_SEQ_MEAN].as_f64().unwrap()).collect();
    assert!((logged[0] - 1.0).abs() < 1e-5, "on policy phi is 1: {logged:?}");
    let tensors = smallrl::model::weights::read_safetensors(&dump.join("step-2.safetensors")).unwrap();
    let double = |key: &str| Vec::<Vec<f64>>::try_from(tensors[key].to_kind(tch::Kind::Double)).unwrap();
    let (new, old, mask) = (double("new_logprobs"), double("old_logprobs"), double("completion_mask"));
    let advantages = Vec::<f64>::try_from(tensors["advantages"].to_kind(tch::Kind::Double)).unwrap();
    let phi = |row: usize| {
        let w: f64 = (0..mask[row].len()).map(|t| (new[row][t] - old[row][t]) * mask[row][t]).sum::<f64>().exp();
        let (k, lambda) = if advantages[row] >= 0.0 { (2, 3.0) } else { (3, 2.0) };
        w.powi(k) * (lambda * (1.0 - w)).exp()
    };
    let expected = (0..advantages.len()).map(phi).sum::<f64>() / advantages.len() as f64;
    println!("vespo/phi_seq_mean: step 1 {}, step 2 {} (float64 from the dump {expected})", logged[0], logged[1]);
    assert!((logged[1] - expected).abs() < 1e-5 && (expected - 1.0).abs() > 1e-4, "step 2: logged {} vs recomputed {expected}", logged[1]);
}

/// `measure_entropy_change` re-scores the batch after the update: with `num_iterations = 2` the
/// next step trains on the same batch with the updated weights, so its logged `entropy` minus
/// this step's is the change measured (the same forward pass, so equal up to rounding).
#[test]
fn the_measured_entropy_change_is_the_next_pass_over_the_same_batch() {
    let out = tempfile::tempdir().unwrap();
    let config = [("num_iterations", json!(2)), ("max_steps", json!(2)), ("measure_entropy_change", json!(true))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let lines = read_jsonl(&train(config).join("metrics.jsonl"));
    let value = |line: &Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key} is logged: {line}"));
    let measured = value(&lines[0], key::ENTROPY_CHANGE);
    let next_pass = value(&lines[1], key::ENTROPY) - value(&lines[0], key::ENTROPY);
    println!("entropy change measured {measured:.3e}, next pass {next_pass:.3e}; cov(logp, A) {:.3e}", value(&lines[0], key::LOGPROB_ADVANTAGE_COVARIANCE));
    assert!(measured != 0.0 && (measured - next_pass).abs() < 1e-6, "measured {measured} vs the next pass's {next_pass}");
}

#[test]
fn the_gradient_noise_scale_is_logged_averaged_and_resumed_without_changing_the_step() {
    // A routed run with the probe (the step as two halves, one group each), interrupted after
    // step 3 and resumed from its step-2 checkpoint, against the same run without the probe.
    let out = tempfile::tempdir().unwrap();
    let plain = read_jsonl(&train(routed_config(&out.path().join("plain"))).join("metrics.jsonl"));
    let probed = TrainConfig::resolve(None, with(routed_config(&out.path().join("probed")), "gradient_noise_scale", true.into())).unwrap();
    let mut first = Trainer::new(probed.clone(), None).unwrap();
    let stopped = first.train(Some(3)).unwrap();
    drop(first);
    let run = Trainer::new(probed, Some(&stopped.run_dir)).unwrap().train(None).unwrap().run_dir;
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    assert_eq!(lines.len(), 4);
    let value = |line: &Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key} is logged: {line}"));
    // The halves' passes compute the step's gradient in another summation order only.
    for (step, (a, b)) in plain.iter().zip(&lines).enumerate() {
        // Absolute bounds (the on-policy loss is about 1e-7, the gradient norm 0.01-0.03):
        // measured at most 2.3e-9 and 7.5e-9.
        for (k, bound) in [(key::LOSS, 1e-7), (key::GRAD_NORM, 1e-6)] {
            assert!((value(a, k) - value(b, k)).abs() <= bound, "step {}: {k} {} without the probe, {} with it", step + 1, a[k], b[k]);
        }
    }
    assert!(plain[0].get(key::NOISE_SCALE).is_none(), "no probe, no key");
    // The running averages are exponential moving averages of the steps' estimates, started
    // at the first, continued across the resumption; B_simple is each pair's ratio.
    let decay = smallrl::probes::NOISE_SCALE_EMA_DECAY;
    let (mut grad_avg, mut trace_avg) = (value(&lines[0], key::NOISE_GRAD_SQUARED), value(&lines[0], key::NOISE_TRACE));
    for (i, line) in lines.iter().enumerate() {
        let (grad, trace) = (value(line, key::NOISE_GRAD_SQUARED), value(line, key::NOISE_TRACE));
        if i > 0 {
            (grad_avg, trace_avg) = (decay * grad_avg + (1.0 - decay) * grad, decay * trace_avg + (1.0 - decay) * trace);
        }
        let close = |ours: f64, exact: f64| (ours - exact).abs() <= 1e-12 * exact.abs();
        assert!(close(value(line, key::NOISE_GRAD_SQUARED_AVG), grad_avg) && close(value(line, key::NOISE_TRACE_AVG), trace_avg), "step {}: {line}", i + 1);
        assert!(close(value(line, key::NOISE_SCALE), trace / grad) && close(value(line, key::NOISE_SCALE_AVG), trace_avg / grad_avg), "step {}: {line}", i + 1);
        assert!(trace > 0.0, "step {}: eight different completions must show gradient noise: {line}", i + 1);
        println!("step {}: |G|² {grad:.3e} tr(Σ) {trace:.3e} B_simple {:.1} (average {:.1})", i + 1, trace / grad, trace_avg / grad_avg);
    }
}

#[test]
fn dynamic_sampling_fills_the_batch_with_groups_whose_rewards_differ() {
    // happy_count on tiny-stories: about half of the groups of 4 have equal rewards (all 0).
    let out = tempfile::tempdir().unwrap();
    let config = [("dynamic_sampling_rounds", json!(6)), ("max_steps", json!(3)), ("log_completions", json!(true))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let run = train(config.clone());
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    let count = |line: &Value, key: &str| line[key].as_u64().unwrap_or_else(|| panic!("{key} is logged: {line}"));
    let mut dropped = 0;
    for line in &lines {
        let (rounds, groups_dropped) = (count(line, key::DYNAMIC_SAMPLING_ROUNDS), count(line, key::DYNAMIC_SAMPLING_DROPPED));
        println!("step {}: {rounds} rounds, {groups_dropped} groups dropped, {} surplus", line["step"], count(line, key::DYNAMIC_SAMPLING_SURPLUS));
        assert!(rounds >= 1 && (groups_dropped > 0) == (rounds > 1), "more rounds only when something was dropped: {line}");
        assert_eq!(line[key::FRAC_REWARD_ZERO_STD].as_f64(), Some(0.0), "{line}");
        dropped += groups_dropped;
    }
    assert!(dropped > 0, "the test needs a step with equal-reward groups");
    // Every trained group of 4, read back from the completions log, has rewards that differ.
    let completions = read_jsonl(&run.join("completions.jsonl"));
    assert_eq!(completions.len(), 3 * 8, "full batches");
    for group in completions.chunks(4) {
        let rewards: Vec<f64> = group.iter().map(|c| c["trained_reward"].as_f64().unwrap()).collect();
        assert!(rewards.iter().any(|&r| r != rewards[0]), "a trained group with equal rewards: {rewards:?}");
    }
    // One round only: the first batch with an equal-reward group stops the run, naming the key.
    let strict = with(with(config, "dynamic_sampling_rounds", json!(1)), "output_dir", json!(out.path().join("strict")));
    let mut trainer = Trainer::new(TrainConfig::resolve(None, strict).unwrap(), None).unwrap();
    let error = format!("{:#}", trainer.train(None).unwrap_err());
    assert!(error.contains("raise dynamic_sampling_rounds"), "{error}");
}

/// beta 0 takes no reference pass (as TRL): nothing is scored by the reference, the dump has no
/// reference log-probs, `kl` is null and the loss is the policy term alone.
#[test]
fn beta_zero_skips_the_reference_pass() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = [("max_steps", json!(1)), ("beta", json!(0.0)), ("dump_batches", json!(dump))]
        .into_iter()
        .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let line = read_jsonl(&train(config).join("metrics.jsonl")).remove(0);
    let tensors = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    assert!(!tensors.contains_key("ref_logprobs"), "beta 0 computed reference log-probs");
    assert!(line[key::KL].is_null(), "kl with beta 0: {}", line[key::KL]);
    assert!(line[key::TIMING_REFERENCE].as_f64().unwrap() < 1e-3, "a reference pass was timed: {}", line[key::TIMING_REFERENCE]);
    // grpo with ratio 1 and no KL: the loss is -mean(A), 0 up to rounding for group-normalised A.
    let advantages = tensors["advantages"].to_kind(tch::Kind::Double);
    let expected = -advantages.mean(tch::Kind::Double).double_value(&[]);
    assert!((line[key::LOSS].as_f64().unwrap() - expected).abs() < 1e-6, "loss {} vs -mean(A) {expected}", line[key::LOSS]);
}

/// TRL's importance-sampling correction in a run: off (the default), a run logs none of its
/// metrics; on, every step logs TRL's `sampling/*` metrics, and since the sampler (the native
/// CPU engine) and the learner (libtorch's training pass) score the same weights, the ratio
/// is 1 up to their rounding, so the run trains as the uncorrected one up to that rounding. The
/// correction's old policy is the rollout's: with num_iterations 2 the second pass keeps the
/// rollout's ratios. Measured: |logp - logp_sampler| at most 1.4e-5, ratios within 1.4e-5 of 1, the
/// loss within 1.5e-7 of the uncorrected run's (absolute; the losses are 0 to 0.025). This run is
/// on policy, so it cannot tell a correct weighting from a wrong one (inverted, or applied to the
/// KL term): `tests/grpo_trl.rs` and `tests/is_correction_trl.rs` check the weighting off policy.
#[test]
fn the_importance_sampling_correction_logs_trls_metrics_and_corrects_rounding_only_on_policy() {
    let out = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[(&str, Value)]| {
        let base = [("num_iterations", json!(2)), ("max_steps", json!(4)), ("loss_type", json!("dapo"))];
        let config = base.iter().chain(extra).fold(small_config(&out.path().join(name), &standard_plugin("happy")), |c, (k, v)| with(c, k, v.clone()));
        deterministic(read_jsonl(&train(config).join("metrics.jsonl")))
    };
    let sampling_keys = [key::IS_RATIO_MIN, key::IS_RATIO_MEAN, key::IS_RATIO_MAX, key::SAMPLING_LOGP_DIFFERENCE_MEAN, key::SAMPLING_LOGP_DIFFERENCE_MAX];
    let off = run("off", &[]);
    for line in &off {
        assert!(sampling_keys.iter().all(|k| line.get(*k).is_none()), "no correction, no sampling/* metrics: {line}");
    }
    let on = run("on", &[("importance_sampling_correction", json!(true)), ("importance_sampling_mode", json!("token_truncate"))]);
    let probe = |line: &Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key} is logged: {line}"));
    let (mut worst_difference, mut worst_ratio, mut worst_loss) = (0.0f64, 0.0f64, 0.0f64);
    for (with, without) in on.iter().zip(&off) {
        let [min, mean, max, difference_mean, difference_max] = sampling_keys.map(|k| probe(with, k));
        assert!(min <= mean && mean <= max && difference_mean <= difference_max, "{with}");
        worst_difference = worst_difference.max(difference_max);
        worst_ratio = worst_ratio.max((1.0 - min).abs()).max((max - 1.0).abs());
        let (loss, reference) = (probe(with, key::LOSS), probe(without, key::LOSS));
        worst_loss = worst_loss.max((loss - reference).abs());
    }
    println!("importance-sampling correction on policy: |logp - logp_sampler| <= {worst_difference:.1e}, ratios within {worst_ratio:.1e} of 1, loss within {worst_loss:.1e} of the uncorrected run's");
    assert!(worst_difference > 0.0 && worst_difference < 1e-4, "sampler and learner agree to rounding on the same weights: {worst_difference:.1e}");
    assert!(worst_ratio < 2e-4, "ratios are exp(rounding): {worst_ratio:.1e} from 1");
    // dapo's token weights sum to 1 and |A| <= (G - 1) / sqrt(G) = 1.5 (G = 4): weights within
    // `worst_ratio` of 1 move the loss by at most 1.5 worst_ratio (plus float32 rounding).
    let bound = 1.5 * worst_ratio + 1e-7;
    assert!(worst_loss <= bound, "the correction of rounding moves the loss by rounding only: {worst_loss:.1e} (bound {bound:.1e})");
    // The second pass over a rollout reuses its ratios (TRL computes them once per rollout).
    for pair in on.chunks(2) {
        assert_eq!(pair[0][key::IS_RATIO_MEAN], pair[1][key::IS_RATIO_MEAN], "one rollout, one set of ratios");
    }
}

/// Evaluations sample through the run's seat at the engine: one decoder per adapter mode
/// (both, retain_only, forget_only; training samples with the first), folded once and kept
/// across evaluations rather than built anew for each.
#[test]
fn evaluations_reuse_the_runs_decoders() {
    let out = tempfile::tempdir().unwrap();
    let config = with(routed_config(out.path()), "eval_every", json!(1));
    one_thread();
    let mut trainer = Trainer::new(TrainConfig::resolve(None, config).unwrap(), None).unwrap();
    trainer.train(Some(1)).unwrap();
    assert_eq!(trainer.decoders(), 3, "training's decoder and one per evaluation mode");
    trainer.train(Some(2)).unwrap();
    assert_eq!(trainer.decoders(), 3, "two more evaluations built no decoder");
}
