use gemm::Parallelism;

use super::*;
use crate::model::{Dims, Layer, Matrix, Model};
use crate::stream::{Job, RowState, run_stream};
use crate::{RowOutput, Sampling, UniformStream};

/// A deterministic pseudo-random value in [-scale, scale).
fn value(i: usize, scale: f32) -> f32 {
    let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    (h as f32 / (1u64 << 23) as f32 - 1.0) * scale
}

/// A random two-layer model. Hidden 128: its float32 products need 3 rows to be
/// row-independent (`256 / 128 + 1`), so a short shared block is padded and a block of two
/// tokens shares nothing; the bfloat16 one shares from 1 row.
fn random_model(bfloat16: bool) -> Model {
    let dims = Dims { hidden: 128, heads: 4, kv_heads: 2, head_dim: 32, intermediate: 96, vocab: 320, max_positions: 64, rms_norm_eps: 1e-6, eos: 7 };
    let mut seed = 0;
    let mut values = |n: usize, scale: f32| -> Vec<f32> {
        seed += n;
        (seed - n..seed).map(|i| value(i, scale)).collect()
    };
    let mut matrix = |inputs: usize, outputs: usize| {
        let data = values(inputs * outputs, 0.15);
        if bfloat16 { Matrix::bfloat16(inputs, outputs, &data) } else { Matrix::new(inputs, outputs, data) }
    };
    let fused = 2 * (dims.heads + dims.kv_heads) * dims.head_dim + dims.kv_heads * dims.head_dim;
    let layers = (0..2)
        .map(|_| Layer {
            input_layernorm: vec![1.0; dims.hidden],
            qkv: matrix(dims.hidden, fused),
            o: matrix(dims.heads * dims.head_dim, dims.hidden),
            post_attention_layernorm: vec![1.0; dims.hidden],
            gate_up: matrix(dims.hidden, 2 * dims.intermediate),
            down: matrix(dims.intermediate, dims.hidden),
            qkv_bias: None,
            qk_norm: None,
        })
        .collect();
    let head = matrix(dims.hidden, dims.vocab);
    let angles: Vec<f32> = (0..dims.max_positions * dims.head_dim).map(|i| (i / dims.head_dim) as f32 * 0.1 * (1 + i % dims.head_dim) as f32).collect();
    let (cos, sin) = (angles.iter().map(|a| a.cos()).collect(), angles.iter().map(|a| a.sin()).collect());
    Model::new(dims, values(dims.vocab * dims.hidden, 1.0), layers, vec![1.0; dims.hidden], head, cos, sin)
}

/// Row `row`'s uniforms: a fixed sequence of its own.
fn uniforms(row: usize) -> UniformStream {
    let mut i = row * 1000;
    Box::new(move || {
        i += 1;
        (value(i, 1.0) as f64 + 1.0) / 2.0
    })
}

fn sample(model: &Model, prompts: &[&[u32]], params: &Sampling, mode: Prefill) -> Vec<RowOutput> {
    let mut streams: Vec<UniformStream> = (0..prompts.len()).map(uniforms).collect();
    let mut rows: Vec<(&[u32], &mut UniformStream)> = prompts.iter().copied().zip(streams.iter_mut()).collect();
    run_stream(model, &mut rows, params, mode, Parallelism::None)
}

/// Exact comparison: the same binary and kernels on the same inputs, so tokens (integers) and
/// log-probabilities (the same float32 operations) must agree to the bit.
fn assert_same(shared: &[RowOutput], per_row: &[RowOutput], context: &str) {
    assert_eq!(shared.len(), per_row.len(), "{context}: rows");
    for (row, (s, p)) in shared.iter().zip(per_row).enumerate() {
        assert_eq!(s.tokens, p.tokens, "{context}: row {row} tokens");
        assert!(!s.tokens.is_empty(), "{context}: row {row} drew tokens");
        assert_eq!(s.logprobs.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), p.logprobs.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{context}: row {row} log-probs");
        assert_eq!((&s.kept, s.kept_overflow, s.diverged), (&p.kept, p.kept_overflow, p.diverged), "{context}: row {row} kept sets and flags");
    }
}

const A: &[u32] = &[5, 9, 13, 2, 7, 40];
const B: &[u32] = &[3, 3, 8];
const C: &[u32] = &[11];

/// Rows with repeated prompts, sampled with one prefill per distinct prompt, draw exactly the
/// tokens and log-probabilities they draw with a prefill per row, in float32 and bfloat16, for
/// plain sampling and for top-k with a repetition penalty and kept sets; and the batches do
/// share (the plan has rows that copy).
#[test]
fn a_shared_prefill_gives_the_per_row_bits() {
    let plain = Sampling { max_new_tokens: 6, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let processed = Sampling { top_k: 20, repetition_penalty: 1.3, kept_sets: true, temperature: 0.8, ..plain };
    // Groups out of order; one prompt alone; all rows one single-token prompt (a block of one
    // token, padded); two rows of one token (fewer than float32's 3 rows: nothing shared).
    let batches: [&[&[u32]]; 3] = [&[A, A, B, A, B, C, A], &[C, C, C, C], &[C, C]];
    for bfloat16 in [false, true] {
        let model = random_model(bfloat16);
        let least = model.independent_rows().expect("both kinds of products are row-independent from some size");
        assert_eq!(least, if bfloat16 { 1 } else { 3 });
        for prompts in batches {
            let fresh: Vec<Option<&[u32]>> = prompts.iter().map(|&p| Some(p)).collect();
            let tokens = prompts.iter().map(|p| p.len()).sum();
            let plan = sources(&fresh, tokens, Some(least), Prefill::Shared);
            let shares = plan.iter().enumerate().any(|(row, &from)| row != from);
            assert_eq!(shares, bfloat16 || prompts.len() > 2, "{prompts:?}: plan {plan:?}");
            for params in [plain, processed] {
                let context = format!("bfloat16 {bfloat16}, prompts {prompts:?}, {params:?}");
                assert_same(&sample(&model, prompts, &params, Prefill::Shared), &sample(&model, prompts, &params, Prefill::PerRow), &context);
            }
        }
    }
}

/// Continued rows (an episode's next turn) never share: a second call on rows that hold the
/// same history and get the same observation draws, shared or not, the per-row bits.
#[test]
fn continued_rows_keep_their_own_prefill() {
    let params = Sampling { max_new_tokens: 4, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    for bfloat16 in [false, true] {
        let model = random_model(bfloat16);
        let turns = |mode: Prefill| {
            let mut states: Vec<RowState> = (0..4).map(|_| RowState::new(&model, 40)).collect();
            let mut streams: Vec<UniformStream> = (0..4).map(uniforms).collect();
            let mut outputs = Vec::new();
            for pending in [A, B] {
                let mut jobs: Vec<Job> = states.iter_mut().zip(streams.iter_mut()).map(|(state, uniforms)| Job { state, pending, uniforms, limit: params.max_new_tokens }).collect();
                outputs.extend(crate::stream::run_jobs(&model, &mut jobs, &params, mode, Parallelism::None));
            }
            outputs
        };
        assert_same(&turns(Prefill::Shared), &turns(Prefill::PerRow), &format!("bfloat16 {bfloat16}"));
    }
}

/// The plan: the first row with a fresh prompt is its source; a continued row (`None`) and
/// every row of a block below the row-independent size, or of a per-row prefill, is its own.
#[test]
fn each_fresh_prompt_has_its_first_row_as_source() {
    let fresh = [Some(A), Some(B), None, Some(A), Some(B), Some(A)];
    assert_eq!(sources(&fresh, 20, Some(2), Prefill::Shared), [0, 1, 2, 0, 1, 0]);
    assert_eq!(sources(&fresh, 20, Some(2), Prefill::PerRow), [0, 1, 2, 3, 4, 5]);
    assert_eq!(sources(&fresh, 20, None, Prefill::Shared), [0, 1, 2, 3, 4, 5]);
    assert_eq!(sources(&fresh, 20, Some(7), Prefill::Shared), [0, 1, 2, 3, 4, 5], "fewer rows than the products need");
    assert_eq!(sources(&fresh, 5, Some(6), Prefill::Shared), [0, 1, 2, 3, 4, 5], "fewer tokens than the products need");
}
