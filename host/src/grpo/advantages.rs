//! Group-normalised advantages (TRL's `scale_rewards`) and DAPO's dynamic-sampling filter.

use tch::{Kind, Tensor};

crate::choice::choice! {
    /// What the advantages are divided by (TRL's `scale_rewards`); the mean subtracted is always
    /// the group's.
    pub enum ScaleRewards ("scale_rewards") {
        /// The group's standard deviation.
        Group = "group",
        /// The whole batch's standard deviation (PPO Lite).
        Batch = "batch",
        /// Nothing: `r - mean_g` (Dr. GRPO).
        Off = "none",
    }
}

/// Advantages `r - mean_g`, divided by `std + eps` unless `scale` is off, in float32 and with
/// TRL 1.16's arithmetic: the unbiased standard deviation as `sqrt(mean(d^2) * n / (n - 1))`,
/// of the group or (`batch`) of the whole batch. `rewards` is `[batch]`, groups are
/// consecutive rows of `group_size`. Also returns TRL's `frac_reward_zero_std`: the fraction
/// of rows whose standard deviation (the one `scale` names; the group's when off) is zero.
pub fn group_advantages(rewards: &Tensor, group_size: usize, scale: ScaleRewards, eps: f64) -> (Tensor, f64) {
    let n = group_size as i64;
    let rewards = rewards.to_kind(Kind::Float);
    let grouped = rewards.view([-1, n]);
    let mean = grouped.mean_dim(1, true, Kind::Float).reshape([-1]).repeat_interleave_self_int(n, 0, None);
    let std = match scale {
        ScaleRewards::Group | ScaleRewards::Off => unbiased_std(&grouped).repeat_interleave_self_int(n, 0, None),
        ScaleRewards::Batch => unbiased_std(&rewards.view([1, -1])).expand_as(&rewards),
    };
    let centred = &rewards - mean;
    let advantages = match scale {
        ScaleRewards::Off => centred,
        ScaleRewards::Group | ScaleRewards::Batch => centred / (&std + eps),
    };
    let zero_std = std.isclose(&std.zeros_like(), 1e-5, 1e-8, false).to_kind(Kind::Float);
    (advantages, zero_std.mean(Kind::Float).double_value(&[]))
}

/// DAPO's dynamic-sampling filter: whether each group (consecutive rows of `group_size`) has
/// rewards that differ among its `counted` rows. A group whose counted rewards are all equal
/// (or with fewer than two counted rows) has zero advantages and teaches nothing: DAPO drops it.
/// Exact equality (verl keeps groups whose `np.std` is above 0; the two differ only for rewards
/// that differ by rounding).
pub fn informative_groups(rewards: &[f64], counted: &[bool], group_size: usize) -> Vec<bool> {
    assert!(rewards.len() == counted.len() && rewards.len() % group_size == 0, "whole groups, one flag per reward");
    rewards
        .chunks(group_size)
        .zip(counted.chunks(group_size))
        .map(|(group, counted)| {
            let mut values = group.iter().zip(counted).filter(|(_, c)| **c).map(|(r, _)| *r);
            let first = values.next();
            first.is_some_and(|first| values.any(|r| r != first))
        })
        .collect()
}

/// `[rows]` unbiased standard deviation of each row of `values` `[rows, n]`, as TRL's `nanstd`.
fn unbiased_std(values: &Tensor) -> Tensor {
    let n = values.size()[1] as f64;
    let mean = values.mean_dim(1, true, Kind::Float);
    let squared = (values - &mean).square().mean_dim(1, false, Kind::Float);
    (squared * (n / (n - 1.0))).sqrt()
}
