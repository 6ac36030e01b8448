//! Off-policy training (`max_steps_off_policy`): batches sampled ahead by the sampler thread
//! with older weights, the loss's ratio to them, exact resumption, learning.

use super::*;
use smallrl::engine::{Sequences, frozen_logprobs};
use tch::{Device, Kind};

/// With one step off policy, step n's batch (1-based) is sampled with the weights after step
/// n - 2 (the first two with the initial weights): the dumped sampler log-probabilities are,
/// within float32 sampling's rounding, the completions' log-probabilities under that
/// checkpoint recomputed in float64 (and far from those of the step's own weights); the
/// ratio's denominator is them, and the logged loss follows from the dump in float64 (TRL's
/// clipped surrogate with the ratio to the sampler).
#[test]
fn one_step_off_policy_samples_with_the_previous_weights_and_takes_the_ratio_to_them() {
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("dump");
    let config = [
        ("adapter", json!("full")), ("lora_preset", Value::Null), ("lr", json!(3e-3)), ("beta", json!(0.0)), ("max_steps", json!(3)),
        ("save_steps", json!(1)), ("eval_every", json!(3)), ("max_steps_off_policy", json!(1)), ("dump_batches", json!(dump)),
    ]
    .into_iter()
    .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let run = train(config);
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    let column = |key: &str| lines.iter().map(|l| l[key].as_u64().unwrap_or_else(|| panic!("{key} logged: {l}"))).collect::<Vec<_>>();
    assert_eq!(column(key::OFF_POLICY_VERSION), [0, 0, 1], "the versions of the weights that sampled steps 1-3");
    // tinker-cookbook 0.6.1's staleness metrics, under its names: one version per batch here.
    assert_eq!(column(key::ASYNC_STALENESS_MAX), [0, 1, 1]);
    assert_eq!(column(key::ASYNC_STALENESS_MIN), [0, 1, 1]);
    assert_eq!(lines.iter().map(|l| l[key::ASYNC_STALENESS_MEAN].as_f64().unwrap()).collect::<Vec<_>>(), [0.0, 1.0, 1.0]);

    let tensors = smallrl::model::weights::read_safetensors(&dump.join("step-3.safetensors")).unwrap();
    assert!(tensors["old_logprobs"].equal(&tensors["sampling_logprobs"]), "the ratio's denominator is the sampler's log-probabilities");
    let double = |key: &str| tensors[key].to_kind(Kind::Double);
    let mask = double("completion_mask");
    let under = |checkpoint: &str| {
        let model = smallrl::model::load(run.join(checkpoint).to_str().unwrap(), "main", Device::Cpu, Kind::Double).unwrap().model;
        let seqs = Sequences { prompt_ids: &tensors["prompt_ids"], prompt_mask: &tensors["prompt_mask"], completion_ids: &tensors["completion_ids"], completion_mask: &tensors["completion_mask"], kept: None };
        frozen_logprobs(&model, seqs, 1.0, &[]) * &mask
    };
    let sampled = double("sampling_logprobs") * &mask;
    let off_by_one = common::max_abs_diff(&sampled, &under("checkpoint-1"));
    let own = common::max_abs_diff(&sampled, &under("checkpoint-2"));
    assert!(off_by_one < 1e-4, "step 3's batch is sampled with the weights after step 1: {off_by_one:e}");
    assert!(own > 1e-2, "and not with step 3's own weights (the test would not see the difference): {own:e}");

    let ratio = (double("new_logprobs") - double("sampling_logprobs")).exp();
    let advantages = double("advantages").unsqueeze(1);
    let epsilon = 0.2;
    let per_token = -(&ratio * &advantages).minimum(&(ratio.clamp(1.0 - epsilon, 1.0 + epsilon) * &advantages));
    let per_sequence = (per_token * &mask).sum_dim_intlist(1, false, Kind::Double) / mask.sum_dim_intlist(1, false, Kind::Double);
    let expected = per_sequence.mean(Kind::Double).double_value(&[]);
    let logged = lines[2]["loss"].as_f64().unwrap();
    assert!((logged - expected).abs() < 1e-6, "logged loss {logged} vs recomputed {expected}");
}

/// Each step's logged sampler fingerprint is that of the weights that sampled its batch, two
/// steps off policy: step n's batch (1-based) was sampled by the weights after step n - 3
/// (`off_policy/policy_version`), whose fingerprint the test computes in float64 from that
/// checkpoint's weight file (the fixture's for version 0) with the sampler's formula written
/// out, within 1e-8 relative (the run's float32 scaling of q's rows; 3e-11 measured). The
/// versions' fingerprints differ by over 100 times the bound (8e-5 measured), so a batch logged
/// with another step's fingerprint fails.
#[test]
fn each_steps_sampler_fingerprint_is_that_of_the_weights_that_sampled_it() {
    let out = tempfile::tempdir().unwrap();
    let config = [
        ("adapter", json!("full")), ("lora_preset", Value::Null), ("lr", json!(3e-3)), ("beta", json!(0.0)), ("max_steps", json!(5)),
        ("save_steps", json!(1)), ("eval_every", json!(5)), ("max_steps_off_policy", json!(2)),
    ]
    .into_iter()
    .fold(small_config(out.path(), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
    let fixture = PathBuf::from(config["model"].as_str().unwrap());
    let run = train(config);
    let lines = read_jsonl(&run.join("metrics.jsonl"));
    let versions: Vec<usize> = lines.iter().map(|l| l[key::OFF_POLICY_VERSION].as_u64().unwrap() as usize).collect();
    assert_eq!(versions, [0, 0, 0, 1, 2], "the versions of the weights that sampled steps 1-5");
    let of_version = |v: usize| folded_fingerprint(&match v {
        0 => fixture.clone(),
        v => run.join(format!("checkpoint-{v}")),
    });
    let expected: Vec<f64> = (0..=2).map(of_version).collect();
    for (a, b) in [(0, 1), (1, 2), (0, 2)] {
        let apart = (expected[a] - expected[b]).abs() / expected[a].abs();
        assert!(apart > 1e-6, "versions {a} and {b} have fingerprints {} and {} (the test could not tell them apart)", expected[a], expected[b]);
    }
    for (step, (line, version)) in lines.iter().zip(&versions).enumerate() {
        let logged = line[key::SAMPLER_WEIGHTS_FINGERPRINT].as_f64().unwrap_or_else(|| panic!("step {} logs its fingerprint: {line}", step + 1));
        let want = expected[*version];
        assert!((logged - want).abs() <= 1e-8 * want.abs(), "step {}: logged fingerprint {logged}, the weights of version {version} have {want}", step + 1);
    }
}

/// The native sampler's weight fingerprint of the Llama model in `dir` (no adapters, float32),
/// from its safetensors in float64: the sum over the folded tensors of (k + 1) * (sum + sum of
/// squares), in the folded order (embeddings, final norm, head; per layer: input norm, the
/// q k rot(q) rot(k) v rows with q scaled by head_dim^-0.5, o, post-attention norm, gate and up,
/// down). A rotated row set is each head's second half negated then its first half: its squares
/// are the rows', its sum the first half's minus the second's.
fn folded_fingerprint(dir: &Path) -> f64 {
    let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let weights = smallrl::model::weights::read_safetensors(&dir.join("model.safetensors")).unwrap();
    let get = |name: &str| weights.get(name).unwrap_or_else(|| panic!("{}: no {name}", dir.display())).to_kind(Kind::Double);
    let sums = |t: &tch::Tensor| (t.sum(Kind::Double).double_value(&[]), t.square().sum(Kind::Double).double_value(&[]));
    let head_dim = config["head_dim"].as_i64().unwrap();
    let (sum_a_minus_b, scale) = (|t: &tch::Tensor| {
        let per_head = t.view([-1, head_dim, t.size()[1]]);
        (per_head.narrow(1, 0, head_dim / 2).sum(Kind::Double) - per_head.narrow(1, head_dim / 2, head_dim / 2).sum(Kind::Double)).double_value(&[])
    }, (head_dim as f64).powf(-0.5));
    let embed = get("model.embed_tokens.weight");
    let head = if config["tie_word_embeddings"].as_bool().unwrap() { embed.shallow_clone() } else { get("lm_head.weight") };
    let mut tensors = vec![sums(&embed), sums(&get("model.norm.weight")), sums(&head)];
    for layer in 0..config["num_hidden_layers"].as_i64().unwrap() {
        let w = |name: &str| get(&format!("model.layers.{layer}.{name}.weight"));
        let (q, k, v) = (w("self_attn.q_proj"), w("self_attn.k_proj"), w("self_attn.v_proj"));
        let ((sq, qq), (sk, qk), (sv, qv)) = (sums(&q), sums(&k), sums(&v));
        let qkv = (scale * sq + sk + scale * sum_a_minus_b(&q) + sum_a_minus_b(&k) + sv, 2.0 * scale * scale * qq + 2.0 * qk + qv);
        let ((sg, qg), (su, qu)) = (sums(&w("mlp.gate_proj")), sums(&w("mlp.up_proj")));
        tensors.extend([sums(&w("input_layernorm")), qkv, sums(&w("self_attn.o_proj")), sums(&w("post_attention_layernorm")), (sg + su, qg + qu), sums(&w("mlp.down_proj"))]);
    }
    tensors.iter().enumerate().map(|(k, (sum, squares))| (k + 1) as f64 * (sum + squares)).sum()
}

/// A run stopped past its newest checkpoint (whose batches sampled ahead it saved) and resumed
/// equals the run that was never stopped, with one and with two steps off policy.
#[test]
fn a_resumed_off_policy_run_repeats_the_uninterrupted_run_exactly() {
    for k in [1, 2] {
        let out = tempfile::tempdir().unwrap();
        let config = |dir: &str| with(routed_config(&out.path().join(dir)), "max_steps_off_policy", json!(k));
        let whole = train(config("a"));
        let resolved = TrainConfig::resolve(None, config("b")).unwrap();
        let mut first = Trainer::new(resolved.clone(), None).unwrap();
        let stopped = first.train(Some(3)).unwrap();
        drop(first);
        assert!(stopped.run_dir.join("checkpoint-2/in_flight.json").is_file(), "checkpoint 2 keeps the batches sampled ahead");
        let resumed = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap().train(None).unwrap();
        for file in ["metrics.jsonl", "routing_eval.jsonl"] {
            let (a, b) = (deterministic(read_jsonl(&whole.join(file))), deterministic(read_jsonl(&resumed.run_dir.join(file))));
            assert_same_metrics(&a, &b, &format!("k {k}: {file}"));
        }
        let staleness: Vec<u64> = read_jsonl(&whole.join("metrics.jsonl")).iter().map(|l| l[key::ASYNC_STALENESS_MAX].as_u64().unwrap()).collect();
        assert_eq!(staleness, (0..4).map(|n: u64| n.min(k)).collect::<Vec<_>>(), "k {k}: step n's batch is min(n, k) steps stale");
        let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-4/adapters.safetensors")).unwrap();
        let (a, b) = (weights(&whole), weights(&resumed.run_dir));
        for (name, tensor) in &a {
            assert!(tensor.equal(&b[name]), "k {k}: {name} differs after resumption");
        }
        let last: Value = serde_json::from_str(&std::fs::read_to_string(whole.join("checkpoint-4/in_flight.json")).unwrap()).unwrap();
        assert_eq!(last["chunks"], json!([]), "k {k}: nothing is sampled beyond the last step");
    }
}

/// A checkpoint written before the queue was one (`in_flight.json` a list of batches, each in
/// parts under `{i}.{part}.`) resumes as it did: checkpoint 2 of a run two steps off policy,
/// rewritten into that layout, resumes to the uninterrupted run's metrics and weights.
#[test]
fn an_off_policy_checkpoint_of_the_old_layout_resumes() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str| with(routed_config(&out.path().join(dir)), "max_steps_off_policy", json!(2));
    let whole = train(config("a"));
    let resolved = TrainConfig::resolve(None, config("b")).unwrap();
    let stopped = Trainer::new(resolved.clone(), None).unwrap().train(Some(2)).unwrap();
    let checkpoint = stopped.run_dir.join("checkpoint-2");
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(checkpoint.join("in_flight.json")).unwrap()).unwrap();
    let chunks = saved["chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), 2, "steps 3 and 4 in flight: {saved}");
    let old_index: Vec<Value> = chunks.iter().map(|c| json!({"step": c["index"], "policy_version": c["policy_version"], "parts": 1, "weights_fingerprint": c["weights_fingerprint"]})).collect();
    let tensors = smallrl::model::weights::read_safetensors(&checkpoint.join("in_flight.safetensors")).unwrap();
    let renamed: Vec<(String, tch::Tensor)> = tensors.into_iter().map(|(name, t)| {
        let (i, rest) = name.split_once('.').unwrap();
        (format!("{i}.0.{rest}"), t)
    }).collect();
    smallrl::model::weights::write_safetensors(&checkpoint.join("in_flight.safetensors"), &renamed).unwrap();
    std::fs::write(checkpoint.join("in_flight.json"), serde_json::to_string_pretty(&old_index).unwrap()).unwrap();
    let resumed = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap().train(None).unwrap();
    for file in ["metrics.jsonl", "routing_eval.jsonl"] {
        assert_same_metrics(&deterministic(read_jsonl(&whole.join(file))), &deterministic(read_jsonl(&resumed.run_dir.join(file))), file);
    }
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-4/adapters.safetensors")).unwrap();
    let (a, b) = (weights(&whole), weights(&resumed.run_dir));
    for (name, tensor) in &a {
        assert!(tensor.equal(&b[name]), "{name} differs after resuming the old layout");
    }
    let rewritten: Value = serde_json::from_str(&std::fs::read_to_string(resumed.run_dir.join("checkpoint-4/in_flight.json")).unwrap()).unwrap();
    assert!(rewritten["next_chunk"].is_u64(), "new checkpoints are written in the queue's layout: {rewritten}");
}

/// Sampling replay with a batch in flight: a run sampling one step ahead with top_k (kept sets
/// recorded, the ratio to the sampler renormalised over them) stopped past its newest
/// checkpoint, whose batch sampled ahead keeps its kept sets, and resumed equals the run that
/// was never stopped, bit for bit.
#[test]
fn a_resumed_off_policy_run_with_kept_sets_in_flight_repeats_the_uninterrupted_run_exactly() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str| with(with(routed_config(&out.path().join(dir)), "max_steps_off_policy", json!(1)), "top_k", json!(8));
    let whole = train(config("a"));
    let resolved = TrainConfig::resolve(None, config("b")).unwrap();
    let mut first = Trainer::new(resolved.clone(), None).unwrap();
    let stopped = first.train(Some(3)).unwrap();
    drop(first);
    let in_flight = smallrl::model::weights::read_safetensors(&stopped.run_dir.join("checkpoint-2/in_flight.safetensors")).unwrap();
    let kept: Vec<&String> = in_flight.keys().filter(|name| name.ends_with(".kept")).collect();
    assert!(!kept.is_empty(), "the batch sampled ahead keeps its kept sets: {:?}", in_flight.keys().collect::<Vec<_>>());
    assert_eq!(in_flight[kept[0]].size()[2], 16, "2 * top_k ids per token");
    let resumed = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap().train(None).unwrap();
    for file in ["metrics.jsonl", "routing_eval.jsonl"] {
        let (a, b) = (deterministic(read_jsonl(&whole.join(file))), deterministic(read_jsonl(&resumed.run_dir.join(file))));
        assert_same_metrics(&a, &b, file);
    }
    for line in read_jsonl(&whole.join("metrics.jsonl")) {
        let mass = line[key::REPLAY_KEPT_MASS_MEAN].as_f64().expect("the kept mass is logged");
        assert!(mass > 0.0 && mass < 1.0, "top_k 8 keeps part of the mass: {mass}");
    }
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-4/adapters.safetensors")).unwrap();
    let (a, b) = (weights(&whole), weights(&resumed.run_dir));
    for (name, tensor) in &a {
        assert!(tensor.equal(&b[name]), "{name} differs after resumption");
    }
}

/// One step off policy still learns (tiny-stories, happy_count, as the on-policy learning tests).
#[test]
fn one_step_off_policy_raises_the_reward() {
    let (first, last) = super::learning::happy_count_learning(&[("max_steps_off_policy", json!(1))]);
    assert!(first < 0.25, "the starting reward should be the pre-trained model's, got {first:.3}");
    assert!(last > first + 0.08, "one step off policy did not raise the reward: {first:.3} -> {last:.3}");
}

/// Keys that cannot go with a batch sampled ahead, or with streamed mini-batches, are refused by name.
#[test]
fn off_policy_training_refuses_what_needs_the_batch_at_its_step() {
    let out = tempfile::tempdir().unwrap();
    for (key, value, says) in [("num_iterations", json!(2), "one optimizer step per batch"), ("importance_sampling_correction", json!(true), "nothing left to correct")] {
        let config = with(with(small_config(out.path(), &standard_plugin("happy")), "max_steps_off_policy", json!(1)), key, value);
        let error = format!("{:#}", TrainConfig::resolve(None, config).err().expect("refused"));
        assert!(error.contains("max_steps_off_policy") && error.contains(says), "{key}: {error}");
    }
    let streamed = |pairs: &[(&str, Value)]| pairs.iter().fold(with(small_config(out.path(), &standard_plugin("happy")), "stream_minibatches", json!(true)), |c, (k, v)| with(c, k, v.clone()));
    for (pairs, says) in [
        (vec![], "set num_substeps above 1"),
        (vec![("num_substeps", json!(2)), ("scale_rewards", json!("batch"))], "each mini-batch's standard deviation"),
        (vec![("num_substeps", json!(2)), ("coh_samples_per_rollout", json!(4))], "coherence rows belong to a whole batch"),
    ] {
        let error = format!("{:#}", TrainConfig::resolve(None, streamed(&pairs)).err().expect("refused"));
        assert!(error.contains("stream_minibatches") && error.contains(says), "{pairs:?}: {error}");
    }
}

/// The process killed (SIGKILL) once its first checkpoint exists, wherever it then is, and
/// resumed with `smallrl train --resume`, ends where the run that was never killed ends.
#[test]
fn an_off_policy_run_killed_and_resumed_equals_the_uninterrupted_run() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str| [("max_steps_off_policy", json!(1)), ("max_steps", json!(8)), ("eval_every", json!(4))].into_iter().fold(routed_config(&out.path().join(dir)), |c, (k, v)| with(c, k, v));
    let whole = train(config("a"));
    let file = out.path().join("b.yaml");
    std::fs::write(&file, serde_json::to_string(&Value::Object(config("b"))).unwrap()).unwrap();
    let run = out.path().join("b").join(whole.file_name().unwrap());
    common::train_killed_at_checkpoint(&file, &run, "checkpoint-2");
    assert!(!run.join("checkpoint-8").exists(), "killed before its end");
    common::smallrl_ok(&["train", "--resume", run.to_str().unwrap()]);
    for file in ["metrics.jsonl", "routing_eval.jsonl"] {
        assert_same_metrics(&deterministic(read_jsonl(&whole.join(file))), &deterministic(read_jsonl(&run.join(file))), file);
    }
    let weights = |dir: &Path| smallrl::model::weights::read_safetensors(&dir.join("checkpoint-8/adapters.safetensors")).unwrap();
    let (a, b) = (weights(&whole), weights(&run));
    for (name, tensor) in &a {
        assert!(tensor.equal(&b[name]), "{name} differs after the kill and resumption");
    }
}

/// Streamed mini-batches (tinker's StreamMinibatchConfig): with `num_substeps: 2` each optimizer
/// step trains one of the batch's two groups, the second sampled by the sampler thread from the
/// weights at the batch's first step (one step stale); the groups and their order are those of
/// the same run unstreamed; step 4's sampler log-probabilities are the completions'
/// log-probabilities under checkpoint 2 (the batch's first weights) in float64, not under
/// checkpoint 3; stopped inside a batch and resumed, the run equals the uninterrupted one.
#[test]
fn streamed_mini_batches_train_each_group_as_it_arrives_from_the_batch_weights() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str, stream: bool| {
        [
            ("adapter", json!("full")), ("lora_preset", Value::Null), ("lr", json!(3e-3)), ("beta", json!(0.0)), ("num_substeps", json!(2)),
            ("save_steps", json!(if stream { 1 } else { 2 })), ("stream_minibatches", json!(stream)), ("log_completions", json!(true)),
        ]
        .into_iter()
        .fold(small_config(&out.path().join(dir), &standard_plugin("happy")), |c, (k, v)| with(c, k, v))
    };
    let streamed = train(config("streamed", true));
    let lines = read_jsonl(&streamed.join("metrics.jsonl"));
    let column = |key: &str| lines.iter().map(|l| l[key].as_u64().unwrap_or_else(|| panic!("{key} logged: {l}"))).collect::<Vec<_>>();
    assert_eq!(column(key::OFF_POLICY_VERSION), [0, 0, 2, 2], "each batch's mini-batches are sampled with its first step's weights");
    assert_eq!(column(key::ASYNC_STALENESS_MAX), [0, 1, 0, 1]);

    let prompts = |run: &Path| read_jsonl(&run.join("completions.jsonl")).iter().map(|l| l["prompt"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    let unstreamed = train(config("unstreamed", false));
    assert_eq!(prompts(&streamed), prompts(&unstreamed), "the same groups in the same order");

    // Checkpoint 3 holds step 4's group, sampled ahead and not yet trained on.
    let batch = smallrl::model::weights::read_safetensors(&streamed.join("checkpoint-3/in_flight.safetensors")).unwrap();
    let under = |checkpoint: &str| -> tch::Tensor {
        let model = smallrl::model::load(streamed.join(checkpoint).to_str().unwrap(), "main", Device::Cpu, Kind::Double).unwrap().model;
        let seqs = Sequences { prompt_ids: &batch["0.prompt_ids"], prompt_mask: &batch["0.prompt_mask"], completion_ids: &batch["0.completion_ids"], completion_mask: &batch["0.completion_mask"], kept: None };
        frozen_logprobs(&model, seqs, 1.0, &[]) * batch["0.completion_mask"].to_kind(Kind::Double)
    };
    let sampled = batch["0.sampling_logprobs"].to_kind(Kind::Double) * batch["0.completion_mask"].to_kind(Kind::Double);
    let batch_start = common::max_abs_diff(&sampled, &under("checkpoint-2"));
    let step_before = common::max_abs_diff(&sampled, &under("checkpoint-3"));
    assert!(batch_start < 1e-4, "step 4's group is sampled with the weights after step 2: {batch_start:e}");
    assert!(step_before > 1e-2, "not with those after step 3: {step_before:e}");

    let resolved = TrainConfig::resolve(None, config("resumed", true)).unwrap();
    let stopped = Trainer::new(resolved.clone(), None).unwrap().train(Some(3)).unwrap();
    let resumed = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap().train(None).unwrap();
    assert_same_metrics(&deterministic(lines.clone()), &deterministic(read_jsonl(&resumed.run_dir.join("metrics.jsonl"))), "streamed metrics.jsonl");
}

/// Two resumption bugs peers shipped: an asynchronous resume that skipped or repeated prompts
/// (NeMo-RL#3599) and a restore that re-seeded the sampling streams (ms-swift#9935). A run two
/// steps off policy, stopped after step 3 with batches in flight and resumed from checkpoint 2,
/// draws every step's prompts and completions exactly as the uninterrupted run does, and no
/// prompt twice within the epoch (200 prompts, 2 a step).
#[test]
fn an_off_policy_resume_neither_skips_nor_repeats_prompts_nor_reseeds_sampling() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str| {
        let config = with(small_config(&out.path().join(dir), &standard_plugin("happy")), "max_steps_off_policy", json!(2));
        with(config, "log_completions", json!(true))
    };
    let whole = train(config("whole"));
    let resolved = TrainConfig::resolve(None, config("resumed")).unwrap();
    let stopped = Trainer::new(resolved.clone(), None).unwrap().train(Some(3)).unwrap();
    assert!(stopped.run_dir.join("checkpoint-2/in_flight.json").is_file(), "checkpoint 2 keeps the batches sampled ahead");
    let resumed = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap().train(None).unwrap().run_dir;
    // (step, prompt, completion) of every completion logged, in order.
    let drawn = |run: &Path| -> Vec<(u64, String, String)> {
        let line = |l: &Value| (l["step"].as_u64().unwrap(), l["prompt"].as_str().unwrap().to_owned(), l["completion"].as_str().unwrap().to_owned());
        read_jsonl(&run.join("completions.jsonl")).iter().map(line).collect()
    };
    let (expected, got) = (drawn(&whole), drawn(&resumed));
    assert_eq!(expected.iter().map(|d| d.0).collect::<Vec<_>>(), (1..=4).flat_map(|step| [step; 8]).collect::<Vec<_>>(), "8 completions a step, each step once");
    for (want, have) in expected.iter().zip(&got) {
        assert_eq!(want.1, have.1, "step {}: the resumed run drew another prompt", want.0);
        assert_eq!(want.2, have.2, "step {}: the resumed run sampled another completion from the same prompt", want.0);
    }
    assert_eq!(expected.len(), got.len());
    let mut prompts: Vec<&str> = expected.chunks(4).map(|group| group[0].1.as_str()).collect();
    prompts.sort();
    prompts.dedup();
    assert_eq!(prompts.len(), 8, "the 4 steps' 8 groups have 8 different prompts within the epoch");
}

/// The weight-delivery check (verl#7495: an adapter that never reached the sampler looked like
/// staleness for two months): with the samplers' refresh broken after step 1 (a test hook),
/// the next sampling from an updated policy stops the run with the check's error, on policy
/// (the run's decoder, float32 and bfloat16: the native copy's rounded panels are compared
/// with the fold) and one step off policy (the sampler thread's snapshot). Every other test's
/// runs pass the check at every sampling.
#[test]
fn a_policy_update_that_never_reaches_the_sampler_stops_the_run() {
    for (k, dtype, sampler) in [(0, "float32", "the run's sampler holds"), (0, "bfloat16", "the run's sampler holds"), (1, "float32", "the run's sampler thread holds")] {
        let out = tempfile::tempdir().unwrap();
        let keys = [("adapter", json!("full")), ("lora_preset", Value::Null), ("lr", json!(3e-3)), ("beta", json!(0.0)), ("max_steps_off_policy", json!(k))];
        let dtype_keys = [("sampler_dtype", json!(dtype)), ("importance_sampling_correction", json!(dtype == "bfloat16"))];
        let config = keys
            .into_iter()
            .chain(dtype_keys)
            .fold(small_config(out.path(), &standard_plugin("happy")), |c, (key, value)| with(c, key, value));
        let mut trainer = Trainer::new(TrainConfig::resolve(None, config).unwrap(), None).unwrap();
        trainer.train(Some(1)).unwrap();
        trainer.break_weight_refresh_for_tests();
        let error = format!("{:#}", trainer.train(Some(2)).err().unwrap_or_else(|| panic!("k {k} {dtype}: the updated policy never reached the sampler, unnoticed")));
        assert!(error.contains("the weight-delivery check failed") && error.contains(sampler), "k {k} {dtype}: {error}");
    }
}
