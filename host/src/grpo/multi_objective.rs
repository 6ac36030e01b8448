//! Several reward components made into one advantage: TRL 1.16's `multi_objective_aggregation`.
//! `sum_then_normalize` (TRL's default and smallrl's) sums the weighted components and normalises
//! the sum as `scale_rewards` says ([`super::group_advantages`]); `normalize_then_sum` is GDPO
//! (arXiv 2601.05242), [`decoupled_advantages`] here.

use tch::{Kind, Tensor};

crate::choice::choice! {
    /// How the reward components become the advantage (TRL's `multi_objective_aggregation`).
    pub enum MultiObjectiveAggregation ("multi_objective_aggregation") {
        /// Their weighted sum, normalised in its group as `scale_rewards` says.
        SumThenNormalize = "sum_then_normalize",
        /// GDPO: each component normalised within its group, the weighted sum of those
        /// normalised over the whole batch.
        NormalizeThenSum = "normalize_then_sum",
    }
}

/// GDPO's advantages (TRL 1.16's `normalize_then_sum`, grpo_trainer.py:2789-2799), in float32
/// with TRL's arithmetic. `scores` is `[batch, k]`, one column per component (groups are
/// consecutive rows of `group_size`), `weights` one per column, `kept` `[batch]` 1 for the rows
/// that count (TRL's scorable rows; smallrl's filter keeps the unflagged ones):
///
/// 1. per group and component, over the kept rows: `z = (r - mean) / (std + eps)`, `std` the
///    unbiased one as TRL's `nanstd` (`sqrt(mean(d^2) * n / (n - 1))`); a component of a group
///    with fewer than two kept rows has no standard deviation (TRL's NaN, dropped by its
///    `nansum`): 0;
/// 2. `s = sum_k weight_k * z_k`;
/// 3. over the kept rows of the whole batch: `A = (s - mean(s)) / (std(s) + eps)`; rows not kept
///    get 0 (TRL's NaN advantages, set to 0), every row with fewer than two kept rows in all.
///
/// Also returns TRL's `frac_reward_zero_std` for it: 1 when the batch's `std(s)` is zero (or
/// undefined), else 0 (TRL compares the one batch-wide standard deviation, on every row).
pub fn decoupled_advantages(scores: &Tensor, weights: &[f64], kept: &Tensor, group_size: usize, eps: f64) -> (Tensor, f64) {
    let (n, k) = (group_size as i64, weights.len() as i64);
    assert_eq!(scores.size(), [kept.size()[0], k], "one score per row and component");
    let kept = kept.to_kind(Kind::Float);
    let grouped = scores.to_kind(Kind::Float).view([-1, n, k]);
    let kept_g = kept.view([-1, n, 1]);
    let (mean, std, compared) = masked_stats(&grouped, &kept_g, 1);
    let z = (&grouped - &mean) / (std + eps) * compared * &kept_g;
    let weights: Vec<f32> = weights.iter().map(|&w| w as f32).collect();
    let summed = (z * Tensor::from_slice(&weights).to(scores.device()).view([1, 1, k])).sum_dim_intlist(2, false, Kind::Float).reshape([-1]);
    let (mean, std, compared) = masked_stats(&summed, &kept, 0);
    let advantages = (&summed - mean) / (&std + eps) * &compared * &kept;
    let zero_std = std.isclose(&std.zeros_like(), 1e-5, 1e-8, false).logical_or(&compared.eq(0.0));
    (advantages, if zero_std.any().int64_value(&[]) != 0 { 1.0 } else { 0.0 })
}

/// The mean and unbiased standard deviation of `values` along `dim` over the rows where `kept`
/// is 1 (dimension kept), as TRL's `nanmean` and `nanstd`, and 1 where at least two rows count
/// (0 where the standard deviation is undefined).
fn masked_stats(values: &Tensor, kept: &Tensor, dim: i64) -> (Tensor, Tensor, Tensor) {
    let count = kept.sum_dim_intlist(dim, true, Kind::Float);
    let mean = (values * kept).sum_dim_intlist(dim, true, Kind::Float) / count.clamp_min(1.0);
    let variance = ((values - &mean).square() * kept).sum_dim_intlist(dim, true, Kind::Float) / count.clamp_min(1.0);
    let compared = count.gt(1.0).to_kind(Kind::Float);
    let std = (variance * (&count / (&count - 1.0).clamp_min(1.0))).sqrt();
    (mean, std, compared)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(t: &Tensor) -> Vec<f64> {
        Vec::try_from(t.to_kind(Kind::Double)).unwrap()
    }

    /// Two components, weights 0.5 and 2, groups of three, every row kept, worked by hand in
    /// float64 (below each step):
    ///
    /// group 1: a = (1, 2, 3): mean 2, unbiased std 1, z_a = (-1, 0, 1) / 1.0001;
    ///          b = (4, 4, 4): std 0, z_b = 0 (zero over 1e-4);
    /// group 2: a = (0, 0, 3): mean 1, d = (-1, -1, 2), var = 6 / 2 = 3, z_a = d / (sqrt 3 + 1e-4);
    ///          b = (1, 0, 0): mean 1/3, d = (2/3, -1/3, -1/3), var = (6/9) / 2 = 1/3,
    ///          z_b = d / (sqrt(1/3) + 1e-4).
    /// s = 0.5 z_a + 2 z_b, then A = (s - mean s) / (std s + 1e-4) over the six rows.
    #[test]
    fn gdpo_normalises_each_component_then_the_weighted_sum_over_the_batch() {
        let a = [1.0, 2.0, 3.0, 0.0, 0.0, 3.0];
        let b = [4.0, 4.0, 4.0, 1.0, 0.0, 0.0];
        let eps = 1e-4;
        let (sa1, sa2, sb2) = (1.0 + eps, 3f64.sqrt() + eps, (1.0f64 / 3.0).sqrt() + eps);
        let z_a = [-1.0 / sa1, 0.0, 1.0 / sa1, -1.0 / sa2, -1.0 / sa2, 2.0 / sa2];
        let z_b = [0.0, 0.0, 0.0, (2.0 / 3.0) / sb2, (-1.0 / 3.0) / sb2, (-1.0 / 3.0) / sb2];
        let s: Vec<f64> = (0..6).map(|i| 0.5 * z_a[i] + 2.0 * z_b[i]).collect();
        let mean = s.iter().sum::<f64>() / 6.0;
        let std = (s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 5.0).sqrt();
        let expected: Vec<f64> = s.iter().map(|x| (x - mean) / (std + eps)).collect();

        let scores = Tensor::from_slice(&[a, b].concat()).view([2, 6]).transpose(0, 1);
        let (advantages, frac_zero_std) = decoupled_advantages(&scores, &[0.5, 2.0], &Tensor::ones([6], (Kind::Float, tch::Device::Cpu)), 3, eps);
        for (i, (ours, exact)) in values(&advantages).iter().zip(&expected).enumerate() {
            assert!((ours - exact).abs() < 1e-6, "row {i}: {ours} vs {exact}");
        }
        assert_eq!(frac_zero_std, 0.0);
        // Not the weighted sum normalised in its group (sum_then_normalize): group 1's sum
        // (4.5, 5, 5.5) would give (-1, 0, 1) / 1.0001 there.
        assert!((values(&advantages)[0] - (-1.0 / sa1)).abs() > 0.1);
    }

    /// Rows not kept leave every statistic: the kept rows' advantages are those of the batch
    /// without them, and a component of a group with one kept row contributes 0.
    #[test]
    fn rows_not_kept_leave_the_group_and_batch_statistics() {
        let a = [1.0, 9.0, 3.0, 2.0, 5.0, 0.0, 7.0, -4.0];
        let b = [0.0, 1.0, 1.0, 0.0, 2.0, 2.0, 3.0, 8.0];
        let kept = [true, false, true, true, false, false, true, false];
        let weights = [1.5, -0.5];
        // Group 1 keeps rows 0, 2, 3; group 2 keeps row 6 alone: its z-scores are 0.
        let stats = |v: &[f64]| {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            (mean, (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() as f64 - 1.0)).sqrt())
        };
        let z = |col: &[f64; 8], i: usize| {
            let (mean, std) = stats(&[col[0], col[2], col[3]]);
            (col[i] - mean) / (std + 1e-4)
        };
        let s: Vec<f64> = [0, 2, 3].iter().map(|&i| 1.5 * z(&a, i) - 0.5 * z(&b, i)).chain([0.0]).collect();
        let (mean, std) = stats(&s);
        let mut expected = [0.0; 8];
        for (j, &i) in [0, 2, 3, 6].iter().enumerate() {
            expected[i] = (s[j] - mean) / (std + 1e-4);
        }
        let scores = Tensor::from_slice(&[a, b].concat()).view([2, 8]).transpose(0, 1);
        let mask = Tensor::from_slice(&kept.map(|k| k as i64 as f32));
        let (advantages, _) = decoupled_advantages(&scores, &weights, &mask, 4, 1e-4);
        for (i, (ours, exact)) in values(&advantages).iter().zip(&expected).enumerate() {
            assert!((ours - exact).abs() < 1e-6, "row {i}: {ours} vs {exact}");
        }
        assert_eq!(values(&advantages)[1], 0.0, "a dropped row gets 0");
    }

    #[test]
    fn a_batch_whose_summed_scores_are_equal_has_zero_std_and_zero_advantages() {
        let scores = Tensor::from_slice(&[2.0f32, 2.0, 5.0, 5.0]).view([4, 1]);
        let (advantages, frac_zero_std) = decoupled_advantages(&scores, &[3.0], &Tensor::ones([4], (Kind::Float, tch::Device::Cpu)), 2, 1e-4);
        assert_eq!(values(&advantages), [0.0; 4]);
        assert_eq!(frac_zero_std, 1.0);
    }
}
