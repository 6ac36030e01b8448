//! The project's statistics, in one place: means, standard deviations and medians of plain
//! values, quantiles, Kish's effective sample size and masked means of tensors, and the mean
//! over seeds with a bootstrap confidence interval.
//!
//! Percentile bootstrap (Efron and Tibshirani, 1993, ch. 13): draw `resamples` samples of the
//! seeds' values with replacement, each of the original size, take each one's mean, and report
//! the 2.5th and 97.5th percentiles of those means (linear interpolation between order
//! statistics, numpy's default `quantile`). Resampling indices come from the repository's seeded
//! generator (`rng::SplitMix64`, already used for every other seeded draw), started afresh from
//! the same seed for every interval, so a summary is the same on every machine and every
//! `--collect`. With few seeds the interval is narrow by construction (it cannot be wider than
//! the spread of the values) and under-covers; it says how much the seeds disagree, not more.

use tch::{Kind, Tensor};

use crate::defaults;
use crate::rng::SplitMix64;

/// The arithmetic mean (0 for no values, where a caller averages an empty batch).
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The unbiased (n - 1) standard deviation; 0 for fewer than two values (the original's
/// routing: "a single-element subset has no variance").
pub fn unbiased_std(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let m = mean(values);
    (values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (values.len() - 1) as f64).sqrt()
}

/// The population (n) standard deviation, numpy's default (the paper's spread over seeds); 0
/// for no values.
pub fn population_std(values: &[f64]) -> f64 {
    let m = mean(values);
    (values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / values.len().max(1) as f64).sqrt()
}

/// The median of `values` (the upper one of an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty(), "the median of no values");
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Kish's effective sample size `(Σw)² / Σw²` of non-negative weights (0 when all are 0).
pub fn effective_sample_size(weights: &Tensor) -> f64 {
    let weights = weights.detach().to_kind(Kind::Double);
    let squares = weights.square().sum(Kind::Double).double_value(&[]);
    if squares == 0.0 {
        return 0.0;
    }
    weights.sum(Kind::Double).double_value(&[]).powi(2) / squares
}

/// Mean of `values` over the tokens in `mask` (TRL's `masked_batch_mean`).
pub fn masked_mean(values: &Tensor, mask: &Tensor) -> f64 {
    let mask = mask.to_kind(Kind::Float);
    ((values * &mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0)).double_value(&[])
}

/// A mean over seeds with its bootstrap interval (`None` for fewer than two values: one
/// value has no spread to resample).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanCi {
    pub mean: f64,
    pub ci: Option<(f64, f64)>,
    pub n: usize,
}

/// Mean and 95% percentile-bootstrap interval of `values` with the defaults
/// ([`defaults::BOOTSTRAP_RESAMPLES`] resamples, seed [`defaults::BOOTSTRAP_SEED`]).
pub fn mean_ci(values: &[f64]) -> MeanCi {
    mean_ci_with(values, defaults::BOOTSTRAP_RESAMPLES, defaults::BOOTSTRAP_SEED, defaults::BOOTSTRAP_LEVEL)
}

pub fn mean_ci_with(values: &[f64], resamples: usize, seed: u64, level: f64) -> MeanCi {
    assert!(!values.is_empty(), "a mean over seeds needs at least one value");
    assert!(values.iter().all(|v| v.is_finite()), "bootstrap of non-finite values: {values:?}");
    assert!(resamples > 0 && level > 0.0 && level < 1.0, "resamples {resamples}, level {level}");
    let (n, average) = (values.len(), mean(values));
    if n < 2 {
        return MeanCi { mean: average, ci: None, n };
    }
    let mut rng = SplitMix64::new(seed);
    let mut means: Vec<f64> = (0..resamples).map(|_| (0..n).map(|_| values[rng.below(n)]).sum::<f64>() / n as f64).collect();
    means.sort_by(f64::total_cmp);
    let tail = (1.0 - level) / 2.0;
    MeanCi { mean: average, ci: Some((quantile_sorted(&means, tail), quantile_sorted(&means, 1.0 - tail))), n }
}

/// The `q` quantile of sorted values, interpolating linearly between order statistics
/// (position `q (n - 1)`, numpy's default).
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    assert!(!sorted.is_empty() && (0.0..=1.0).contains(&q));
    let position = q * (sorted.len() - 1) as f64;
    let (low, high) = (position.floor() as usize, position.ceil() as usize);
    sorted[low] + (sorted[high] - sorted[low]) * (position - low as f64)
}
