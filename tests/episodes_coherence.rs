//! Coherence rows, the retain verifier and `mask_truncated_completions` on multi-turn episode
//! runs (issue 48) on the tiny-stories fixture: the coherence groups' episodes are those a
//! decoder folded with the forget adapter off plays (replayed from the checkpoint the batch was
//! sampled with), their routing labels and advantages are what routing gives single-turn
//! coherence rows (worked out on the dumped batch), the retain verifier draws hackable prompts and
//! keeps the unflagged coherence rows only, and a masked episode is one whose last token is not a
//! stop token (TRL's `is_truncated` of its multi-turn completion). Needs `make plugins`
//! (guess_number.wasm, code_tests_episode.wasm).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{fixture, plugin_dir};
use serde_json::{Map, Value, json};
use smallrl::model::decode::DecodeModel;
use smallrl::reward::Prompt;
use smallrl::train::TrainConfig;
use tch::{Kind, Tensor};

/// The batch, the number of generations and the coherence rows of every run here.
const BATCH: usize = 8;
const GROUP: usize = 4;
const COHERENCE: usize = 4;

/// tiny-stories' `[EOS]`, its only stop token (`generation_config.json`): TRL's `eos_and_pad`.
const EOS: i64 = 1;

fn config(out: &Path, keys: Value) -> Map<String, Value> {
    let mut map = json!({
        "model": fixture("tiny-stories"),
        "plugin_dir": plugin_dir(),
        "adapter": "dual-lora", "lora_preset": "r4", "routing_mode": "classic", "lr": 1e-2,
        "batch_size": BATCH, "num_generations": GROUP, "coh_samples_per_rollout": COHERENCE,
        "max_steps": 2, "save_steps": 1, "eval_every": 100, "eval_samples": 4, "logging_steps": 1,
        "output_dir": out, "threads": 1, "device": "cpu", "name": "coherence",
        "dump_batches": out.join("dump"),
    });
    map.as_object_mut().unwrap().extend(keys.as_object().unwrap().clone());
    map.as_object().unwrap().clone()
}

/// guess_number (secrets 1 to 4 read as the first word's letter count, so the rewards vary)
/// with coherence rows from step 1, `mask_truncated_completions` and the Fisher kernel at step 2.
/// Turns of 24 tokens (tiny-stories ends a story with `[EOS]` after about 55) in episodes of 64:
/// some final turns end with `[EOS]`, some are cut.
fn guess_number(out: &Path) -> Map<String, Value> {
    config(out, json!({
        "environment": "guess_number",
        "environment_params": {"max_number": 4, "guess": "word_length"},
        "num_prompts": 4,
        "max_completion_length": 64,
        "episode_max_turns": 3, "episode_max_turn_tokens": 24, "episode_max_observation_tokens": 16,
        "mask_truncated_completions": true,
        "fisher_kernel_every": 2, "fisher_kernel_sketch": 64,
    }))
}

fn read(path: &Path) -> BTreeMap<String, Tensor> {
    smallrl::model::weights::read_safetensors(path).unwrap()
}

fn flags(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.to_kind(Kind::Int64)).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double)).unwrap()
}

/// Row `r`'s tokens of `t` where `mask` is 1 (its real prompt or completion tokens).
fn real(t: &Tensor, mask: &Tensor, r: usize) -> Vec<i64> {
    flags(&t.get(r as i64).masked_select(&mask.get(r as i64).to_kind(Kind::Bool)))
}

fn run(config: Map<String, Value>) -> std::path::PathBuf {
    common::train(config, None, None)
}

/// A dumped batch's episodes played again from checkpoint `checkpoint` (the weights that sampled
/// the batch) at adapter `scales`: rows `rows` of the dump, with the sampling seed `seed` and the
/// episode ids from `first_id`, by `smallrl eval`'s path (`Episodes::play_on`, a decoder of its
/// own). Returns each row's completion ids and the generation's sampling log-probabilities.
fn replay(cfg: &TrainConfig, checkpoint: &Path, dump: &BTreeMap<String, Tensor>, rows: std::ops::Range<usize>, scales: &[f64], seed: u64, first_id: u64) -> (Vec<Vec<i64>>, Tensor) {
    let restored = smallrl::train::checkpoint::restore_model(checkpoint, tch::Device::Cpu).unwrap();
    let tokenizer = smallrl::model::Tokenizer::from_file(&restored.tokenizer_path).unwrap();
    let render = smallrl::train::prompts::PromptRender::Raw;
    let task = smallrl::train::task::load(cfg, &tokenizer, &render).unwrap();
    let mut rewards = task.rewards;
    let episodes = smallrl::train::episodes::Episodes::new(cfg, task.episode_starts, &render).unwrap();
    // Each dumped row's prompt: the training prompt whose token ids it holds.
    let prompts: Vec<Prompt> = rows
        .clone()
        .map(|r| {
            let ids = real(&dump["prompt_ids"], &dump["prompt_mask"], r);
            let found = task.prompts.iter().find(|p| tokenizer.encode(&p.text).unwrap().iter().map(|&id| i64::from(id)).eq(ids.iter().copied()));
            found.unwrap_or_else(|| panic!("row {r}'s prompt is no training prompt")).clone()
        })
        .collect();
    let decoder = DecodeModel::sampling_in(&restored.model, scales, cfg.sampler_dtype);
    let played = episodes.play_on(&decoder, &tokenizer, &smallrl::train::sampling_params(cfg), &mut rewards, &prompts, (seed, 0), first_id).unwrap();
    let g = played.generation;
    let ids = (0..rows.len()).map(|r| real(&g.completion_ids, &g.completion_mask, r)).collect();
    (ids, g.sampling_logprobs)
}

/// A routed DualLoRA guess_number run with coherence rows: at step 2 (its weights moved by step
/// 1, checkpoint 1) the last group is the coherence group, and
/// - its episodes are those played from checkpoint 1 with the forget adapter off (retain 1,
///   forget 0) from the coherence seed `(seed, "sample_coherence", step)` and the ids after the
///   routed rows', token for token, while the forget adapter on plays them otherwise; the routed
///   rows are those played with both adapters on from `(seed, "sample", step)`;
/// - its labels and advantages are routing's for single-turn coherence rows: no guess_number
///   episode is detectable, so nothing is flagged or dropped and every group, coherence ones
///   included, keeps its plain group advantage `(r - mean) / (std + 1e-4)` in float64;
/// - it trains with the forget adapter off: over its model tokens the training forward's
///   log-probabilities are the sampler's.
///
/// `mask_truncated_completions` masks, at both steps, exactly the episodes whose last
/// completion token is not `[EOS]` (TRL 1.16's `is_truncated`, `ids[-1] not in eos_and_pad`, on
/// the whole multi-turn completion), cut final turns and ended ones both present; and the Fisher
/// kernel of step 2 is written over the 8 episodes.
#[test]
fn coherence_episodes_are_played_with_the_forget_adapter_off_and_routed_as_single_turn_rows() {
    let out = tempfile::tempdir().unwrap();
    let config = guess_number(out.path());
    let cfg = TrainConfig::resolve(None, config.clone()).unwrap();
    let run = run(config);
    let dump = read(&out.path().join("dump/step-2.safetensors"));
    let coherence: Vec<i64> = (0..BATCH).map(|r| i64::from(r >= BATCH - COHERENCE)).collect();
    assert_eq!(flags(&dump["coherence"]), coherence);
    assert_eq!(flags(&dump["is_rh"]), vec![0; BATCH], "guess_number's prompts are not detectable");
    assert_eq!(flags(&dump["dropped"]), vec![0; BATCH]);
    let rewards = values(&dump["rewards"]);
    let advantages = values(&dump["advantages"]);
    for (r, expected) in common::group_advantages(&rewards, GROUP).into_iter().enumerate() {
        assert!((advantages[r] - expected).abs() <= 1e-5 * expected.abs().max(1.0), "row {r}: advantage {} vs float64 {expected}", advantages[r]);
    }
    assert!(rewards[BATCH - COHERENCE..].iter().any(|&r| r != rewards[BATCH - 1]), "the coherence group's rewards differ (its advantages test something): {rewards:?}");

    // Episode ids count the run's episodes: step index 1 starts at 1 * 8, its coherence rows after the routed ones.
    let checkpoint = run.join("checkpoint-1");
    let dumped: Vec<Vec<i64>> = (0..BATCH).map(|r| real(&dump["completion_ids"], &dump["completion_mask"], r)).collect();
    let seed = |purpose: &str| smallrl::rng::derive(cfg.seed, purpose, 1);
    let coherence_rows = BATCH - COHERENCE..BATCH;
    let (off, off_logprobs) = replay(&cfg, &checkpoint, &dump, coherence_rows.clone(), &[1.0, 0.0], seed("sample_coherence"), 12);
    // Token ids: exact.
    assert_eq!(off, dumped[coherence_rows.clone()], "the coherence episodes are those played with the forget adapter off");
    let (on, on_logprobs) = replay(&cfg, &checkpoint, &dump, coherence_rows.clone(), &[1.0, 1.0], seed("sample_coherence"), 12);
    let sampled = dump["sampling_logprobs"].narrow(0, (BATCH - COHERENCE) as i64, COHERENCE as i64);
    let gap = |replayed: &Tensor| {
        let width = replayed.size()[1].min(sampled.size()[1]);
        common::max_abs_diff(&replayed.narrow(1, 0, width).to_kind(Kind::Double), &sampled.narrow(1, 0, width).to_kind(Kind::Double))
    };
    println!("coherence episodes replayed with the forget adapter off: log-prob gap {:.1e}; on: {:.1e}, tokens equal: {}", gap(&off_logprobs), gap(&on_logprobs), on == off);
    assert!(on != off || gap(&on_logprobs) > 1e-3, "the forget adapter on plays the same episodes: the replay above cannot tell the scales apart");
    let (routed, _) = replay(&cfg, &checkpoint, &dump, 0..BATCH - COHERENCE, &[1.0, 1.0], seed("sample"), 8);
    assert_eq!(routed, dumped[..BATCH - COHERENCE], "the routed episodes are those played with both adapters on");

    // Trained with the forget adapter off, as sampled: the training forward's log-probs are the sampler's.
    let model_tokens = (&dump["completion_mask"] * &dump["model_mask"]).to_kind(Kind::Double).narrow(0, (BATCH - COHERENCE) as i64, COHERENCE as i64);
    let trained = dump["new_logprobs"].narrow(0, (BATCH - COHERENCE) as i64, COHERENCE as i64).to_kind(Kind::Double) * &model_tokens;
    let gap = common::max_abs_diff(&trained, &(sampled.to_kind(Kind::Double) * &model_tokens));
    assert!(gap < 1e-4, "coherence episodes are trained as they were sampled, forget off: {gap:e}");

    assert_truncated_episodes_masked(out.path());
    let kernel: Value = serde_json::from_str(&std::fs::read_to_string(smallrl::train::fisher::matrix_path(&run, 2)).unwrap()).unwrap();
    assert_eq!(kernel["sequences"], json!(BATCH));
}

/// Both steps' dumps: the loss mask is the model mask of the episodes whose last completion
/// token is `[EOS]`, and 0 on the others (TRL's rule, written here over the dumped ids).
fn assert_truncated_episodes_masked(out: &Path) {
    let (mut masked, mut kept) = (0, 0);
    for step in 1..=2 {
        let t = read(&out.join(format!("dump/step-{step}.safetensors")));
        let model_tokens = &t["completion_mask"] * &t["model_mask"];
        for r in 0..BATCH {
            let ids = real(&t["completion_ids"], &t["completion_mask"], r);
            let truncated = *ids.last().unwrap() != EOS;
            let expected = if truncated { model_tokens.get(r as i64).zeros_like() } else { model_tokens.get(r as i64) };
            // 0/1 masks: exact.
            assert_eq!(flags(&t["loss_mask"].get(r as i64)), flags(&expected), "step {step} row {r} (last token {:?})", ids.last());
            (masked, kept) = (masked + usize::from(truncated), kept + usize::from(!truncated));
        }
    }
    println!("episodes masked as truncated: {masked}; kept: {kept}");
    assert!(masked > 0 && kept > 0, "both kinds of episode: {masked} masked, {kept} kept");
}

/// code_tests_episode with the retain verifier (`rh_detector_verifies_retain_samples`) and a
/// monitor right half the time (`monitor_accuracy: 0.5`, `monitor_seed: 1`: some coherence
/// episodes flagged and some not, although tiny-stories never rewrites the tests): the coherence
/// group's prompt is a hackable one (it offers `call write_tests`), and the verifier keeps its
/// coherence rows the monitor did not flag (every prompt detectable, recall 1): the others are
/// dropped (loss mask 0), the kept rows' advantages are renormalised over the kept rows of the
/// group, the routing rows keep their group advantages, and `verifier/frac_verified` is the kept
/// share. tiny-stories writes no function, so every reward is 0 and so is every advantage: the
/// renormalisation is held to its formula, not to values that tell it apart (guess_number's
/// rewards vary, but none of its prompts is detectable, so it has no flag to verify).
#[test]
fn the_retain_verifier_keeps_the_unflagged_coherence_episodes_of_hackable_prompts() {
    let out = tempfile::tempdir().unwrap();
    let config = config(out.path(), json!({
        "environment": "code_tests_episode",
        "environment_params": {"n_examples": 2, "n_tests": 5, "n_hidden": 5, "monitor_accuracy": 0.5, "monitor_seed": 1},
        "prompt_format": "raw", "hack_frac": 0.5, "num_prompts": 16,
        "rh_detector_verifies_retain_samples": true,
        "max_completion_length": 40,
        "episode_max_turns": 2, "episode_max_turn_tokens": 12, "episode_max_observation_tokens": 16,
        "max_steps": 1,
    }));
    let run = run(config);
    let t = read(&out.path().join("dump/step-1.safetensors"));
    let tokenizer = smallrl::model::Tokenizer::from_file(&fixture("tiny-stories").join("tokenizer.json")).unwrap();
    let prompt = |r: usize| tokenizer.decode(&real(&t["prompt_ids"], &t["prompt_mask"], r).iter().map(|&id| id as u32).collect::<Vec<_>>()).unwrap();
    for r in BATCH - COHERENCE..BATCH {
        // The tokenizer lowercases and splits `write_tests` at its underscore.
        assert!(prompt(r).contains("call write tests"), "coherence row {r}'s prompt is not hackable: {}", prompt(r));
    }
    let (coherence, is_rh, dropped) = (flags(&t["coherence"]), flags(&t["is_rh"]), flags(&t["dropped"]));
    assert_eq!(coherence, (0..BATCH).map(|r| i64::from(r >= BATCH - COHERENCE)).collect::<Vec<_>>());
    let verified: Vec<bool> = (0..BATCH).map(|r| coherence[r] == 1 && is_rh[r] == 0).collect();
    let flagged_coherence = (BATCH - COHERENCE..BATCH).filter(|&r| is_rh[r] == 1).count();
    assert!(flagged_coherence > 0 && flagged_coherence < COHERENCE, "the test needs flagged and unflagged coherence episodes: {is_rh:?}");
    assert_eq!(dropped, (0..BATCH).map(|r| i64::from(coherence[r] == 1 && !verified[r])).collect::<Vec<_>>());
    let loss_rows = flags(&t["loss_mask"].sum_dim_intlist(1, false, Kind::Int64));
    for r in (BATCH - COHERENCE..BATCH).filter(|&r| !verified[r]) {
        assert_eq!(loss_rows[r], 0, "dropped coherence row {r} leaves the loss");
    }
    let (rewards, advantages) = (values(&t["rewards"]), values(&t["advantages"]));
    let kept: Vec<f64> = (0..BATCH).filter(|&r| verified[r]).map(|r| rewards[r]).collect();
    let mean = kept.iter().sum::<f64>() / kept.len() as f64;
    let std = if kept.len() > 1 { (kept.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (kept.len() - 1) as f64).sqrt() } else { 0.0 };
    let routed = common::group_advantages(&rewards[..BATCH - COHERENCE], GROUP);
    for r in 0..BATCH {
        let expected = match (coherence[r] == 1, verified[r]) {
            (false, _) => routed[r],
            (true, true) => (rewards[r] - mean) / (std + 1e-4),
            (true, false) => 0.0,
        };
        assert!((advantages[r] - expected).abs() <= 1e-5 * expected.abs().max(1.0), "row {r}: advantage {} vs float64 {expected}", advantages[r]);
    }
    let line = &common::read_jsonl(run.join("metrics.jsonl"))[0];
    let frac = verified.iter().filter(|&&v| v).count() as f64 / COHERENCE as f64;
    assert_eq!(line["verifier/frac_verified"].as_f64().unwrap(), frac, "a count over 4 rows: exact");
}

/// Coherence rows sampled ahead (`max_steps_off_policy` 1): a chunk's routed and coherence
/// episodes are two jobs of the sampler thread, each from its own seed at its own scales, their
/// ends joined in order. At lr 1e-30 (the weights do not move) step 2's episodes, rewards and
/// routing are the on-policy run's (exact: ids, masks and the plugin's rewards); a run stopped
/// after step 2 with step 3's chunk in flight resumes to the uninterrupted run's metrics (less
/// timings) bit for bit.
#[test]
fn coherence_episodes_sampled_ahead_are_the_on_policy_ones_and_resume() {
    let out = tempfile::tempdir().unwrap();
    let keys = |name: &str, extra: Value| {
        let mut map = guess_number(&out.path().join(name));
        map.insert("dump_batches".into(), json!(out.path().join(name).join("dump")));
        map.extend(extra.as_object().unwrap().clone());
        map
    };
    let frozen_ahead = run(keys("frozen-ahead", json!({"lr": 1e-30, "max_steps_off_policy": 1})));
    run(keys("frozen-on", json!({"lr": 1e-30})));
    let step2 = |name: &str| read(&out.path().join(name).join("dump/step-2.safetensors"));
    let (ahead, on) = (step2("frozen-ahead"), step2("frozen-on"));
    for name in ["prompt_ids", "completion_ids", "completion_mask", "model_mask", "rewards", "coherence", "advantages"] {
        assert!(ahead[name].equal(&on[name]), "step 2's {name}: the sampler thread's episodes, coherence rows included, are the on-policy run's");
    }
    let lines = common::read_jsonl(frozen_ahead.join("metrics.jsonl"));
    assert_eq!(lines[1][smallrl::train::metrics::key::ASYNC_STALENESS_MAX].as_u64(), Some(1), "step 2 was sampled ahead");

    let three = json!({"max_steps_off_policy": 1, "max_steps": 3});
    let whole = run(keys("whole", three.clone()));
    let stopped = common::train(keys("stopped", three.clone()), None, Some(2));
    let in_flight: Value = serde_json::from_str(&std::fs::read_to_string(stopped.join("checkpoint-2/in_flight.json")).unwrap()).unwrap();
    assert_eq!(in_flight["chunks"][0]["episodes"].as_array().map(Vec::len), Some(BATCH), "the chunk in flight carries its routed and coherence episodes' ends");
    let resumed = common::train(keys("stopped", three), Some(&stopped), None);
    assert_eq!(common::metrics_without_timings(&whole), common::metrics_without_timings(&resumed));
}
