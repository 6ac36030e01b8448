//! Episode runs sampled ahead (issue 48, item 5): `max_steps_off_policy`, `sampling_steps_ahead`
//! and `stream_minibatches` on guess_number (tiny-stories), the run's sampler thread playing
//! each chunk's episodes with its own instance of the environment. Step n's episodes are played
//! by the weights of step n - 1 and the ratio is to their log-probabilities over the model's
//! tokens only; a run stopped or killed with episodes in flight resumes bit for bit; the second
//! instance failing stops the run naming the plugin's file. Needs `make plugins`.

mod common;

use std::path::Path;

use common::{max_abs_diff, metrics_without_timings, read_jsonl, train};
use serde_json::{Map, Value, json};
use smallrl::engine::{Sequences, frozen_logprobs};
use smallrl::train::metrics::key;
use tch::{Device, Kind, Tensor};

/// guess_number's tiny-stories run (`common::guess_number::tiny_stories_config`) with full
/// fine-tuning, beta 0 and grpo's loss, 2 prompts of 4 episodes, 4 steps, a checkpoint every 2;
/// `overrides` on top.
fn config(out: &Path, overrides: &[(&str, Value)]) -> Map<String, Value> {
    let keys = [("adapter", json!("full")), ("beta", json!(0.0)), ("loss_type", json!("grpo")), ("batch_size", json!(8)), ("max_steps", json!(4)), ("save_steps", json!(2))];
    let mut map = common::guess_number::tiny_stories_config(out, &keys);
    map.remove("lora_rank");
    map.remove("lora_alpha");
    for (key, value) in overrides {
        map.insert((*key).into(), value.clone());
    }
    map
}

fn read(path: &Path) -> std::collections::BTreeMap<String, Tensor> {
    smallrl::model::weights::read_safetensors(path).unwrap()
}

fn column_u64(lines: &[Value], key: &str) -> Vec<u64> {
    lines.iter().map(|l| l[key].as_u64().unwrap_or_else(|| panic!("{key} logged: {l}"))).collect()
}

/// The final checkpoint's weights of two runs are the same bits.
fn assert_same_weights(a: &Path, b: &Path, checkpoint: &str) {
    let (x, y) = (read(&a.join(checkpoint).join("model.safetensors")), read(&b.join(checkpoint).join("model.safetensors")));
    assert_eq!(x.len(), y.len());
    for (name, tensor) in &x {
        assert!(tensor.equal(&y[name]), "{checkpoint}: {name} differs");
    }
}

/// One step off policy: step 3's episodes were played by the weights after step 1: their dumped
/// sampler log-probabilities on the model's tokens are those of checkpoint 1 recomputed in
/// float64 (and far from checkpoint 2's), 0 on observation tokens. The ratio's denominator is
/// the sampler's log-probabilities, and the logged loss (grpo, beta 0) and
/// `kl_sample_train_v1` follow from the dump in float64 over the model's tokens only (with the
/// observations in, both would differ). At lr 1e-30 (an update far below float32's resolution of
/// the weights: they do not move, and lr 0 is refused) the sampler thread's
/// episodes of step 2 are the on-policy run's (the same prompts, seeds and episode ids: token
/// ids, masks and rewards equal; exact, as ids and integers).
#[test]
fn one_step_off_policy_episodes_are_played_by_the_previous_weights_and_the_ratio_is_over_model_tokens() {
    let out = tempfile::tempdir().unwrap();
    let dump = |name: &str| out.path().join(format!("dump-{name}"));
    let keys = |name: &str, steps: usize| vec![("max_steps", json!(steps)), ("save_steps", json!(1)), ("dump_batches", json!(dump(name)))];
    let ahead = |mut keys: Vec<(&'static str, Value)>| {
        keys.push(("max_steps_off_policy", json!(1)));
        keys
    };
    let run = train(config(&out.path().join("off"), &ahead(keys("off", 3))), None, None);
    let lines = read_jsonl(run.join("metrics.jsonl"));
    assert_eq!(column_u64(&lines, key::OFF_POLICY_VERSION), [0, 0, 1], "the versions of the weights that played steps 1-3");
    assert_eq!(column_u64(&lines, key::ASYNC_STALENESS_MAX), [0, 1, 1]);

    let frozen = |mut keys: Vec<(&'static str, Value)>| {
        keys.push(("lr", json!(1e-30)));
        keys
    };
    let still_ahead = train(config(&out.path().join("still-off"), &ahead(frozen(keys("still-off", 2)))), None, None);
    let still_on = train(config(&out.path().join("still-on"), &frozen(keys("still-on", 2))), None, None);
    let (ahead_lines, on_lines) = (read_jsonl(still_ahead.join("metrics.jsonl")), read_jsonl(still_on.join("metrics.jsonl")));
    let (ahead_step2, on_step2) = (read(&dump("still-off").join("step-2.safetensors")), read(&dump("still-on").join("step-2.safetensors")));
    for name in ["prompt_ids", "completion_ids", "completion_mask", "model_mask", "rewards"] {
        assert!(ahead_step2[name].equal(&on_step2[name]), "step 2's {name}: the sampler thread's episodes are the on-policy run's");
    }
    for metric in ["reward", smallrl::train::episodes::TURNS, smallrl::train::episodes::OBSERVATION_TOKENS] {
        assert_eq!(ahead_lines[1][metric], on_lines[1][metric], "step 2's {metric}");
    }

    let t = read(&dump("off").join("step-3.safetensors"));
    assert!(t["old_logprobs"].equal(&t["sampling_logprobs"]), "the ratio's denominator is the sampler's log-probabilities");
    let double = |name: &str| t[name].to_kind(Kind::Double);
    let (completion, mask) = (double("completion_mask"), double("loss_mask"));
    assert!(mask.equal(&(&completion * double("model_mask"))), "the loss mask is the model's tokens");
    let observations = &completion - &mask;
    assert!(observations.sum(Kind::Double).double_value(&[]) > 0.0, "some episode had an observation");
    let sampled = double("sampling_logprobs");
    assert_eq!((&sampled * &observations).abs().max().double_value(&[]), 0.0, "observation tokens carry no sampling log-probability");
    let under = |checkpoint: &str| {
        let model = smallrl::model::load(run.join(checkpoint).to_str().unwrap(), "main", Device::Cpu, Kind::Double).unwrap().model;
        let seqs = Sequences { prompt_ids: &t["prompt_ids"], prompt_mask: &t["prompt_mask"], completion_ids: &t["completion_ids"], completion_mask: &t["completion_mask"], kept: None };
        frozen_logprobs(&model, seqs, 1.0, &[]) * &mask
    };
    let played_by = max_abs_diff(&(&sampled * &mask), &under("checkpoint-1"));
    let own = max_abs_diff(&(&sampled * &mask), &under("checkpoint-2"));
    assert!(played_by < 1e-4, "step 3's episodes were played by the weights after step 1: {played_by:e}");
    assert!(own > 1e-2, "and not by step 3's own (the test would not see the difference): {own:e}");

    let new = double("new_logprobs");
    let ratio = (&new - &sampled).exp();
    let advantages = double("advantages").unsqueeze(1);
    let epsilon = 0.2;
    let per_token = -(&ratio * &advantages).minimum(&(ratio.clamp(1.0 - epsilon, 1.0 + epsilon) * &advantages));
    let loss_over = |m: &Tensor| ((&per_token * m).sum_dim_intlist(1, false, Kind::Double) / m.sum_dim_intlist(1, false, Kind::Double)).mean(Kind::Double).double_value(&[]);
    let (want, with_observations) = (loss_over(&mask), loss_over(&completion));
    let logged = lines[2]["loss"].as_f64().unwrap();
    assert!((logged - want).abs() < 1e-6, "logged loss {logged} vs float64 over the model's tokens {want}");
    assert!((with_observations - want).abs() > 1e-4, "a loss that tests the mask: {with_observations} with the observations in");
    let kl_over = |m: &Tensor| ((&sampled - &new) * m).sum(Kind::Double).double_value(&[]) / m.sum(Kind::Double).double_value(&[]);
    let kl = lines[2][key::KL_SAMPLE_TRAIN_V1].as_f64().unwrap();
    let kl64 = kl_over(&mask);
    assert!((kl - kl64).abs() <= 1e-6 + 1e-5 * kl64.abs(), "kl_sample_train_v1 {kl} vs float64 over the model's tokens {kl64}");
    assert!((kl_over(&completion) - kl64).abs() > 1e-3, "the observations would change kl_sample_train_v1");
}

/// Stopped after step 3 (checkpoint 2 holds the chunk of step 3's episodes, played ahead, with
/// their ends) and resumed, a run one and two steps off policy writes the uninterrupted run's
/// metrics (less timings) and final weights, bit for bit.
#[test]
fn an_episode_run_stopped_with_episodes_in_flight_resumes_to_the_uninterrupted_run() {
    for k in [1, 2] {
        let out = tempfile::tempdir().unwrap();
        let keys = [("max_steps_off_policy", json!(k))];
        let whole = train(config(&out.path().join("a"), &keys), None, None);
        let stopped = train(config(&out.path().join("b"), &keys), None, Some(3));
        let in_flight: Value = serde_json::from_str(&std::fs::read_to_string(stopped.join("checkpoint-2/in_flight.json")).unwrap()).unwrap();
        let chunks = in_flight["chunks"].as_array().unwrap();
        assert_eq!(chunks.len(), k as usize, "k {k}: checkpoint 2 holds the chunks played ahead");
        assert_eq!(chunks[0]["episodes"].as_array().map(Vec::len), Some(8), "k {k}: a chunk in flight carries its 8 episodes' ends");
        let resumed = train(config(&out.path().join("b"), &keys), Some(&stopped), None);
        assert_eq!(metrics_without_timings(&whole).len(), 4);
        assert_eq!(metrics_without_timings(&whole), metrics_without_timings(&resumed), "k {k}: metrics.jsonl");
        assert_same_weights(&whole, &resumed, "checkpoint-4");
    }
}

/// `smallrl train` one step off policy, killed (SIGKILL) once its first checkpoint exists
/// (whose in-flight chunk holds step 3's episodes), wherever the run then is, and resumed with
/// `--resume`, writes the uninterrupted run's metrics (less timings) and final weights.
#[test]
fn an_episode_run_killed_with_episodes_in_flight_resumes_to_the_uninterrupted_run() {
    let out = tempfile::tempdir().unwrap();
    let keys = [("max_steps_off_policy", json!(1)), ("max_steps", json!(6))];
    let whole = train(config(&out.path().join("a"), &keys), None, None);
    let file = out.path().join("b.yaml");
    std::fs::write(&file, Value::Object(config(&out.path().join("b"), &keys)).to_string()).unwrap();
    let run = out.path().join("b").join(whole.file_name().unwrap());
    common::train_killed_at_checkpoint(&file, &run, "checkpoint-2");
    assert!(!run.join("checkpoint-6").exists(), "killed before its end");
    common::smallrl_ok(&["train", "--resume", run.to_str().unwrap()]);
    assert_eq!(metrics_without_timings(&whole), metrics_without_timings(&run));
    assert_same_weights(&whole, &run, "checkpoint-6");
}

/// Without a group filter `sampling_steps_ahead` 1 is `max_steps_off_policy` 1 on episodes too
/// (the same chunks played by the same weights: metrics less timings equal); streamed
/// mini-batches (`num_substeps` 2) train each batch's second group one step stale and, stopped
/// inside a batch and resumed, equal their uninterrupted run.
#[test]
fn sampling_steps_ahead_and_streamed_episode_runs_run_and_resume() {
    let out = tempfile::tempdir().unwrap();
    let exact = train(config(&out.path().join("exact"), &[("max_steps_off_policy", json!(1))]), None, None);
    let pipeline = train(config(&out.path().join("pipeline"), &[("sampling_steps_ahead", json!(1))]), None, None);
    assert_eq!(metrics_without_timings(&exact), metrics_without_timings(&pipeline));

    let streamed = [("stream_minibatches", json!(true)), ("num_substeps", json!(2)), ("save_steps", json!(1))];
    let whole = train(config(&out.path().join("streamed"), &streamed), None, None);
    let lines = read_jsonl(whole.join("metrics.jsonl"));
    assert_eq!(column_u64(&lines, key::OFF_POLICY_VERSION), [0, 0, 2, 2], "each batch's mini-batches are played with its first step's weights");
    assert_eq!(column_u64(&lines, key::ASYNC_STALENESS_MAX), [0, 1, 0, 1]);
    let stopped = train(config(&out.path().join("streamed-b"), &streamed), None, Some(3));
    let resumed = train(config(&out.path().join("streamed-b"), &streamed), Some(&stopped), None);
    assert_eq!(metrics_without_timings(&whole), metrics_without_timings(&resumed));
    assert_same_weights(&whole, &resumed, "checkpoint-4");
}

/// The sampler thread's instance of the environment failing to start stops the run before its
/// directory is written, naming the plugin's file.
#[test]
fn a_second_environment_instance_that_fails_stops_the_run_naming_the_plugin() {
    let out = tempfile::tempdir().unwrap();
    common::one_thread();
    let cfg = smallrl::train::TrainConfig::resolve(None, config(out.path(), &[("max_steps_off_policy", json!(1))])).unwrap();
    smallrl::plugins::refuse_another_instance_for_tests();
    let error = format!("{:#}", smallrl::train::Trainer::new(cfg, None).err().expect("the run stops"));
    assert!(error.contains("guess_number.wasm") && error.contains("cannot start a second instance") && error.contains("max_steps_off_policy"), "{error}");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "no run directory was written");
}

/// Two runs one step off policy packed (each run's sampler thread plays its own episodes with
/// its own environment instance, never stacked; the CPU default stacks no pass) are their solo
/// runs bit for bit: metrics less timings and final weights.
#[test]
fn packed_episode_runs_sampled_ahead_equal_their_solo_runs() {
    use smallrl::train::packed::{PackOptions, PackedRun, train_packed_with};
    let out = tempfile::tempdir().unwrap();
    let pair = |dir: &str| -> Vec<Map<String, Value>> {
        let keys = |seed: u64, lr: f64| vec![("max_steps_off_policy", json!(1)), ("seed", json!(seed)), ("lr", json!(lr)), ("name", json!(format!("guess-{seed}")))];
        vec![config(&out.path().join(dir), &keys(1, 3e-3)), config(&out.path().join(dir), &keys(2, 1e-3))]
    };
    let alone: Vec<_> = pair("alone").into_iter().map(|c| train(c, None, None)).collect();
    assert_ne!(metrics_without_timings(&alone[0]), metrics_without_timings(&alone[1]), "the two runs differ");
    common::one_thread();
    let runs = pair("packed").into_iter().map(|c| PackedRun { config: smallrl::train::TrainConfig::resolve(None, c).unwrap(), resume: None }).collect();
    let packed: Vec<_> = train_packed_with(runs, None, PackOptions::default()).unwrap().into_iter().map(|outcome| outcome.unwrap().run_dir).collect();
    for (alone, packed) in alone.iter().zip(&packed) {
        assert_eq!(metrics_without_timings(alone), metrics_without_timings(packed), "{}", packed.display());
        assert_same_weights(alone, packed, "checkpoint-4");
    }
}

/// A filtered pipeline on episodes (`sampling_steps_ahead` 1 with `dynamic_sampling_rounds`:
/// groups whose 4 episodes have equal rewards dropped, a chunk's surplus carried, a step that
/// runs out playing a chunk itself on the run's own instance) stopped after step 3 and resumed
/// equals its uninterrupted run bit for bit.
#[test]
fn a_filtered_episode_pipeline_resumes_to_the_uninterrupted_run() {
    let out = tempfile::tempdir().unwrap();
    let keys = [("sampling_steps_ahead", json!(1)), ("dynamic_sampling_rounds", json!(4)), ("batch_size", json!(16))];
    let whole = train(config(&out.path().join("a"), &keys), None, None);
    let lines = read_jsonl(whole.join("metrics.jsonl"));
    let dropped: u64 = column_u64(&lines, key::DYNAMIC_SAMPLING_DROPPED).iter().sum();
    assert!(dropped > 0, "the test needs groups of equal rewards");
    let stopped = train(config(&out.path().join("b"), &keys), None, Some(3));
    let resumed = train(config(&out.path().join("b"), &keys), Some(&stopped), None);
    assert_eq!(metrics_without_timings(&whole), metrics_without_timings(&resumed));
    assert_same_weights(&whole, &resumed, "checkpoint-4");
}
