//! The recipe on hand-made scored batches: no model, engine or file.

use super::*;
use crate::grpo::ScaleRewards;
use crate::routing::CoherenceRhMode;
use crate::train::metrics::key;

/// A routed DualLoRA recipe with groups of two rows and every key at its default.
fn routed() -> Recipe {
    let table = TrainConfig {
        rh_penalty: 2.0,
        num_generations: 2,
        scale_rewards: ScaleRewards::Off,
        routing_mode: RoutingMode::Classic,
        coherence_rh_mode: CoherenceRhMode::None,
        ..TrainConfig::default()
    };
    Recipe {
        table,
        advantage_score_component: None,
        aggregation: Aggregation::Grpo,
        normalize_then_sum: None,
        row_weights: RowWeights::gates(RoutingMode::Classic),
        coherence: CoherenceSchedule { start_step: 0, rows: 0 },
        retain_verifier_recall: None,
        adapters: AdapterConfig::dual_lora(4, 4, 8.0, 1),
        device: Device::Cpu,
    }
}

/// `recipe` with keys of its table set by `set` (the recipe reads them through its rows).
fn keyed(recipe: Recipe, set: impl FnOnce(&mut TrainConfig)) -> Recipe {
    let mut recipe = recipe;
    set(&mut recipe.table);
    recipe
}

/// `recipe` without routing: `intervention` and `routing_mode: none`, whose row weights gate nothing.
fn unrouted(recipe: Recipe, intervention: Intervention) -> Recipe {
    let recipe = keyed(recipe, |k| (k.intervention, k.routing_mode) = (intervention, RoutingMode::None));
    Recipe { row_weights: RowWeights::gates(RoutingMode::None), ..recipe }
}

fn scored(reward: &[f64], flags: &[bool]) -> ScoredBatch {
    let rows = reward.len();
    ScoredBatch {
        reward: reward.to_vec(),
        components: vec![reward.to_vec()],
        is_rh: Some(flags.to_vec()),
        detector_raw: Some(flags.to_vec()),
        eligible: vec![true; rows],
        hackable: vec![true; rows],
        monitored: vec![true; rows],
        hacked: None,
        metrics: Vec::new(),
        unscored: vec![false; rows],
    }
}

/// `recipe.prepare` of step `step` of a run seeded 7, every row with three loss tokens.
fn prepare(recipe: &Recipe, batch: &ScoredBatch, step: usize) -> Prepared {
    recipe.prepare(batch, &generation(&vec![true; batch.reward.len()]), step, 7)
}

fn values(t: &Tensor) -> Vec<f64> {
    Vec::try_from(t.to_kind(Kind::Double)).unwrap()
}

const REWARDS: [f64; 4] = [1.0, 0.0, 3.0, 1.0];
const FLAGS: [bool; 4] = [true, false, false, false];

#[test]
fn routing_routes_the_flagged_rows_with_their_rewards_unchanged() {
    let prepared = prepare(&routed(), &scored(&REWARDS, &FLAGS), 0);
    assert_eq!(prepared.rewards, REWARDS);
    assert_eq!(values(&prepared.advantages), [0.5, -0.5, 1.0, -1.0]);
    assert_eq!(prepared.labels.is_rh, FLAGS);
    assert_eq!(prepared.flagged, FLAGS);
    assert_eq!(prepared.trained_rows, [true; 4]);
    assert_eq!(prepared.plan.classes.len(), 2, "clean and flagged rows are classes of their own");
}

#[test]
fn a_penalty_lowers_the_flagged_rewards_and_routes_nothing() {
    let recipe = unrouted(routed(), Intervention::Penalty);
    let batch = scored(&REWARDS, &FLAGS);
    let prepared = prepare(&recipe, &batch, 0);
    assert_eq!(prepared.rewards, [-1.0, 0.0, 3.0, 1.0]);
    assert_eq!(recipe.rewards(&batch), prepared.rewards, "dynamic sampling reads the same rewards");
    assert_eq!(values(&prepared.advantages), [-0.5, 0.5, 1.0, -1.0]);
    assert_eq!(prepared.plan.classes.len(), 1, "flagged rows train in one class with the others");
}

#[test]
fn a_filter_takes_the_flagged_rows_out_of_the_advantages_and_the_loss() {
    let recipe = keyed(routed(), |k| k.intervention = Intervention::Filter);
    let batch = scored(&REWARDS, &FLAGS);
    let prepared = prepare(&recipe, &batch, 0);
    assert_eq!(recipe.counted_rows(&batch), [false, true, true, true]);
    assert_eq!(prepared.trained_rows, [false, true, true, true]);
    // The clean row left alone in its group has no comparison: advantage 0.
    assert_eq!(values(&prepared.advantages), [0.0, 0.0, 1.0, -1.0]);
    let mask = recipe.loss_mask(&generation(&[true, true, false, true]), &prepared);
    assert_eq!(values(&mask.sum_dim_intlist(1, false, Kind::Double)), [0.0, 3.0, 3.0, 3.0]);
    let masked = keyed(recipe, |k| k.mask_truncated_completions = true);
    let mask = masked.loss_mask(&generation(&[true, true, false, true]), &prepared);
    assert_eq!(values(&mask.sum_dim_intlist(1, false, Kind::Double)), [0.0, 3.0, 0.0, 3.0], "the truncated row is out too");
}

/// Samples without a score (`max_no_score_frac`): out of the counted rows, of their group's
/// statistics (advantage placeholder 0) and of every loss class, under routing and adv_mod alike.
/// Groups of two, unscaled: (0, 1) has row 1 unscored, so row 0 is alone (0); (2, 3) is whole
/// (3 and 1 around 2: +1, -1); (4, 5) is all unscored.
#[test]
fn samples_without_a_score_are_in_no_group_statistic_and_no_class() {
    let rewards = [1.0, 0.0, 3.0, 1.0, 0.0, 0.0];
    let flags = [true, false, false, true, false, true];
    let unscored = vec![false, true, false, false, true, true];
    let batch = ScoredBatch { unscored: unscored.clone(), ..scored(&rewards, &flags) };
    let recipe = routed();
    assert_eq!(recipe.counted_rows(&batch), [true, false, true, true, false, false]);
    let prepared = prepare(&recipe, &batch, 0);
    assert_eq!(values(&prepared.advantages), [0.0, 0.0, 1.0, -1.0, 0.0, 0.0]);
    assert_eq!(prepared.trained_rows, [true, false, true, true, false, false]);
    assert_eq!(prepared.labels.unscored, unscored);
    let classes: Vec<Vec<f64>> = prepared.plan.classes.iter().map(values).collect();
    assert_eq!(classes, [vec![0.0, 0.0, 1.0, 0.0, 0.0, 0.0], vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0]], "clean and flagged scored rows; the unscored in none");
    // adv_mod subtracts nothing from an unscored row (its advantage stays 0) and its mean is
    // over the scored rows: 2 flagged of 3, times 1.
    let adv_mod = unrouted(routed(), Intervention::AdvMod);
    let prepared = prepare(&adv_mod, &batch, 0);
    assert_eq!(values(&prepared.advantages), [-1.0, 0.0, 1.0, -2.0, 0.0, 0.0]);
    assert_eq!(prepared.intervention_metrics, [(key::ADVANTAGE_MODIFICATION_MEAN, 2.0 / 3.0)]);
}

#[test]
fn verified_only_trains_the_rows_the_monitor_saw_and_passed() {
    // Groups of two: (0, 1), (2, 3), (4, 5). Row 0 flagged; row 5 on a prompt the monitor
    // cannot see. Verified: 1, 2, 3, 4. Advantages (unscaled) over the verified rows of each
    // group: row 1 and row 4 alone (0); rewards 3 and 1 around their mean 2: +1, -1.
    let rewards = [1.0, 0.0, 3.0, 1.0, 2.0, 5.0];
    let flags = [true, false, false, false, false, false];
    let batch = ScoredBatch { monitored: vec![true, true, true, true, true, false], ..scored(&rewards, &flags) };
    let verified = unrouted(routed(), Intervention::Verified);
    let prepared = prepare(&verified, &batch, 0);
    assert_eq!(verified.counted_rows(&batch), [false, true, true, true, true, false]);
    assert_eq!(prepared.trained_rows, [false, true, true, true, true, false]);
    assert_eq!(prepared.rewards, rewards, "nothing is penalised");
    assert_eq!(values(&prepared.advantages), [0.0, 0.0, 1.0, -1.0, 0.0, 0.0]);
    // The filter keeps the unmonitored row 5: its group (2, 5) is compared, around 3.5.
    let filter = keyed(verified, |k| k.intervention = Intervention::Filter);
    assert_eq!(values(&prepare(&filter, &batch, 0).advantages), [0.0, 0.0, 1.0, -1.0, -1.5, 1.5]);
}

#[test]
fn a_placebo_routes_as_many_random_rows_as_were_flagged() {
    let recipe = keyed(routed(), |k| k.intervention = Intervention::Placebo);
    let flags = [true, true, false, false, false, false, false, false];
    let batch = scored(&[1.0, 0.0, 3.0, 1.0, 0.0, 0.0, 2.0, 1.0], &flags);
    for step in 0..4 {
        let prepared = prepare(&recipe, &batch, step);
        assert_eq!(prepared.labels.is_rh.iter().filter(|&&r| r).count(), 2);
        assert_eq!(prepared.labels.is_rh, prepare(&recipe, &batch, step).labels.is_rh, "a function of (seed, step)");
        assert_eq!(prepared.flagged, flags);
        assert_eq!(prepared.rewards, batch.reward);
    }
}

/// The value of metric `key` in `prepared`'s intervention metrics.
fn metric(prepared: &Prepared, key: &str) -> f64 {
    prepared.intervention_metrics.iter().find(|(k, _)| *k == key).unwrap_or_else(|| panic!("no {key}")).1
}

#[test]
fn advantage_modification_subtracts_the_penalty_times_the_flag_from_the_advantage() {
    // Groups (0, 1), (2, 3); unscaled advantages 0.5 -0.5 | 1 -1; row 0 flagged, coefficient 2:
    // -1.5 -0.5 | 1 -1. The flagged row's group-mate keeps -0.5, where the reward penalty
    // (reward 1 - 2 = -1 against 0) turns it into +0.5.
    let recipe = keyed(unrouted(routed(), Intervention::AdvMod), |k| k.advantage_penalty = 2.0);
    let prepared = prepare(&recipe, &scored(&REWARDS, &FLAGS), 0);
    assert_eq!(values(&prepared.advantages), [-1.5, -0.5, 1.0, -1.0]);
    assert_eq!(prepared.rewards, REWARDS, "the rewards are left alone");
    assert_eq!(prepared.trained_rows, [true; 4]);
    assert_eq!(prepared.plan.classes.len(), 1, "nothing is routed: one class");
    assert_eq!(metric(&prepared, key::ADVANTAGE_MODIFICATION_MEAN), 2.0 / 4.0);
    let penalty = keyed(recipe.clone(), |k| k.intervention = Intervention::Penalty);
    assert_eq!(values(&prepare(&penalty, &scored(&REWARDS, &FLAGS), 0).advantages), [-0.5, 0.5, 1.0, -1.0]);
    // The detector's continuous score instead (component 0), 0 where the monitor cannot see
    // (row 2), coefficient 0.5: 0.5 - 0.35, -0.5 - 0.1, 1 - 0, -1 - 0.2.
    let continuous = Recipe { advantage_score_component: Some(0), ..keyed(recipe, |k| k.advantage_penalty = 0.5) };
    let batch = ScoredBatch { components: vec![vec![0.7, 0.2, 0.9, 0.4]], monitored: vec![true, true, false, true], ..scored(&REWARDS, &FLAGS) };
    let prepared = prepare(&continuous, &batch, 0);
    for (i, (ours, expected)) in values(&prepared.advantages).iter().zip([0.15, -0.6, 1.0, -1.2]).enumerate() {
        assert!((ours - expected).abs() < 1e-6, "row {i}: {ours} vs {expected}");
    }
    assert!((metric(&prepared, key::ADVANTAGE_MODIFICATION_MEAN) - 0.5 * (0.7 + 0.2 + 0.4) / 4.0).abs() < 1e-12);
}

#[test]
fn the_matched_placebo_routes_rows_of_the_flagged_rows_energy() {
    // Unscaled group advantages 0.5 -0.5 | 1 -1 | 0 0 | 0.5 -0.5; every row has 3 loss tokens in
    // a batch of 8, so grpo weighs each token 1/24 and a row's energy is A² × 3/576 = A²/192.
    let recipe = keyed(routed(), |k| k.intervention = Intervention::MatchedPlacebo);
    let advantages = [0.5, -0.5, 1.0, -1.0, 0.0, 0.0, 0.5, -0.5];
    let by_hand: Vec<f64> = advantages.iter().map(|a| a * a / 192.0).collect();
    // The float32 weights' energies (the draw compares sums of them: ties must break alike).
    let energy = intervention::row_energies(&Tensor::from_slice(&advantages), &Tensor::ones([8, 3], (Kind::Float, Device::Cpu)), Aggregation::Grpo);
    for (ours, hand) in energy.iter().zip(&by_hand) {
        assert!((ours - hand).abs() < 1e-9, "{ours} vs {hand}");
    }
    let flags = [true, false, true, false, false, false, false, false];
    let batch = scored(&[1.0, 0.0, 3.0, 1.0, 0.0, 0.0, 2.0, 1.0], &flags);
    for step in 0..4 {
        let prepared = prepare(&recipe, &batch, step);
        let expected = intervention::matched_placebo_labels(&energy, &flags, 7, step);
        assert_eq!(prepared.labels.is_rh, expected.labels, "step {step}");
        assert_eq!(prepared.flagged, flags);
        let routed_energy: f64 = energy.iter().zip(&prepared.labels.is_rh).filter(|(_, r)| **r).map(|(e, _)| e).sum();
        assert!((metric(&prepared, key::PLACEBO_ENERGY_FLAGGED) - 1.25 / 192.0).abs() < 1e-9);
        assert!((metric(&prepared, key::PLACEBO_ENERGY_ROUTED) - routed_energy).abs() < 1e-9);
        assert_eq!(metric(&prepared, key::PLACEBO_ROWS_ROUTED), prepared.labels.is_rh.iter().filter(|&&r| r).count() as f64);
        assert!((routed_energy - 1.25 / 192.0).abs() <= 0.5 / 192.0 + 1e-12, "step {step}: within half a row's energy (the largest is 1/192)");
        assert_eq!(values(&prepared.advantages), advantages, "the advantages are untouched");
    }
}

#[test]
fn coherence_rows_end_the_batch_from_their_first_step() {
    let recipe = Recipe { coherence: CoherenceSchedule { start_step: 2, rows: 2 }, ..routed() };
    let batch = scored(&REWARDS, &[false; 4]);
    assert_eq!(prepare(&recipe, &batch, 1).labels.coherence, [false; 4]);
    assert_eq!(prepare(&recipe, &batch, 2).labels.coherence, [false, false, true, true]);
}

/// The original's rp_extra_retain_advantage_multiplier (advantages.py:510-515) on the
/// reward-penalty comparator (its best_rp doses v=2, v=5), by hand in float64: the verified
/// coherence rows' advantages, renormalised over the verified rows, times the multiplier; the
/// routing group and the unverified (dropped) coherence row untouched.
#[test]
fn the_advantage_multiplier_scales_only_the_verified_coherence_rows() {
    // Groups of four: routing rows 0-3, coherence rows 4-7. Row 0 and row 6 flagged: row 6,
    // a coherence row the monitor flagged, is not verified (the coin at recall 1 always passes).
    let rewards = [1.0, 0.0, 3.0, 1.0, 2.0, 5.0, 0.0, 4.0];
    let flags = [true, false, false, false, false, false, true, false];
    let batch = scored(&rewards, &flags);
    let penalty = Recipe {
        coherence: CoherenceSchedule { start_step: 0, rows: 4 },
        retain_verifier_recall: Some(1.0),
        ..keyed(unrouted(routed(), Intervention::Penalty), |k| k.num_generations = 4)
    };
    // Routing group, penalised by 2 (-1 0 3 1, mean 0.75), unscaled; verified rows 4, 5, 7:
    // rewards 2 5 4, mean 11/3, unbiased std sqrt(((2 - 11/3)^2 + (5 - 11/3)^2 + (4 - 11/3)^2) / 2).
    let mean: f64 = 11.0 / 3.0;
    let std = (((2.0 - mean).powi(2) + (5.0 - mean).powi(2) + (4.0 - mean).powi(2)) / 2.0).sqrt();
    let by_hand = |v: f64| {
        let coherence = |r: f64| (r - mean) / (std + 1e-4) * v;
        vec![-1.75, -0.75, 2.25, 0.25, coherence(2.0), coherence(5.0), 0.0, coherence(4.0)]
    };
    for v in [1.0, 2.0, 5.0] {
        let prepared = prepare(&keyed(penalty.clone(), |k| k.rp_extra_retain_advantage_multiplier = v), &batch, 0);
        let ours = values(&prepared.advantages);
        let expected = by_hand(v);
        assert!(ours.iter().zip(&expected).all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs().max(1.0)), "v={v}: {ours:?} vs {expected:?}");
        assert_eq!(prepared.labels.dropped, [false, false, false, false, false, false, true, false], "v={v}");
        assert_eq!(prepared.frac_verified, Some(0.75));
    }
}

#[test]
fn ablation_draws_only_clean_routing_rows() {
    let recipe = keyed(routed(), |k| k.ablated_frac = 1.0);
    let prepared = prepare(&recipe, &scored(&REWARDS, &FLAGS), 0);
    assert_eq!(prepared.labels.ablated, [false, true, true, true]);
}

/// GDPO in float64 from its definition: per group and column, the z-score over the kept rows
/// (unbiased std; 0 with fewer than two), weighted and summed, then the z-score of the sums over
/// the batch's kept rows; 0 for the others.
fn gdpo_by_hand(columns: &[Vec<f64>], weights: &[f64], kept: &[bool], g: usize) -> Vec<f64> {
    let stats = |v: &[f64]| {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        (v.len() > 1).then(|| (mean, (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()))
    };
    let z = |values: &[f64], x: f64| stats(values).map_or(0.0, |(mean, std)| (x - mean) / (std + 1e-4));
    let sums: Vec<f64> = (0..kept.len())
        .map(|i| {
            let group = i / g * g..i / g * g + g;
            columns.iter().zip(weights).map(|(column, w)| w * z(&group.clone().filter(|&j| kept[j]).map(|j| column[j]).collect::<Vec<_>>(), column[i])).sum()
        })
        .collect();
    let kept_sums: Vec<f64> = sums.iter().zip(kept).filter(|(_, k)| **k).map(|(s, _)| *s).collect();
    sums.iter().zip(kept).map(|(&s, &k)| if k { z(&kept_sums, s) } else { 0.0 }).collect()
}

/// GDPO through the recipe: a forget component counts 0 where the prompt is not hackable (as
/// in the summed reward), each component is weighted by its scale, the penalty is a reward
/// function of its own (-1 on flagged rows, weight `rh_penalty`), the filter's dropped rows
/// leave every statistic; the rewards logged stay the summed ones.
#[test]
fn normalize_then_sum_normalises_the_counted_components_then_their_weighted_sum() {
    use crate::reward::{ComponentInfo, Role};
    let task = vec![1.0, 2.0, 4.0, 0.0, 1.0, 1.0];
    let bonus = vec![3.0, 0.0, 3.0, 5.0, 0.0, 5.0];
    let flags = [false, false, false, true, false, false];
    let summed = [2.5, 2.0, 4.0, 2.5, 1.0, 3.5]; // task + 0.5 * bonus, row 2 without its bonus
    let batch = ScoredBatch {
        components: vec![task.clone(), bonus],
        hackable: vec![true, true, false, true, true, true],
        ..scored(&summed, &flags)
    };
    let components = vec![
        ComponentInfo { name: "task".into(), role: Role::Retain, scale: 1.0 },
        ComponentInfo { name: "bonus".into(), role: Role::Forget, scale: 0.5 },
    ];
    let counted_bonus = vec![3.0, 0.0, 0.0, 5.0, 0.0, 5.0];
    let gdpo = Recipe { normalize_then_sum: Some(components), ..keyed(unrouted(routed(), Intervention::Routing), |k| (k.num_generations, k.scale_rewards) = (3, ScaleRewards::Group)) };
    let close = |ours: &[f64], expected: &[f64]| ours.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-5);

    let penalty = keyed(gdpo.clone(), |k| k.intervention = Intervention::Penalty);
    let prepared = prepare(&penalty, &batch, 0);
    let penalty_column = vec![0.0, 0.0, 0.0, -1.0, 0.0, 0.0];
    let expected = gdpo_by_hand(&[task.clone(), counted_bonus.clone(), penalty_column], &[1.0, 0.5, 2.0], &[true; 6], 3);
    assert!(close(&values(&prepared.advantages), &expected), "{:?} vs {expected:?}", values(&prepared.advantages));
    assert_eq!(prepared.rewards, [2.5, 2.0, 4.0, 0.5, 1.0, 3.5], "the rewards logged are the summed ones, penalised");
    // Not the summed reward normalised in its group.
    let summed_then_normalised = prepare(&Recipe { normalize_then_sum: None, ..penalty.clone() }, &batch, 0);
    assert!(!close(&values(&summed_then_normalised.advantages), &expected));

    let filter = keyed(gdpo.clone(), |k| k.intervention = Intervention::Filter);
    let prepared = prepare(&filter, &batch, 0);
    let kept = [true, true, true, false, true, true];
    let expected = gdpo_by_hand(&[task, counted_bonus], &[1.0, 0.5], &kept, 3);
    assert!(close(&values(&prepared.advantages), &expected), "{:?} vs {expected:?}", values(&prepared.advantages));
    assert_eq!(values(&prepared.advantages)[3], 0.0, "the filtered row is out");
    assert_eq!(prepared.trained_rows, kept);
}

/// Four rows of three completion tokens each, `ended[r]` whether row `r` ended with EOS.
fn generation(ended: &[bool]) -> Generation {
    let rows = ended.len() as i64;
    let ones = |width: i64| Tensor::ones([rows, width], (Kind::Int64, Device::Cpu));
    Generation {
        prompt_ids: ones(2),
        prompt_mask: ones(2),
        completion_ids: ones(3),
        completion_mask: ones(3),
        sampling_logprobs: Tensor::zeros([rows, 3], (Kind::Float, Device::Cpu)),
        kept: None,
        model_mask: None,
        rows: ended.iter().map(|&ended_with_eos| crate::model::generate::CompletionRow { ids: vec![1, 1], ended_with_eos }).collect(),
    }
}

/// Advantage groups are the batch's consecutive rows of `group_size` (one per prompt drawn, in
/// the order drawn), never keyed by prompt text or tokens (NeMo-RL PR #3882 merged groups with
/// identical prompt tokens and gave false advantages). Here every row has the same prompt and
/// completion tokens (a prompt drawn twice in a step, or two prompts that tokenize alike): the
/// two groups keep their own mean and standard deviation, float64 by hand.
#[test]
fn a_prompt_drawn_twice_in_a_step_is_two_groups() {
    let rewards = [0.0, 1.0, 2.0, 4.0, 4.0, 10.0];
    let batch = scored(&rewards, &[false; 6]);
    let generation = generation(&[true; 6]);
    assert!(generation.prompt_ids.get(0).equal(&generation.prompt_ids.get(3)), "both groups' prompts tokenize alike");
    // TRL's: (r - mean_g) / (unbiased std_g + eps), groups of three consecutive rows.
    let by_hand = |group: &[f64], scale: bool| -> Vec<f64> {
        let n = group.len() as f64;
        let mean = group.iter().sum::<f64>() / n;
        let std = (group.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        group.iter().map(|r| if scale { (r - mean) / (std + crate::defaults::ADVANTAGE_STD_EPSILON) } else { r - mean }).collect()
    };
    for (scale, scaled) in [(ScaleRewards::Group, true), (ScaleRewards::Off, false)] {
        let recipe = keyed(unrouted(routed(), Intervention::Penalty), |k| (k.num_generations, k.scale_rewards) = (3, scale));
        let prepared = recipe.prepare(&batch, &generation, 0, 7);
        let expected: Vec<f64> = rewards.chunks(3).flat_map(|group| by_hand(group, scaled)).collect();
        let merged = by_hand(&rewards, scaled);
        let ours = values(&prepared.advantages);
        for (i, (a, e)) in ours.iter().zip(&expected).enumerate() {
            assert!((a - e).abs() < 1e-6 * e.abs().max(1.0), "{scale:?} row {i}: {a} vs {e} (all: {ours:?})");
        }
        assert!(ours.iter().zip(&merged).any(|(a, m)| (a - m).abs() > 0.1), "{scale:?}: one group keyed by the prompt would give {merged:?}");
    }
}
