//! What a run does with the monitor's flags: the controls beside gradient routing.
//!
//! | intervention | flagged samples                                                       |
//! |--------------|-----------------------------------------------------------------------|
//! | routing      | go where `routing_mode` sends them (with `none`: nowhere special: the baseline) |
//! | penalty      | reward - `rh_penalty`, trained like every other sample; no routing    |
//! | filter       | leave the loss, and their group's advantages are computed without them |
//! | placebo      | trained as clean; instead a random subset of the same size is routed  |
//! | verified     | only verified samples train: the monitor saw them and did not flag them |
//! | adv_mod      | advantage - `advantage_penalty` × score, trained like every other sample; no routing |
//! | matched_placebo | trained as clean; instead a random subset of the same gradient energy is routed |
//!
//! Filtering recomputes the group statistics over the kept samples rather than zeroing the
//! flagged samples' advantages: a flagged (hacking) sample usually has a high reward, so left
//! in the group mean it would push every clean sample's advantage down, and the hack would
//! still shape the update through the baseline. A kept sample alone in its group gets
//! advantage 0 (no comparison). The kept samples' loss keeps its routing weight
//! `n_kept / n` (`grpo::grpo_loss`'s classes), so a filter run steps the shared weights as
//! much per clean sample as a routed run does.
//!
//! Verified-only (the original's `verified_only_training`, the paper's `verif` arm) is the filter
//! turned around: instead of dropping what the monitor flagged, it keeps only what the monitor
//! vouches for, a sample on a prompt the monitor sees (`monitored`: eligible and detectable)
//! that its own output (before recall and false positives) did not flag. Everything else,
//! unmonitored samples included, leaves the advantages and the loss as the filter's dropped
//! rows do.
//!
//! The placebo's subset is drawn from `(seed, "placebo", step)` uniformly among all rows,
//! independently of which rows the monitor flagged: routing labels that carry no information
//! about the hack, at the same rate, separate "routing the hack away" from "a second adapter
//! that learns from some rows".
//!
//! Advantage modification (`adv_mod`, arXiv 2604.01476) leaves the rewards and the group
//! statistics alone and subtracts `advantage_penalty × score` from each sample's advantage, the
//! advantage the loss sees (after any coherence handling). The score is chosen by
//! `advantage_score` ([`AdvantageScore`]), never guessed from the detector: `flag` (default) is
//! the monitor's flag as 0 or 1 (`is_rh`: after `recall` and `false_positive_rate`, 0 where the
//! monitor does not see the sample), `detector_score` the raw score of the reward component that
//! an `rh_detector: score_threshold` thresholds, on monitored samples (0 elsewhere); the
//! configuration refuses `detector_score` without such a detector, and with `recall` or
//! `false_positive_rate` off their defaults (draws on flags, which a continuous score does not
//! have). Unlike `penalty`, a flagged sample does not move its group's mean and standard
//! deviation, so its group-mates' advantages stay what the task alone made them.
//!
//! The matched placebo answers the objection that a plain placebo routes as many rows as were
//! flagged but not as much gradient: flagged (hacking) rows tend to have large advantages. It
//! routes a random subset whose *gradient energy* matches the flagged rows'. Row `i`'s policy
//! term has, at ratio 1, the gradient `g_i = A_i Σ_t w_t ∇log p_t` (`w_t` the aggregation's
//! token weights, [`crate::grpo::token_weights`]). Its energy proxy is
//! `e_i = A_i² Σ_t w_t²`: under the policy that sampled the row, the score-function terms of
//! different tokens are uncorrelated (`E[∇log p_s | tokens before s] = 0`), so
//! `E|g_i|² = A_i² Σ_t w_t² E|∇log p_t|²`, which is `e_i` up to one factor shared by every token
//! when their score norms are taken as equal; energies of independently sampled rows add the same
//! way, so a subset's energy is the sum of its rows'. It costs nothing: no backward pass. `A_i` is
//! the group advantage (before routing's renormalisation and coherence handling, which depend on
//! the labels being drawn) and `w_t` the weights of the whole batch as one class and one
//! micro-batch (for grpo, dr_grpo and luspo a row's weights under any classes; for dapo and bnpo
//! the classes rescale them by a common factor each). The rows are taken in a random order drawn
//! from `(seed, "matched-placebo", step)` and the subset is the prefix whose cumulative energy is
//! closest to the flagged rows' (the shorter prefix on a tie): the match is exact to within half
//! the energy of one row, and which rows are flagged matters only through their total energy.

use tch::{Kind, Tensor};

use crate::grpo::{self, Aggregation, ScaleRewards};
use crate::rng::{self, SplitMix64};

crate::choice::choice! {
    /// What the monitor's flags do (the table above).
    pub enum Intervention ("intervention") {
        Routing = "routing",
        Penalty = "penalty",
        Filter = "filter",
        Placebo = "placebo",
        Verified = "verified",
        AdvMod = "adv_mod",
        MatchedPlacebo = "matched_placebo",
    }
}

crate::choice::choice! {
    /// The score `adv_mod` subtracts, times `advantage_penalty`, from each sample's advantage.
    pub enum AdvantageScore ("advantage_score") {
        /// The monitor's flag as 0 or 1 (`is_rh`: after recall and false positives).
        Flag = "flag",
        /// The raw score of the component an `rh_detector: score_threshold` thresholds, on
        /// monitored samples (0 elsewhere).
        DetectorScore = "detector_score",
    }
}

/// How a sweep's `--intervention-arms` makes an intervention's arm from a routed grid point
/// (`sweep/plan.rs`, docs/src/training.md "Controls"): every intervention is an arm, in the
/// order [`Intervention::ALL`] declares them, made as [`Intervention::arm`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArmShape {
    /// Keeps the grid point's routing (`routing_mode`, ablation), which the arm then applies
    /// to its own rows; otherwise the arm starts from the point without routing.
    pub routed: bool,
    /// Keeps the routed point's coherence rows (they train retain alone).
    pub coherence: bool,
    /// The keys only this arm may hold (each valid with its intervention alone): a grid point's
    /// or `--fixed` value is set aside while the routed point resolves and given to this arm;
    /// without one the arm takes the routed point's (the file's or the default).
    pub keys: &'static [&'static str],
}

impl Intervention {
    /// This intervention's sweep arm (a new intervention says here what its arm keeps).
    pub const fn arm(self) -> ArmShape {
        const UNROUTED: ArmShape = ArmShape { routed: false, coherence: false, keys: &[] };
        match self {
            Self::Routing | Self::Placebo | Self::MatchedPlacebo => ArmShape { routed: true, ..UNROUTED },
            Self::Filter | Self::Verified => UNROUTED,
            // The reward-penalty comparator keeps the routed run's coherence rows (the original's
            // matrix_rp_7envs: "the same 32 verified coherence extras"); adv_mod refines it.
            Self::Penalty => ArmShape { coherence: true, keys: &["rh_penalty"], ..UNROUTED },
            Self::AdvMod => ArmShape { coherence: true, keys: &["advantage_penalty", "advantage_score"], ..UNROUTED },
        }
    }
}

/// `reward - penalty` for flagged samples, the reward otherwise (after the `max_reward` cap,
/// so the penalty is never absorbed by it).
pub fn penalised(rewards: &[f64], flagged: &[bool], penalty: f64) -> Vec<f64> {
    assert_eq!(rewards.len(), flagged.len(), "one flag per reward");
    rewards.iter().zip(flagged).map(|(&r, &f)| if f { r - penalty } else { r }).collect()
}

/// The rows verified-only trains: monitored (eligible, on a detectable prompt) and not flagged
/// by the detector's own output.
pub fn verified_rows(monitored: &[bool], detected: &[bool]) -> Vec<bool> {
    assert_eq!(monitored.len(), detected.len(), "one verdict per row");
    monitored.iter().zip(detected).map(|(&m, &d)| m && !d).collect()
}

/// The placebo's routing labels: as many rows as `flagged` has flags, drawn uniformly (the
/// first rows of a Fisher-Yates shuffle) from `(seed, "placebo", step)`; which rows are flagged
/// does not matter, only how many.
pub fn placebo_labels(flagged: &[bool], seed: u64, step: usize) -> Vec<bool> {
    let count = flagged.iter().filter(|&&f| f).count();
    labels_of(&shuffled(flagged.len(), rng::derive(seed, "placebo", step as u64))[..count], flagged.len())
}

/// `0..n` in the order of a Fisher-Yates shuffle seeded `seed`. Its first `k` rows are those a
/// shuffle stopped after `k` swaps picks: the later swaps never touch them.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut rows: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64::new(seed);
    for i in 0..n {
        let pick = i + rng.below(n - i);
        rows.swap(i, pick);
    }
    rows
}

fn labels_of(rows: &[usize], n: usize) -> Vec<bool> {
    let mut labels = vec![false; n];
    for &row in rows {
        labels[row] = true;
    }
    labels
}

/// `adv_mod`'s scores with `advantage_score: flag`: each flag as 0 or 1.
pub fn flag_scores(flagged: &[bool]) -> Vec<f64> {
    flagged.iter().map(|&f| f64::from(u8::from(f))).collect()
}

/// `adv_mod`'s scores with `advantage_score: detector_score`: the thresholded component's raw
/// score where the monitor sees the sample, 0 where it does not (it could not flag it either).
pub fn detector_scores(component: &[f64], monitored: &[bool]) -> Vec<f64> {
    assert_eq!(component.len(), monitored.len(), "one score per row");
    component.iter().zip(monitored).map(|(&score, &seen)| if seen { score } else { 0.0 }).collect()
}

/// Each row's gradient-energy proxy `A_i² Σ_t w_t²` (the module's doc says why): `advantages`
/// `[batch]`, `loss_tokens` `[batch, tokens]` 1 on the tokens the loss counts, `w` the
/// aggregation's token weights of the whole batch as one class and one micro-batch.
pub fn row_energies(advantages: &Tensor, loss_tokens: &Tensor, aggregation: Aggregation) -> Vec<f64> {
    let rows = loss_tokens.size()[0];
    let everyone = Tensor::ones([rows], (Kind::Bool, loss_tokens.device()));
    let weights = grpo::token_weights(&loss_tokens.to_kind(Kind::Float), &[everyone], aggregation, 1).to_kind(Kind::Double);
    let energy = weights.square().sum_dim_intlist(1, false, Kind::Double) * advantages.to_kind(Kind::Double).square();
    Vec::try_from(energy.to_device(tch::Device::Cpu)).expect("energies are a 1-D tensor")
}

/// The matched placebo's draw.
#[derive(Debug, Clone, PartialEq)]
pub struct MatchedDraw {
    /// The routed rows.
    pub labels: Vec<bool>,
    /// The flagged rows' energy (the target) and the routed rows'.
    pub energy_flagged: f64,
    pub energy_routed: f64,
}

/// The matched placebo's routing labels: the rows in the order of a shuffle seeded by
/// `(seed, "matched-placebo", step)`, up to where their cumulative `energy` is closest to the
/// flagged rows' (the shorter prefix on a tie; nothing when nothing is flagged).
pub fn matched_placebo_labels(energy: &[f64], flagged: &[bool], seed: u64, step: usize) -> MatchedDraw {
    assert_eq!(energy.len(), flagged.len(), "one energy per row");
    let energy_flagged: f64 = energy.iter().zip(flagged).filter(|(_, f)| **f).map(|(e, _)| e).sum();
    let order = shuffled(energy.len(), rng::derive(seed, "matched-placebo", step as u64));
    let (mut best, mut best_gap, mut cumulative) = (0, energy_flagged.abs(), 0.0);
    for (k, &row) in order.iter().enumerate() {
        cumulative += energy[row];
        let gap = (cumulative - energy_flagged).abs();
        if gap < best_gap {
            (best, best_gap) = (k + 1, gap);
        }
    }
    let energy_routed = order[..best].iter().map(|&row| energy[row]).sum();
    MatchedDraw { labels: labels_of(&order[..best], energy.len()), energy_flagged, energy_routed }
}

/// The loss mask with the `kept` rows (`[batch]` 0/1) only: the filter's dropped rows leave
/// the loss (policy term and KL).
pub fn filtered_loss_mask(loss_mask: &Tensor, kept: &Tensor) -> Tensor {
    loss_mask * kept.unsqueeze(1).to_kind(loss_mask.kind())
}

/// Group advantages over the `kept` rows only (1 = kept): `(r - mean) / (std + eps)` with the
/// mean and unbiased standard deviation of the kept members of each group (of all kept rows
/// for `batch`), 0 for dropped rows and for a kept row alone in its group. Also returns the
/// fraction of kept rows whose standard deviation is zero (or undefined), TRL's
/// `frac_reward_zero_std` over what trains.
pub fn kept_group_advantages(rewards: &Tensor, kept: &Tensor, group_size: usize, scale: ScaleRewards, eps: f64) -> (Tensor, f64) {
    let n = group_size as i64;
    let kept = kept.to_kind(Kind::Float);
    let (rewards_g, kept_g) = (rewards.to_kind(Kind::Float).view([-1, n]), kept.view([-1, n]));
    let count = kept_g.sum_dim_intlist(1, true, Kind::Float);
    let mean = (&rewards_g * &kept_g).sum_dim_intlist(1, true, Kind::Float) / count.clamp_min(1.0);
    let centred = (&rewards_g - &mean) * &kept_g;
    let group_std = (centred.square().sum_dim_intlist(1, true, Kind::Float) / (&count - 1.0).clamp_min(1.0)).sqrt();
    let compared = count.gt(1.0).to_kind(Kind::Float);
    let std = match scale {
        ScaleRewards::Group | ScaleRewards::Off => group_std.expand_as(&rewards_g),
        ScaleRewards::Batch => {
            let total = kept.sum(Kind::Float);
            let all = rewards.to_kind(Kind::Float);
            let batch_mean = (&all * &kept).sum(Kind::Float) / total.clamp_min(1.0);
            let batch_var = ((&all - batch_mean) * &kept).square().sum(Kind::Float) / (&total - 1.0).clamp_min(1.0);
            batch_var.sqrt().expand_as(&rewards_g)
        }
    };
    let advantages = match scale {
        ScaleRewards::Off => &centred * &compared,
        ScaleRewards::Group | ScaleRewards::Batch => &centred / (&std + eps) * &compared,
    };
    let zero_std = std.isclose(&std.zeros_like(), 1e-5, 1e-8, false).logical_or(&compared.eq(0.0)).to_kind(Kind::Float);
    let kept_rows = kept.sum(Kind::Float).double_value(&[]).max(1.0);
    let frac_zero_std = (zero_std * &kept_g).sum(Kind::Float).double_value(&[]) / kept_rows;
    (advantages.reshape([-1]), frac_zero_std)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flagged_samples_reward_is_its_reward_minus_the_penalty() {
        let out = penalised(&[0.9, 0.4, 1.0, -0.2], &[true, false, false, true], 0.75);
        assert_eq!(out, vec![0.9 - 0.75, 0.4, 1.0, -0.2 - 0.75]);
    }

    #[test]
    fn the_placebo_routes_as_many_rows_as_were_flagged_whichever_they_are() {
        for (seed, step) in [(1, 0), (42, 7), (3, 199)] {
            let draw = placebo_labels(&[true, true, true, false, false, false, false, false, false, false], seed, step);
            assert_eq!(draw.iter().filter(|&&r| r).count(), 3, "as many as flagged");
            // By construction: flag exactly the rows the draw left out (the same number of them).
            let mut flagged: Vec<bool> = draw.iter().map(|&r| !r).collect();
            let mut extra = flagged.iter().filter(|&&f| f).count() - 3;
            for f in flagged.iter_mut().rev() {
                if extra > 0 && *f {
                    *f = false;
                    extra -= 1;
                }
            }
            let routed = placebo_labels(&flagged, seed, step);
            assert_eq!(routed, draw, "the draw depends on the count only");
            assert!(routed.iter().zip(&flagged).all(|(r, f)| !(*r && *f)), "none of the flagged rows is routed");
            assert_ne!(placebo_labels(&flagged, seed, step + 1), routed, "another step draws again");
        }
        assert_eq!(placebo_labels(&[false; 5], 1, 0), vec![false; 5]);
        assert_eq!(placebo_labels(&[true; 5], 1, 0), vec![true; 5]);
    }

    /// Energies by hand: rows of 2, 3, 1 and 0 loss tokens in a batch of 4 (6 tokens).
    /// grpo weighs a token 1/(n_i × 4), so Σ w² = 1/(16 n_i); dapo 1/6, so Σ w² = n_i/36;
    /// dr_grpo (max length 5) 1/(4 × 5), so Σ w² = n_i/400; a row without tokens has none.
    #[test]
    fn row_energies_are_the_squared_advantage_times_the_squared_token_weights() {
        let mask = Tensor::from_slice(&[1.0f32, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]).view([4, 3]);
        let advantages = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 3.0]);
        let cases = [
            (Aggregation::Grpo, [1.0 / 32.0, 4.0 / 48.0, 0.25 / 16.0, 0.0]),
            (Aggregation::Dapo, [2.0 / 36.0, 12.0 / 36.0, 0.25 / 36.0, 0.0]),
            (Aggregation::DrGrpo { max_completion_length: 5 }, [2.0 / 400.0, 12.0 / 400.0, 0.25 / 400.0, 0.0]),
        ];
        for (aggregation, expected) in cases {
            let ours = row_energies(&advantages, &mask, aggregation);
            for (i, (a, b)) in ours.iter().zip(expected).enumerate() {
                assert!((a - b).abs() <= 1e-7 * b.max(1e-3), "{aggregation:?} row {i}: {a} vs {b}");
            }
        }
    }

    /// A test-side generator of energies and flags (not the code's rng stream).
    fn energies_and_flags(case: u64, n: usize) -> (Vec<f64>, Vec<bool>) {
        let mut rng = SplitMix64::new(case.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xABCD);
        let energy = (0..n).map(|_| if rng.next_f64() < 0.2 { 0.0 } else { rng.next_f64() * 3.0 }).collect();
        let flagged = (0..n).map(|_| rng.next_f64() < 0.3).collect();
        (energy, flagged)
    }

    #[test]
    fn the_matched_placebo_routes_a_prefix_of_its_seeded_order_closest_in_energy_to_the_flagged_rows() {
        let mut routed_counts = std::collections::BTreeSet::new();
        for case in 0..200u64 {
            let n = 4 + (case as usize % 29);
            let (energy, flagged) = energies_and_flags(case, n);
            let (seed, step) = (case % 7, case as usize);
            let draw = matched_placebo_labels(&energy, &flagged, seed, step);
            // The energies reported are those of the rows (float64, in index order here).
            let sum = |rows: &[bool]| energy.iter().zip(rows).filter(|(_, r)| **r).map(|(e, _)| e).sum::<f64>();
            assert!((draw.energy_flagged - sum(&flagged)).abs() < 1e-12);
            assert!((draw.energy_routed - sum(&draw.labels)).abs() < 1e-12);
            // Within half the energy of one row of the target (the granularity of a row).
            let largest = energy.iter().copied().fold(0.0, f64::max);
            assert!((draw.energy_routed - draw.energy_flagged).abs() <= largest / 2.0 + 1e-12, "case {case}: {draw:?}");
            // Brute force over every prefix of the seeded order: none is closer, no shorter one as close.
            let order = shuffled(n, rng::derive(seed, "matched-placebo", step as u64));
            let k = draw.labels.iter().filter(|&&r| r).count();
            assert_eq!(labels_of(&order[..k], n), draw.labels, "case {case}: the routed rows are a prefix of the order");
            let gap = |j: usize| (order[..j].iter().map(|&r| energy[r]).sum::<f64>() - draw.energy_flagged).abs();
            for j in 0..=n {
                assert!(gap(j) >= gap(k) - 1e-12 && (j >= k || gap(j) > gap(k)), "case {case}: prefix {j} beats {k}");
            }
            // Deterministic in (seed, step), drawn again at another step.
            assert_eq!(matched_placebo_labels(&energy, &flagged, seed, step), draw);
            routed_counts.insert((k, flagged.iter().filter(|&&f| f).count()));
        }
        assert!(routed_counts.iter().any(|(routed, flagged)| routed != flagged), "the count is not what is matched");
        let (energy, flagged) = energies_and_flags(3, 24);
        let other_steps: Vec<Vec<bool>> = (0..5).map(|step| matched_placebo_labels(&energy, &flagged, 1, step).labels).collect();
        assert!(other_steps.windows(2).any(|w| w[0] != w[1]), "another step draws again");
        // Nothing flagged: nothing routed; everything flagged, every energy positive: everything.
        assert_eq!(matched_placebo_labels(&[1.0, 2.0, 0.5], &[false; 3], 1, 0).labels, [false; 3]);
        assert_eq!(matched_placebo_labels(&[1.0, 2.0, 0.5], &[true; 3], 1, 0).labels, [true; 3]);
    }

    #[test]
    fn the_matched_placebo_sees_which_rows_are_flagged_only_through_their_energy() {
        // Integers, so every total below is exact: 1 + 4 = 2 + 3 = 5 = 5.
        let energy = [1.0, 2.0, 3.0, 4.0, 5.0, 0.5, 6.0, 2.5];
        let flag = |rows: &[usize]| (0..8).map(|i| rows.contains(&i)).collect::<Vec<bool>>();
        for (seed, step) in [(1, 0), (42, 3), (7, 99)] {
            let draws: Vec<MatchedDraw> = [flag(&[0, 3]), flag(&[1, 2]), flag(&[4])].iter().map(|f| matched_placebo_labels(&energy, f, seed, step)).collect();
            assert!(draws.iter().all(|d| d == &draws[0]), "seed {seed} step {step}: {draws:?}");
            assert_eq!(draws[0].energy_flagged, 5.0);
            let heavier = matched_placebo_labels(&energy, &flag(&[4, 6]), seed, step);
            assert!(heavier.energy_routed >= draws[0].energy_routed, "a larger target routes at least as much energy");
        }
    }

    /// The placebo draws what it drew before the shuffle was shared with the matched placebo:
    /// the partial Fisher-Yates shuffle it used, written out here.
    #[test]
    fn the_plain_placebo_draws_as_its_partial_shuffle_did() {
        for (seed, step, count) in [(1, 0, 3), (42, 7, 1), (3, 199, 9)] {
            let mut rows: Vec<usize> = (0..12).collect();
            let mut rng = SplitMix64::new(rng::derive(seed, "placebo", step as u64));
            for i in 0..count {
                let pick = i + rng.below(12 - i);
                rows.swap(i, pick);
            }
            let flagged: Vec<bool> = (0..12).map(|i| i >= 12 - count).collect();
            let expected: Vec<bool> = (0..12).map(|i| rows[..count].contains(&i)).collect();
            assert_eq!(placebo_labels(&flagged, seed, step), expected);
        }
    }

    /// Float64 reference from the formula, written out per group.
    fn reference(rewards: &[f64], kept: &[bool], g: usize, scale: ScaleRewards, eps: f64) -> Vec<f64> {
        let kept_values = |rows: std::ops::Range<usize>| rows.filter(|&i| kept[i]).map(|i| rewards[i]).collect::<Vec<f64>>();
        let stats = |v: &[f64]| {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() as f64 - 1.0);
            (mean, var.sqrt())
        };
        let batch_std = stats(&kept_values(0..rewards.len())).1;
        (0..rewards.len())
            .map(|i| {
                let group = kept_values(i / g * g..i / g * g + g);
                if !kept[i] || group.len() < 2 {
                    return 0.0;
                }
                let (mean, std) = stats(&group);
                match scale {
                    ScaleRewards::Off => rewards[i] - mean,
                    ScaleRewards::Group => (rewards[i] - mean) / (std + eps),
                    ScaleRewards::Batch => (rewards[i] - mean) / (batch_std + eps),
                }
            })
            .collect()
    }

    #[test]
    fn filtered_advantages_are_those_of_the_kept_samples_alone() {
        let rewards = [0.1, 0.9, 0.4, 1.0, 0.3, 0.3, 0.7, 0.2, 0.5, 0.6, 0.8, 0.95];
        let kept = [true, false, true, true, true, true, true, true, false, true, false, false];
        let mask = Tensor::from_slice(&kept.map(|k| if k { 1.0f32 } else { 0.0 }));
        for scale in [ScaleRewards::Group, ScaleRewards::Batch, ScaleRewards::Off] {
            let (ours, _) = kept_group_advantages(&Tensor::from_slice(&rewards), &mask, 4, scale, 1e-4);
            let ours: Vec<f64> = Vec::<f32>::try_from(&ours).unwrap().into_iter().map(f64::from).collect();
            let expected = reference(&rewards, &kept, 4, scale, 1e-4);
            for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
                assert!((a - b).abs() < 1e-5, "{scale:?} row {i}: {a} vs {b}");
            }
            assert_eq!(ours[9], 0.0, "a kept sample alone in its group has no comparison");
            assert!(ours[0] != 0.0 && ours[1] == 0.0, "dropped rows get 0");
        }
        // With every row kept, the same as TRL's group advantages (float32, 1e-6).
        let all = Tensor::ones([12], (Kind::Float, tch::Device::Cpu));
        let (ours, frac) = kept_group_advantages(&Tensor::from_slice(&rewards), &all, 4, ScaleRewards::Group, 1e-4);
        let (trl, trl_frac) = crate::grpo::group_advantages(&Tensor::from_slice(&rewards), 4, ScaleRewards::Group, 1e-4);
        assert!((ours - trl).abs().max().double_value(&[]) < 1e-6);
        assert_eq!(frac, trl_frac);
    }
}
