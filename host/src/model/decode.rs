//! Fast inference: adapters folded into fused weights, and a preallocated KV cache.
//!
//! A decode step of a 1.25M-parameter model is a few MFLOP per row, so its cost is the number of
//! libtorch ops, not arithmetic. Each layer therefore runs one fused projection that yields
//! `q, k, rotate_half(q), rotate_half(k), v` at once (the rotation is folded into extra weight
//! rows, so RoPE costs two multiplies and an add), one output projection, one fused gate/up
//! projection and one down projection. The KV cache is preallocated and written in place;
//! attention reads the slots written so far (views of the cache, no copies) under an additive
//! key mask, and runs as two batched matrix products (see [`grouped_attention`]).
//!
//! The token loop's state lives here too ([`DecodeState`]: buffers that keep their memory for
//! the whole decode, and the sampler), with the CUDA graphs captured on it ([`GraphedDecode`]);
//! `generate.rs` drives the loop. Architecture invariant: `decode` never imports `generate`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use tch::{Device, Kind, Tensor};

use super::cuda_graph::CudaGraph;
use super::folded::{FoldedWeights, SamplerDtype};
use smallrl_native::Sampling as SamplingParams;
use super::linear::{per_run, run_matmul};
use super::llama::{Llama, embed, rms_norm};
use super::native::NativeModel;
use super::sampler::Sampler;

/// The decoder of a [`Llama`] at fixed adapter scales. Rebuild after the weights change.
pub struct DecodeModel {
    /// The libtorch decoder's weights ([`Self::weights`]): a libtorch decoder's own, refolded in
    /// place or replaced at each delivery; where the native sampler serves, made from its
    /// copy's values only when a libtorch pass asks (a pack's stacked decoder, tests) and dropped
    /// at the next delivery, so a run's decoder keeps one copy of the weights.
    torch: OnceLock<FoldedWeights>,
    /// The folded weights' shapes, config and rotary tables ([`FoldedWeights::layout`]).
    layout: FoldedWeights,
    pub device: Device,
    /// The dtype the decoder computes in: the model's, or bfloat16 for a bfloat16 sampler.
    pub kind: Kind,
    /// The precision it samples in (`sampler_dtype`).
    pub sampler_dtype: SamplerDtype,
    /// The same weights for the libtorch-free CPU sampler (of a float32 model on the CPU only),
    /// its matrices in the sampler's dtype.
    pub(super) native: Option<NativeModel>,
    /// Decode buffers and CUDA graphs captured on these weights (`Decoder::CudaGraphs`); they
    /// are freed with the model, so a graph never outlives the weights it reads.
    pub(super) graphs: Mutex<Vec<GraphedDecode>>,
}

/// Threads for the passes over a native copy (refill, check, fingerprint): libtorch's, which
/// the run set to its `threads`. The passes' results do not depend on it.
fn check_threads() -> usize {
    tch::get_num_threads().max(1) as usize
}

/// Keys and values of every layer, `[batch, kv_heads, capacity, head_dim]` each.
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    pub capacity: i64,
}

impl KvCache {
    /// Rows `index` (`[n]` int64) of this cache, grown (with zeros) to `capacity` slots.
    pub(super) fn rows_grown(&self, index: &Tensor, capacity: i64) -> KvCache {
        assert!(capacity >= self.capacity, "a cache only grows");
        let keep = |t: &Tensor| t.index_select(0, index).constant_pad_nd([0, 0, 0, capacity - self.capacity]);
        KvCache { keys: self.keys.iter().map(keep).collect(), values: self.values.iter().map(keep).collect(), capacity }
    }

    /// Copies `other` (of the same shape) into this cache, keeping its memory.
    pub(super) fn copy_from(&mut self, other: &KvCache) {
        assert_eq!(self.capacity, other.capacity, "caches of different capacities");
        for (to, from) in self.keys.iter_mut().chain(self.values.iter_mut()).zip(other.keys.iter().chain(&other.values)) {
            to.copy_(from);
        }
    }
}

impl DecodeModel {
    /// Folds the adapters in at `scales` (one per adapter slot of the model); samples in the
    /// model's dtype.
    pub fn new(model: &Llama, scales: &[f64]) -> Self {
        Self::sampling_in(model, scales, SamplerDtype::Float32)
    }

    /// Folds the adapters in at `scales` and samples in `dtype`: with bfloat16, the native
    /// sampler's matrices are rounded to bfloat16 (its activations and sums stay float32) and
    /// the libtorch decoder's folded weights are cast to bfloat16 (as a bfloat16 model's).
    pub fn sampling_in(model: &Llama, scales: &[f64], dtype: SamplerDtype) -> Self {
        Self::from_folded(FoldedWeights::new(model, scales), model.device, model.kind, dtype)
    }

    /// A decoder sampling in `dtype` from weights already folded from a model on `device` in
    /// `model_kind`.
    pub fn from_folded(folded: FoldedWeights, device: Device, model_kind: Kind, dtype: SamplerDtype) -> Self {
        let native = Self::native_available(device, model_kind).then(|| NativeModel::new(&folded, dtype));
        let kind = Self::sampling_kind(model_kind, dtype);
        let layout = folded.layout();
        let torch = match native {
            Some(_) => OnceLock::new(),
            None if kind == model_kind => OnceLock::from(folded),
            None => OnceLock::from(folded.to_kind(kind)),
        };
        Self { torch, layout, device, kind, sampler_dtype: dtype, native, graphs: Mutex::new(Vec::new()) }
    }

    /// The weights libtorch passes read (made from the native copy at the first call after a
    /// delivery where the native sampler serves).
    pub(super) fn weights(&self) -> &FoldedWeights {
        self.torch.get_or_init(|| self.native.as_ref().expect("a decoder without libtorch weights has a native copy").folded(&self.layout, self.kind))
    }

    /// The dtype a libtorch decoder of a `model_kind` model computes in when sampling in `dtype`.
    pub fn sampling_kind(model_kind: Kind, dtype: SamplerDtype) -> Kind {
        match dtype {
            SamplerDtype::Float32 => model_kind,
            SamplerDtype::Bfloat16 => Kind::BFloat16,
        }
    }

    /// Refolds `model` at `scales` and delivers it ([`Self::deliver`]: the native copy refilled
    /// in place and checked, libtorch weights copied where CUDA graphs hold them). Panics where
    /// the weights then held are not the fold's.
    pub fn refresh(&mut self, model: &Llama, scales: &[f64]) {
        if let Err([held, expected]) = self.deliver(FoldedWeights::new(model, scales), true) {
            panic!("a refreshed decoder holds weights of fingerprints {held:?}, not the fold's {expected:?}");
        }
    }

    /// Refreshes from `fresh` (the policy folded now; `refresh` false: the test hook of a lost
    /// refresh) and holds what the sampler reads to it; returns the fingerprint of the weights it
    /// samples with, or the held and expected fingerprints where they differ (the engine's
    /// weight-delivery check reports it). A native copy (float32 or bfloat16 matrices) is
    /// refilled in place, each chunk read back, compared with `fresh` bit for bit (as rounded)
    /// and summed for the fingerprint while in cache: one pass on the run's threads
    /// (`smallrl_native`'s `check.rs`), and `fresh` is dropped (libtorch weights made from the old copy are too); a libtorch decoder's
    /// weights take `fresh` (moved in, or copied and cast) and their fingerprint is held to
    /// `fresh`'s in the decoder's dtype.
    pub fn deliver(&mut self, fresh: FoldedWeights, refresh: bool) -> Result<f64, [Vec<f64>; 2]> {
        if let Some(native) = &mut self.native {
            let threads = check_threads();
            let Some(held) = native.refill_certified(&fresh, threads, refresh) else {
                return Err([vec![native.fingerprint(threads)], vec![NativeModel::new(&fresh, self.sampler_dtype).fingerprint(threads)]]);
            };
            self.torch.take();
            return Ok(held);
        }
        let expected = fresh.fingerprints_in(self.kind);
        refresh.then(|| self.adopt(fresh));
        let held = self.fingerprints();
        let bits = |values: &[f64]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        if bits(&held) == bits(&expected) { Ok(expected[0]) } else { Err([held, expected]) }
    }

    /// `fresh` as the libtorch weights: moved in, or copied (and cast) where CUDA graphs hold
    /// their memory or the decoder samples in another dtype.
    fn adopt(&mut self, fresh: FoldedWeights) {
        assert_eq!(self.layout.config, fresh.config, "refolded weights of another shape");
        if self.graphs.get_mut().expect("the decoder's graphs lock").is_empty() && fresh.embed_tokens.kind() == self.kind {
            self.torch = OnceLock::from(fresh);
        } else {
            self.weights().copy_from(&fresh);
        }
    }

    /// The fingerprint of the weights a new decoder samples with ([`Self::deliver`]'s).
    pub fn delivered_fingerprint(&self) -> f64 {
        self.native.as_ref().map(|native| native.fingerprint(check_threads())).unwrap_or_else(|| self.fingerprints()[0])
    }

    /// The fingerprints of its libtorch weights, one per stacked run, in its dtype.
    pub fn fingerprints(&self) -> Vec<f64> {
        self.weights().fingerprints_in(self.kind)
    }

    /// The decoders of several runs of one architecture as one: their weights stacked on a
    /// leading run axis ([`FoldedWeights::stack`]), so a decode step runs every run's rows with
    /// one batched matrix product per projection instead of a few hundred small kernels per
    /// run. Rows `r * b..(r + 1) * b` of a batch of `runs * b` rows are run `r`'s. libtorch
    /// only: the CPU sampler (`native.rs`) decodes one run at a time.
    pub fn stacked(parts: &[&DecodeModel]) -> Self {
        let first = parts.first().expect("stacking needs at least one decoder");
        assert!(parts.iter().all(|p| p.device == first.device && p.kind == first.kind), "stacked decoders on different devices or dtypes");
        let weights = FoldedWeights::stack(&parts.iter().map(|p| p.weights()).collect::<Vec<_>>());
        Self { layout: weights.layout(), torch: OnceLock::from(weights), device: first.device, kind: first.kind, sampler_dtype: first.sampler_dtype, native: None, graphs: Mutex::new(Vec::new()) }
    }

    /// Copies `parts` (the runs this decoder was stacked from, refreshed) into its weights in
    /// place, so its buffers and CUDA graphs stay valid.
    pub fn refresh_stacked(&mut self, parts: &[&DecodeModel]) {
        assert_eq!(Some(parts.len() as i64), self.layout.runs(), "refreshing stacked weights from another number of runs");
        for (run, part) in parts.iter().enumerate() {
            self.weights().copy_run_from(run, part.weights());
        }
    }

    /// How many runs' weights this decoder holds (1 unless [`DecodeModel::stacked`]).
    pub fn runs(&self) -> usize {
        self.layout.runs().unwrap_or(1) as usize
    }

    /// The model's config.json (stop ids, context length) as the decoder samples with it.
    pub fn config(&self) -> &super::config::LlamaConfig {
        &self.layout.config
    }

    /// The CPU sampler's copy of the weights (of a float32 model on the CPU only).
    pub fn native(&self) -> Option<&NativeModel> {
        self.native.as_ref()
    }

    /// Whether the libtorch-free sampler and scorer (`native.rs`) serve this device and dtype
    /// (every model family smallrl loads: Qwen's biases and q/k norms come folded).
    pub fn native_available(device: Device, kind: Kind) -> bool {
        Self::native_refusal(device, kind).is_none()
    }

    /// Why the native sampler does not serve this device and dtype (`None` when it does).
    pub fn native_refusal(device: Device, kind: Kind) -> Option<String> {
        (device != Device::Cpu || kind != Kind::Float).then(|| format!("the native sampler runs float32 on the CPU only (here {kind:?} on {device:?})"))
    }

    pub fn new_cache(&self, batch: i64, capacity: i64) -> KvCache {
        let cfg = self.config();
        assert!(
            capacity as usize <= cfg.max_position_embeddings,
            "prompt plus completion ({capacity} tokens) exceeds max_position_embeddings {}",
            cfg.max_position_embeddings
        );
        let shape = [batch, cfg.num_key_value_heads as i64, capacity, cfg.head_dim as i64];
        let zeros = || (0..cfg.num_hidden_layers).map(|_| Tensor::zeros(shape, (self.kind, self.device))).collect();
        KvCache { keys: zeros(), values: zeros(), capacity }
    }

    /// Runs `ids` (`[batch, n]`) at `positions` (`[batch, n]`), writing their keys and values
    /// into cache slots `start..start + n`. `mask` is `[batch, 1, n, capacity]` additive (0 =
    /// attend, -inf = not; see [`additive_mask`]). Returns the final-norm hidden states
    /// `[batch, n, hidden]`.
    pub fn forward(&self, ids: &Tensor, positions: &Tensor, cache: &mut KvCache, start: i64, mask: &Tensor) -> Tensor {
        self.forward_writing(ids, positions, cache, CacheWrite::Range(start), mask)
    }

    /// One decode step: `ids` (`[batch, 1]`) at `positions`, keys and values written into the
    /// cache slot held by `slot` (`[1]` int64 on the model's device), attention over the whole
    /// capacity under `mask` (`[batch, 1, 1, capacity]`). No shape depends on the step and
    /// nothing is read back to the host, so a step can be recorded as a CUDA graph.
    pub fn forward_at_slot(&self, ids: &Tensor, positions: &Tensor, cache: &mut KvCache, slot: &Tensor, mask: &Tensor) -> Tensor {
        self.forward_writing(ids, positions, cache, CacheWrite::Slot(slot), mask)
    }

    fn forward_writing(&self, ids: &Tensor, positions: &Tensor, cache: &mut KvCache, write: CacheWrite, mask: &Tensor) -> Tensor {
        let weights = self.weights();
        let cfg = &weights.config;
        let (b, n) = ids.size2().expect("ids must be [batch, n]");
        let (heads, kv_heads, hd) = (cfg.num_attention_heads as i64, cfg.num_key_value_heads as i64, cfg.head_dim as i64);
        let qk_width = (heads + kv_heads) * hd;
        let flat = positions.reshape([-1]);
        let cos = weights.cos.index_select(0, &flat).view([b, n, 1, hd]);
        let sin = weights.sin.index_select(0, &flat).view([b, n, 1, hd]);
        let eps = cfg.rms_norm_eps;
        let capacity = cache.capacity;
        let mut x = embed(&weights.embed_tokens, ids);
        for (layer, (keys, values)) in weights.layers.iter().zip(cache.keys.iter_mut().zip(cache.values.iter_mut())) {
            let h = rms_norm(&x, &layer.input_layernorm, eps);
            let fused = run_matmul(&h, &layer.qkv_t);
            let fused = match &layer.qkv_bias {
                Some(bias) => per_run(&fused, bias, 1, |x, b| x + b),
                None => fused,
            };
            let qk = fused.narrow(-1, 0, qk_width).view([b, n, heads + kv_heads, hd]);
            let rotated = fused.narrow(-1, qk_width, qk_width).view([b, n, heads + kv_heads, hd]);
            let (qk, rotated) = match &layer.qk_norm {
                // RMSNorm of each head (float32, as transformers computes it); a head and its
                // rotate_half have the same RMS.
                Some((w, w_rotated)) => {
                    let inv_rms = (qk.to_kind(Kind::Float).square().mean_dim(-1, true, Kind::Float) + eps).rsqrt();
                    let normed = |x: &Tensor, w: &Tensor| per_run(&(x.to_kind(Kind::Float) * &inv_rms).to_kind(x.kind()), w, 2, |x, w| x * w);
                    (normed(&qk, w), normed(&rotated, w_rotated))
                }
                None => (qk, rotated),
            };
            let v = fused.narrow(-1, 2 * qk_width, kv_heads * hd).view([b, n, kv_heads, hd]);
            let qk = qk * &cos + rotated * &sin;
            let (new_keys, new_values) = (qk.narrow(2, heads, kv_heads).transpose(1, 2), v.transpose(1, 2));
            let used = match write {
                CacheWrite::Range(start) => {
                    keys.narrow(2, start, n).copy_(&new_keys);
                    values.narrow(2, start, n).copy_(&new_values);
                    // Only slots up to the last one written can be attended to.
                    start + n
                }
                CacheWrite::Slot(slot) => {
                    let _ = keys.index_copy_(2, slot, &new_keys);
                    let _ = values.index_copy_(2, slot, &new_values);
                    capacity
                }
            };
            let attn = grouped_attention(&qk.narrow(2, 0, heads), &keys.narrow(2, 0, used), &values.narrow(2, 0, used), &mask.narrow(3, 0, used), kv_heads);
            x = x + run_matmul(&attn, &layer.o_t);
            let h = rms_norm(&x, &layer.post_attention_layernorm, eps);
            let gate_up = run_matmul(&h, &layer.gate_up_t);
            let inter = cfg.intermediate_size as i64;
            let act = gate_up.narrow(-1, 0, inter).silu() * gate_up.narrow(-1, inter, inter);
            x = x + run_matmul(&act, &layer.down_t);
        }
        rms_norm(&x, &weights.norm, eps)
    }

    /// `hidden` `[rows, n, hidden]` to logits `[rows, n, vocab]`.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        run_matmul(hidden, &self.weights().head_t)
    }
}

/// Where a forward pass writes its keys and values, and which cache slots it attends to.
#[derive(Clone, Copy)]
enum CacheWrite<'a> {
    /// Slots `start..start + n`; attention reads slots `0..start + n` (views, no copies).
    Range(i64),
    /// The slot held by a `[1]` int64 device tensor; attention reads the whole capacity.
    Slot(&'a Tensor),
}

/// Attention of pre-scaled queries `[batch, n, heads, head_dim]` over the used part of the
/// cache (`[batch, kv_heads, len, head_dim]`) with an additive mask `[batch, 1, n, len]`
/// (0 or -inf). The query heads sharing a key/value head are stacked as rows of one matrix, so
/// each (row, kv head) pair is one small matrix product of a batched MKL call; libtorch's CPU
/// `scaled_dot_product_attention` instead issues a matrix-vector product per row and head
/// when decoding one token, which cost more than all projections together. Returns
/// `[batch, n, heads * head_dim]`.
fn grouped_attention(q: &Tensor, keys: &Tensor, values: &Tensor, mask: &Tensor, kv_heads: i64) -> Tensor {
    let (b, n, heads, hd) = q.size4().expect("queries are [batch, n, heads, head_dim]");
    let group = heads / kv_heads;
    let len = keys.size()[2];
    // [batch, kv, n * group, hd]: row (t, g) is query position t of head kv * group + g.
    let q = q.reshape([b, n, kv_heads, group, hd]).permute([0, 2, 1, 3, 4]).reshape([b * kv_heads, n * group, hd]);
    // (A narrowed cache still merges batch and kv-head dimensions without a copy.)
    let scores = q.bmm(&keys.view([b * kv_heads, len, hd]).transpose(1, 2));
    let scores = scores.view([b, kv_heads, n, group, len]) + mask.view([b, 1, n, 1, len]);
    let probs = scores.softmax(-1, Kind::Float).to_kind(values.kind()).view([b * kv_heads, n * group, len]);
    let out = probs.bmm(&values.view([b * kv_heads, len, hd]));
    out.view([b, kv_heads, n, group, hd]).permute([0, 2, 1, 3, 4]).reshape([b, n, heads * hd])
}

/// Boolean attend-mask to the additive form (0 where attended, -inf elsewhere).
pub fn additive_mask(mask: &Tensor, kind: Kind) -> Tensor {
    Tensor::zeros(mask.size(), (kind, mask.device())).masked_fill(&mask.logical_not(), f64::NEG_INFINITY)
}

/// The additive prefill mask `[batch, 1, n, capacity]` for prompts in slots `0..n`: causal,
/// keys limited to real tokens, and each query allowed to see itself so a padding row is never
/// empty.
pub fn prefill_mask(prompt_mask: &Tensor, capacity: i64) -> Tensor {
    let (_, n) = prompt_mask.size2().expect("prompt_mask must be [batch, n]");
    let device = prompt_mask.device();
    let slots = Tensor::arange(capacity, (Kind::Int64, device));
    let queries = Tensor::arange(n, (Kind::Int64, device)).unsqueeze(1);
    let causal = slots.unsqueeze(0).le_tensor(&queries);
    let diagonal = slots.unsqueeze(0).eq_tensor(&queries);
    let keys = prompt_mask.to_kind(Kind::Int64).constant_pad_nd([0, capacity - n]).to_kind(Kind::Bool);
    let keys = keys.unsqueeze(1).unsqueeze(1);
    additive_mask(&causal.logical_and(&keys).logical_or(&diagonal), Kind::Float)
}

/// Static buffers and CUDA graphs of one decode shape, kept by the [`DecodeModel`].
pub(super) struct GraphedDecode {
    pub(super) key: ShapeKey,
    pub(super) state: DecodeState,
    /// One graph per chunk length.
    pub(super) graphs: HashMap<usize, CudaGraph>,
}

/// What a captured graph is specific to: batch, prompt length and the sampling settings
/// (which ops a step runs, and the capacity).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ShapeKey {
    batch: i64,
    prompt_len: i64,
    params: SamplingParams,
}

/// Everything the token loop reads and writes, in tensors that keep their memory for the whole
/// decode (a CUDA graph replays on the same addresses). The step counter lives on the device,
/// so a step's ops do not depend on the host.
pub(super) struct DecodeState {
    cache: KvCache,
    /// `[batch, capacity]` additive: 0 for prompt tokens and for each generated slot once
    /// written, -inf for padding and for slots not yet reached.
    key_mask: Tensor,
    /// `[batch, 1]`: the position of each row's next token.
    next_position: Tensor,
    /// `[1]` int64: tokens drawn so far.
    step: Tensor,
    /// `[batch, vocab]`: the logits the next token is drawn from.
    logits: Tensor,
    /// `[batch, max_new_tokens]` drawn tokens (EOS after a row's end) and their log-probs.
    tokens: Tensor,
    logprobs: Tensor,
    /// Sampling replay (`smallrl_native::kept_capacity` is `Some(k)`): `[batch,
    /// max_new_tokens, k]` each token's kept set, and `[batch]` bool the rows where one
    /// outgrew `k` (an error, checked after the loop).
    kept: Option<(Tensor, Tensor)>,
    /// `[batch]` bool: rows that produced EOS.
    pub(super) finished: Tensor,
    /// `[max_new_tokens, batch]` float64, `None` for greedy decoding.
    uniforms: Option<Tensor>,
    pub(super) sampler: Sampler,
    prompt_len: i64,
    eos: i64,
    /// Stop tokens besides `eos` (none for most models: the loop's ops are then those of one id).
    extra_stops: Vec<i64>,
}

impl DecodeState {
    /// Prefills the left-padded prompts and sets up the loop's buffers.
    /// `uniforms` are [`row_uniforms`] (`None` for greedy decoding).
    pub(super) fn prefill(model: &DecodeModel, prompt_ids: &Tensor, prompt_mask: &Tensor, params: &SamplingParams, uniforms: Option<Tensor>) -> Self {
        let device = model.device;
        let eos = model.config().eos_token_id as i64;
        let (batch, prompt_len) = prompt_ids.size2().expect("prompt ids are [batch, len]");
        let max_new_tokens = params.max_new_tokens as i64;
        let capacity = prompt_len + max_new_tokens;
        let mut cache = model.new_cache(batch, capacity);
        let positions = (prompt_mask.cumsum(1, Kind::Int64) - 1).clamp_min(0);
        let hidden = model.forward(prompt_ids, &positions, &mut cache, 0, &prefill_mask(prompt_mask, capacity));
        Self {
            cache,
            key_mask: additive_mask(&prompt_mask.constant_pad_nd([0, max_new_tokens]).to_kind(Kind::Bool), Kind::Float),
            next_position: prompt_mask.sum_dim_intlist(1, false, Kind::Int64).unsqueeze(1),
            step: Tensor::zeros([1], (Kind::Int64, device)),
            logits: model.logits(&hidden.narrow(1, prompt_len - 1, 1)).squeeze_dim(1).contiguous(),
            tokens: Tensor::full([batch, max_new_tokens], eos, (Kind::Int64, device)),
            logprobs: Tensor::zeros([batch, max_new_tokens], (Kind::Float, device)),
            kept: smallrl_native::kept_capacity(params, model.config().vocab_size).map(|capacity| {
                (Tensor::full([batch, max_new_tokens, capacity as i64], eos, (Kind::Int64, device)), Tensor::zeros([batch], (Kind::Bool, device)))
            }),
            finished: Tensor::zeros([batch], (Kind::Bool, device)),
            uniforms,
            sampler: Sampler::new(params, prompt_ids, prompt_mask, model.config().vocab_size as i64),
            prompt_len,
            eos,
            extra_stops: model.config().extra_stop_ids.iter().map(|&id| i64::from(id)).collect(),
        }
    }

    /// A loop continuing rows whose keys and values are in `cache` (an episode's next turn,
    /// `model::continuation`): `logits` are each row's next-token logits, `key_mask` (`[batch,
    /// capacity]` additive) says which slots each row attends to, `next_position` (`[batch, 1]`)
    /// its next position; the steps write slots `used..used + max_new_tokens`. The repetition
    /// penalty sees the left-padded `seen_ids` under `seen_mask` (each row's whole sequence).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn resume(model: &DecodeModel, cache: KvCache, key_mask: Tensor, next_position: Tensor, logits: Tensor, used: i64, params: &SamplingParams, uniforms: Option<Tensor>, seen: (&Tensor, &Tensor)) -> Self {
        assert!(!params.kept_sets, "kept sets are not recorded for continued rows");
        assert!(used + params.max_new_tokens as i64 <= cache.capacity, "the steps' slots lie past the cache");
        let (device, eos) = (model.device, model.config().eos_token_id as i64);
        let (batch, steps) = (logits.size()[0], params.max_new_tokens as i64);
        Self {
            cache,
            key_mask,
            next_position,
            step: Tensor::zeros([1], (Kind::Int64, device)),
            logits,
            tokens: Tensor::full([batch, steps], eos, (Kind::Int64, device)),
            logprobs: Tensor::zeros([batch, steps], (Kind::Float, device)),
            kept: None,
            finished: Tensor::zeros([batch], (Kind::Bool, device)),
            uniforms,
            sampler: Sampler::new(params, seen.0, seen.1, model.config().vocab_size as i64),
            prompt_len: used,
            eos,
            extra_stops: model.config().extra_stop_ids.iter().map(|&id| i64::from(id)).collect(),
        }
    }

    /// The cache, key mask and next positions, for the next turn of [`Self::resume`].
    pub(super) fn into_cache(self) -> (KvCache, Tensor, Tensor) {
        (self.cache, self.key_mask, self.next_position)
    }

    pub(super) fn shape_key(&self) -> ShapeKey {
        ShapeKey { batch: self.finished.size()[0], prompt_len: self.prompt_len, params: self.sampler.params.clone() }
    }

    /// Copies `fresh` (a state of the same shape) into these buffers, keeping their memory.
    pub(super) fn load(&mut self, fresh: &DecodeState) {
        assert_eq!(self.shape_key(), fresh.shape_key(), "a decode state is reused for its own shape only");
        self.cache.copy_from(&fresh.cache);
        for (to, from) in [
            (&mut self.key_mask, &fresh.key_mask),
            (&mut self.next_position, &fresh.next_position),
            (&mut self.step, &fresh.step),
            (&mut self.logits, &fresh.logits),
            (&mut self.tokens, &fresh.tokens),
            (&mut self.logprobs, &fresh.logprobs),
            (&mut self.finished, &fresh.finished),
        ] {
            to.copy_(from);
        }
        // The key says whether these exist (temperature, repetition penalty), so both or neither do.
        if let (Some(to), Some(from)) = (&mut self.uniforms, &fresh.uniforms) {
            to.copy_(from);
        }
        if let (Some((kept, overflow)), Some((fresh_kept, fresh_overflow))) = (&mut self.kept, &fresh.kept) {
            kept.copy_(fresh_kept);
            overflow.copy_(fresh_overflow);
        }
        if let (Some(to), Some(from)) = (&mut self.sampler.seen, &fresh.sampler.seen) {
            to.copy_(from);
        }
    }

    /// Runs `n` decode steps: draw each row's token from the current logits, record it, and
    /// run it through the model for the next logits. Finished rows keep running (the shape
    /// stays fixed) but emit EOS with log-probability 0. Nothing is read back to the host.
    pub(super) fn run_steps(&mut self, model: &DecodeModel, n: usize) {
        let batch = self.finished.size()[0];
        let step_mask = self.key_mask.view([batch, 1, 1, self.cache.capacity]);
        for _ in 0..n {
            let uniforms = self.uniforms.as_ref().map(|u| u.index_select(0, &self.step).squeeze_dim(0));
            let (token, logprob, survivors) = self.sampler.draw(&self.logits, uniforms, self.kept.is_some());
            if let (Some((kept, overflow)), Some(survivors)) = (&mut self.kept, survivors) {
                record_kept(kept, overflow, &survivors, &token, &self.finished, &self.step);
            }
            let token = token.masked_fill(&self.finished, self.eos);
            let _ = self.tokens.index_copy_(1, &self.step, &token.unsqueeze(1));
            let _ = self.logprobs.index_copy_(1, &self.step, &logprob.masked_fill(&self.finished, 0.0).unsqueeze(1));
            let _ = self.finished.logical_or_(&token.eq(self.eos));
            for &stop in &self.extra_stops {
                let _ = self.finished.logical_or_(&token.eq(stop));
            }
            let slot = &self.step + self.prompt_len;
            let _ = self.key_mask.index_fill_(1, &slot, 0.0);
            let hidden = model.forward_at_slot(&token.unsqueeze(1), &self.next_position, &mut self.cache, &slot, &step_mask);
            self.logits.copy_(&model.logits(&hidden).squeeze_dim(1));
            self.next_position += 1;
            self.sampler.observe(&token);
            self.step += 1;
        }
    }

    /// Tokens and log-probabilities of the first `steps` steps (views of the buffers).
    pub(super) fn results(&self, steps: usize) -> (Tensor, Tensor) {
        (self.tokens.narrow(1, 0, steps as i64), self.logprobs.narrow(1, 0, steps as i64))
    }

    /// With kept sets: those of the first `steps` steps and the rows where one overflowed
    /// (views of the buffers).
    pub(super) fn kept_results(&self, steps: usize) -> Option<(Tensor, Tensor)> {
        self.kept.as_ref().map(|(kept, overflow)| (kept.narrow(1, 0, steps as i64), overflow.shallow_clone()))
    }
}

/// Writes step `step`'s kept sets into `kept` (`[batch, steps, k]`): each row's `survivors`
/// (`[batch, vocab]` bool) as ids, padded with the row's drawn `token`; flags in `overflow`
/// the unfinished rows with more than `k` survivors. No host synchronisation (CUDA graphs).
fn record_kept(kept: &mut Tensor, overflow: &mut Tensor, survivors: &Tensor, token: &Tensor, finished: &Tensor, step: &Tensor) {
    let capacity = kept.size()[2];
    // The survivors first (value 1), in no particular order: the trainer reads a set.
    let (found, ids) = survivors.to_kind(Kind::Float).topk(capacity, -1, true, false);
    let ids = ids.where_self(&found.gt(0.5), &token.unsqueeze(1));
    let _ = kept.index_copy_(1, step, &ids.unsqueeze(1));
    let too_many = survivors.sum_dim_intlist(-1, false, Kind::Int64).gt(capacity).logical_and(&finished.logical_not());
    let _ = overflow.logical_or_(&too_many);
}
