//! `sampling_steps_ahead` (tinker-cookbook 0.6.1's `AsyncConfig` with constant-reward groups removed): a group pipeline
//! sampled ahead, the oldest groups trained first, none dropped for staleness.

use super::*;
use smallrl::engine::{Sequences, frozen_logprobs};
use tch::{Device, Kind, Tensor};

fn column_u64(lines: &[Value], key: &str) -> Vec<u64> {
    lines.iter().map(|l| l[key].as_u64().unwrap_or_else(|| panic!("{key} logged: {l}"))).collect()
}

/// Without filtering, the pipeline's chunks are the batches of `max_steps_off_policy` at the
/// same depth, sampled with the same weights: the two runs are equal bit for bit (metrics and
/// weights), and step n's batch is min(n, 2) steps stale.
#[test]
fn without_filtering_sampling_steps_ahead_is_max_steps_off_policy() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str, key: &str| with(small_config(&out.path().join(dir), &standard_plugin("happy")), key, json!(2));
    let exact = train(config("exact", "max_steps_off_policy"));
    let pipeline = train(config("pipeline", "sampling_steps_ahead"));
    let (a, b) = (deterministic(read_jsonl(&exact.join("metrics.jsonl"))), deterministic(read_jsonl(&pipeline.join("metrics.jsonl"))));
    assert_same_metrics(&a, &b, "metrics.jsonl");
    assert_eq!(column_u64(&b, key::ASYNC_STALENESS_MAX), [0, 1, 2, 2], "step n (0-based) trains the groups sampled with the weights of step max(0, n - 2)");
    assert_eq!(column_u64(&b, key::OFF_POLICY_VERSION), [0, 0, 0, 1]);
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-4/adapters.safetensors")).unwrap();
    let (x, y) = (weights(&exact), weights(&pipeline));
    for (name, tensor) in &x {
        assert!(tensor.equal(&y[name]), "{name} differs");
    }
}

/// Coherence rows (the last group of each batch, sampled and trained with the forget adapter
/// off) in the group pipeline: its chunks are sampled as `max_steps_off_policy`'s batches are,
/// coherence rows included, so a routed DualLoRA run with them is the same run bit for bit
/// (metrics and both adapters). The pipeline once sampled every row with both adapters on and
/// the recipe still trained the last group as coherence rows: the metrics of steps 3-4, sampled
/// after the forget adapter had moved, differed.
#[test]
fn coherence_rows_are_sampled_with_the_forget_adapter_off_in_the_pipeline() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str, key: &str| {
        let config = with(routed_config(&out.path().join(dir)), "coh_samples_per_rollout", json!(4));
        with(with(config, key, json!(1)), "save_steps", json!(4))
    };
    let exact = train(config("exact", "max_steps_off_policy"));
    let pipeline = train(config("pipeline", "sampling_steps_ahead"));
    let (a, b) = (deterministic(read_jsonl(&exact.join("metrics.jsonl"))), deterministic(read_jsonl(&pipeline.join("metrics.jsonl"))));
    assert_same_metrics(&a, &b, "metrics.jsonl");
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-4/adapters.safetensors")).unwrap();
    let (x, y) = (weights(&exact), weights(&pipeline));
    let forget_moved = x.iter().any(|(name, t)| name.contains("forget") && name.contains("lora_B") && t.abs().max().double_value(&[]) > 0.0);
    assert!(forget_moved, "the forget adapter never moved: sampling with it on or off would be the same and the test would hold nothing");
    for (name, tensor) in &x {
        assert!(tensor.equal(&y[name]), "{name} differs");
    }
}

/// A filtered pipeline (happy_binary, groups of two, so about half the groups have equal rewards
/// and are dropped): which weights sampled each trained group, found by recomputing its sampler
/// log-probabilities in float64 under every checkpoint that could have (the first weights, and
/// each step's), gives the logged staleness (tinker's `async/staleness_*`: max, min and mean over groups) and version at every step;
/// no group is more than one step stale, the oldest come first, and some batch mixes versions.
#[test]
fn a_filtered_pipeline_trains_the_oldest_groups_with_the_weights_that_sampled_them() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let steps = 5;
    let run = train(filtered_config(&out.path().join("run"), steps, Some(&dump)));
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    let dropped: u64 = column_u64(&lines, key::DYNAMIC_SAMPLING_DROPPED).iter().sum();
    assert!(dropped > 0, "the test needs groups of equal rewards");
    let mut double_models = vec![smallrl::model::load(common::fixture("tiny-stories").to_str().unwrap(), "main", Device::Cpu, Kind::Double).unwrap().model];
    for step in 1..steps {
        double_models.push(smallrl::model::load(run.join(format!("checkpoint-{step}")).to_str().unwrap(), "main", Device::Cpu, Kind::Double).unwrap().model);
    }
    let group = 2;
    let mut mixed = 0;
    for (n, line) in lines.iter().enumerate() {
        let tensors = smallrl::model::weights::read_safetensors(&dump.join(format!("step-{}.safetensors", n + 1))).unwrap();
        let mask = tensors["completion_mask"].to_kind(Kind::Double);
        let sampled = tensors["sampling_logprobs"].to_kind(Kind::Double) * &mask;
        let seqs = Sequences { prompt_ids: &tensors["prompt_ids"], prompt_mask: &tensors["prompt_mask"], completion_ids: &tensors["completion_ids"], completion_mask: &tensors["completion_mask"], kept: None };
        let under: Vec<Tensor> = double_models[..=n].iter().map(|model| frozen_logprobs(model, seqs, 1.0, &[]) * &mask).collect();
        let rows = sampled.size()[0];
        let mut versions = Vec::new();
        for g in 0..rows / group {
            let gap = |v: usize| common::max_abs_diff(&sampled.narrow(0, g * group, group), &under[v].narrow(0, g * group, group));
            let gaps: Vec<f64> = (0..=n).map(gap).collect();
            let best = (0..=n).min_by(|&a, &b| gaps[a].total_cmp(&gaps[b])).unwrap();
            assert!(gaps[best] < 1e-4, "step {} group {g}: no checkpoint sampled it: {gaps:?}", n + 1);
            assert!(gaps.iter().enumerate().all(|(v, &d)| v == best || d > 1e-3), "step {} group {g}: the checkpoints are too close to tell: {gaps:?}", n + 1);
            versions.push(best);
        }
        let staleness: Vec<usize> = versions.iter().map(|&v| n - v).collect();
        let max = *staleness.iter().max().unwrap();
        let min = *staleness.iter().min().unwrap();
        let mean = staleness.iter().sum::<usize>() as f64 / staleness.len() as f64;
        assert!(max <= 1, "step {}: a group {max} steps stale with sampling_steps_ahead 1", n + 1);
        assert_eq!(line[key::ASYNC_STALENESS_MAX].as_u64(), Some(max as u64), "step {}: {versions:?}", n + 1);
        assert_eq!(line[key::ASYNC_STALENESS_MIN].as_u64(), Some(min as u64), "step {}: {versions:?}", n + 1);
        assert_eq!(line[key::ASYNC_STALENESS_MEAN].as_f64(), Some(mean), "step {}: {versions:?}", n + 1);
        assert_eq!(line[key::OFF_POLICY_VERSION].as_u64(), Some(*versions.iter().min().unwrap() as u64), "step {}", n + 1);
        assert!(versions.windows(2).all(|w| w[0] <= w[1]), "step {}: the oldest groups first: {versions:?}", n + 1);
        mixed += usize::from(versions.first() != versions.last());
    }
    assert!(mixed > 0, "some batch should hold groups of two versions (a chunk's surplus carried), or the test does not exercise them");
}

/// Stopped past a checkpoint whose pipeline holds a chunk partly used (its surplus carried) and
/// resumed, a filtered pipeline equals the run that was never stopped, bit for bit.
#[test]
fn a_resumed_filtered_pipeline_repeats_the_uninterrupted_run_exactly() {
    let out = tempfile::tempdir().unwrap();
    let steps = 5;
    let whole = train(filtered_config(&out.path().join("a"), steps, None));
    let resolved = TrainConfig::resolve(None, filtered_config(&out.path().join("b"), steps, None)).unwrap();
    one_thread();
    let mut first = Trainer::new(resolved.clone(), None).unwrap();
    let stopped = first.train(Some(3)).unwrap();
    drop(first);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(stopped.run_dir.join("checkpoint-2/in_flight.json")).unwrap()).unwrap();
    assert!(saved["next_chunk"].as_u64().unwrap() >= 3, "checkpoint 2 records the next chunk: {saved}");
    let resumed = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap().train(None).unwrap();
    let (a, b) = (deterministic(read_jsonl(&whole.join("metrics.jsonl"))), deterministic(read_jsonl(&resumed.run_dir.join("metrics.jsonl"))));
    assert_same_metrics(&a, &b, "metrics.jsonl");
    let partly_used = (1..steps).any(|c| {
        let text = std::fs::read_to_string(whole.join(format!("checkpoint-{c}/in_flight.json"))).unwrap();
        let saved: Value = serde_json::from_str(&text).unwrap();
        saved["chunks"].as_array().unwrap().iter().any(|chunk| chunk["next_group"].as_u64().unwrap() > 0)
    });
    assert!(partly_used, "some checkpoint should hold a chunk partly used, or the test does not exercise the carried surplus");
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join(format!("checkpoint-{steps}/model.safetensors"))).unwrap();
    let (x, y) = (weights(&whole), weights(&resumed.run_dir));
    for (name, tensor) in &x {
        assert!(tensor.equal(&y[name]), "{name} differs after resumption");
    }
}

/// One step ahead with groups of two and happy_binary's 0/1 reward, equal groups dropped
/// (dynamic_sampling_rounds), full fine-tuning at a learning rate that moves the weights
/// enough for the checkpoints to be told apart, a checkpoint every step.
fn filtered_config(dir: &Path, steps: usize, dump: Option<&Path>) -> Map<String, Value> {
    let mut config = [
        ("adapter", json!("full")), ("lora_preset", Value::Null), ("lr", json!(1e-3)), ("beta", json!(0.0)), ("max_steps", json!(steps)),
        ("save_steps", json!(1)), ("eval_every", json!(steps)), ("num_generations", json!(2)), ("sampling_steps_ahead", json!(1)),
        ("dynamic_sampling_rounds", json!(8)),
    ]
    .into_iter()
    .fold(small_config(dir, &standard_plugin("happy_binary")), |c, (k, v)| with(c, k, v));
    if let Some(dump) = dump {
        config = with(config, "dump_batches", json!(dump));
    }
    config
}

/// One step ahead with equal groups dropped and tinker's ppo still learns (tiny-stories,
/// happy_count, as the on-policy learning tests, in groups of four so that some groups say
/// "happy" in none of their completions and are dropped).
#[test]
fn a_filtered_pipeline_with_ppo_raises_the_reward() {
    let overrides = [("sampling_steps_ahead", json!(1)), ("dynamic_sampling_rounds", json!(4)), ("loss_fn", json!("ppo")), ("num_generations", json!(4))];
    let metrics = super::learning::happy_count_metrics(&overrides);
    let dropped: u64 = column_u64(&metrics, key::DYNAMIC_SAMPLING_DROPPED).iter().sum();
    assert!(dropped > 0, "the run should drop groups of equal rewards");
    let (first, last) = super::learning::first_and_last(&metrics, &overrides);
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "the filtered pipeline did not raise the reward: {first:.3} -> {last:.3}");
}
