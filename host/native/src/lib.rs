//! smallrl's CPU sampler for tiny LLaMA models: float32 loops and the `gemm` crate, no
//! libtorch.
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
//! token is `[q, k, rotate_half(q), rotate_half(k), v]`. This crate has no modelling choices
//! of its own beyond that layout.
//!
//! Invariant: each row's tokens depend only on its prompt and its own uniform stream, never on
//! which stream or thread computed it.

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
}

/// A row's source of uniform numbers in [0, 1). (A trait object, not a generic parameter:
/// generic code would be compiled in the calling crate, at its optimisation level.)
pub type UniformStream = Box<dyn FnMut() -> f64 + Send>;

/// Shapes of the model.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub max_positions: usize,
    pub rms_norm_eps: f32,
    pub eos: u32,
}

/// A row-major `[inputs, outputs]` matrix: `y = x · W` for row vectors `x`.
pub struct Matrix {
    inputs: usize,
    outputs: usize,
    data: Vec<f32>,
}

impl Matrix {
    pub fn new(inputs: usize, outputs: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), inputs * outputs, "a {inputs} x {outputs} matrix needs {} values", inputs * outputs);
        Self { inputs, outputs, data }
    }

    /// `out[m, outputs] = x[m, inputs] · W`, or `out += x · W` with `accumulate`.
    fn apply(&self, x: &[f32], out: &mut [f32], accumulate: bool) {
        let m = x.len() / self.inputs;
        assert_eq!(x.len(), m * self.inputs, "input is not a whole number of rows");
        assert_eq!(out.len(), m * self.outputs, "output buffer has the wrong size");
        if m == 0 {
            return;
        }
        // SAFETY: the three buffers hold m x inputs, inputs x outputs and m x outputs floats in
        // row-major order (checked above), matching the strides passed; `out` does not alias.
        unsafe {
            gemm::gemm(
                m,
                self.outputs,
                self.inputs,
                out.as_mut_ptr(),
                1,
                self.outputs as isize,
                accumulate,
                x.as_ptr(),
                1,
                self.inputs as isize,
                self.data.as_ptr(),
                1,
                self.outputs as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
}

/// One decoder block.
pub struct Layer {
    pub input_layernorm: Vec<f32>,
    /// `[hidden, (heads + kv_heads) * head_dim * 2 + kv_heads * head_dim]`.
    pub qkv: Matrix,
    /// `[heads * head_dim, hidden]`.
    pub o: Matrix,
    pub post_attention_layernorm: Vec<f32>,
    /// `[hidden, 2 * intermediate]`: gate then up.
    pub gate_up: Matrix,
    /// `[intermediate, hidden]`.
    pub down: Matrix,
}

/// The float32 weights and shapes of a model.
pub struct Model {
    dims: Dims,
    embed_tokens: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    head: Matrix,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Model {
    /// `embed_tokens` is `[vocab, hidden]`, `head` `[hidden, vocab]`, `cos`/`sin`
    /// `[max_positions, head_dim]`. Panics on any shape that disagrees with `dims`.
    pub fn new(dims: Dims, embed_tokens: Vec<f32>, layers: Vec<Layer>, norm: Vec<f32>, head: Matrix, cos: Vec<f32>, sin: Vec<f32>) -> Self {
        let Dims { hidden, heads, kv_heads, head_dim, intermediate, vocab, max_positions, .. } = dims;
        assert!(heads % kv_heads == 0, "{heads} query heads cannot share {kv_heads} key/value heads");
        assert_eq!(embed_tokens.len(), vocab * hidden, "embedding shape");
        assert_eq!(norm.len(), hidden, "final norm shape");
        assert_eq!((head.inputs, head.outputs), (hidden, vocab), "output head shape");
        assert_eq!(cos.len(), max_positions * head_dim, "cos table shape");
        assert_eq!(sin.len(), max_positions * head_dim, "sin table shape");
        let qk = (heads + kv_heads) * head_dim;
        for (i, l) in layers.iter().enumerate() {
            assert_eq!((l.qkv.inputs, l.qkv.outputs), (hidden, 2 * qk + kv_heads * head_dim), "layer {i}: fused projection shape");
            assert_eq!((l.o.inputs, l.o.outputs), (heads * head_dim, hidden), "layer {i}: o shape");
            assert_eq!((l.gate_up.inputs, l.gate_up.outputs), (hidden, 2 * intermediate), "layer {i}: gate/up shape");
            assert_eq!((l.down.inputs, l.down.outputs), (intermediate, hidden), "layer {i}: down shape");
            assert_eq!(l.input_layernorm.len(), hidden, "layer {i}: input norm shape");
            assert_eq!(l.post_attention_layernorm.len(), hidden, "layer {i}: post-attention norm shape");
        }
        assert!(!layers.is_empty(), "a model needs at least one layer");
        Self { dims, embed_tokens, layers, norm, head, cos, sin }
    }

    pub fn dims(&self) -> &Dims {
        &self.dims
    }

    /// Width of the rotated-query-and-key block of the fused projection.
    fn qk_width(&self) -> usize {
        (self.dims.heads + self.dims.kv_heads) * self.dims.head_dim
    }
}

/// What one row produced: its tokens (through the first EOS, if any) and their sampling
/// log-probabilities.
pub struct RowOutput {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
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
    in_streams(&mut jobs, threads, |rows| run_stream(model, rows, params))
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

/// Keys and values of one row; slot = position. Keys are `[layer][kv_head][head_dim][slot]`,
/// values `[layer][kv_head][slot][head_dim]`.
struct RowCache {
    keys: Vec<f32>,
    values: Vec<f32>,
    capacity: usize,
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
}

/// One token to run through the model: which row of the stream, at which position.
#[derive(Clone, Copy)]
struct TokenSlot {
    row: usize,
    position: usize,
    token: u32,
}

/// Reusable activation buffers for a block of `m` tokens.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
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

/// Samples every row of `prompts` on the calling thread.
fn run_stream(model: &Model, rows: &mut [(&[u32], &mut UniformStream)], params: &Sampling) -> Vec<RowOutput> {
    if has_avx2() {
        // SAFETY: the CPU supports the features the function is compiled for (checked).
        return unsafe { run_stream_avx2(model, rows, params) };
    }
    run_stream_body(model, rows, params)
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The same loops compiled with AVX2 and FMA, so the element-wise kernels (exp, norms,
/// attention) vectorise 8 wide; the matrix products dispatch on their own.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn run_stream_avx2(model: &Model, rows: &mut [(&[u32], &mut UniformStream)], params: &Sampling) -> Vec<RowOutput> {
    run_stream_body(model, rows, params)
}

#[inline(always)]
fn run_stream_body(model: &Model, rows: &mut [(&[u32], &mut UniformStream)], params: &Sampling) -> Vec<RowOutput> {
    let (prompts, mut uniforms): (Vec<&[u32]>, Vec<&mut UniformStream>) = rows.iter_mut().map(|(p, u)| (*p, &mut **u)).unzip();
    let mut caches: Vec<RowCache> = prompts.iter().map(|p| RowCache::new(model, p.len() + params.max_new_tokens)).collect();
    let mut seen: Vec<Vec<bool>> = if params.repetition_penalty != 1.0 {
        prompts.iter().map(|p| seen_tokens(p, model.dims.vocab)).collect()
    } else {
        Vec::new()
    };
    let mut outputs: Vec<RowOutput> = prompts.iter().map(|_| RowOutput { tokens: Vec::new(), logprobs: Vec::new(), diverged: false }).collect();
    let mut scratch = Scratch::default();
    let mut logits = Vec::new();

    // Prefill: every prompt token of every row in one block; logits of each row's last token.
    let prefill: Vec<TokenSlot> = prompts
        .iter()
        .enumerate()
        .flat_map(|(row, p)| p.iter().enumerate().map(move |(position, &token)| TokenSlot { row, position, token }))
        .collect();
    let last_of_row: Vec<usize> = prompts.iter().scan(0, |end, p| {
        *end += p.len();
        Some(*end - 1)
    }).collect();
    forward(model, &prefill, &mut caches, &mut scratch);
    head(model, &scratch.x, &last_of_row, &mut logits);

    let mut active: Vec<usize> = (0..prompts.len()).collect();
    for step in 0..params.max_new_tokens {
        let mut still_active = Vec::with_capacity(active.len());
        for (i, &row) in active.iter().enumerate() {
            let row_logits = &mut logits[i * model.dims.vocab..(i + 1) * model.dims.vocab];
            let row_seen = seen.get(row).map(Vec::as_slice);
            let Some((token, logprob)) = draw(row_logits, row_seen, params, uniforms[row]) else {
                outputs[row].diverged = true;
                continue;
            };
            outputs[row].tokens.push(token);
            outputs[row].logprobs.push(logprob);
            if let Some(s) = seen.get_mut(row) {
                s[token as usize] = true;
            }
            if token != model.dims.eos {
                still_active.push(row);
            }
        }
        active = still_active;
        if active.is_empty() || step + 1 == params.max_new_tokens {
            break;
        }
        let block: Vec<TokenSlot> = active
            .iter()
            .map(|&row| TokenSlot { row, position: prompts[row].len() + step, token: *outputs[row].tokens.last().expect("a token was drawn") })
            .collect();
        forward(model, &block, &mut caches, &mut scratch);
        let every: Vec<usize> = (0..block.len()).collect();
        head(model, &scratch.x, &every, &mut logits);
    }
    outputs
}

fn score_stream(model: &Model, rows: &mut [&(Vec<u32>, usize)], temperature: f32) -> Vec<Vec<f32>> {
    if has_avx2() {
        // SAFETY: the CPU supports the features the function is compiled for (checked).
        return unsafe { score_stream_avx2(model, rows, temperature) };
    }
    score_stream_body(model, rows, temperature)
}

#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn score_stream_avx2(model: &Model, rows: &mut [&(Vec<u32>, usize)], temperature: f32) -> Vec<Vec<f32>> {
    score_stream_body(model, rows, temperature)
}

/// One sequence at a time: the whole sequence as one block (causal through the cache), then
/// the output head at the positions that predict the scored tokens. (Plain loops: closures
/// would not be compiled with this function's target features.)
#[inline(always)]
fn score_stream_body(model: &Model, rows: &mut [&(Vec<u32>, usize)], temperature: f32) -> Vec<Vec<f32>> {
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
        forward(model, &block, &mut cache, &mut scratch);
        let predicting: Vec<usize> = (start - 1..tokens.len() - 1).collect();
        head(model, &scratch.x, &predicting, &mut logits);
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

fn seen_tokens(prompt: &[u32], vocab: usize) -> Vec<bool> {
    let mut seen = vec![false; vocab];
    for &t in prompt {
        seen[t as usize] = true;
    }
    seen
}

/// Runs `block` through every layer, writing each token's key and value into its row's cache
/// at slot = position before attention, so a token attends to slots `0..=position` of its row
/// (causal within the block, and over everything cached before). Leaves the final-norm hidden
/// states in `scratch.x`.
#[inline(always)]
fn forward(model: &Model, block: &[TokenSlot], caches: &mut [RowCache], s: &mut Scratch) {
    let (m, d) = (block.len(), model.dims.hidden);
    let capacity = caches.iter().map(|c| c.capacity).max().unwrap_or(0);
    s.resize(model, m, capacity);
    for (i, slot) in block.iter().enumerate() {
        let t = slot.token as usize;
        s.x[i * d..(i + 1) * d].copy_from_slice(&model.embed_tokens[t * d..(t + 1) * d]);
    }
    for (l, layer) in model.layers.iter().enumerate() {
        rms_norm_rows(&s.x, &layer.input_layernorm, model.dims.rms_norm_eps, &mut s.h);
        layer.qkv.apply(&s.h, &mut s.fused, false);
        rope_and_cache(model, l, block, &mut s.fused, caches);
        attention(model, l, block, &s.fused, caches, &mut s.attn, &mut s.scores);
        layer.o.apply(&s.attn, &mut s.x, true);
        rms_norm_rows(&s.x, &layer.post_attention_layernorm, model.dims.rms_norm_eps, &mut s.h);
        layer.gate_up.apply(&s.h, &mut s.gate_up, false);
        silu_gate(&s.gate_up, model.dims.intermediate, &mut s.act);
        layer.down.apply(&s.act, &mut s.x, true);
    }
    let mut normed = std::mem::take(&mut s.h);
    rms_norm_rows(&s.x, &model.norm, model.dims.rms_norm_eps, &mut normed);
    std::mem::swap(&mut s.x, &mut normed);
    s.h = normed;
}

/// Logits of the tokens `rows` (indices into the block) of the final hidden states `x`.
fn head(model: &Model, x: &[f32], rows: &[usize], logits: &mut Vec<f32>) {
    let d = model.dims.hidden;
    let picked: Vec<f32> = rows.iter().flat_map(|&i| x[i * d..(i + 1) * d].iter().copied()).collect();
    logits.resize(rows.len() * model.dims.vocab, 0.0);
    model.head.apply(&picked, logits, false);
}

/// HF's RMSNorm per row: `x / sqrt(mean(x^2) + eps) * weight`, in float32.
#[inline(always)]
fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (row, out) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (mean_square + eps).sqrt();
        for ((o, v), w) in out.iter_mut().zip(row).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// Applies RoPE in place to the query and key part of each fused row (`q, k` then their
/// `rotate_half` images, then `v`) and writes keys and values to the rows' caches.
#[inline(always)]
fn rope_and_cache(model: &Model, layer: usize, block: &[TokenSlot], fused: &mut [f32], caches: &mut [RowCache]) {
    let (hd, kv) = (model.dims.head_dim, model.dims.kv_heads);
    let qk = model.qk_width();
    let width = fused.len() / block.len().max(1);
    for (row, slot) in fused.chunks_exact_mut(width).zip(block) {
        let cos = &model.cos[slot.position * hd..(slot.position + 1) * hd];
        let sin = &model.sin[slot.position * hd..(slot.position + 1) * hd];
        let (plain, rest) = row.split_at_mut(qk);
        let (rotated, values) = rest.split_at_mut(qk);
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
fn attention(model: &Model, layer: usize, block: &[TokenSlot], fused: &[f32], caches: &[RowCache], out: &mut [f32], scores: &mut [f32]) {
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

/// `scores[g][s] = q_g · key[s]` for the query heads `queries` (`[group][head_dim]`) of one
/// key head, keys stored `[head_dim][capacity]`, `scores` `[group][len]`: one pass over the
/// slots per query component (vectorised along the slots, no horizontal sums).
#[inline(always)]
fn group_scores(queries: &[f32], head_dim: usize, keys: &[f32], capacity: usize, scores: &mut [f32]) {
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
fn weighted_sum(weights: &[f32], inv_total: f32, values: &[f32], out: &mut [f32]) {
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
fn silu_gate(gate_up: &[f32], intermediate: usize, act: &mut [f32]) {
    for (row, out) in gate_up.chunks_exact(2 * intermediate).zip(act.chunks_exact_mut(intermediate)) {
        let (gate, up) = row.split_at(intermediate);
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + exp(-g)) * u;
        }
    }
}

/// Replaces `x` by `exp(x - max(x))` and returns the sum (the softmax denominator).
#[inline(always)]
fn softmax_in_place(x: &mut [f32]) -> f32 {
    let max = max_of(x);
    // Two simple loops (map, then sum) vectorise; one fused loop did not.
    for v in x.iter_mut() {
        *v = exp(*v - max);
    }
    sum_f32(x)
}

/// Sum in float32, eight lanes at a time.
#[inline(always)]
fn sum_f32(x: &[f32]) -> f32 {
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
fn max_of(x: &[f32]) -> f32 {
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
fn sum_f64(x: &[f32]) -> f64 {
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
fn exp(x: f32) -> f32 {
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

/// Draws one token from a row's logits with HF's processors in HF's order (repetition
/// penalty, temperature, top-k, top-p), like the host's libtorch sampler (`model/generate.rs`). Returns
/// the token and its log-probability under the processed distribution, or None when the logits
/// are not a distribution (a NaN, or an infinite logit: the weights diverged). `scores` is consumed.
#[inline(always)]
fn draw(scores: &mut [f32], seen: Option<&[bool]>, params: &Sampling, uniform: &mut UniformStream) -> Option<(u32, f32)> {
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
    let total = softmax_in_place(scores);
    if !total.is_finite() {
        return None;
    }
    let token = inverse_cdf(scores, uniform());
    Some((token as u32, (scores[token] / total).ln()))
}

/// First index of the largest value (libtorch's `argmax` on CPU).
fn argmax(x: &[f32]) -> usize {
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
fn inverse_cdf(weights: &[f32], uniform: f64) -> usize {
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
fn top_k(scores: &mut [f32], k: usize) {
    let k = k.min(scores.len());
    let mut sorted = scores.to_vec();
    sorted.sort_unstable_by(|a, b| b.total_cmp(a));
    let threshold = sorted[k - 1];
    scores.iter_mut().filter(|s| **s < threshold).for_each(|s| *s = f32::NEG_INFINITY);
}

/// HF `TopPLogitsWarper`: in ascending order, tokens whose cumulative probability stays within
/// `1 - top_p` become `-inf`; the most likely token always stays.
fn top_p(scores: &mut [f32], top_p: f32) {
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


#[cfg(test)]
mod tests {
    use super::*;

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
        let params = Sampling { max_new_tokens: 1, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0 };
        for (bad, temperature) in [(f32::NAN, 1.0), (f32::INFINITY, 1.0), (f32::NAN, 0.0), (f32::INFINITY, 0.0)] {
            let mut scores = vec![0.0f32, bad, 1.0];
            let mut uniform: UniformStream = Box::new(|| 0.5);
            assert_eq!(draw(&mut scores, None, &Sampling { temperature, ..params }, &mut uniform), None, "logit {bad}, temperature {temperature}");
        }
        let mut uniform: UniformStream = Box::new(|| 0.5);
        assert_eq!(draw(&mut [0.0f32, 0.0], None, &params, &mut uniform).map(|(token, _)| token), Some(1));
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
