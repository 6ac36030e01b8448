//! Slice maths on float32: RMS norm, attention scores and sums, SiLU gate, softmax, sums and a fast `exp`.

/// HF's RMSNorm per row: `x / sqrt(mean(x^2) + eps) * weight`, in float32.
#[inline(always)]
pub(crate) fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (row, out) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (mean_square + eps).sqrt();
        for ((o, v), w) in out.iter_mut().zip(row).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// `scores[g][s] = q_g · key[s]` for the query heads `queries` (`[group][head_dim]`) of one
/// key head, keys stored `[head_dim][capacity]`, `scores` `[group][len]`: one pass over the
/// slots per query component (vectorised along the slots, no horizontal sums).
#[inline(always)]
pub(crate) fn group_scores(queries: &[f32], head_dim: usize, keys: &[f32], capacity: usize, scores: &mut [f32]) {
    let len = scores.len() / (queries.len() / head_dim);
    scores.fill(0.0);
    for (d, keys_d) in keys.chunks_exact(capacity).enumerate() {
        let keys_d = &keys_d[..len];
        for (head_scores, q) in scores.chunks_exact_mut(len).zip(queries.chunks_exact(head_dim)) {
            let qd = q[d];
            for (score, k) in head_scores.iter_mut().zip(keys_d) {
                *score += qd * k;
            }
        }
    }
}

/// `out = inv_total * sum_s weights[s] * values[s]` for `values` `[len, head_dim]`; the common
/// head_dim of 32 gets an accumulator the compiler keeps in registers.
#[inline(always)]
pub(crate) fn weighted_sum(weights: &[f32], inv_total: f32, values: &[f32], out: &mut [f32]) {
    // Inlined so it is compiled with the caller's target features.
    #[inline(always)]
    fn fixed<const HD: usize>(weights: &[f32], values: &[f32]) -> [f32; HD] {
        let mut acc = [0f32; HD];
        for (w, v) in weights.iter().zip(values.chunks_exact(HD)) {
            for j in 0..HD {
                acc[j] += w * v[j];
            }
        }
        acc
    }
    if out.len() == 32 {
        let acc = fixed::<32>(weights, values);
        for (o, a) in out.iter_mut().zip(acc) {
            *o = a * inv_total;
        }
        return;
    }
    out.fill(0.0);
    for (w, v) in weights.iter().zip(values.chunks_exact(out.len())) {
        for (o, x) in out.iter_mut().zip(v) {
            *o += w * x;
        }
    }
    out.iter_mut().for_each(|o| *o *= inv_total);
}

/// `act = silu(gate) * up` for rows laid out `[gate | up]`.
#[inline(always)]
pub(crate) fn silu_gate(gate_up: &[f32], intermediate: usize, act: &mut [f32]) {
    for (row, out) in gate_up.chunks_exact(2 * intermediate).zip(act.chunks_exact_mut(intermediate)) {
        let (gate, up) = row.split_at(intermediate);
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + exp(-g)) * u;
        }
    }
}

/// Replaces `x` by `exp(x - max(x))` and returns the sum (the softmax denominator).
#[inline(always)]
pub(crate) fn softmax_in_place(x: &mut [f32]) -> f32 {
    let max = max_of(x);
    // Two simple loops (map, then sum) vectorise; one fused loop did not.
    for v in x.iter_mut() {
        *v = exp(*v - max);
    }
    sum_f32(x)
}

/// Sum in float32, eight lanes at a time.
#[inline(always)]
pub(crate) fn sum_f32(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in &mut chunks {
        for j in 0..8 {
            lanes[j] += chunk[j];
        }
    }
    lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// The largest value (`-inf` for an empty slice), eight lanes at a time.
#[inline(always)]
pub(crate) fn max_of(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in &mut chunks {
        for j in 0..8 {
            lanes[j] = if chunk[j] > lanes[j] { chunk[j] } else { lanes[j] };
        }
    }
    let tail = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    lanes.iter().copied().fold(tail, f32::max)
}

/// Sum in float64, eight lanes at a time.
#[inline(always)]
pub(crate) fn sum_f64(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in &mut chunks {
        for j in 0..8 {
            lanes[j] += chunk[j] as f64;
        }
    }
    lanes.iter().sum::<f64>() + chunks.remainder().iter().map(|&v| v as f64).sum::<f64>()
}

/// `e^x` in float32 (Cephes' `expf`: Cody-Waite reduction and a degree-5 polynomial, within
/// 2 ulp), written branch-free so loops over it vectorise; `x < -87.3` (including `-inf`)
/// gives exactly 0, so masked-out scores keep probability 0.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    let clamped = x.clamp(-87.3, 88.3);
    let n = (clamped * LOG2E + 0.5).floor();
    let r = clamped - n * 0.693_359_375 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // 2^n from the bits of n + 127 (in 1..=254 after the clamp), read off the mantissa of
    // n + 127 + 2^23 rather than by a float-to-int cast, whose saturation blocks vectorising.
    let biased = ((n + 127.0 + 8_388_608.0).to_bits() & 0x7F_FFFF) << 23;
    let scale = f32::from_bits(biased);
    if x < -87.3 { 0.0 } else { y * scale }
}
