//! The weights as the host lays them out: dimensions, row-major matrices, one struct per layer.

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

/// A row-major `[inputs, outputs]` matrix: `y = x · W` for row vectors `x`, its weights in
/// float32 or (rounded once) in bfloat16.
pub struct Matrix {
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
    pub(crate) weights: Weights,
}

/// How a [`Matrix`] stores its weights.
pub(crate) enum Weights {
    /// Row-major, multiplied by `gemm`.
    Float32(Vec<f32>),
    /// bfloat16 in `bf16.rs`'s panel layout, multiplied by its kernels in float32.
    Bfloat16(Vec<u16>),
}

impl Matrix {
    pub fn new(inputs: usize, outputs: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), inputs * outputs, "a {inputs} x {outputs} matrix needs {} values", inputs * outputs);
        Self { inputs, outputs, weights: Weights::Float32(data) }
    }

    /// The same matrix with its weights rounded to bfloat16 (to nearest, ties to even), its
    /// products still accumulated in float32.
    pub fn bfloat16(inputs: usize, outputs: usize, data: &[f32]) -> Self {
        assert_eq!(data.len(), inputs * outputs, "a {inputs} x {outputs} matrix needs {} values", inputs * outputs);
        Self { inputs, outputs, weights: Weights::Bfloat16(crate::bf16::pack(inputs, outputs, data)) }
    }

    /// Overwrites the weights with `data` (row-major `[inputs, outputs]`, rounded as
    /// [`Matrix::new`] or [`Matrix::bfloat16`] did), keeping their memory: refreshing a
    /// sampler after an optimizer step allocates nothing.
    pub fn refill(&mut self, data: &[f32]) {
        assert_eq!(data.len(), self.inputs * self.outputs, "a {} x {} matrix needs {} values", self.inputs, self.outputs, self.inputs * self.outputs);
        match &mut self.weights {
            Weights::Float32(weights) => weights.copy_from_slice(data),
            Weights::Bfloat16(packed) => crate::bf16::pack_into(self.inputs, self.outputs, data, packed),
        }
    }

    /// Whether the weights are `data` (row-major) as [`Matrix::refill`] stores them, bit for bit.
    pub fn holds(&self, data: &[f32]) -> bool {
        data.len() == self.inputs * self.outputs
            && match &self.weights {
                Weights::Float32(weights) => crate::same_bits(weights, data),
                Weights::Bfloat16(packed) => crate::bf16::holds(self.inputs, self.outputs, data, packed),
            }
    }

    /// [`crate::sums`] of the values its products read, in storage order: the float32 weights,
    /// or the bfloat16 ones widened (a last panel's zero padding adds nothing).
    pub fn sums(&self) -> (f64, f64) {
        match &self.weights {
            Weights::Float32(weights) => crate::sums(weights),
            Weights::Bfloat16(packed) => crate::sums::sums_by(packed, |&v| f64::from(crate::bf16::from_bf16(v))),
        }
    }

    /// The float32 weights, row-major (`None` for a bfloat16 matrix, stored in panels).
    pub fn float32(&self) -> Option<&[f32]> {
        match &self.weights {
            Weights::Float32(weights) => Some(weights),
            Weights::Bfloat16(_) => None,
        }
    }

    /// Its values, row-major `[inputs, outputs]` float32 (bfloat16 weights widened exactly).
    pub fn values(&self) -> Vec<f32> {
        match &self.weights {
            Weights::Float32(weights) => weights.clone(),
            Weights::Bfloat16(packed) => crate::bf16::unpack(self.inputs, self.outputs, packed),
        }
    }

    /// The fewest rows `m` from which each row's product `x · W` has the same bits whatever the
    /// other rows of its block (`None`: no such `m`). The bfloat16 kernels: 1 (each output is
    /// one FMA chain over k in order, per row). gemm 0.19 (float32): a block of one row takes
    /// its matrix-vector path and one of `m * outputs <= 256` its small-product kernels, each
    /// summing in its own order; beyond them its blocked kernels sum each output over k in
    /// order, in chunks of a `kc` set by k and the cache sizes, except with `outputs <= 64`,
    /// where `kc` also depends on whether `m <= 64`.
    pub(crate) fn independent_rows(&self) -> Option<usize> {
        match self.weights {
            Weights::Bfloat16(_) => Some(1),
            Weights::Float32(_) => (self.outputs > 64).then(|| (256 / self.outputs + 1).max(2)),
        }
    }

    /// Bytes of its weights (what one product reads).
    pub fn bytes(&self) -> usize {
        match &self.weights {
            Weights::Float32(data) => data.len() * std::mem::size_of::<f32>(),
            Weights::Bfloat16(data) => data.len() * std::mem::size_of::<u16>(),
        }
    }

    /// `out[m, outputs] = x[m, inputs] · W`, or `out += x · W` with `accumulate`; `parallelism`
    /// splits the product's output among threads (each weight read once for all rows).
    pub(crate) fn apply(&self, x: &[f32], out: &mut [f32], accumulate: bool, parallelism: gemm::Parallelism) {
        let m = x.len() / self.inputs;
        assert_eq!(x.len(), m * self.inputs, "input is not a whole number of rows");
        assert_eq!(out.len(), m * self.outputs, "output buffer has the wrong size");
        if m == 0 {
            return;
        }
        let data = match &self.weights {
            Weights::Float32(data) => data,
            Weights::Bfloat16(packed) => return crate::bf16::apply(packed, self.inputs, self.outputs, x, out, accumulate, parallelism),
        };
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
                data.as_ptr(),
                1,
                self.outputs as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                parallelism,
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
    /// Biases of the fused projection, `[fused width]` (Qwen2's q/k/v biases in its layout).
    pub qkv_bias: Option<Vec<f32>>,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: Option<QkNorm>,
}

/// The weights of a per-head RMSNorm of the fused projection's `q, k` block, `[(heads +
/// kv_heads) * head_dim]` each: `plain` for `q, k` and `rotated` for their `rotate_half`
/// images. A head and its `rotate_half` have the same RMS, so both are divided by the plain
/// head's.
pub struct QkNorm {
    pub plain: Vec<f32>,
    pub rotated: Vec<f32>,
}

/// One weight of a [`Model`] ([`Model::weights`]).
pub enum Weight<'a> {
    Vector(&'a [f32]),
    Matrix(&'a Matrix),
}

/// One weight of a [`Model`] to overwrite ([`Model::weights_mut`]).
pub enum WeightMut<'a> {
    Vector(&'a mut [f32]),
    Matrix(&'a mut Matrix),
}

/// The weights (float32, the matrices in float32 or bfloat16) and shapes of a model.
pub struct Model {
    pub(crate) dims: Dims,
    pub(crate) embed_tokens: Vec<f32>,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Vec<f32>,
    pub(crate) head: Matrix,
    pub(crate) cos: Vec<f32>,
    pub(crate) sin: Vec<f32>,
    /// Stop tokens besides `dims.eos` (generation_config.json's other `eos_token_id`s).
    pub(crate) extra_stops: Vec<u32>,
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
            if let Some(bias) = &l.qkv_bias {
                assert_eq!(bias.len(), l.qkv.outputs, "layer {i}: fused bias shape");
            }
            if let Some(norm) = &l.qk_norm {
                assert_eq!((norm.plain.len(), norm.rotated.len()), (qk, qk), "layer {i}: q/k norm shape");
            }
        }
        assert!(!layers.is_empty(), "a model needs at least one layer");
        Self { dims, embed_tokens, layers, norm, head, cos, sin, extra_stops: Vec::new() }
    }

    /// A row also stops on each of `ids` (besides `dims.eos`).
    pub fn with_extra_stops(mut self, ids: Vec<u32>) -> Self {
        self.extra_stops = ids;
        self
    }

    /// Whether `token` ends a row.
    pub(crate) fn is_stop(&self, token: u32) -> bool {
        token == self.dims.eos || self.extra_stops.contains(&token)
    }

    /// Every weight (all but the rotary tables) in a fixed order: the embeddings, the final
    /// norm, the head, then per layer its norms and matrices, the fused bias and the q/k norms
    /// where it has them (the order of the host's folded weights).
    pub fn weights(&self) -> Vec<Weight<'_>> {
        let mut all = vec![Weight::Vector(&self.embed_tokens), Weight::Vector(&self.norm), Weight::Matrix(&self.head)];
        for l in &self.layers {
            all.extend([Weight::Vector(&l.input_layernorm), Weight::Matrix(&l.qkv), Weight::Matrix(&l.o), Weight::Vector(&l.post_attention_layernorm), Weight::Matrix(&l.gate_up), Weight::Matrix(&l.down)]);
            all.extend(l.qkv_bias.as_deref().map(Weight::Vector));
            if let Some(norm) = &l.qk_norm {
                all.extend([Weight::Vector(&norm.plain), Weight::Vector(&norm.rotated)]);
            }
        }
        all
    }

    /// [`Model::weights`] to overwrite in place (shapes fixed).
    pub fn weights_mut(&mut self) -> Vec<WeightMut<'_>> {
        let mut all = vec![WeightMut::Vector(&mut self.embed_tokens), WeightMut::Vector(&mut self.norm), WeightMut::Matrix(&mut self.head)];
        for l in &mut self.layers {
            all.extend([WeightMut::Vector(&mut l.input_layernorm), WeightMut::Matrix(&mut l.qkv), WeightMut::Matrix(&mut l.o), WeightMut::Vector(&mut l.post_attention_layernorm), WeightMut::Matrix(&mut l.gate_up), WeightMut::Matrix(&mut l.down)]);
            all.extend(l.qkv_bias.as_deref_mut().map(WeightMut::Vector));
            if let Some(norm) = &mut l.qk_norm {
                all.extend([WeightMut::Vector(&mut norm.plain), WeightMut::Vector(&mut norm.rotated)]);
            }
        }
        all
    }

    pub fn dims(&self) -> &Dims {
        &self.dims
    }

    /// Bytes of weights one decode step reads (every matrix once, the head included).
    pub fn weight_bytes(&self) -> usize {
        let matrices = self.layers.iter().map(|l| l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes()).sum::<usize>();
        matrices + self.head.bytes()
    }

    /// Every stop token: `dims.eos`, then the others.
    pub fn stop_ids(&self) -> Vec<u32> {
        std::iter::once(self.dims.eos).chain(self.extra_stops.iter().copied()).collect()
    }

    /// The fewest rows a block needs for every matrix product to compute each row as any larger
    /// block would ([`Matrix::independent_rows`]; `None` if some product never does).
    pub(crate) fn independent_rows(&self) -> Option<usize> {
        let mut matrices = self.layers.iter().flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down]).chain([&self.head]);
        matrices.try_fold(1, |least, m| m.independent_rows().map(|rows| least.max(rows)))
    }

    /// Width of the rotated-query-and-key block of the fused projection.
    pub(crate) fn qk_width(&self) -> usize {
        (self.dims.heads + self.dims.kv_heads) * self.dims.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{same_bits, sums};

    /// The sums are those of the float64 formula (values exact in float64, so any order gives
    /// the same), and a refilled matrix is the one built from the new values, bfloat16 panels
    /// included (padding columns stay zero).
    #[test]
    fn sums_and_refilled_matrices_match_their_references() {
        let values: Vec<f32> = (0..21).map(|i| i as f32 * 0.5 - 3.0).collect();
        let exact: (f64, f64) = (values.iter().map(|&v| v as f64).sum(), values.iter().map(|&v| (v as f64) * (v as f64)).sum());
        assert_eq!(sums(&values), exact);
        let (inputs, outputs) = (3, 37);
        let old: Vec<f32> = (0..inputs * outputs).map(|i| i as f32).collect();
        let new: Vec<f32> = (0..inputs * outputs).map(|i| 1.0 / (1.0 + i as f32)).collect();
        let mut float32 = Matrix::new(inputs, outputs, old.clone());
        float32.refill(&new);
        assert!(same_bits(float32.float32().unwrap(), &new));
        let mut bfloat16 = Matrix::bfloat16(inputs, outputs, &old);
        bfloat16.refill(&new);
        let (Weights::Bfloat16(refilled), Weights::Bfloat16(built)) = (&bfloat16.weights, &Matrix::bfloat16(inputs, outputs, &new).weights) else { panic!("bfloat16 matrices") };
        assert_eq!(refilled, built);
        assert!(!same_bits(&new, &old));
    }

    /// A matrix holds the values it was built from and not one changed value (the last panel's
    /// last column), in both layouts; a bfloat16 matrix's sums are those of its rounded values
    /// (float64 reference, any order within 1e-12 relative).
    #[test]
    fn matrices_hold_their_values_and_sum_what_their_products_read() {
        let (inputs, outputs) = (3, 37);
        let values: Vec<f32> = (0..inputs * outputs).map(|i| 1.0 / (1.0 + i as f32)).collect();
        let mut changed = values.clone();
        *changed.last_mut().unwrap() = 2.0;
        for matrix in [Matrix::new(inputs, outputs, values.clone()), Matrix::bfloat16(inputs, outputs, &values)] {
            assert!(matrix.holds(&values) && !matrix.holds(&changed));
        }
        let rounded: Vec<f64> = values.iter().map(|&v| f64::from(crate::from_bf16(crate::to_bf16(v)))).collect();
        let exact: (f64, f64) = (rounded.iter().sum(), rounded.iter().map(|v| v * v).sum());
        let (sum, squares) = Matrix::bfloat16(inputs, outputs, &values).sums();
        assert!((sum - exact.0).abs() <= 1e-12 * exact.0 && (squares - exact.1).abs() <= 1e-12 * exact.1, "{sum} {squares} against {exact:?}");
        assert!(rounded.iter().zip(&values).any(|(r, &v)| *r != f64::from(v)), "the values round");
    }
}
