//! One stream of rows: the token loop (prefill, decode step, head) and scoring, each row with its own KV cache.

use gemm::Parallelism;

use crate::kernels::{group_scores, max_of, rms_norm_rows, silu_gate, softmax_in_place, weighted_sum};
use crate::model::Model;
use crate::prefill::{Prefill, pad, sources};
use crate::sampling::draw;
use crate::{RowOutput, Sampling, UniformStream};

/// Keys and values of one row; slot = position. Keys are `[layer][kv_head][head_dim][slot]`,
/// values `[layer][kv_head][slot][head_dim]`.
#[derive(Default)]
pub(crate) struct RowCache {
    keys: Vec<f32>,
    values: Vec<f32>,
    pub(crate) capacity: usize,
}

impl RowCache {
    fn new(model: &Model, capacity: usize) -> Self {
        let size = model.layers.len() * model.dims.kv_heads * model.dims.head_dim * capacity;
        Self { keys: vec![0.0; size], values: vec![0.0; size], capacity }
    }

    /// Offset of one layer's key/value head in `keys` and `values`.
    fn head_base(&self, layer: usize, kv_heads: usize, head: usize, head_dim: usize) -> usize {
        (layer * kv_heads + head) * self.capacity * head_dim
    }

    /// Copies slots `0..slots` of every layer's keys and values from `from` (whose capacity
    /// may differ) into the same slots here.
    pub(crate) fn copy_slots(&mut self, from: &RowCache, slots: usize, model: &Model) {
        let (kv, hd) = (model.dims.kv_heads, model.dims.head_dim);
        assert!(slots <= self.capacity && slots <= from.capacity, "copied slots fit both caches");
        for layer in 0..model.layers.len() {
            for h in 0..kv {
                let (to_base, from_base) = (self.head_base(layer, kv, h, hd), from.head_base(layer, kv, h, hd));
                for d in 0..hd {
                    let (to, at) = (to_base + d * self.capacity, from_base + d * from.capacity);
                    self.keys[to..to + slots].copy_from_slice(&from.keys[at..at + slots]);
                }
                self.values[to_base..to_base + slots * hd].copy_from_slice(&from.values[from_base..from_base + slots * hd]);
            }
        }
    }
}

/// One token to run through the model: which row of the stream, at which position.
#[derive(Clone, Copy)]
pub(crate) struct TokenSlot {
    pub(crate) row: usize,
    pub(crate) position: usize,
    pub(crate) token: u32,
}

/// Reusable activation buffers for a block of `m` tokens.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) x: Vec<f32>,
    h: Vec<f32>,
    fused: Vec<f32>,
    attn: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    scores: Vec<f32>,
}

impl Scratch {
    fn resize(&mut self, model: &Model, m: usize, capacity: usize) {
        let hd = model.dims.head_dim;
        self.x.resize(m * model.dims.hidden, 0.0);
        self.h.resize(m * model.dims.hidden, 0.0);
        self.fused.resize(m * model.layers[0].qkv.outputs, 0.0);
        self.attn.resize(m * model.dims.heads * hd, 0.0);
        self.gate_up.resize(m * 2 * model.dims.intermediate, 0.0);
        self.act.resize(m * model.dims.intermediate, 0.0);
        self.scores.resize(capacity * (model.dims.heads / model.dims.kv_heads), 0.0);
    }
}

/// One row's decoding state, kept across calls so a row can continue where it stopped (an
/// episode's next turn): its KV cache, how many positions it holds, the last drawn token (not
/// yet run through the model: a row's final token never is until the row continues), and the
/// tokens seen so far (for the repetition penalty; empty without one).
#[derive(Default)]
pub struct RowState {
    cache: RowCache,
    pub(crate) len: usize,
    pub(crate) held: Option<u32>,
    pub(crate) seen: Vec<bool>,
}

impl RowState {
    /// An empty row whose cache holds `capacity` positions.
    pub(crate) fn new(model: &Model, capacity: usize) -> Self {
        Self { cache: RowCache::new(model, capacity), len: 0, held: None, seen: Vec::new() }
    }

    /// Positions its cache holds, plus the held token.
    pub fn len(&self) -> usize {
        self.len + usize::from(self.held.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Frees the cache (a finished episode); the row cannot continue.
    pub(crate) fn release(&mut self) {
        *self = Self::default();
    }
}

/// One row of a call: its state, the tokens to append before drawing (a prompt, or an
/// observation), its uniform stream and the most tokens it may draw.
pub(crate) struct Job<'a> {
    pub(crate) state: &'a mut RowState,
    pub(crate) pending: &'a [u32],
    pub(crate) uniforms: &'a mut UniformStream,
    pub(crate) limit: usize,
}

/// Samples every row of `prompts` on the calling thread, each from a fresh state.
pub(crate) fn run_stream(model: &Model, rows: &mut [(&[u32], &mut UniformStream)], params: &Sampling, mode: Prefill, par: Parallelism) -> Vec<RowOutput> {
    let mut states: Vec<RowState> = rows.iter().map(|(p, _)| RowState::new(model, p.len() + params.max_new_tokens)).collect();
    let mut jobs: Vec<Job> = states
        .iter_mut()
        .zip(rows.iter_mut())
        .map(|(state, (pending, uniforms))| Job { state, pending, uniforms, limit: params.max_new_tokens })
        .collect();
    run_jobs(model, &mut jobs, params, mode, par)
}

/// Appends each job's pending tokens to its row and samples up to its limit, on the calling thread.
pub(crate) fn run_jobs(model: &Model, jobs: &mut [Job], params: &Sampling, mode: Prefill, par: Parallelism) -> Vec<RowOutput> {
    if has_avx2() {
        // SAFETY: the CPU supports the features the function is compiled for (checked).
        return unsafe { run_jobs_avx2(model, jobs, params, mode, par) };
    }
    run_jobs_body(model, jobs, params, mode, par)
}

pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The same loops compiled with AVX2 and FMA, so the element-wise kernels (exp, norms,
/// attention) vectorise 8 wide; the matrix products dispatch on their own.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
pub(crate) unsafe fn run_jobs_avx2(model: &Model, jobs: &mut [Job], params: &Sampling, mode: Prefill, par: Parallelism) -> Vec<RowOutput> {
    run_jobs_body(model, jobs, params, mode, par)
}

/// Prefill ([`prefill`]: each row's held and pending tokens, every distinct one once, at the
/// positions after what its cache holds); then the token loop from the logits of each row's
/// last token. A row leaves the batch at a stop token or its limit; its last token is held.
#[inline(always)]
pub(crate) fn run_jobs_body(model: &Model, jobs: &mut [Job], params: &Sampling, mode: Prefill, par: Parallelism) -> Vec<RowOutput> {
    let penalty = params.repetition_penalty != 1.0;
    let mut caches: Vec<RowCache> = jobs.iter_mut().map(|j| std::mem::take(&mut j.state.cache)).collect();
    let mut outputs: Vec<RowOutput> = jobs.iter().map(|_| RowOutput { tokens: Vec::new(), logprobs: Vec::new(), kept: Vec::new(), kept_overflow: false, diverged: false }).collect();
    let kept_capacity = crate::kept_capacity(params, model.dims.vocab);
    let mut survivors = Vec::new();
    let mut scratch = Scratch::default();
    let mut logits = Vec::new();

    let mut active: Vec<usize> = (0..jobs.len()).filter(|&row| jobs[row].limit > 0).collect();
    prefill(model, jobs, &mut caches, &mut scratch, &active, &mut logits, penalty, mode, par);
    let most = jobs.iter().map(|j| j.limit).max().unwrap_or(0);
    for _ in 0..most {
        let mut still_active = Vec::with_capacity(active.len());
        for (i, &row) in active.iter().enumerate() {
            let row_logits = &mut logits[i * model.dims.vocab..(i + 1) * model.dims.vocab];
            let job = &mut jobs[row];
            let row_seen = penalty.then_some(job.state.seen.as_slice());
            let Some((token, logprob)) = draw(row_logits, row_seen, params, job.uniforms, kept_capacity.map(|_| &mut survivors)) else {
                outputs[row].diverged = true;
                continue;
            };
            if let Some(capacity) = kept_capacity {
                if survivors.len() > capacity {
                    outputs[row].kept_overflow = true;
                    continue;
                }
                let kept = &mut outputs[row].kept;
                kept.extend_from_slice(&survivors);
                kept.extend(std::iter::repeat_n(token, capacity - survivors.len()));
            }
            outputs[row].tokens.push(token);
            outputs[row].logprobs.push(logprob);
            if penalty {
                job.state.seen[token as usize] = true;
            }
            if !model.is_stop(token) && outputs[row].tokens.len() < job.limit {
                still_active.push(row);
            }
        }
        active = still_active;
        if active.is_empty() {
            break;
        }
        let block: Vec<TokenSlot> = active
            .iter()
            .map(|&row| TokenSlot { row, position: jobs[row].state.len, token: *outputs[row].tokens.last().expect("a token was drawn") })
            .collect();
        for &row in &active {
            jobs[row].state.len += 1;
        }
        forward(model, &block, &mut caches, &mut scratch, par);
        let every: Vec<usize> = (0..block.len()).collect();
        head(model, &scratch.x, &every, &mut logits, par);
    }
    for ((job, cache), output) in jobs.iter_mut().zip(caches).zip(&outputs) {
        job.state.cache = cache;
        job.state.held = output.tokens.last().copied();
    }
    outputs
}

/// Runs each job's held and pending tokens through the model at the positions after what its
/// cache holds (attending to it), one prefill per source row ([`sources`]); the other rows get
/// their source's cache slots. Leaves in `logits` the next-token logits of each row of
/// `active`, in order.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn prefill(model: &Model, jobs: &mut [Job], caches: &mut [RowCache], s: &mut Scratch, active: &[usize], logits: &mut Vec<f32>, penalty: bool, mode: Prefill, par: Parallelism) {
    let fresh: Vec<Option<&[u32]>> = jobs.iter().map(|j| (j.state.len == 0 && j.state.held.is_none()).then_some(j.pending)).collect();
    let block_tokens = jobs.iter().map(|j| usize::from(j.state.held.is_some()) + j.pending.len()).sum();
    let independent_rows = model.independent_rows();
    let source = sources(&fresh, block_tokens, independent_rows, mode);
    let shared = source.iter().enumerate().any(|(row, &from)| row != from);
    // A shared block is padded to the size from which its products are row-independent.
    let least = if shared { independent_rows.expect("rows share only where the products are row-independent") } else { 0 };
    let (mut block, mut last_of_source) = queue_tokens(model, jobs, caches, &source, penalty);
    pad(&mut block, least);
    forward(model, &block, caches, s, par);
    for (row, &from) in source.iter().enumerate().filter(|(row, from)| row != *from) {
        // `from < row`: a source is the first row with its tokens.
        let (before, after) = caches.split_at_mut(row);
        after[0].copy_slots(&before[from], jobs[row].state.len, model);
    }
    pad(&mut last_of_source, least);
    let mut source_logits = Vec::new();
    head(model, &s.x, &last_of_source, &mut source_logits, par);
    let sources_in_order: Vec<usize> = (0..jobs.len()).filter(|&row| source[row] == row).collect();
    let vocab = model.dims.vocab;
    logits.resize(active.len() * vocab, 0.0);
    for (to, &row) in logits.chunks_exact_mut(vocab).zip(active) {
        let rank = sources_in_order.binary_search(&source[row]).expect("a source row runs its own prefill");
        to.copy_from_slice(&source_logits[rank * vocab..(rank + 1) * vocab]);
    }
}

/// Appends each row's held and pending tokens to its state (positions, repetition-penalty
/// set); returns the block of the source rows' tokens and, per source row in order, the index
/// of its last token in the block.
#[inline(always)]
fn queue_tokens(model: &Model, jobs: &mut [Job], caches: &[RowCache], source: &[usize], penalty: bool) -> (Vec<TokenSlot>, Vec<usize>) {
    let mut block = Vec::new();
    let mut last_of_source = Vec::new();
    for (row, job) in jobs.iter_mut().enumerate() {
        let state = &mut *job.state;
        let tokens: Vec<u32> = state.held.take().into_iter().chain(job.pending.iter().copied()).collect();
        assert!(!tokens.is_empty(), "a row continues with no token to run");
        assert!(state.len + tokens.len() + job.limit <= caches[row].capacity, "a row's tokens outgrow its cache");
        if penalty && state.seen.is_empty() {
            state.seen = vec![false; model.dims.vocab];
        }
        for token in tokens {
            if source[row] == row {
                block.push(TokenSlot { row, position: state.len, token });
            }
            state.len += 1;
            if penalty {
                state.seen[token as usize] = true;
            }
        }
        if source[row] == row {
            last_of_source.push(block.len() - 1);
        }
    }
    (block, last_of_source)
}

pub(crate) fn score_stream(model: &Model, rows: &mut [&(Vec<u32>, usize)], temperature: f32) -> Vec<Vec<f32>> {
    if has_avx2() {
        // SAFETY: the CPU supports the features the function is compiled for (checked).
        return unsafe { score_stream_avx2(model, rows, temperature) };
    }
    score_stream_body(model, rows, temperature)
}

#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
pub(crate) unsafe fn score_stream_avx2(model: &Model, rows: &mut [&(Vec<u32>, usize)], temperature: f32) -> Vec<Vec<f32>> {
    score_stream_body(model, rows, temperature)
}

/// One sequence at a time: the whole sequence as one block (causal through the cache), then
/// the output head at the positions that predict the scored tokens. (Plain loops: closures
/// would not be compiled with this function's target features.)
#[inline(always)]
pub(crate) fn score_stream_body(model: &Model, rows: &mut [&(Vec<u32>, usize)], temperature: f32) -> Vec<Vec<f32>> {
    let vocab = model.dims.vocab;
    let mut scratch = Scratch::default();
    let mut logits = Vec::new();
    let mut scored = Vec::with_capacity(rows.len());
    for (tokens, start) in rows.iter() {
        let mut cache = [RowCache::new(model, tokens.len())];
        let mut block = Vec::with_capacity(tokens.len());
        for (position, &token) in tokens.iter().enumerate() {
            block.push(TokenSlot { row: 0, position, token });
        }
        forward(model, &block, &mut cache, &mut scratch, Parallelism::None);
        let predicting: Vec<usize> = (start - 1..tokens.len() - 1).collect();
        head(model, &scratch.x, &predicting, &mut logits, Parallelism::None);
        let mut logprobs = Vec::with_capacity(predicting.len());
        for (scores, &token) in logits.chunks_exact_mut(vocab).zip(&tokens[*start..]) {
            if temperature != 1.0 {
                for s in scores.iter_mut() {
                    *s /= temperature;
                }
            }
            let (chosen, max) = (scores[token as usize], max_of(scores));
            logprobs.push(chosen - max - softmax_in_place(scores).ln());
        }
        scored.push(logprobs);
    }
    scored
}

/// Runs `block` through every layer, writing each token's key and value into its row's cache
/// at slot = position before attention, so a token attends to slots `0..=position` of its row
/// (causal within the block, and over everything cached before). Leaves the final-norm hidden
/// states in `scratch.x`.
#[inline(always)]
pub(crate) fn forward(model: &Model, block: &[TokenSlot], caches: &mut [RowCache], s: &mut Scratch, par: Parallelism) {
    let (m, d) = (block.len(), model.dims.hidden);
    let capacity = caches.iter().map(|c| c.capacity).max().unwrap_or(0);
    s.resize(model, m, capacity);
    for (i, slot) in block.iter().enumerate() {
        let t = slot.token as usize;
        s.x[i * d..(i + 1) * d].copy_from_slice(&model.embed_tokens[t * d..(t + 1) * d]);
    }
    for (l, layer) in model.layers.iter().enumerate() {
        rms_norm_rows(&s.x, &layer.input_layernorm, model.dims.rms_norm_eps, &mut s.h);
        layer.qkv.apply(&s.h, &mut s.fused, false, par);
        if let Some(bias) = &layer.qkv_bias {
            add_row_bias(&mut s.fused, bias);
        }
        rope_and_cache(model, l, block, &mut s.fused, caches);
        attention(model, l, block, &s.fused, caches, &mut s.attn, &mut s.scores);
        layer.o.apply(&s.attn, &mut s.x, true, par);
        rms_norm_rows(&s.x, &layer.post_attention_layernorm, model.dims.rms_norm_eps, &mut s.h);
        layer.gate_up.apply(&s.h, &mut s.gate_up, false, par);
        silu_gate(&s.gate_up, model.dims.intermediate, &mut s.act);
        layer.down.apply(&s.act, &mut s.x, true, par);
    }
    let mut normed = std::mem::take(&mut s.h);
    rms_norm_rows(&s.x, &model.norm, model.dims.rms_norm_eps, &mut normed);
    std::mem::swap(&mut s.x, &mut normed);
    s.h = normed;
}

/// Logits of the tokens `rows` (indices into the block) of the final hidden states `x`.
pub(crate) fn head(model: &Model, x: &[f32], rows: &[usize], logits: &mut Vec<f32>, par: Parallelism) {
    let d = model.dims.hidden;
    let picked: Vec<f32> = rows.iter().flat_map(|&i| x[i * d..(i + 1) * d].iter().copied()).collect();
    logits.resize(rows.len() * model.dims.vocab, 0.0);
    model.head.apply(&picked, logits, false, par);
}

/// Adds `bias` to every row of `rows` (Qwen2's fused q/k/v biases). Kept out of line so the
/// LLaMA decode loop stays as it was.
#[inline(never)]
fn add_row_bias(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        for (y, b) in row.iter_mut().zip(bias) {
            *y += b;
        }
    }
}

/// Qwen3's per-head RMSNorm of one fused row's `q, k` heads (`plain`) and their `rotate_half`
/// images (`rotated`, normed by the plain head's RMS). Out of line, as [`add_row_bias`].
#[inline(never)]
fn qk_norm(norm: &crate::model::QkNorm, hd: usize, eps: f32, plain: &mut [f32], rotated: &mut [f32]) {
    let heads = plain.chunks_exact_mut(hd).zip(rotated.chunks_exact_mut(hd));
    for ((head, rot), (w, w_rot)) in heads.zip(norm.plain.chunks_exact(hd).zip(norm.rotated.chunks_exact(hd))) {
        let inv = 1.0 / (head.iter().map(|v| v * v).sum::<f32>() / hd as f32 + eps).sqrt();
        for j in 0..hd {
            head[j] *= inv * w[j];
            rot[j] *= inv * w_rot[j];
        }
    }
}

/// Applies the per-head q/k norm where the model has one, then RoPE, in place to the query and
/// key part of each fused row (`q, k` then their `rotate_half` images, then `v`), and writes
/// keys and values to the rows' caches.
#[inline(always)]
pub(crate) fn rope_and_cache(model: &Model, layer: usize, block: &[TokenSlot], fused: &mut [f32], caches: &mut [RowCache]) {
    let (hd, kv) = (model.dims.head_dim, model.dims.kv_heads);
    let qk = model.qk_width();
    let width = fused.len() / block.len().max(1);
    for (row, slot) in fused.chunks_exact_mut(width).zip(block) {
        let cos = &model.cos[slot.position * hd..(slot.position + 1) * hd];
        let sin = &model.sin[slot.position * hd..(slot.position + 1) * hd];
        let (plain, rest) = row.split_at_mut(qk);
        let (rotated, values) = rest.split_at_mut(qk);
        if let Some(norm) = &model.layers[layer].qk_norm {
            qk_norm(norm, hd, model.dims.rms_norm_eps, plain, rotated);
        }
        for (head, rot) in plain.chunks_exact_mut(hd).zip(rotated.chunks_exact(hd)) {
            for j in 0..hd {
                head[j] = head[j] * cos[j] + rot[j] * sin[j];
            }
        }
        let cache = &mut caches[slot.row];
        let keys = &plain[model.dims.heads * hd..];
        for h in 0..kv {
            let base = cache.head_base(layer, kv, h, hd);
            // Keys transposed ([head_dim][slot]) so scores are computed slot-parallel.
            for (d, &k) in keys[h * hd..(h + 1) * hd].iter().enumerate() {
                cache.keys[base + d * cache.capacity + slot.position] = k;
            }
            let at = base + slot.position * hd;
            cache.values[at..at + hd].copy_from_slice(&values[h * hd..(h + 1) * hd]);
        }
    }
}

/// Causal attention of each token's (pre-scaled) query heads over its row's cached slots
/// `0..=position`; query head `h` reads key/value head `h / (heads / kv_heads)`. The query heads
/// sharing a key/value head are scored together, each key row read once for the group.
#[inline(always)]
pub(crate) fn attention(model: &Model, layer: usize, block: &[TokenSlot], fused: &[f32], caches: &[RowCache], out: &mut [f32], scores: &mut [f32]) {
    let (hd, kv) = (model.dims.head_dim, model.dims.kv_heads);
    let group = model.dims.heads / kv;
    let width = fused.len() / block.len().max(1);
    for ((row, slot), out) in fused.chunks_exact(width).zip(block).zip(out.chunks_exact_mut(model.dims.heads * hd)) {
        let cache = &caches[slot.row];
        let len = slot.position + 1;
        for kv_head in 0..kv {
            let base = cache.head_base(layer, kv, kv_head, hd);
            let heads = kv_head * group * hd..(kv_head + 1) * group * hd;
            let scores = &mut scores[..group * len];
            group_scores(&row[heads.clone()], hd, &cache.keys[base..base + hd * cache.capacity], cache.capacity, scores);
            let values = &cache.values[base..base + len * hd];
            for (head_scores, head_out) in scores.chunks_exact_mut(len).zip(out[heads].chunks_exact_mut(hd)) {
                let inv_total = 1.0 / softmax_in_place(head_scores);
                weighted_sum(head_scores, inv_total, values, head_out);
            }
        }
    }
}
