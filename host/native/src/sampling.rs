//! Drawing a token as HF's logits processors do (repetition penalty, temperature, top-k, top-p), from a row's own uniform stream.

use crate::kernels::{softmax_in_place, sum_f64};
use crate::{Sampling, UniformStream};

/// Draws one token from a row's logits with HF's processors in HF's order (repetition
/// penalty, temperature, top-k, top-p), like the host's libtorch sampler (`model/generate.rs`). Returns
/// the token and its log-probability under the processed distribution, or None when the logits
/// are not a distribution (a NaN, or an infinite logit: the weights diverged). `scores` is consumed.
/// `kept`, when given (sampling at temperature > 0), receives the ids that survived top-k and
/// top-p, ascending (every id when nothing truncates).
#[inline(always)]
pub(crate) fn draw(scores: &mut [f32], seen: Option<&[bool]>, params: &Sampling, uniform: &mut UniformStream, kept: Option<&mut Vec<u32>>) -> Option<(u32, f32)> {
    if let Some(seen) = seen {
        let penalty = params.repetition_penalty as f32;
        for (s, &was_seen) in scores.iter_mut().zip(seen) {
            if was_seen {
                *s = if *s < 0.0 { *s * penalty } else { *s / penalty };
            }
        }
    }
    if params.temperature == 0.0 {
        let token = argmax(scores);
        let chosen = scores[token];
        let max = chosen;
        let total = softmax_in_place(scores);
        if !total.is_finite() {
            return None;
        }
        return Some((token as u32, chosen - max - total.ln()));
    }
    if params.temperature != 1.0 {
        let t = params.temperature as f32;
        scores.iter_mut().for_each(|s| *s /= t);
    }
    if params.top_k > 0 {
        top_k(scores, params.top_k);
    }
    if params.top_p < 1.0 {
        top_p(scores, params.top_p as f32);
    }
    if let Some(kept) = kept {
        // Before the softmax: a survivor far below the maximum may underflow to weight 0.
        kept.clear();
        kept.extend(scores.iter().enumerate().filter(|(_, s)| **s > f32::NEG_INFINITY).map(|(i, _)| i as u32));
    }
    let total = softmax_in_place(scores);
    if !total.is_finite() {
        return None;
    }
    let token = inverse_cdf(scores, uniform());
    Some((token as u32, (scores[token] / total).ln()))
}

/// First index of the largest value (libtorch's `argmax` on CPU).
pub(crate) fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// The first bin whose cumulative weight exceeds `uniform * total` (float64 sums), over
/// unnormalised weights: a bin of weight 0 is never chosen. Blocks of 64 are summed first so
/// the sequential part is short.
#[inline(always)]
pub(crate) fn inverse_cdf(weights: &[f32], uniform: f64) -> usize {
    const BLOCK: usize = 64;
    let block_sums: Vec<f64> = weights.chunks(BLOCK).map(sum_f64).collect();
    let target = uniform * block_sums.iter().sum::<f64>();
    let mut cumulative = 0.0;
    for (b, &block_sum) in block_sums.iter().enumerate() {
        if cumulative + block_sum > target {
            let block = &weights[b * BLOCK..(b * BLOCK + BLOCK).min(weights.len())];
            let mut inside = cumulative;
            for (i, &w) in block.iter().enumerate() {
                inside += w as f64;
                if inside > target {
                    return b * BLOCK + i;
                }
            }
            // The block's sum (eight lanes) and its running sum round differently: the draw
            // fell in the block's last ulps, so it belongs to the block's last token with weight.
            return b * BLOCK + block.iter().rposition(|&w| w > 0.0).expect("a block with positive sum has a token with weight");
        }
        cumulative += block_sum;
    }
    // Rounding can leave the target at the very top: the last bin with weight (`draw` checked
    // that the weights are finite, so the largest has weight 1).
    weights.iter().rposition(|&w| w > 0.0).expect("no token has positive probability")
}

/// HF `TopKLogitsWarper`: scores below the k-th largest become `-inf`.
pub(crate) fn top_k(scores: &mut [f32], k: usize) {
    let k = k.min(scores.len());
    // The k-th largest score by selection (linear time; a full sort of a 49k vocabulary per
    // token cost more than the draw itself), the same value a descending sort puts at k - 1.
    let mut values = scores.to_vec();
    let (_, &mut threshold, _) = values.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    scores.iter_mut().filter(|s| **s < threshold).for_each(|s| *s = f32::NEG_INFINITY);
}

/// HF `TopPLogitsWarper`: in ascending order, tokens whose cumulative probability stays within
/// `1 - top_p` become `-inf`; the most likely token always stays.
pub(crate) fn top_p(scores: &mut [f32], top_p: f32) {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let mut probs: Vec<f32> = order.iter().map(|&i| scores[i]).collect();
    let total = softmax_in_place(&mut probs);
    let mut cumulative = 0.0;
    for (rank, &i) in order.iter().enumerate().take(scores.len() - 1) {
        cumulative += probs[rank] / total;
        if cumulative <= 1.0 - top_p {
            scores[i] = f32::NEG_INFINITY;
        }
    }
}
