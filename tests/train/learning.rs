//! Learning: each objective raises the happy_count reward on tiny-stories.

use super::*;

#[test]
fn grpo_on_happy_count_raises_the_reward() {
    let (first, last) = happy_count_learning(&[]);
    // tiny-stories says "happy" in about 45% of samples (0.1-0.2 on the happy_count scale);
    // 20 steps of GRPO with LoRA r8 at lr 3e-3 roughly double it (seen with 1 thread:
    // 0.165 over steps 1-5 -> 0.350 over steps 16-20).
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "GRPO did not raise the reward: {first:.3} -> {last:.3}");
}

/// CISPO (TRL's loss_type cispo, weight cap 5 as TRL recommends) on a batch reused twice, so
/// that the second step's weights differ from 1. Seen with 1 thread: 0.144 over steps 1-5 ->
/// 0.353 over steps 16-20.
#[test]
fn cispo_on_happy_count_raises_the_reward() {
    let (first, last) = happy_count_learning(&[("loss_type", json!("cispo")), ("epsilon_high", json!(5.0)), ("num_iterations", json!(2))]);
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "CISPO did not raise the reward: {first:.3} -> {last:.3}");
}

/// tinker's `importance_sampling` as tinker's cookbook runs it (rewards centred per group, not
/// scaled; tinker's sum over tokens, which dr_grpo is up to a constant; no KL in the loss).
/// Seen with 1 thread: 0.148 over steps 1-5 -> 0.340 over steps 16-20.
#[test]
fn tinker_importance_sampling_on_happy_count_raises_the_reward() {
    let (first, last) = happy_count_learning(&tinker(&[("loss_fn", json!("importance_sampling"))]));
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "importance_sampling did not raise the reward: {first:.3} -> {last:.3}");
}

/// tinker's `ppo` with two substeps (tinker's advice for ppo): each batch of two groups is two
/// optimizer steps of one group, the second against the sampler's log-probabilities of a policy
/// one update behind. Seen with 1 thread: 0.140 over steps 1-5 -> 0.285 over steps 16-20.
#[test]
fn tinker_ppo_with_substeps_on_happy_count_raises_the_reward() {
    let (first, last) = happy_count_learning(&tinker(&[("loss_fn", json!("ppo")), ("num_substeps", json!(2))]));
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "ppo did not raise the reward: {first:.3} -> {last:.3}");
}

/// tinker's `dro` with its documentation's beta 0.05, on a batch reused twice so that the
/// penalty is not zero. Seen with 1 thread: 0.150 over steps 1-5 -> 0.330 over steps 16-20.
#[test]
fn tinker_dro_on_happy_count_raises_the_reward() {
    let (first, last) = happy_count_learning(&tinker(&[("loss_fn", json!("dro")), ("dro_beta", json!(0.05)), ("num_iterations", json!(2))]));
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "dro did not raise the reward: {first:.3} -> {last:.3}");
}

/// `overrides` with tinker's aggregation and advantages: dr_grpo, no reward scaling, no KL.
fn tinker(overrides: &[(&'static str, Value)]) -> Vec<(&'static str, Value)> {
    let mut all = vec![("loss_type", json!("dr_grpo")), ("scale_rewards", json!("none")), ("beta", json!(0.0))];
    all.extend(overrides.iter().cloned());
    all
}

/// A bfloat16 sampler with TRL's correction learns as the float32 run does (the first test
/// above), and every step's metrics show the sampler/learner mismatch a float32 sampler does not
/// have (its differences are float32 rounding, about 1e-5: `tests/train/steps.rs`).
#[test]
fn a_bfloat16_sampler_with_the_correction_raises_the_reward() {
    let overrides = [("sampler_dtype", json!("bfloat16")), ("importance_sampling_correction", json!(true))];
    let metrics = happy_count_metrics(&overrides);
    let (first, last) = first_and_last(&metrics, &overrides);
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "GRPO with a bfloat16 sampler did not raise the reward: {first:.3} -> {last:.3}");
    for (step, m) in metrics.iter().enumerate() {
        let (difference, kl) = (m["sampling/sampling_logp_difference/max"].as_f64().unwrap(), m["kl_sample_train_v2"].as_f64().unwrap());
        assert!(difference > 1e-3 && kl > 0.0, "step {}: sampler/learner mismatch {difference}, kl_sample_train_v2 {kl}: not a bfloat16 sampler", step + 1);
    }
}

/// 20 steps on happy_count with LoRA r8 (plus `overrides`): the mean reward of steps 1-5 and
/// of steps 16-20.
pub(super) fn happy_count_learning(overrides: &[(&str, Value)]) -> (f64, f64) {
    first_and_last(&happy_count_metrics(overrides), overrides)
}

/// The mean reward of steps 1-5 and of steps 16-20. The learning tests' rise of 0.08 is a
/// claim about GRPO, not about one machine's trajectory: a processor whose rounding flips one
/// sampled token runs another trajectory, so the bound sits well below the rises recorded
/// (0.165 -> 0.350 for GRPO, 0.136 -> 0.345 one step off policy), not at one seed's figure.
pub(super) fn first_and_last(metrics: &[Value], overrides: &[(&str, Value)]) -> (f64, f64) {
    let rewards: Vec<f64> = metrics.iter().map(|m| m["reward"].as_f64().unwrap()).collect();
    let mean = |r: &[f64]| r.iter().sum::<f64>() / r.len() as f64;
    let (first, last) = (mean(&rewards[..5]), mean(&rewards[15..]));
    println!("{overrides:?}: mean reward, steps 1-5: {first:.3}; steps 16-20: {last:.3}");
    (first, last)
}

/// The metrics of 20 steps on happy_count with LoRA r8 (plus `overrides`).
pub(super) fn happy_count_metrics(overrides: &[(&str, Value)]) -> Vec<Value> {
    let out = tempfile::tempdir().unwrap();
    let config = small_config(out.path(), &standard_plugin("happy"));
    let config = [
        ("adapter", json!("lora")), ("lora_preset", Value::Null), ("lora_rank", 8.into()), ("lora_alpha", 8.0.into()),
        ("lr", 3e-3.into()), ("batch_size", 32.into()), ("num_generations", 16.into()),
        ("max_completion_length", 64.into()), ("max_steps", 20.into()), ("save_steps", 20.into()), ("eval_every", 20.into()),
    ]
    .into_iter()
    .chain(overrides.iter().map(|(k, v)| (*k, v.clone())))
    .fold(config, |c, (k, v)| with(c, k, v));
    let run = train(config);
    read_jsonl(&run.join("metrics.jsonl"))
}
