//! `train_dtype: bfloat16` in whole runs (issue 50): it learns as float32 does, a resumed run
//! repeats the uninterrupted one bit for bit, and the key is written and named only when set.
//! Its numbers against float64 and torch.autocast: `tests/train_dtype.rs`.

use super::*;

/// happy_count's 20 steps with bfloat16 matrix products rise as the float32 runs do
/// (`learning.rs`: the same bound, well below the rises recorded).
#[test]
fn bfloat16_training_raises_the_reward() {
    let (first, last) = super::learning::happy_count_learning(&[("train_dtype", json!("bfloat16"))]);
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "bfloat16 training did not raise the reward: {first:.3} -> {last:.3}");
}

/// Stopped after step 3 (past checkpoint 2) and resumed, a DualLoRA routed run in bfloat16
/// equals the run that was never stopped, metrics and weights bit for bit; its config.yaml and
/// name say bfloat16, a float32 run's say nothing of the key.
#[test]
fn a_resumed_bfloat16_run_repeats_the_uninterrupted_run_exactly() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str| with(routed_config(&out.path().join(dir)), "train_dtype", json!("bfloat16"));
    let whole = train(config("a"));
    let resolved = TrainConfig::resolve(None, config("b")).unwrap();
    assert!(resolved.run_name().unwrap().contains("train_bfloat16"), "{}", resolved.run_name().unwrap());
    let mut first = Trainer::new(resolved.clone(), None).unwrap();
    let stopped = first.train(Some(3)).unwrap();
    drop(first);
    let resumed = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap().train(None).unwrap();
    for file in ["metrics.jsonl", "routing_eval.jsonl"] {
        let (a, b) = (deterministic(read_jsonl(&whole.join(file))), deterministic(read_jsonl(&resumed.run_dir.join(file))));
        assert_same_metrics(&a, &b, file);
    }
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-4/adapters.safetensors")).unwrap();
    let (a, b) = (weights(&whole), weights(&resumed.run_dir));
    for (name, tensor) in &a {
        assert!(tensor.equal(&b[name]), "{name} differs after resumption");
    }
    let saved = std::fs::read_to_string(whole.join("config.yaml")).unwrap();
    assert!(saved.contains("train_dtype: bfloat16"), "{saved}");
    let plain = train(routed_config(&out.path().join("plain")));
    assert!(!std::fs::read_to_string(plain.join("config.yaml")).unwrap().contains("train_dtype"), "a float32 run's config.yaml has no train_dtype");
    let loss = |run: &Path| read_jsonl(&run.join("metrics.jsonl")).iter().map(|l| l["loss"].as_f64().unwrap()).collect::<Vec<_>>();
    assert_ne!(loss(&whole), loss(&plain), "bfloat16 products must change the run's numbers");
}
