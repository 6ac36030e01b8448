//! Hand-computed values of the objective's formulas.

use tch::{Kind, Tensor};

use super::*;
use super::metric_key as key;
use crate::model::batch::Generation;

/// The value `terms` log under `key` (not null).
fn logged<'a>(terms: &'a LossTerms, key: &str) -> &'a Tensor {
    terms.metric(key).unwrap_or_else(|| panic!("the loss logs no value under {key}"))
}

fn approx(actual: &Tensor, expected: f64, what: &str) {
    let actual = actual.double_value(&[]);
    assert!((actual - expected).abs() < 1e-6, "{what}: {actual} vs {expected} (by hand)");
}

/// Two completions of 3 and 2 tokens (a padding token after the second), advantages +1 and
/// -1, and the ratios to the old policy given per token.
struct HandBatch {
    logprobs: Tensor,
    old: Tensor,
    advantages: Tensor,
    mask: Tensor,
}

fn hand_batch() -> HandBatch {
    let ratios = [1.5f64, 1.1, 0.5, 0.7, 1.5, 0.1];
    let old: Vec<f32> = ratios.iter().map(|r| -r.ln() as f32).collect();
    HandBatch {
        logprobs: Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)),
        old: Tensor::from_slice(&old).view([2, 3]),
        advantages: Tensor::from_slice(&[1.0f32, -1.0]),
        mask: Tensor::from_slice(&[1i64, 1, 1, 1, 1, 0]).view([2, 3]),
    }
}

fn loss_terms(b: &HandBatch, settings: &Objective) -> LossTerms {
    let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
    grpo_loss(&b.logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &all_rows, settings)
}

/// TRL's clip with `epsilon` 0.2, `epsilon_high` 0.28 and `delta` 1.3 (CISPO's cap 0.28), no KL.
fn settings(level: ImportanceSamplingLevel, loss_type: LossType) -> Objective {
    let surrogate = match loss_type {
        LossType::Cispo => Surrogate::Cispo { cap: 0.28 },
        _ => Surrogate::Clip { low: 0.2, high: 0.28, delta: Some(1.3) },
    };
    Objective { surrogate, ratio_to: RatioTo::OldPolicy, ratio_level: level, aggregation: Aggregation::of(loss_type, 3), kl: None, top_entropy_quantile: 1.0, correction: None, off_policy_mask_threshold: None, entropy: None }
}

#[test]
fn token_ratios_clip_at_epsilon_high_and_delta_and_count_as_trl_logs_them() {
    let terms = loss_terms(&hand_batch(), &settings(ImportanceSamplingLevel::Token, LossType::Dapo));
    // -min(min(r, delta) A, clip(r, 0.8, 1.28) A) per token: row A = +1: 1.5 -> -1.28,
    // 1.1 -> -1.1, 0.5 -> -0.5; row A = -1: 0.7 -> 0.8, 1.5 -> 1.3 (delta). dapo: sum / 5.
    approx(&terms.loss, (-1.28 - 1.1 - 0.5 + 0.8 + 1.3) / 5.0, "loss");
    // Low: 0.7 with A < 0; high: 1.5 (clamped to 1.3, still above 1.28) with A > 0.
    approx(logged(&terms, key::CLIP_LOW), 1.0 / 5.0, "clip_ratio/low_mean");
    approx(logged(&terms, key::CLIP_HIGH), 1.0 / 5.0, "clip_ratio/high_mean");
    approx(logged(&terms, key::CLIP_REGION), 2.0 / 5.0, "clip_ratio/region_mean");
    // Outside [0.8, 1.28] whatever the advantage: 1.5, 0.5, 0.7, 1.5.
    approx(logged(&terms, key::CLIP_RATIO), 4.0 / 5.0, "clip_ratio");
}

#[test]
fn sequence_ratios_are_the_exp_of_the_mean_log_ratio_over_real_tokens() {
    let b = hand_batch();
    let terms = loss_terms(&b, &settings(ImportanceSamplingLevel::Sequence, LossType::Grpo));
    // Geometric means, the padding's 0.1 left out: both inside the clip range, so the
    // per-sequence loss is -r A.
    let (first, second) = ((1.5f64 * 1.1 * 0.5).powf(1.0 / 3.0), (0.7f64 * 1.5).sqrt());
    approx(&terms.loss, (-first + second) / 2.0, "loss");
    approx(logged(&terms, key::CLIP_REGION), 0.0, "clip_ratio/region_mean");
    // With A = +1 on both rows, the first stays in range and the second (1.025) is above
    // 1 + epsilon_high = 1.02: one completion in two.
    let tight = Objective { surrogate: Surrogate::Clip { low: 0.02, high: 0.02, delta: None }, ..settings(ImportanceSamplingLevel::Sequence, LossType::Grpo) };
    let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
    let positive = Tensor::from_slice(&[1.0f32, 1.0]);
    let terms = grpo_loss(&b.logprobs, Some(&b.old), None, &positive, (&b.mask).into(), &all_rows, &tight);
    approx(logged(&terms, key::CLIP_HIGH), 0.5, "clip_ratio/high_mean per completion");
    approx(&terms.loss, (-first - 1.02) / 2.0, "loss with the second completion clipped");
}

#[test]
fn cispo_weights_the_log_prob_by_the_capped_detached_ratio() {
    let b = hand_batch();
    let logprobs = b.logprobs.set_requires_grad(true);
    let cispo = Objective { surrogate: Surrogate::Cispo { cap: 1.2 }, ..settings(ImportanceSamplingLevel::Token, LossType::Cispo) };
    let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
    let terms = grpo_loss(&logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &all_rows, &cispo);
    terms.loss.backward();
    // d loss / d logp = -min(r, 1.2) A / 5 (dapo over the 5 loss tokens); the ratio itself
    // carries no gradient. Ratios 1.5 1.1 0.5 | 0.7 1.5 (padding), A = +1 | -1.
    let expected = [-1.2, -1.1, -0.5, 0.7, 1.2, 0.0].map(|g| g / 5.0);
    let grad = Vec::<f64>::try_from(logprobs.grad().to_kind(Kind::Double).reshape([-1])).unwrap();
    for (ours, hand) in grad.iter().zip(expected) {
        assert!((ours - hand).abs() < 1e-6, "gradient {grad:?} vs {expected:?} (by hand)");
    }
    assert!(terms.metric(key::CLIP_REGION).is_none(), "TRL logs no PPO clip fractions for cispo");
    // Capped with A > 0: the first row's 1.5 only; capped at all: both 1.5s.
    approx(logged(&terms, key::CISPO_CLIP_RATIO), 1.0 / 5.0, "cispo_clip_ratio");
    approx(logged(&terms, key::CLIP_RATIO), 2.0 / 5.0, "clip_ratio");
}

#[test]
fn tinker_losses_follow_their_documented_formulas_by_hand() {
    let b = hand_batch();
    let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
    let tinker = |surrogate| Objective { surrogate, ratio_to: RatioTo::Sampler, ..settings(ImportanceSamplingLevel::Token, LossType::Dapo) };
    // importance_sampling, dapo over the 5 loss tokens: -(r A) = -(1.5 + 1.1 + 0.5) + (0.7 + 1.5).
    let terms = grpo_loss(&b.logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &all_rows, &tinker(Surrogate::ImportanceSampling));
    approx(&terms.loss, (-3.1 + 2.2) / 5.0, "importance_sampling loss");
    approx(logged(&terms, key::CLIP_RATIO), 0.0, "importance_sampling clips nothing");
    assert!(terms.metric(key::CLIP_REGION).is_none() && terms.metric(key::CISPO_CLIP_RATIO).is_none());
    // dro at logp = 0: -(0 * A - 0.25 (ln r)^2) per token; d/dlogp = -(A - 0.5 ln r) / 5.
    let logprobs = b.logprobs.set_requires_grad(true);
    let terms = grpo_loss(&logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &all_rows, &tinker(Surrogate::Dro { beta: 0.5 }));
    terms.loss.backward();
    let ratios = [1.5f64, 1.1, 0.5, 0.7, 1.5];
    approx(&terms.loss, ratios.iter().map(|r| 0.25 * r.ln().powi(2)).sum::<f64>() / 5.0, "dro loss");
    let advantages = [1.0, 1.0, 1.0, -1.0, -1.0];
    let grad = Vec::<f64>::try_from(logprobs.grad().to_kind(Kind::Double).reshape([-1])).unwrap();
    for (i, (r, a)) in ratios.iter().zip(advantages).enumerate() {
        let hand = -(a - 0.5 * r.ln()) / 5.0;
        assert!((grad[i] - hand).abs() < 1e-6, "dro gradient {grad:?}: token {i} should be {hand} (by hand)");
    }
    assert_eq!(grad[5], 0.0, "padding");
}

#[test]
fn the_high_entropy_mask_keeps_the_tokens_at_or_above_the_quantile() {
    let b = hand_batch();
    // Loss tokens' entropies 3 1 5 | 2 4 (the padding's 100 must not count): the 0.6
    // quantile (top 0.4) is at rank 0.6 * 4 = 2.4 of 1 2 3 4 5, so 3.4; 5 and 4 stay.
    let entropy = Tensor::from_slice(&[3.0f32, 1.0, 5.0, 2.0, 4.0, 100.0]).view([2, 3]);
    let kept = high_entropy_mask(&entropy, &b.mask, 0.4);
    assert!(kept.equal(&Tensor::from_slice(&[0.0f32, 0.0, 1.0, 0.0, 1.0, 0.0]).view([2, 3])), "{kept}");
    assert!(high_entropy_mask(&entropy, &b.mask, 1.0).equal(&b.mask.to_kind(Kind::Float)), "quantile 1 keeps every loss token");
    // The policy term trains on the kept tokens only; the aggregation still counts all five.
    let masks = TokenMasks { loss: &b.mask, policy: Some(&kept) };
    let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
    let terms = grpo_loss(&b.logprobs, Some(&b.old), None, &b.advantages, masks, &all_rows, &settings(ImportanceSamplingLevel::Token, LossType::Dapo));
    // Kept: 0.5 with A = +1 (-0.5), 1.5 with A = -1 (1.3 after delta).
    approx(&terms.loss, (-0.5 + 1.3) / 5.0, "loss");
}

#[test]
fn the_losses_of_complementary_rows_split_the_batch_loss_for_every_loss_type() {
    let b = hand_batch();
    let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
    let first = Tensor::from_slice(&[1.0f32, 0.0]);
    for loss_type in [LossType::Grpo, LossType::DrGrpo, LossType::Dapo, LossType::Bnpo, LossType::Cispo] {
        let s = settings(ImportanceSamplingLevel::Token, loss_type);
        let part = |rows: &Tensor| weighted_loss(&b.logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &row_token_weights(&b.mask, &all_rows, s.aggregation, rows), &s).loss;
        let whole = loss_terms(&b, &s).loss.double_value(&[]);
        let (a, c) = (part(&first).double_value(&[]), part(&(1.0 - &first)).double_value(&[]));
        assert!((a + c - whole).abs() < 1e-6, "{loss_type}: {a} + {c} vs {whole}");
    }
    // dapo's first row alone keeps the batch's five tokens as its divisor (by hand, as in
    // the clip test): (-1.28 - 1.1 - 0.5) / 5, not / 3 as a class of that row alone would.
    let dapo = settings(ImportanceSamplingLevel::Token, LossType::Dapo);
    let weights = row_token_weights(&b.mask, &all_rows, dapo.aggregation, &first);
    approx(&weighted_loss(&b.logprobs, Some(&b.old), None, &b.advantages, (&b.mask).into(), &weights, &dapo).loss, (-1.28 - 1.1 - 0.5) / 5.0, "first row's part");
}

/// Kish's `(Σw)² / Σw²` in f64.
fn kish(weights: &[f64]) -> f64 {
    weights.iter().sum::<f64>().powi(2) / weights.iter().map(|w| w * w).sum::<f64>()
}

#[test]
fn the_effective_sample_size_weighs_tokens_by_aggregation_and_ratio() {
    let b = hand_batch();
    let ratios = [1.5, 1.1, 0.5, 0.7, 1.5];
    // dapo: every loss token weighs 1/5; grpo: 1/(3 * 2) in the first row, 1/(2 * 2) in the second.
    let dapo = ratios.map(|r| r / 5.0);
    let grpo = [1.5 / 6.0, 1.1 / 6.0, 0.5 / 6.0, 0.7 / 4.0, 1.5 / 4.0];
    for (loss_type, weights) in [(LossType::Dapo, dapo), (LossType::Grpo, grpo)] {
        let ess = loss_terms(&b, &settings(ImportanceSamplingLevel::Token, loss_type)).number(key::EFFECTIVE_SAMPLE_SIZE).unwrap();
        assert!((ess - kish(&weights)).abs() < 1e-5, "{loss_type}: {ess} vs {} (by hand)", kish(&weights));
    }
    // On-policy (ratio 1) dapo weighs the five tokens alike: five.
    let all_rows = [Tensor::ones([2], (Kind::Float, tch::Device::Cpu))];
    let fresh = grpo_loss(&b.logprobs, None, None, &b.advantages, (&b.mask).into(), &all_rows, &settings(ImportanceSamplingLevel::Token, LossType::Dapo));
    let fresh = fresh.number(key::EFFECTIVE_SAMPLE_SIZE).unwrap();
    assert!((fresh - 5.0).abs() < 1e-5, "{fresh}");
}

#[test]
fn kl_estimators_and_their_gradients_follow_schulman() {
    let mut logprobs = Tensor::from_slice(&[-1.0f32, -2.0, -0.25]).set_requires_grad(true);
    let reference = Tensor::from_slice(&[-1.5f32, -1.0, -0.25]);
    // d = ref - logp = -0.5, 1, 0; each value and d/dlogp written out in f64.
    let d = [-0.5f64, 1.0, 0.0];
    let exact: [(KlEstimator, fn(f64) -> f64, fn(f64) -> f64); 3] = [
        (KlEstimator::K1, |d| -d, |_| 1.0),
        (KlEstimator::K2, |d| 0.5 * d * d, |d| -d),
        (KlEstimator::K3, |d| d.exp() - d - 1.0, |d| 1.0 - d.exp()),
    ];
    for (estimator, value, slope) in exact {
        logprobs.zero_grad();
        let kl = per_token_kl(&logprobs, &reference, estimator);
        kl.sum(Kind::Float).backward();
        let (kl, grad) = (Vec::<f64>::try_from(kl.detach().to_kind(Kind::Double)).unwrap(), Vec::<f64>::try_from(logprobs.grad().to_kind(Kind::Double)).unwrap());
        for i in 0..3 {
            assert!((kl[i] - value(d[i])).abs() < 1e-6 && (grad[i] - slope(d[i])).abs() < 1e-6, "{estimator}: {kl:?} {grad:?} at d = {d:?}");
        }
    }
}

/// `r - mean_g`, over the unbiased std of the group or of the batch, in plain f64.
fn by_hand(rewards: &[f64], group: usize, scale: ScaleRewards) -> Vec<f64> {
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let std = |v: &[f64]| (v.iter().map(|x| (x - mean(v)).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt();
    rewards
        .chunks(group)
        .flat_map(|g| {
            let divisor = match scale {
                ScaleRewards::Group => std(g) + 1e-4,
                ScaleRewards::Batch => std(rewards) + 1e-4,
                ScaleRewards::Off => 1.0,
            };
            g.iter().map(move |r| (r - mean(g)) / divisor)
        })
        .collect()
}

#[test]
fn advantages_scale_by_the_group_the_batch_or_nothing() {
    let rewards = [0.0, 1.0, 1.0, 1.0, 0.0, 0.5, 0.0, 2.0, 3.0, 3.0, 3.0, 3.0];
    for (scale, zero_std) in [(ScaleRewards::Group, 1.0 / 3.0), (ScaleRewards::Batch, 0.0), (ScaleRewards::Off, 1.0 / 3.0)] {
        let (advantages, frac_zero_std) = group_advantages(&Tensor::from_slice(&rewards), 4, scale, 1e-4);
        let advantages = Vec::<f64>::try_from(advantages.to_kind(Kind::Double)).unwrap();
        for (ours, exact) in advantages.iter().zip(by_hand(&rewards, 4, scale)) {
            assert!((ours - exact).abs() < 1e-6, "{scale}: {ours} vs {exact}");
        }
        assert!((frac_zero_std - zero_std).abs() < 1e-7, "{scale}: frac_reward_zero_std {frac_zero_std}, by hand {zero_std}");
    }
}

#[test]
fn dynamic_sampling_keeps_the_groups_whose_counted_rewards_differ() {
    let all = [true; 9];
    // Groups of 3: equal, one differs, equal zeros.
    let rewards = [0.5, 0.5, 0.5, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0];
    assert_eq!(informative_groups(&rewards, &all, 3), [false, true, false]);
    // Only counted rows matter (intervention: filter): the second group's kept rows are
    // equal, the first's single kept row is not a spread, the third's two kept rows differ.
    let rewards = [0.5, 0.2, 0.5, 1.0, 0.0, 1.0, 0.0, 0.3, 0.0];
    let counted = [true, false, false, true, false, true, false, true, true];
    assert_eq!(informative_groups(&rewards, &counted, 3), [false, false, true]);
    assert_eq!(informative_groups(&rewards, &all, 3), [true, true, true]);
    assert_eq!(informative_groups(&[1.0, 1.0 + 1e-12], &[true, true], 2), [true], "any difference counts");
}

#[test]
fn masking_truncated_completions_removes_their_rows_only() {
    use crate::model::batch::CompletionRow;
    let generation = Generation {
        prompt_ids: Tensor::ones([2, 1], (Kind::Int64, tch::Device::Cpu)),
        prompt_mask: Tensor::ones([2, 1], (Kind::Int64, tch::Device::Cpu)),
        completion_ids: Tensor::from_slice(&[5i64, 1, 1, 5, 6, 7]).view([2, 3]),
        completion_mask: Tensor::from_slice(&[1i64, 1, 0, 1, 1, 1]).view([2, 3]),
        sampling_logprobs: Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)),
        kept: None,
        model_mask: None,
        rows: vec![CompletionRow::new(&[5, 1], 1), CompletionRow::new(&[5, 6, 7], 1)],
    };
    assert!(loss_mask(&generation, false).equal(&generation.completion_mask));
    let expected = Tensor::from_slice(&[1i64, 1, 0, 0, 0, 0]).view([2, 3]);
    assert!(loss_mask(&generation, true).equal(&expected), "the row without EOS leaves the loss");
}

/// Kish's ESS of each aggregation's weights, by hand for rows of 1, 2 and 3 loss tokens (of 4):
/// grpo weighs a token 1/(L_i n), so over tokens (Σw)²/Σw² = 1/(1/9 + 2/36 + 3/81) = 54/11 and
/// over sequences 3 (each row 1/3); dr_grpo, dapo and bnpo in one micro-batch weigh tokens
/// equally (ESS 6 over tokens, (1+2+3)²/(1+4+9) = 18/7 over sequences); bnpo in three
/// micro-batches of one row normalises each row by its own tokens, as grpo does.
#[test]
fn the_ess_of_each_aggregation_matches_hand_computed_values() {
    let mask = Tensor::from_slice(&[1.0f32, 0., 0., 0., 1., 1., 0., 0., 1., 1., 1., 0.]).view([3, 4]);
    let cases = [
        (Aggregation::Grpo, 1, 54.0 / 11.0, 3.0),
        (Aggregation::DrGrpo { max_completion_length: 4 }, 1, 6.0, 18.0 / 7.0),
        (Aggregation::Dapo, 1, 6.0, 18.0 / 7.0),
        (Aggregation::Bnpo, 1, 6.0, 18.0 / 7.0),
        (Aggregation::Bnpo, 3, 54.0 / 11.0, 3.0),
    ];
    for (aggregation, micro_batches, tokens, sequences) in cases {
        let ess = WeightEss::of(&mask, aggregation, micro_batches);
        assert!((ess.tokens - tokens).abs() < 1e-5 && (ess.sequences - sequences).abs() < 1e-5, "{aggregation:?} x{micro_batches}: {ess:?}, expected {tokens} and {sequences}");
    }
}

/// The correction's batch: two completions of 3 and 2 loss tokens (then a padding token whose
/// log-difference, 50, must never count), the sampler's log-probabilities 0 and the learner's
/// `ln rho` per token: rho = 2, 0.1, 4 (product 0.8) and 1.25, 8 (product 10).
fn correction_batch() -> (Tensor, Tensor, Tensor) {
    let rho = [2.0f64, 0.1, 4.0, 1.25, 8.0];
    let mut learner: Vec<f32> = rho.iter().map(|r| r.ln() as f32).collect();
    learner.push(50.0);
    let learner = Tensor::from_slice(&learner).view([2, 3]);
    let mask = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 0]).view([2, 3]);
    (learner, Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)), mask)
}

fn assert_values(actual: &Tensor, expected: &[f64], what: &str) {
    let actual: Vec<f64> = Vec::try_from(actual.to_kind(Kind::Double).flatten(0, -1)).unwrap();
    assert_eq!(actual.len(), expected.len(), "{what}: {actual:?}");
    for (a, e) in actual.iter().zip(expected) {
        assert!((a - e).abs() <= 1e-6 * e.abs().max(1.0), "{what}: {actual:?} vs {expected:?} (by hand)");
    }
}

/// Each mode with bounds [0.2, 3], by hand: per token, truncation clamps 0.1 to 0.2 and 4 and 8
/// to 3, masking zeroes them; per completion the ratio is the product of the token ratios (TRL
/// sums the log-differences), 0.8 kept, 10 clamped to 3 or zeroed. TRL's metrics: the ratio's
/// min / mean / max over loss tokens (completions per sequence), |log-difference| over loss tokens.
#[test]
fn each_correction_mode_weights_and_logs_as_computed_by_hand() {
    let (learner, sampler, mask) = correction_batch();
    let token = |values: [f64; 5]| values.to_vec();
    let cases = [
        (ImportanceSamplingMode::TokenTruncate, token([2.0, 0.2, 3.0, 1.25, 3.0])),
        (ImportanceSamplingMode::TokenMask, token([2.0, 0.0, 0.0, 1.25, 0.0])),
        (ImportanceSamplingMode::SequenceTruncate, vec![0.8, 3.0]),
        (ImportanceSamplingMode::SequenceMask, vec![0.8, 0.0]),
    ];
    let mask_bool = mask.to_kind(Kind::Bool);
    for (mode, expected) in cases {
        let correction = IsCorrection::new(mode, 0.2, 3.0).unwrap();
        let rho = correction.ratio(&learner, &sampler, &mask);
        let on_loss_tokens = match mode.per_sequence() {
            true => rho.shallow_clone(),
            false => rho.masked_select(&mask_bool),
        };
        assert_values(&on_loss_tokens, &expected, &format!("{mode} ratio"));
        let stats = correction.stats(&rho, &learner, &sampler, &mask);
        let (min, max) = expected.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        let mean = expected.iter().sum::<f64>() / expected.len() as f64;
        let logs = [2.0f64, 0.1, 4.0, 1.25, 8.0].map(|r| r.ln().abs());
        let logs_mean = logs.iter().sum::<f64>() / 5.0;
        let got = [stats.ratio_min, stats.ratio_mean, stats.ratio_max, stats.logp_difference_mean, stats.logp_difference_max];
        let want = [min, mean, max, logs_mean, 10f64.ln()];
        assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 1e-6), "{mode} metrics {got:?} vs {want:?} (by hand)");
    }
}

/// The correction multiplies each token's policy term (not the KL term, as TRL adds it after),
/// carries no gradient of its own, and enters the ESS: on policy (ratio 1, advantages +1 and
/// -1, dapo over 5 tokens) with token_truncate's weights rho the loss is
/// `Σ -A rho / 5 + beta Σ kl / 5`, its gradient in each log-probability `-A rho / 5 + beta dkl / 5`.
#[test]
fn the_correction_weighs_the_policy_term_of_the_loss_and_its_gradient() {
    let (learner, sampler, mask) = correction_batch();
    let logprobs = Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let reference = Tensor::full([2, 3], -0.5, (Kind::Float, tch::Device::Cpu));
    let advantages = Tensor::from_slice(&[1.0f32, -1.0]);
    let correction = IsCorrection::new(ImportanceSamplingMode::TokenTruncate, 0.2, 3.0).unwrap();
    let objective = Objective {
        kl: Some(KlPenalty { beta: 0.1, estimator: KlEstimator::K1, bias_correction: false }),
        correction: Some(correction),
        ..settings(ImportanceSamplingLevel::Token, LossType::Dapo)
    };
    let weights = token_weights(&mask.to_kind(Kind::Float), &[Tensor::ones([2], (Kind::Float, tch::Device::Cpu))], objective.aggregation, 1);
    // On policy with an exact sampler: the old log-probabilities are the current ones detached
    // (old None), equal to the sampler's, so every rho is 1.
    let on_policy = LossLogprobs { current: &logprobs, old: None, reference: Some(&reference), sampler: Some(&sampler), replayed: None, old_is_sampler: false };
    let rho = [2.0, 0.2, 3.0, 1.25, 3.0];
    let terms = sampled_loss(on_policy, &advantages, (&mask).into(), &weights, &objective);
    let kl = 0.5 * 5.0; // k1 = logp - ref = 0.5 per token
    approx(&terms.loss, (-(1.0 + 1.0 + 1.0) + (1.0 + 1.0) + 0.1 * kl) / 5.0, "loss on policy, exact sampler");
    // The current log-probabilities at the learner's values: the surrogate's ratio still 1 (old
    // None), the correction's rho = exp(learner - sampler), truncated into [0.2, 3].
    let current = learner.detach().set_requires_grad(true);
    let terms = sampled_loss(LossLogprobs { current: &current, old: None, reference: Some(&reference), sampler: Some(&sampler), replayed: None, old_is_sampler: false }, &advantages, (&mask).into(), &weights, &objective);
    let k1: Vec<f64> = [2.0f64, 0.1, 4.0, 1.25, 8.0].iter().map(|r| r.ln() + 0.5).collect();
    let policy = -(rho[0] + rho[1] + rho[2]) + (rho[3] + rho[4]);
    approx(&terms.loss, (policy + 0.1 * k1.iter().sum::<f64>()) / 5.0, "loss");
    terms.loss.backward();
    let signs = [1.0, 1.0, 1.0, -1.0, -1.0];
    let expected: Vec<f64> = (0..5).map(|i| (-signs[i] * rho[i] + 0.1) / 5.0).collect();
    assert_values(&current.grad().masked_select(&mask.to_kind(Kind::Bool)), &expected, "gradient");
    let ess = rho.iter().sum::<f64>().powi(2) / rho.iter().map(|r| r * r).sum::<f64>();
    let ours = terms.number(key::EFFECTIVE_SAMPLE_SIZE).unwrap();
    assert!((ours - ess).abs() < 1e-4, "ESS {ours} vs {ess} (by hand)");
    let (ratio_max, ratio_min) = (terms.number(key::IS_RATIO_MAX).expect("the correction's metrics"), terms.number(key::IS_RATIO_MIN).unwrap());
    assert!((ratio_max - 3.0).abs() < 1e-6 && (ratio_min - 0.2).abs() < 1e-6, "ratios {ratio_min}..{ratio_max}");
    let without = sampled_loss(LossLogprobs { current: &current, old: None, reference: Some(&reference), sampler: Some(&sampler), replayed: None, old_is_sampler: false }, &advantages, (&mask).into(), &weights, &Objective { correction: None, ..objective });
    assert!(without.metrics.iter().all(|m| !m.key.starts_with("sampling/")), "no metrics without the correction");
}

/// Sampling replay: what the loss compares with the sampler is the policy's renormalised
/// log-probabilities (`replayed`), what it compares with the trainer's own policies the full
/// ones. (1) The correction on policy takes rho from the replayed ones (the numbers of the test
/// above) while the KL to the reference and the gradient stay the full ones'. (2) A ratio to the
/// sampler (`old_is_sampler`) is `exp(replayed - old)`: the hand batch's ratios, so the hand
/// batch's loss; to a trainer's old policy it is `exp(full - old)`.
#[test]
fn replayed_log_probabilities_stand_against_the_sampler_and_the_full_ones_against_the_trainer() {
    let (learner, sampler, mask) = correction_batch();
    let current = Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let reference = Tensor::full([2, 3], -0.5, (Kind::Float, tch::Device::Cpu));
    let advantages = Tensor::from_slice(&[1.0f32, -1.0]);
    let objective = Objective {
        kl: Some(KlPenalty { beta: 0.1, estimator: KlEstimator::K1, bias_correction: false }),
        correction: Some(IsCorrection::new(ImportanceSamplingMode::TokenTruncate, 0.2, 3.0).unwrap()),
        ..settings(ImportanceSamplingLevel::Token, LossType::Dapo)
    };
    let weights = token_weights(&mask.to_kind(Kind::Float), &[Tensor::ones([2], (Kind::Float, tch::Device::Cpu))], objective.aggregation, 1);
    let logprobs = LossLogprobs { current: &current, old: None, reference: Some(&reference), sampler: Some(&sampler), replayed: Some(&learner), old_is_sampler: false };
    let terms = sampled_loss(logprobs, &advantages, (&mask).into(), &weights, &objective);
    let rho = [2.0, 0.2, 3.0, 1.25, 3.0];
    let policy = -(rho[0] + rho[1] + rho[2]) + (rho[3] + rho[4]);
    approx(&terms.loss, (policy + 0.1 * 0.5 * 5.0) / 5.0, "rho from the replayed log-probabilities, k1 from the full ones");
    terms.loss.backward();
    let signs = [1.0, 1.0, 1.0, -1.0, -1.0];
    let expected: Vec<f64> = (0..5).map(|i| (-signs[i] * rho[i] + 0.1) / 5.0).collect();
    assert_values(&current.grad().masked_select(&mask.to_kind(Kind::Bool)), &expected, "gradient into the full log-probabilities");

    let b = hand_batch();
    let plain = settings(ImportanceSamplingLevel::Token, LossType::Dapo);
    let expected = loss_terms(&b, &plain).loss.double_value(&[]);
    let weights = token_weights(&b.mask.to_kind(Kind::Float), &[Tensor::ones([2], (Kind::Float, tch::Device::Cpu))], plain.aggregation, 1);
    let loss = |old: &Tensor, replayed: &Tensor, old_is_sampler: bool| {
        let full = b.logprobs.copy().set_requires_grad(true);
        let logprobs = LossLogprobs { current: &full, old: Some(old), reference: None, sampler: Some(old), replayed: Some(replayed), old_is_sampler };
        sampled_loss(logprobs, &b.advantages, (&b.mask).into(), &weights, &plain).loss.double_value(&[])
    };
    // The hand ratios r = exp(0 - old): to the sampler (old 0) from replayed = -old; to the
    // trainer's old policy from the full 0, whatever the replayed ones.
    let (zeros, shifted) = (b.old.zeros_like(), b.old.zeros_like() - 1.0);
    assert!((loss(&zeros, &(-&b.old), true) - expected).abs() < 1e-6, "ratio to the sampler from the replayed log-probabilities");
    assert!((loss(&b.old, &shifted, false) - expected).abs() < 1e-6, "ratio to a trainer's old policy from the full log-probabilities");
    assert!((loss(&b.old, &shifted, true) - expected).abs() > 1e-3, "the replayed ones would change the loss");
}

/// The hand batch's per-token ratios and advantages as float64 rows (loss tokens only).
const HAND_RATIOS: [&[f64]; 2] = [&[1.5, 1.1, 0.5], &[0.7, 1.5]];
const HAND_ADVANTAGES: [f64; 2] = [1.0, -1.0];

/// The hand batch with differentiable log-probabilities (zeros) and `objective`'s loss over it.
fn hand_loss(objective: &Objective, sampler: Option<&Tensor>) -> (Tensor, LossTerms) {
    let b = hand_batch();
    let logprobs = b.logprobs.set_requires_grad(true);
    let weights = token_weights(&b.mask.to_kind(Kind::Float), &[Tensor::ones([2], (Kind::Float, tch::Device::Cpu))], objective.aggregation, 1);
    let logprobs_in = LossLogprobs { current: &logprobs, old: Some(&b.old), reference: None, sampler, replayed: None, old_is_sampler: objective.ratio_to == RatioTo::Sampler };
    let terms = sampled_loss(logprobs_in, &b.advantages, (&b.mask).into(), &weights, objective);
    terms.loss.backward();
    (logprobs.grad().masked_select(&b.mask.to_kind(Kind::Bool)), terms)
}

fn with_surrogate(surrogate: Surrogate, level: ImportanceSamplingLevel, loss_type: LossType) -> Objective {
    Objective { surrogate, ..settings(level, loss_type) }
}

/// SAPO's gate `sigmoid(tau (r - 1)) 4 / tau` (float64, by its definition) in place of the clip,
/// aggregated as grpo; its gradient in each log-probability `-A 4 sigma (1 - sigma) r / n_row / 2`.
#[test]
fn sapo_gates_each_ratio_softly_with_the_temperature_of_its_advantage_sign() {
    let (positive, negative) = (0.5, 3.0);
    let objective = with_surrogate(Surrogate::Sapo { positive, negative }, ImportanceSamplingLevel::Token, LossType::Sapo);
    assert_eq!(objective.aggregation, Aggregation::Grpo);
    let (grad, terms) = hand_loss(&objective, None);
    let sigma = |tau: f64, r: f64| 1.0 / (1.0 + (-tau * (r - 1.0)).exp());
    let (mut loss, mut expected_grad) = (0.0, vec![]);
    for (ratios, a) in HAND_RATIOS.iter().zip(HAND_ADVANTAGES) {
        let tau = if a > 0.0 { positive } else { negative };
        let n = ratios.len() as f64;
        loss += ratios.iter().map(|&r| -sigma(tau, r) * 4.0 / tau * a).sum::<f64>() / n / 2.0;
        expected_grad.extend(ratios.iter().map(|&r| -a * 4.0 * sigma(tau, r) * (1.0 - sigma(tau, r)) * r / n / 2.0));
    }
    approx(&terms.loss, loss, "sapo loss");
    assert_values(&grad, &expected_grad, "sapo gradient");
    assert!(terms.metric(key::CLIP_REGION).is_none() && terms.metric(key::VESPO_PHI_SEQ_MEAN).is_none(), "sapo logs no clip fractions");
}

/// LUSPO: the clipped sequence ratio (both rows' geometric means inside [0.8, 1.28]), each row's
/// token losses summed, the mean over rows: `(-3 r_1 + 2 r_2) / 2`.
#[test]
fn luspo_sums_each_sequence_and_averages_the_sequences() {
    let objective = settings(ImportanceSamplingLevel::Sequence, LossType::Luspo);
    assert_eq!(objective.aggregation, Aggregation::Luspo);
    let (_, terms) = hand_loss(&objective, None);
    let (first, second) = ((1.5f64 * 1.1 * 0.5).powf(1.0 / 3.0), (0.7f64 * 1.5).sqrt());
    approx(&terms.loss, (-3.0 * first + 2.0 * second) / 2.0, "luspo loss");
}

/// VESPO's weight `phi(w) = w^k e^(lambda (1 - w))` of each row's `w = prod_t r_t` (float64),
/// `(k, lambda)` = (2, 3) for `A >= 0` and (3, 2) below, detached: the loss `Σ -phi A logp / 5`
/// (dapo) is 0 at `logp = 0` and its gradient `-phi A / 5`; with the per-token correction
/// (`token_truncate` into [0.2, 3]) `w` also multiplies the truncated `exp(logp_old - logp_sampler)`.
#[test]
fn vespo_weighs_each_sequence_by_the_gamma_function_of_its_importance_weight() {
    let gamma = VespoGamma { k_pos: 2.0, lambda_pos: 3.0, k_neg: 3.0, lambda_neg: 2.0 };
    let objective = with_surrogate(Surrogate::Vespo(gamma), ImportanceSamplingLevel::Token, LossType::Vespo);
    assert_eq!(objective.aggregation, Aggregation::Dapo);
    let phi = |w: f64, a: f64| if a >= 0.0 { w.powi(2) * (3.0 * (1.0 - w)).exp() } else { w.powi(3) * (2.0 * (1.0 - w)).exp() };
    let expect = |extra: [f64; 2]| -> (Vec<f64>, f64) {
        let phis: Vec<f64> = (0..2).map(|i| phi(HAND_RATIOS[i].iter().product::<f64>() * extra[i], HAND_ADVANTAGES[i])).collect();
        let grad = (0..2).flat_map(|i| std::iter::repeat_n(-phis[i] * HAND_ADVANTAGES[i] / 5.0, HAND_RATIOS[i].len())).collect();
        (grad, (phis[0] + phis[1]) / 2.0)
    };
    let (grad, terms) = hand_loss(&objective, None);
    let (expected_grad, phi_mean) = expect([1.0, 1.0]);
    approx(&terms.loss, 0.0, "vespo loss at logp 0");
    assert_values(&grad, &expected_grad, "vespo gradient");
    approx(logged(&terms, key::VESPO_PHI_SEQ_MEAN), phi_mean, "vespo/phi_seq_mean");
    // The sampler 0.4 above the old policy on the first row's tokens, 0.1 below on the second's:
    // rho = e^-0.4 (inside [0.2, 3]) thrice, e^0.1 twice, folded into w; never multiplied in.
    let b = hand_batch();
    let shift = Tensor::from_slice(&[0.4f32, 0.4, 0.4, -0.1, -0.1, 0.0]).view([2, 3]);
    let sampler = &b.old + shift;
    let corrected = Objective { correction: Some(IsCorrection::new(ImportanceSamplingMode::TokenTruncate, 0.2, 3.0).unwrap()), ..objective };
    let (grad, terms) = hand_loss(&corrected, Some(&sampler));
    let (expected_grad, phi_mean) = expect([(-1.2f64).exp(), 0.2f64.exp()]);
    assert_values(&grad, &expected_grad, "vespo gradient with the correction");
    approx(logged(&terms, key::VESPO_PHI_SEQ_MEAN), phi_mean, "vespo/phi_seq_mean with the correction");
}

/// The off-policy mask drops the second row (A = -1) when its mean gap `logp_sampler - logp`
/// (0.2 here) exceeds the threshold, never the first (A = +1, gap 0.5): the loss is then the
/// first row's alone (dapo over all 5 tokens), `(-1.28 - 1.1 - 0.5) / 5` with TRL's clip.
#[test]
fn the_off_policy_mask_drops_only_far_off_policy_negative_sequences() {
    let sampler = Tensor::from_slice(&[0.5f32, 0.5, 0.5, 0.3, 0.1, 9.0]).view([2, 3]);
    let masked = |threshold| Objective { off_policy_mask_threshold: Some(threshold), ..settings(ImportanceSamplingLevel::Token, LossType::Dapo) };
    let (_, dropped) = hand_loss(&masked(0.1), Some(&sampler));
    approx(&dropped.loss, (-1.28 - 1.1 - 0.5) / 5.0, "loss with the second row masked");
    let (_, kept) = hand_loss(&masked(0.25), Some(&sampler));
    approx(&kept.loss, (-1.28 - 1.1 - 0.5 + 0.8 + 1.3) / 5.0, "loss with both rows (gap 0.2 <= 0.25)");
}

/// The bias-corrected KL: k3 times the (differentiable) token ratio, so its gradient in `logp`
/// is `r (dk3 + k3)`: reference 0.3 below `logp` = 0 gives `d = -0.3`, `k3 = e^d - d - 1`,
/// `dk3/dlogp = 1 - e^d`; beta 0.1, policy term as in the clip test, dapo over 5 tokens.
#[test]
fn the_bias_corrected_kl_is_weighted_by_the_ratio_in_value_and_gradient() {
    let b = hand_batch();
    let reference = Tensor::full([2, 3], -0.3, (Kind::Float, tch::Device::Cpu));
    let kl = |bias_correction| Objective { kl: Some(KlPenalty { beta: 0.1, estimator: KlEstimator::K3, bias_correction }), ..settings(ImportanceSamplingLevel::Token, LossType::Dapo) };
    let weights = token_weights(&b.mask.to_kind(Kind::Float), &[Tensor::ones([2], (Kind::Float, tch::Device::Cpu))], Aggregation::Dapo, 1);
    let loss_of = |objective: &Objective| {
        let logprobs = b.logprobs.copy().set_requires_grad(true);
        let terms = sampled_loss(LossLogprobs { current: &logprobs, old: Some(&b.old), reference: Some(&reference), sampler: None, replayed: None, old_is_sampler: objective.ratio_to == RatioTo::Sampler }, &b.advantages, (&b.mask).into(), &weights, objective);
        terms.loss.backward();
        (terms.loss.double_value(&[]), logprobs.grad().masked_select(&b.mask.to_kind(Kind::Bool)))
    };
    let d = -0.3f64;
    let k3 = d.exp() - d - 1.0;
    let ratios: Vec<f64> = HAND_RATIOS.concat();
    let (plain, _) = loss_of(&kl(false));
    let (corrected, grad) = loss_of(&kl(true));
    let policy = (-1.28 - 1.1 - 0.5 + 0.8 + 1.3) / 5.0;
    assert!((plain - (policy + 0.1 * 5.0 * k3 / 5.0)).abs() < 1e-6, "plain KL: {plain}");
    assert!((corrected - (policy + 0.1 * k3 * ratios.iter().sum::<f64>() / 5.0)).abs() < 1e-6, "corrected KL: {corrected}");
    // The policy term's gradient: r where the clip passes it (1.1, 0.5 with A = +1; 0.7 -> clipped
    // at 0.8 with A = -1 is flat; 1.5 with A = +1 clipped; 1.5 with A = -1 clamped by delta, flat).
    let policy_grad = [0.0, -1.1, -0.5, 0.0, 0.0];
    let expected: Vec<f64> = ratios.iter().zip(policy_grad).map(|(r, p)| (p + 0.1 * r * ((1.0 - d.exp()) + k3)) / 5.0).collect();
    assert_values(&grad, &expected, "gradient of the corrected KL");
}

/// A row in no class (a sample without a score) leaves the token weights as if the batch had
/// not held it. Rows of 3, 2 and 1 tokens, the third in no class (the first two in one); by
/// hand over the first two (n = 2, 5 tokens): grpo 1/(3·2) and 1/(2·2), dr_grpo 1/(2·3), dapo and bnpo 1/5, luspo 1/2.
#[test]
fn a_row_in_no_class_is_out_of_the_aggregation() {
    let mask = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]).view([3, 3]);
    let classes = [Tensor::from_slice(&[1.0f32, 1.0, 0.0])];
    let cases = [
        (Aggregation::Grpo, 1.0 / 6.0, 1.0 / 4.0),
        (Aggregation::DrGrpo { max_completion_length: 3 }, 1.0 / 6.0, 1.0 / 6.0),
        (Aggregation::Dapo, 0.2, 0.2),
        (Aggregation::Bnpo, 0.2, 0.2),
        (Aggregation::Luspo, 0.5, 0.5),
    ];
    for (aggregation, first, second) in cases {
        let ours: Vec<f64> = Vec::try_from(token_weights(&mask, &classes, aggregation, 1).to_kind(Kind::Double).view([-1])).unwrap();
        let expected = [first, first, first, second, second, 0.0, 0.0, 0.0, 0.0];
        assert!(ours.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-7), "{aggregation:?}: {ours:?} vs {expected:?}");
    }
}
