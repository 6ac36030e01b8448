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
                let [gate, up, down] = block.mlp.folded(scales, width as i64);
                let (q, k) = (merged(q), merged(k));
                let rotated = |heads: usize| Rows::RotateHalf { heads, head_dim: hd };
                let [qkv_t, o_t, gate_up_t, down_t] = fold_matrices([
                    // q's columns scaled, `x * q_scale` as before (the rotated ones too: a
                    // negation commutes with the rounding), then k, their rotations, v.
                    vec![Block::new(&q, Rows::Plain, Some(q_scale)), Block::plain(&k), Block::new(&q, rotated(heads), Some(q_scale)), Block::new(&k, rotated(kv_heads), None), Block::plain(&merged(v))],
                    vec![Block::plain(&merged(o))],
                    vec![Block::plain(&gate), Block::plain(&up)],
                    vec![Block::plain(&down)],
                ]);
                FoldedLayer {
                    input_layernorm: block.input_layernorm.detach(),
                    qkv_t,
                    qkv_bias,
                    qk_norm,
                    o_t,
                    post_attention_layernorm: block.post_attention_layernorm.detach(),
                    gate_up_t,
                    down_t,
                }
            })
            .collect();
        Self {
            config: cfg.clone(),
            embed_tokens: model.embed_tokens.detach(),
            layers,
            norm: model.norm.detach(),
            head_t: fold_matrices([vec![Block::plain(model.head_weight())]]).into_iter().next().expect("one matrix"),
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

/// How a [`Block`]'s columns take its source's rows.
#[derive(Clone, Copy)]
enum Rows {
    /// Column `c` is row `c`.
    Plain,
    /// Head by head, so that `x · block = rotate_half(x · plain)`: column `j < half` of a head is
    /// its row `j + half` negated, column `j >= half` its row `j - half`.
    RotateHalf { heads: usize, head_dim: usize },
}

impl Rows {
    /// Each column's source row and whether it is negated, for a source of `rows` rows.
    fn map(self, rows: usize) -> Vec<(u32, bool)> {
        match self {
            Rows::Plain => (0..rows as u32).map(|r| (r, false)).collect(),
            Rows::RotateHalf { heads, head_dim } => {
                assert_eq!(rows, heads * head_dim, "rotating a projection of {rows} rows as {heads} heads of {head_dim}");
                let half = head_dim / 2;
                (0..rows).map(|c| if c % head_dim < half { ((c + half) as u32, true) } else { ((c - half) as u32, false) }).collect()
            }
        }
    }
}

/// Columns of a folded matrix: the rows of `source` (an `[out, in]` weight) as [`Rows`] takes
/// them, times `scale` where given (rounded as `x * scale` rounds on the source's dtype).
struct Block {
    source: Tensor,
    rows: Rows,
    scale: Option<f64>,
}

impl Block {
    fn new(source: &Tensor, rows: Rows, scale: Option<f64>) -> Self {
        Block { source: source.detach(), rows, scale }
    }

    fn plain(source: &Tensor) -> Self {
        Block::new(source, Rows::Plain, None)
    }
}

/// Each matrix `[in, outputs]` made of its blocks side by side (`x · matrix` is every block's
/// projection of `x`), each value written once where the decoders read it. Where every source
/// is a contiguous float32 CPU tensor the native crate's threads write them all in one pass
/// (`smallrl_native::fold_transposed`: libtorch's copies are a parallel region each, and on a
/// busy machine each waited for a descheduled thread); elsewhere (CUDA, other dtypes) libtorch
/// copies them. Both give the same bits: a transposition, a float32 product, a negation.
fn fold_matrices<const N: usize>(matrices: [Vec<Block>; N]) -> [Tensor; N] {
    let native = matrices.iter().flatten().all(|b| b.source.device() == tch::Device::Cpu && b.source.kind() == Kind::Float && b.source.is_contiguous());
    fold_matrices_by(matrices, native)
}

/// [`fold_matrices`] by the native crate's pass (`native`) or by libtorch's copies.
fn fold_matrices_by<const N: usize>(matrices: [Vec<Block>; N], native: bool) -> [Tensor; N] {
    let width = |blocks: &[Block]| blocks.iter().map(|b| b.source.size()[0]).sum::<i64>();
    let folded = matrices.each_ref().map(|blocks| {
        let first = &blocks.first().expect("a folded matrix has columns").source;
        Tensor::empty([first.size()[1], width(blocks)], (first.kind(), first.device()))
    });
    if native {
        let jobs = matrices
            .iter()
            .zip(&folded)
            .map(|(blocks, to)| smallrl_native::Folded {
                // SAFETY: `to` is a contiguous float32 CPU tensor made above (with memory where
                // it has values), written here only, and no view of it exists until the pass returns.
                to: if to.numel() == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(to.data_ptr() as *mut f32, to.numel()) } },
                inputs: to.size()[0] as usize,
                blocks: blocks.iter().map(|b| smallrl_native::Columns { source: host_values::<f32>(&b.source), rows: b.rows.map(b.source.size()[0] as usize), scale: b.scale.map(|s| s as f32) }).collect(),
            })
            .collect();
        smallrl_native::fold_transposed(jobs, tch::get_num_threads().max(1) as usize);
    } else {
        for (blocks, to) in matrices.iter().zip(&folded) {
            let mut column = 0;
            for b in blocks {
                let rows = b.source.size()[0];
                let mut part = to.narrow(1, column, rows);
                match b.rows {
                    Rows::Plain => part.copy_(&b.source.tr()),
                    Rows::RotateHalf { heads, head_dim } => part.copy_(&rotate_half_rows(&b.source, heads, head_dim).tr()),
                }
                if let Some(scale) = b.scale {
                    let _ = part.g_mul_scalar_(scale);
                }
                column += rows;
            }
        }
    }
    folded
}

/// Rows of a `[heads * head_dim, in]` projection rearranged so that `W' x = rotate_half(W x)`
/// head by head.
fn rotate_half_rows(weight: &Tensor, heads: usize, head_dim: usize) -> Tensor {
    let per_head = weight.view([heads as i64, head_dim as i64, -1]);
    let half = head_dim as i64 / 2;
    let rotated = Tensor::cat(&[per_head.narrow(1, half, half).neg(), per_head.narrow(1, 0, half)], 1);
    rotated.reshape([(heads * head_dim) as i64, -1])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The native pass writes the fused projection and a side-by-side pair as libtorch's copies
    /// do (a separate implementation: `rotate_half_rows`, transposed views, the in-place
    /// product), bit for bit (exact: both are transpositions, one float32 product and
    /// negations), over more rows than one tile; and the rotated columns are
    /// `rotate_half` of the plain ones' values, written out by hand.
    #[test]
    fn the_native_fold_writes_what_libtorch_copies_write() {
        tch::manual_seed(3);
        let (heads, kv_heads, head_dim, inputs) = (2, 1, 4, 21);
        let random = |rows: i64| Tensor::randn([rows, inputs], (Kind::Float, tch::Device::Cpu));
        let (q, k, v, gate, up) = (random(8), random(4), random(4), random(5), random(3));
        let rotated = |heads: usize| Rows::RotateHalf { heads, head_dim };
        let blocks = || {
            [
                vec![Block::new(&q, Rows::Plain, Some(0.35)), Block::plain(&k), Block::new(&q, rotated(heads), Some(0.35)), Block::new(&k, rotated(kv_heads), None), Block::plain(&v)],
                vec![Block::plain(&gate), Block::plain(&up)],
            ]
        };
        let bits = |t: &Tensor| Vec::<f32>::try_from(&t.contiguous().view([-1])).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let (native, torch) = (fold_matrices_by(blocks(), true), fold_matrices_by(blocks(), false));
        for (n, t) in native.iter().zip(&torch) {
            assert_eq!(n.size(), t.size());
            assert_eq!(bits(n), bits(t));
        }
        let qkv = Vec::<f32>::try_from(&native[0].contiguous().view([-1])).unwrap();
        let scaled_q: Vec<f32> = Vec::<f32>::try_from(&q.contiguous().view([-1])).unwrap().iter().map(|x| x * 0.35f32).collect();
        let columns = 2 * (8 + 4) + 4;
        for i in 0..inputs as usize {
            for c in 0..8 {
                let (h, j) = (c / head_dim, c % head_dim);
                let expected = if j < head_dim / 2 { -scaled_q[(h * head_dim + j + 2) * inputs as usize + i] } else { scaled_q[(h * head_dim + j - 2) * inputs as usize + i] };
                assert_eq!(qkv[i * columns + 12 + c].to_bits(), expected.to_bits(), "input {i}, rotated column {c}");
                assert_eq!(qkv[i * columns + c].to_bits(), scaled_q[c * inputs as usize + i].to_bits(), "input {i}, column {c}");
            }
        }
    }
}
