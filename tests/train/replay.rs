//! Offline repair (`replay_rollouts`): a run trained on another run's recorded rollouts, with
//! its own intervention, and the ratio to the recorded sampler.

use super::*;
use tch::{Kind, Tensor};

fn recorded(dir: &Path, step: usize) -> std::collections::BTreeMap<String, Tensor> {
    smallrl::model::weights::read_safetensors(&dir.join(format!("step-{step}.safetensors"))).unwrap()
}

/// A run with the monitor (any "happy") and no intervention records its rollouts; a second run
/// replays them with `intervention: filter`. The replay trains on exactly the recorded
/// completions, samples nothing, takes its ratio to the recorded sampler's log-probabilities,
/// drops the flagged rows, and its logged loss follows in float64 from its dump: TRL's clipped
/// surrogate with the ratio to the sampler, each kept row's token mean, summed over the kept
/// rows and divided by all the batch's rows (the filter's class weight `n_kept / n`).
#[test]
fn a_replay_trains_on_the_recorded_rollouts_with_its_own_intervention() {
    let out = tempfile::tempdir().unwrap();
    let monitored = |dir: &str| {
        let config = with(small_config(&out.path().join(dir), &standard_plugin("happy")), "beta", json!(0.0));
        let config = with(config, "rh_detector", json!({"plugin": "happy_count", "params": {"threshold": 1}}));
        with(config, "plugin_dir", json!(repo_root().join("plugins")))
    };
    let (recorded_dir, replay_dump) = (out.path().join("recorded-dump"), out.path().join("replay-dump"));
    train(with(monitored("recorded"), "dump_batches", json!(recorded_dir)));
    let replay = with(with(with(monitored("replay"), "replay_rollouts", json!(recorded_dir)), "intervention", json!("filter")), "dump_batches", json!(replay_dump));
    let run = train(replay);
    assert!(run.file_name().unwrap().to_str().unwrap().contains("_replay"), "the run's name says it replays: {}", run.display());

    let lines = read_jsonl(&run.join("metrics.jsonl"));
    let (mut dropped_rows, mut changed_advantages) = (0, false);
    for (line, step) in lines.iter().zip(1..) {
        let (original, replayed) = (recorded(&recorded_dir, step), recorded(&replay_dump, step));
        assert!(original["completion_ids"].equal(&replayed["completion_ids"]), "step {step}: the recorded completions");
        assert!(replayed["old_logprobs"].equal(&original["sampling_logprobs"]), "step {step}: the ratio to the recorded sampler");
        assert_eq!(line[key::TIMING_GENERATE].as_f64(), Some(0.0), "step {step}: nothing sampled");
        let double = |key: &str| replayed[key].to_kind(Kind::Double);
        let (mask, advantages) = (double("loss_mask"), double("advantages"));
        // A filtered row keeps its completion but no loss token.
        let filtered = double("completion_mask").sum_dim_intlist(1, false, Kind::Double).gt(0.0).logical_and(&mask.sum_dim_intlist(1, false, Kind::Double).eq(0.0));
        dropped_rows += filtered.sum(Kind::Int64).int64_value(&[]) as usize;
        changed_advantages |= !original["advantages"].equal(&replayed["advantages"]);
        let ratio = (double("new_logprobs") - double("old_logprobs")).exp();
        let a = advantages.unsqueeze(1);
        let per_token = -(&ratio * &a).minimum(&(ratio.clamp(0.8, 1.2) * &a));
        let tokens = mask.sum_dim_intlist(1, false, Kind::Double).clamp_min(1.0);
        let rows = mask.size()[0] as f64;
        let expected = ((per_token * &mask).sum_dim_intlist(1, false, Kind::Double) / tokens).sum(Kind::Double).double_value(&[]) / rows;
        let logged = line[key::LOSS].as_f64().unwrap();
        assert!((logged - expected).abs() < 1e-6, "step {step}: logged loss {logged} vs recomputed {expected}");
    }
    assert!(dropped_rows > 0 && changed_advantages, "the monitor flagged some recorded rows, which the filter dropped from the loss and the group statistics ({dropped_rows} rows)");

    // Another seed draws other prompts: the replay stops at step 1, naming the file.
    let other = with(with(monitored("other"), "replay_rollouts", json!(recorded_dir)), "seed", json!(7));
    one_thread();
    let error = Trainer::new(TrainConfig::resolve(None, other).unwrap(), None).unwrap().train(None).err().expect("a replay of other prompts fails");
    let message = format!("{error:#}");
    assert!(message.contains("step-1.safetensors") && message.contains("another prompt"), "{message}");
    // More steps than were recorded: refused before the run starts.
    let longer = with(with(monitored("longer"), "replay_rollouts", json!(recorded_dir)), "max_steps", json!(6));
    let message = format!("{:#}", TrainConfig::resolve(None, longer).err().expect("refused"));
    assert!(message.contains("step-5.safetensors is missing"), "{message}");
}
