//! Tests of traps peers shipped (issue 37): each fails on the bug it is named after.

use tch::{Kind, Tensor};

use super::*;

/// NeMo-RL#4158: after dynamic sampling, a group that keeps one odd sample (three rewards 0, one
/// 1) is informative, and its group baseline must leave every row a nonzero advantage (the odd
/// one `+3/4 / std`, the others `-1/4 / std`), whatever the scaling; a baseline that zeroes them
/// all makes the kept group teach nothing.
#[test]
fn a_kept_group_with_one_odd_sample_keeps_nonzero_advantages() {
    let rewards = [0.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5];
    assert_eq!(informative_groups(&rewards, &[true; 8], 4), [true, false], "the odd group is kept, the equal one dropped");
    let odd = Tensor::from_slice(&rewards[..4]).to_kind(Kind::Float);
    // The unbiased std of (0, 0, 1, 0): sqrt(3/16 * 4/3) = 0.5.
    for (scale, divisor) in [(ScaleRewards::Group, 0.5 + 1e-4), (ScaleRewards::Off, 1.0), (ScaleRewards::Batch, 0.5 + 1e-4)] {
        let (advantages, frac_zero_std) = group_advantages(&odd, 4, scale, 1e-4);
        let advantages = Vec::<f64>::try_from(advantages.to_kind(Kind::Double)).unwrap();
        let expected = [-0.25, -0.25, 0.75, -0.25].map(|a| a / divisor);
        for (a, e) in advantages.iter().zip(expected) {
            assert!((a - e).abs() < 1e-6, "{scale}: advantages {advantages:?}, expected {expected:?}");
        }
        assert_eq!(frac_zero_std, 0.0, "{scale}");
    }
}

/// miles#2796: a fully masked completion (truncated and masked, or not trained) must add no
/// token to the token normalisers: dapo's and bnpo's weights of the other rows are the same as
/// without the masked row (1 / their 5 tokens), not diluted by its padding. grpo and luspo
/// divide by rows, as TRL does (the masked row counts in the mean over sequences).
#[test]
fn a_fully_masked_completion_adds_no_token_to_the_normaliser() {
    let mask = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]).view([3, 3]);
    let everyone = [Tensor::ones([3], (Kind::Float, tch::Device::Cpu))];
    for aggregation in [Aggregation::Dapo, Aggregation::Bnpo] {
        let weights = token_weights(&mask, &everyone, aggregation, 1);
        let kept = weights.masked_select(&mask.to_kind(Kind::Bool));
        let expected = Tensor::full([5], 1.0 / 5.0, (Kind::Float, tch::Device::Cpu));
        assert!(kept.allclose(&expected, 1e-7, 1e-9, false), "{aggregation:?}: {kept:?}");
        assert_eq!(weights.get(2).abs().sum(Kind::Float).double_value(&[]), 0.0, "{aggregation:?}: the masked row weighs nothing");
    }
    let luspo = token_weights(&mask, &everyone, Aggregation::Luspo, 1);
    assert!((luspo.sum(Kind::Float).double_value(&[]) - 5.0 / 3.0).abs() < 1e-6, "luspo: each token 1 / 3 rows");
}
