//! smallrl's CPU sampler for tiny LLaMA models: float32 loops and the `gemm` crate (or, for a
//! bfloat16 sampler, its own kernels over bfloat16 weights), no libtorch.
//!
//! Why it exists: one decode step of the 1.25M SimpleStories model is about 2.5 MFLOP per row,
//! so through libtorch a step costs its ~30 small ops per layer (dispatch, allocation, threads
//! woken for tiny tensors), not arithmetic. Here a step is five matrix products per layer into
//! reused buffers plus fused loops; rows are split into one independent stream per thread (no
//! synchronisation inside a step), and finished rows leave the batch.
//!
//! The host (`smallrl::model::native`) fills a [`Model`] from its libtorch decoder's folded
//! weights: adapters merged, the attention scale `1/sqrt(head_dim)` folded into the query
//! rows, and `rotate_half` folded into extra rows of the fused projection, whose output per
//! token is `[q, k, rotate_half(q), rotate_half(k), v]` (plus the fused q/k/v biases of Qwen2,
//! and Qwen3's per-head q/k norm weights in the same layout, the attention scale then folded
//! into q's norm weight). This crate has no modelling choices of its own beyond that layout.
//!
//! Invariant: each row's tokens depend only on its prompt and its own uniform stream, never on
//! which stream or thread computed it.
//!
//! Layout: `model.rs` (the weights' layout), `stream.rs` (the token loop and scoring over one
//! stream of rows), `prefill.rs` (a call's prefill, each distinct fresh prompt once), `kernels.rs` (slice maths), `bf16.rs` (bfloat16 weights and their
//! products, for a sampler in bfloat16), `sampling.rs` (HF's logits processors and the draw),
//! `sums.rs` (the weights' fingerprint sums and bitwise comparison, for the host's
//! weight-delivery check), `check.rs` (that check's passes over a whole model, on threads),
//! `fold.rs` (the host fold's transposes, on threads);
//! this file is the API and the split of rows into streams.

mod bf16;
mod check;
mod fold;
mod kernels;
mod model;
mod prefill;
mod sampling;
mod stream;
mod sums;

pub use bf16::{from_bf16, to_bf16};
pub use fold::{Columns, Folded, fold_transposed};
pub use sums::{same_bits, sums};
pub use model::{Dims, Layer, Matrix, Model, QkNorm, Weight, WeightMut};
pub use stream::RowState;
use prefill::Prefill;
use stream::{Job, run_jobs, run_stream, score_stream};

/// How tokens are drawn (the host re-exports it as `SamplingParams`). `temperature == 0` is
/// greedy decoding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    pub max_new_tokens: usize,
    pub temperature: f64,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1.0 disables nucleus sampling.
    pub top_p: f64,
    /// 1.0 disables the repetition penalty.
    pub repetition_penalty: f64,
    /// Record each drawn token's kept set (the tokens that survived top-k and top-p), for
    /// sampling replay: the trainer renormalises its log-probabilities over them. Only when
    /// sampling truncates ([`kept_capacity`]).
    pub kept_sets: bool,
}

/// The most tokens a kept set may hold when only top-p truncates (prime-rl's bound): a token
/// whose top-p nucleus is wider fails the row, naming this bound.
pub const TOP_P_KEPT_BOUND: usize = 512;

/// How many ids a recorded kept set holds per token (padded with the drawn token itself), or
/// `None` when nothing is recorded (`kept_sets` off, greedy decoding, or no truncation). With
/// top-k, `2 * top_k`: HF's warper keeps every token tied with the k-th score, and a
/// lower-precision sampler (bfloat16 logits) ties often; else [`TOP_P_KEPT_BOUND`]. Never more
/// than the vocabulary. A token whose kept set is larger fails the row.
pub fn kept_capacity(params: &Sampling, vocab: usize) -> Option<usize> {
    let truncates = params.top_k > 0 || params.top_p < 1.0;
    (params.kept_sets && truncates && params.temperature != 0.0).then(|| match params.top_k {
        0 => TOP_P_KEPT_BOUND,
        k => 2 * k,
    }.min(vocab))
}

/// A row's source of uniform numbers in [0, 1). (A trait object, not a generic parameter:
/// generic code would be compiled in the calling crate, at its optimisation level.)
pub type UniformStream = Box<dyn FnMut() -> f64 + Send>;

/// What one row produced: its tokens (through the first EOS, if any) and their sampling
/// log-probabilities.
pub struct RowOutput {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// With kept sets ([`kept_capacity`] `Some(k)`): `k` ids per token, the token's kept set in
    /// ascending order padded with the token itself; empty otherwise.
    pub kept: Vec<u32>,
    /// A token's kept set held more than [`kept_capacity`] ids: the caller reports it as an
    /// error (the row stops there).
    pub kept_overflow: bool,
    /// The row stopped early because its logits were not a distribution (a NaN or an infinite
    /// logit: the weights diverged); the caller reports it as an error.
    pub diverged: bool,
}

/// Samples a completion for every prompt, `threads` streams of rows in parallel. Row `r`
/// draws its uniforms in [0, 1) from `uniforms[r]`, one per token. Each output holds the row's
/// tokens through its first EOS (if any) and their log-probabilities under the processed
/// distribution. Panics on an empty prompt, a token outside the vocabulary or a prompt plus
/// completion longer than `max_positions` (the host checks these first, with messages).
pub fn sample(model: &Model, prompts: &[Vec<u32>], params: &Sampling, uniforms: &mut [UniformStream], threads: usize) -> Vec<RowOutput> {
    assert_eq!(prompts.len(), uniforms.len(), "one uniform stream per row");
    for p in prompts {
        assert!(!p.is_empty(), "empty prompt");
        assert!(p.len() + params.max_new_tokens <= model.dims.max_positions, "prompt plus completion exceeds max_positions");
        assert!(p.iter().all(|&t| (t as usize) < model.dims.vocab), "a prompt token is outside the vocabulary");
    }
    let mut jobs: Vec<(&[u32], &mut UniformStream)> = prompts.iter().map(Vec::as_slice).zip(uniforms.iter_mut()).collect();
    if threads > 1 && model.weight_bytes() > SHARED_WEIGHT_BYTES {
        // A model this large is memory-bound when decoding: one stream of all rows, whose
        // matrix products the threads split, reads each weight once per step for all rows.
        return run_stream(model, &mut jobs, params, Prefill::Shared, gemm::Parallelism::Rayon(threads));
    }
    in_streams(&mut jobs, threads, |rows| run_stream(model, rows, params, Prefill::Shared, gemm::Parallelism::None))
}

/// Rows that continue across calls (multi-turn episodes): each keeps its KV cache, so a call
/// appends only its new tokens (an observation) at the positions that follow, attending to
/// everything cached, and samples on from there. A row's tokens are those [`sample`] draws for
/// its whole sequence as one prompt, up to floating-point summation order.
pub struct Session {
    rows: Vec<RowState>,
}

impl Session {
    /// One empty row per entry of `capacities` (the most positions each will hold).
    pub fn new(model: &Model, capacities: &[usize]) -> Self {
        for &capacity in capacities {
            assert!(capacity <= model.dims.max_positions, "a row's capacity exceeds max_positions");
        }
        Self { rows: capacities.iter().map(|&capacity| RowState::new(model, capacity)).collect() }
    }

    /// Appends `pending[i]` to row `rows[i]` (rows in increasing order) and samples up to
    /// `limits[i]` tokens for it from `uniforms[i]`, `threads` streams of rows in parallel (as
    /// [`sample`]). A row's last drawn token is run through the model when it next continues.
    pub fn continue_rows(&mut self, model: &Model, rows: &[usize], pending: &[Vec<u32>], limits: &[usize], params: &Sampling, uniforms: &mut [UniformStream], threads: usize) -> Vec<RowOutput> {
        assert!(rows.len() == pending.len() && rows.len() == limits.len() && rows.len() == uniforms.len(), "one pending list, limit and uniform stream per row");
        assert!(rows.windows(2).all(|w| w[0] < w[1]) && rows.last().is_none_or(|&r| r < self.rows.len()), "rows in increasing order, each in the session");
        assert!(pending.iter().flatten().all(|&t| (t as usize) < model.dims.vocab), "a token is outside the vocabulary");
        let mut selected = rows.iter().peekable();
        let states = self.rows.iter_mut().enumerate().filter_map(|(row, state)| selected.next_if_eq(&&row).map(|_| state));
        let mut jobs: Vec<Job> = states
            .zip(pending)
            .zip(limits)
            .zip(uniforms.iter_mut())
            .map(|(((state, pending), &limit), uniforms)| Job { state, pending, uniforms, limit })
            .collect();
        if threads > 1 && model.weight_bytes() > SHARED_WEIGHT_BYTES {
            return run_jobs(model, &mut jobs, params, Prefill::Shared, gemm::Parallelism::Rayon(threads));
        }
        in_streams(&mut jobs, threads, |rows| run_jobs(model, rows, params, Prefill::Shared, gemm::Parallelism::None))
    }

    /// Row `row`'s state (how many positions it holds).
    pub fn row(&self, row: usize) -> &RowState {
        &self.rows[row]
    }

    /// Frees row `row`'s cache (its episode ended).
    pub fn release(&mut self, row: usize) {
        self.rows[row].release();
    }
}

/// Log-probabilities of the tokens `start..` of each `(tokens, start)` sequence (`start >= 1`),
/// each predicted from all tokens before it, with the logits divided by `temperature`: what
/// GRPO's reference and old policies need. `threads` streams of sequences in parallel.
pub fn score(model: &Model, sequences: &[(Vec<u32>, usize)], temperature: f32, threads: usize) -> Vec<Vec<f32>> {
    for (tokens, start) in sequences {
        assert!(*start >= 1 && *start <= tokens.len(), "scored tokens must follow at least one token");
        assert!(tokens.len() <= model.dims.max_positions, "sequence longer than max_positions");
        assert!(tokens.iter().all(|&t| (t as usize) < model.dims.vocab), "a token is outside the vocabulary");
    }
    assert!(temperature > 0.0, "temperature must be positive");
    let mut jobs: Vec<&(Vec<u32>, usize)> = sequences.iter().collect();
    in_streams(&mut jobs, threads, |rows| score_stream(model, rows, temperature))
}

/// Above this many bytes of weights, [`sample`] runs one stream of all rows with the threads
/// splitting each matrix product, instead of one stream of rows per thread: each stream reads
/// every weight at every step, which is free while the weights stay in the caches (the 1.25M
/// model's 5 MB) and the bottleneck once they do not (135M: 540 MB per stream per token).
const SHARED_WEIGHT_BYTES: usize = 64 << 20;

/// Runs `work` on `threads` contiguous chunks of `jobs` in parallel and concatenates the
/// results in job order (the calling thread does the work when there is one chunk).
fn in_streams<J: Send, R: Send>(jobs: &mut [J], threads: usize, work: impl Fn(&mut [J]) -> Vec<R> + Sync) -> Vec<R> {
    if jobs.is_empty() {
        return Vec::new();
    }
    let per_stream = jobs.len().div_ceil(threads.clamp(1, jobs.len()));
    if per_stream == jobs.len() {
        return work(jobs);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = jobs.chunks_mut(per_stream).map(|chunk| scope.spawn(move || work(chunk))).collect();
        handles.into_iter().flat_map(|h| h.join().expect("a stream of rows panicked")).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::*;
    use crate::sampling::*;

    #[test]
    fn exp_is_within_two_ulp_of_libm_and_zero_far_below() {
        let mut worst = 0.0f32;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let (ours, reference) = (exp(x), x.exp());
            worst = worst.max((ours - reference).abs() / reference);
        }
        assert!(worst <= 2.0 * f32::EPSILON, "relative error {worst}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-90.0), 0.0);
    }

    #[test]
    fn inverse_cdf_picks_bins_by_cumulative_weight_and_never_an_empty_one() {
        let mut weights = vec![0.0f32; 200];
        weights[1] = 1.0;
        weights[130] = 2.0;
        weights[199] = 1.0;
        // Cumulative edges at 1, 3, 4 of a total of 4.
        for (uniform, expected) in [(0.0, 1), (0.2499, 1), (0.25, 130), (0.7499, 130), (0.75, 199), (0.999_999, 199)] {
            assert_eq!(inverse_cdf(&weights, uniform), expected, "uniform {uniform}");
        }
    }

    #[test]
    fn a_draw_from_non_finite_logits_is_none_not_a_token() {
        let params = Sampling { max_new_tokens: 1, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
        for (bad, temperature) in [(f32::NAN, 1.0), (f32::INFINITY, 1.0), (f32::NAN, 0.0), (f32::INFINITY, 0.0)] {
            let mut scores = vec![0.0f32, bad, 1.0];
            let mut uniform: UniformStream = Box::new(|| 0.5);
            assert_eq!(draw(&mut scores, None, &Sampling { temperature, ..params }, &mut uniform, None), None, "logit {bad}, temperature {temperature}");
        }
        let mut uniform: UniformStream = Box::new(|| 0.5);
        assert_eq!(draw(&mut [0.0f32, 0.0], None, &params, &mut uniform, None).map(|(token, _)| token), Some(1));
    }

    #[test]
    fn a_draw_in_the_rounding_gap_of_a_block_stays_in_that_block() {
        // Block 0: 1.0 and 63 weights of 3e-17. Summed in eight lanes the block exceeds 1.0 by
        // a few ulps; summed one by one it stays 1.0. A target in that gap belongs to block 0.
        let mut weights = vec![3e-17f32; 128];
        weights[0] = 1.0;
        weights[64] = 1.0;
        weights[65..].iter_mut().for_each(|w| *w = 0.0);
        let block0 = sum_f64(&weights[..64]);
        assert!(block0 > 1.0, "the lanes keep the small weights: {block0}");
        let total = block0 + 1.0;
        let uniform = (1.0 + (block0 - 1.0) / 2.0) / total;
        assert!(uniform * total > 1.0 && uniform * total < block0);
        assert_eq!(inverse_cdf(&weights, uniform), 63);
    }

    #[test]
    fn top_k_and_top_p_follow_hf() {
        let mut scores = vec![1.0, 3.0, 2.0, 3.0];
        top_k(&mut scores, 2);
        assert_eq!(scores, [f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY, 3.0]);
        // Probabilities 0.1, 0.2, 0.3, 0.4 (by log): top_p 0.6 keeps the two most likely
        // (ascending cumulative 0.1, 0.3 <= 0.4 are removed; 0.6 is not).
        let mut scores: Vec<f32> = [0.1f32, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect();
        top_p(&mut scores, 0.6);
        assert_eq!(scores[..2], [f32::NEG_INFINITY, f32::NEG_INFINITY]);
        assert!(scores[2].is_finite() && scores[3].is_finite());
    }
}
