//! The weights both decoders run on: a [`Llama`] at fixed adapter scales with the adapters
//! merged, the attention scale folded into the query rows and `rotate_half` folded into extra
//! rows of one fused `q, k, rotate_half(q), rotate_half(k), v` projection per layer.
//!
//! Architecture invariant: `decode.rs` (libtorch) and `native.rs` (the CPU sampler and scorer)
//! both read these values and nothing else of the model, so they share every modelling decision.

use tch::{Kind, Tensor};

use super::config::LlamaConfig;
use super::linear::Linear;
use super::llama::Llama;

crate::choice::choice! {
    /// The precision a run samples in (`sampler_dtype`): float32, or the folded weights' matrices
    /// in bfloat16 (half the bytes a memory-bound decode step reads). The policy's training,
    /// reference and old log-probabilities stay in the model's dtype.
    pub enum SamplerDtype ("sampler_dtype") {
        Float32 = "float32",
        Bfloat16 = "bfloat16",
    }
}

pub(super) struct FoldedLayer {
    pub(super) input_layernorm: Tensor,
    /// `[hidden, (q + k) * 2 + v]`, transposed for `x.matmul`.
    pub(super) qkv_t: Tensor,
    /// `[(q + k) * 2 + v]`: the q/k/v biases (Qwen2) in the fused projection's layout.
    pub(super) qkv_bias: Option<Tensor>,
    /// Qwen3's per-head norms of q and k, `[heads + kv_heads, head_dim]` each: the weights of
    /// `q, k` (q's times the attention scale) and the same rearranged for their `rotate_half`
    /// rows. The RMS of a head is that of its `rotate_half`, so both halves of the fused
    /// output are normalised by the RMS of the first (see `decode.rs`).
    pub(super) qk_norm: Option<(Tensor, Tensor)>,
    pub(super) o_t: Tensor,
    pub(super) post_attention_layernorm: Tensor,
    /// `[hidden, 2 * intermediate]`: gate then up.
    pub(super) gate_up_t: Tensor,
    pub(super) down_t: Tensor,
}

/// Inference weights of a [`Llama`] at fixed adapter scales. Rebuild after the weights change.
pub struct FoldedWeights {
    pub config: LlamaConfig,
    pub(super) embed_tokens: Tensor,
    pub(super) layers: Vec<FoldedLayer>,
    pub(super) norm: Tensor,
    pub(super) head_t: Tensor,
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
}

impl FoldedWeights {
    /// Folds the adapters in at `scales` (one per adapter slot of the model).
    pub fn new(model: &Llama, scales: &[f64]) -> Self {
        let _guard = tch::no_grad_guard();
        // DualMLP adapters widen the MLP (`mlp_adapter.rs`); LoRA keeps the width.
        let width = model.folded_intermediate_size(scales);
        let cfg = &LlamaConfig { intermediate_size: width, ..model.config.clone() };
        let merged = |l: &Linear| l.merged_weight(scales);
        let layers = model
            .layers
            .iter()
            .map(|block| {
                let attn = &block.self_attn;
                let [q, k, v, o] = attn.projections();
                // The attention scale 1/sqrt(head_dim) is folded into the query rows, or into
                // q's norm weight where q is normalised (a norm would undo a scale before it).
                let scale = (cfg.head_dim as f64).powf(-0.5);
                let q_scale = if attn.q_norm.is_some() { 1.0 } else { scale };
                let (heads, kv_heads, hd) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
                let bias = |l: &Linear| l.bias.as_ref().map(|b| b.detach());
                let qkv_bias = match (bias(q), bias(k), bias(v)) {
                    (Some(bq), Some(bk), Some(bv)) => {
                        let bq = bq * q_scale;
                        let (rbq, rbk) = (rotate_half_rows(&bq.unsqueeze(1), heads, hd).squeeze_dim(1), rotate_half_rows(&bk.unsqueeze(1), kv_heads, hd).squeeze_dim(1));
                        Some(Tensor::cat(&[bq, bk, rbq, rbk, bv], 0))
                    }
                    (None, None, None) => None,
                    _ => panic!("q, k and v projections with and without biases"),
                };
                let qk_norm = match (&attn.q_norm, &attn.k_norm) {
                    (Some(qn), Some(kn)) => {
                        let w = Tensor::cat(&[(qn.detach() * scale).expand([heads as i64, hd as i64], false), kn.detach().expand([kv_heads as i64, hd as i64], false)], 0);
                        let half = hd as i64 / 2;
                        let w_rotated = Tensor::cat(&[w.narrow(1, half, half), w.narrow(1, 0, half)], 1);
                        Some((w.contiguous(), w_rotated.contiguous()))
                    }
                    (None, None) => None,
                    _ => panic!("a q_norm without a k_norm or the reverse"),
                };
                let qkv_t = fused_qkv_t([&merged(q), &merged(k), &merged(v)], q_scale, heads, kv_heads, hd);
                let [gate, up, down] = block.mlp.folded(scales, width as i64);
                FoldedLayer {
                    input_layernorm: block.input_layernorm.detach(),
                    qkv_t,
                    qkv_bias,
                    qk_norm,
                    o_t: transposed(&merged(o)),
                    post_attention_layernorm: block.post_attention_layernorm.detach(),
                    gate_up_t: transposed_side_by_side(&gate, &up),
                    down_t: transposed(&down),
                }
            })
            .collect();
        Self {
            config: cfg.clone(),
            embed_tokens: model.embed_tokens.detach(),
            layers,
            norm: model.norm.detach(),
            head_t: transposed(model.head_weight()),
            cos: model.rope.cos.to_kind(model.kind),
            sin: model.rope.sin.to_kind(model.kind),
        }
    }

    /// These weights with memory of their own where [`FoldedWeights::new`] takes the model's
    /// tensors as they are (the embeddings and the norms are views of the policy's parameters,
    /// not copies): for a libtorch decoder that samples while the model trains (the sampler
    /// thread's, `engine/ahead.rs`), which would otherwise read embeddings and norms the
    /// optimizer changes mid-decode while its fingerprint says it holds the snapshot.
    pub fn owned(mut self) -> Self {
        self.embed_tokens = self.embed_tokens.copy();
        self.norm = self.norm.copy();
        for layer in &mut self.layers {
            layer.input_layernorm = layer.input_layernorm.copy();
            layer.post_attention_layernorm = layer.post_attention_layernorm.copy();
        }
        self
    }

    /// The weights of several runs of one architecture (equal configs), stacked on a leading run
    /// axis so that one batched matrix product per projection serves every run (`decode.rs`).
    pub(super) fn stack(parts: &[&FoldedWeights]) -> Self {
        let _guard = tch::no_grad_guard();
        let first = parts.first().expect("stacking needs at least one run");
        for part in parts {
            assert_eq!(part.config, first.config, "stacked weights of another architecture");
            assert!(part.runs().is_none(), "stacking weights that are stacked already");
        }
        let stacked = |pick: fn(&FoldedWeights) -> &Tensor| Tensor::stack(&parts.iter().map(|p| pick(p)).collect::<Vec<_>>(), 0);
        let layers = (0..first.layers.len())
            .map(|i| {
                let layer = |pick: fn(&FoldedLayer) -> &Tensor| Tensor::stack(&parts.iter().map(|p| pick(&p.layers[i])).collect::<Vec<_>>(), 0);
                let optional = |pick: fn(&FoldedLayer) -> Option<&Tensor>| {
                    let present: Vec<&Tensor> = parts.iter().filter_map(|p| pick(&p.layers[i])).collect();
                    assert!(present.is_empty() || present.len() == parts.len(), "stacked weights of another architecture");
                    (!present.is_empty()).then(|| Tensor::stack(&present, 0))
                };
                let qk_norm = optional(|l| l.qk_norm.as_ref().map(|n| &n.0)).zip(optional(|l| l.qk_norm.as_ref().map(|n| &n.1)));
                FoldedLayer {
                    input_layernorm: layer(|l| &l.input_layernorm),
                    qkv_t: layer(|l| &l.qkv_t),
                    qkv_bias: optional(|l| l.qkv_bias.as_ref()),
                    qk_norm,
                    o_t: layer(|l| &l.o_t),
                    post_attention_layernorm: layer(|l| &l.post_attention_layernorm),
                    gate_up_t: layer(|l| &l.gate_up_t),
                    down_t: layer(|l| &l.down_t),
                }
            })
            .collect();
        Self {
            config: first.config.clone(),
            embed_tokens: stacked(|w| &w.embed_tokens),
            layers,
            norm: stacked(|w| &w.norm),
            head_t: stacked(|w| &w.head_t),
            cos: first.cos.shallow_clone(),
            sin: first.sin.shallow_clone(),
        }
    }

    /// `Some(r)` for the weights of `r` runs stacked on a leading axis ([`FoldedWeights::stack`]):
    /// every tensor but the rotary tables (`cos`, `sin`, which the config fixes) has it.
    pub(super) fn runs(&self) -> Option<i64> {
        (self.embed_tokens.dim() == 3).then(|| self.embed_tokens.size()[0])
    }
}

impl FoldedWeights {
    /// The same weights cast to `kind` (the rotary tables included), for a libtorch decoder
    /// that samples in another dtype than the model's.
    pub(super) fn to_kind(&self, kind: Kind) -> Self {
        let mut cast = self.map_run_tensors(&mut |t| t.to_kind(kind));
        (cast.cos, cast.sin) = (self.cos.to_kind(kind), self.sin.to_kind(kind));
        cast
    }

    /// These weights' shapes, config and rotary tables without their values: each tensor of
    /// [`Self::run_tensors`] a zero expanded to its shape (one value of memory), a template for
    /// [`Self::map_run_tensors`].
    pub(super) fn layout(&self) -> Self {
        self.map_run_tensors(&mut |t| Tensor::zeros([0i64; 0], (t.kind(), tch::Device::Cpu)).expand(t.size(), false))
    }

    /// These weights with each tensor of [`Self::run_tensors`] replaced by `f` of it (of the same
    /// shape), called in that order; the rotary tables shared.
    pub(super) fn map_run_tensors(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        let mut f = |t: &Tensor| {
            let mapped = f(t);
            assert_eq!(mapped.size(), t.size(), "a folded weight mapped to another shape");
            mapped
        };
        let (embed_tokens, norm, head_t) = (f(&self.embed_tokens), f(&self.norm), f(&self.head_t));
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            // The fields in `run_tensors`' order: a struct expression evaluates them as written.
            layers.push(FoldedLayer {
                input_layernorm: f(&l.input_layernorm),
                qkv_t: f(&l.qkv_t),
                o_t: f(&l.o_t),
                post_attention_layernorm: f(&l.post_attention_layernorm),
                gate_up_t: f(&l.gate_up_t),
                down_t: f(&l.down_t),
                qkv_bias: l.qkv_bias.as_ref().map(&mut f),
                qk_norm: l.qk_norm.as_ref().map(|(w, w_rotated)| (f(w), f(w_rotated))),
            });
        }
        Self { config: self.config.clone(), embed_tokens, layers, norm, head_t, cos: self.cos.shallow_clone(), sin: self.sin.shallow_clone() }
    }

    /// Every tensor that depends on the weights (all but the rotary tables), in a fixed order.
    pub(super) fn run_tensors(&self) -> Vec<&Tensor> {
        let mut all = vec![&self.embed_tokens, &self.norm, &self.head_t];
        for l in &self.layers {
            all.extend([&l.input_layernorm, &l.qkv_t, &l.o_t, &l.post_attention_layernorm, &l.gate_up_t, &l.down_t]);
            all.extend(&l.qkv_bias);
            if let Some((w, w_rotated)) = &l.qk_norm {
                all.extend([w, w_rotated]);
            }
        }
        all
    }

    /// One number per run (stacked weights: one for each run) that changes whenever a weight
    /// does: [`fingerprint`] over the weight tensors in [`Self::run_tensors`]'s order. Each
    /// run's value is computed on that run's tensors alone, so a stacked run's equals its
    /// part's bit for bit, and the native sampler's copy of the same values has the same one
    /// ([`super::native::NativeModel::fingerprint`]).
    pub fn fingerprints(&self) -> Vec<f64> {
        self.fingerprints_in(self.embed_tokens.kind())
    }

    /// [`Self::fingerprints`] of these weights cast to `kind` (a tensor at a time): what a
    /// decoder sampling in `kind` holds once refreshed from them.
    pub fn fingerprints_in(&self, kind: Kind) -> Vec<f64> {
        let _guard = tch::no_grad_guard();
        let of = |tensors: Vec<Tensor>| fingerprint(tensors.iter().map(|t| tensor_sums(&t.to_kind(kind))));
        let tensors = self.run_tensors();
        match self.runs() {
            None => vec![of(tensors.into_iter().map(Tensor::shallow_clone).collect())],
            Some(runs) => (0..runs).map(|run| of(tensors.iter().map(|t| t.get(run)).collect())).collect(),
        }
    }

    /// Copies `part` (one run's weights, folded again) into run `run` of these stacked weights,
    /// keeping their memory, as [`FoldedWeights::copy_from`] does for one run.
    pub(super) fn copy_run_from(&self, run: usize, part: &FoldedWeights) {
        let _guard = tch::no_grad_guard();
        let runs = self.runs().expect("copy_run_from writes into stacked weights");
        assert!((run as i64) < runs && part.runs().is_none(), "run {run} of {runs} stacked runs");
        assert_eq!(self.config, part.config, "refolded weights of another shape");
        for (to, from) in self.run_tensors().into_iter().zip(part.run_tensors()) {
            to.get(run as i64).copy_(from);
        }
    }

    /// Copies `other` (the same model folded again, e.g. after an optimizer step) into these
    /// tensors, keeping their memory: what a captured CUDA graph reads stays where it was.
    pub(super) fn copy_from(&self, other: &FoldedWeights) {
        let _guard = tch::no_grad_guard();
        assert_eq!(self.config, other.config, "refolded weights of another shape");
        assert_eq!(self.runs(), other.runs(), "refolded weights of another run count");
        // The rotary tables follow from the config, equal above.
        let (to, from) = (self.run_tensors(), other.run_tensors());
        assert_eq!(to.len(), from.len(), "refolded weights with another layer count");
        for (to, from) in to.into_iter().zip(from) {
            assert_eq!(to.size(), from.size(), "refolded weights of another shape");
            // A shallow clone shares the storage, so this writes into `self`.
            to.shallow_clone().copy_(from);
        }
    }
}

/// The weights' fingerprint from each tensor's [`smallrl_native::sums`], in order: the sum of
/// `(k + 1) * (sum + sum of squares)`, `k` the tensor's index, in float64.
pub(super) fn fingerprint(tensors: impl Iterator<Item = (f64, f64)>) -> f64 {
    tensors.enumerate().map(|(k, (sum, squares))| (k + 1) as f64 * (sum + squares)).sum()
}

/// [`smallrl_native::sums`] of a tensor's values (bfloat16 and half widened exactly to float32 first).
fn tensor_sums(t: &Tensor) -> (f64, f64) {
    let t = t.to_device(tch::Device::Cpu).contiguous();
    match t.kind() {
        Kind::Float => smallrl_native::sums(host_values::<f32>(&t)),
        Kind::Double => smallrl_native::sums(host_values::<f64>(&t)),
        Kind::BFloat16 | Kind::Half => tensor_sums(&t.to_kind(Kind::Float)),
        kind => panic!("weights of dtype {kind:?}"),
    }
}

/// The values of a contiguous CPU tensor of element type `T`, read where they are.
pub(super) fn host_values<T: tch::kind::Element>(t: &Tensor) -> &[T] {
    assert!(t.device() == tch::Device::Cpu && t.is_contiguous() && t.kind() == T::KIND, "host values of a {:?} tensor on {:?}", t.kind(), t.device());
    let len = t.numel();
    if len == 0 {
        return &[];
    }
    // SAFETY: a contiguous CPU tensor of kind `T` holds `numel` values of `T` from its data
    // pointer on, alive (and not written: weights are only replaced between samplings) as long
    // as `t` is borrowed.
    unsafe { std::slice::from_raw_parts(t.data_ptr() as *const T, len) }
}

fn transposed(weight: &Tensor) -> Tensor {
    weight.detach().tr().contiguous()
}

/// The fused projection `[in, (q + k) * 2 + v]`: the columns of `q` (times `q_scale`, rounded
/// as `q * q_scale`), `k`, `rotate_half(q)`, `rotate_half(k)` and `v` side by side, each value
/// written once where the decoders read it (transposed from the `[out, in]` weights, with no
/// concatenated copy to transpose).
fn fused_qkv_t([q, k, v]: [&Tensor; 3], q_scale: f64, heads: usize, kv_heads: usize, head_dim: usize) -> Tensor {
    let (nq, nk, nv) = (q.size()[0], k.size()[0], v.size()[0]);
    let qkv_t = Tensor::empty([v.size()[1], 2 * (nq + nk) + nv], (v.kind(), v.device()));
    let part = |start: i64, len: i64| qkv_t.narrow(1, start, len);
    part(0, nq).copy_(&q.tr());
    let _ = part(0, nq).g_mul_scalar_(q_scale);
    part(nq, nk).copy_(&k.tr());
    rotate_half_columns(&part(0, nq), &part(nq + nk, nq), heads, head_dim);
    rotate_half_columns(&part(nq, nk), &part(2 * nq + nk, nk), kv_heads, head_dim);
    part(2 * (nq + nk), nv).copy_(&v.tr());
    qkv_t
}

/// `cat([a, b], 0)` transposed (`[in, a_out + b_out]`), each value written once.
fn transposed_side_by_side(a: &Tensor, b: &Tensor) -> Tensor {
    let (a_out, b_out) = (a.size()[0], b.size()[0]);
    let both = Tensor::empty([a.size()[1], a_out + b_out], (a.kind(), a.device()));
    both.narrow(1, 0, a_out).copy_(&a.tr());
    both.narrow(1, a_out, b_out).copy_(&b.tr());
    both
}

/// Writes into `to` (`[in, heads * head_dim]`, a view) the columns of `from` (the same shape)
/// rearranged so that `x · to = rotate_half(x · from)` head by head: [`rotate_half_rows`] of
/// the transposed weights, with no copy of their own.
fn rotate_half_columns(from: &Tensor, to: &Tensor, heads: usize, head_dim: usize) {
    let (from, to) = (from.view([-1, heads as i64, head_dim as i64]), to.view([-1, heads as i64, head_dim as i64]));
    let half = head_dim as i64 / 2;
    let _ = from.narrow(2, half, half).neg_out(&to.narrow(2, 0, half));
    to.narrow(2, half, half).copy_(&from.narrow(2, 0, half));
}

/// Rows of a `[heads * head_dim, in]` projection rearranged so that `W' x = rotate_half(W x)`
/// head by head.
fn rotate_half_rows(weight: &Tensor, heads: usize, head_dim: usize) -> Tensor {
    let per_head = weight.view([heads as i64, head_dim as i64, -1]);
    let half = head_dim as i64 / 2;
    let rotated = Tensor::cat(&[per_head.narrow(1, half, half).neg(), per_head.narrow(1, 0, half)], 1);
    rotated.reshape([(heads * head_dim) as i64, -1])
}
