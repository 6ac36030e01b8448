//! What a run does with the monitor's flags: the controls beside gradient routing.
//!
//! | intervention | flagged samples                                                       |
//! |--------------|-----------------------------------------------------------------------|
//! | routing      | go where `routing_mode` sends them (with `none`: nowhere special: the baseline) |
//! | penalty      | reward - `rh_penalty`, trained like every other sample; no routing    |
//! | filter       | leave the loss, and their group's advantages are computed without them |
//! | placebo      | trained as clean; instead a random subset of the same size is routed  |
//! | verified     | only verified samples train: the monitor saw them and did not flag them |
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

use tch::{Kind, Tensor};

use crate::grpo::ScaleRewards;
use crate::rng::{self, SplitMix64};

crate::choice::choice! {
    /// What the monitor's flags do (the table above).
    pub enum Intervention ("intervention") {
        Routing = "routing",
        Penalty = "penalty",
        Filter = "filter",
        Placebo = "placebo",
        Verified = "verified",
    }
}

/// Every intervention, in the order sweeps plan them.
pub const ALL: [Intervention; 5] = [Intervention::Routing, Intervention::Penalty, Intervention::Filter, Intervention::Placebo, Intervention::Verified];

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

/// The placebo's routing labels: as many rows as `flagged` has flags, drawn uniformly (a
/// partial Fisher-Yates shuffle) from `(seed, "placebo", step)`; which rows are flagged does
/// not matter, only how many.
pub fn placebo_labels(flagged: &[bool], seed: u64, step: usize) -> Vec<bool> {
    let count = flagged.iter().filter(|&&f| f).count();
    let mut rows: Vec<usize> = (0..flagged.len()).collect();
    let mut rng = SplitMix64::new(rng::derive(seed, "placebo", step as u64));
    for i in 0..count {
        let pick = i + rng.below(rows.len() - i);
        rows.swap(i, pick);
    }
    let mut labels = vec![false; flagged.len()];
    for &row in &rows[..count] {
        labels[row] = true;
    }
    labels
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
