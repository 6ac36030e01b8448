//! Rotary position embeddings, HF's non-interleaved ("rotate_half") layout.

use tch::{Device, Kind, Tensor};

/// `cos` and `sin` tables of shape `[max_positions, head_dim]`, computed in float32 exactly as
/// transformers does (`inv_freq = 1 / theta^(arange(0, d, 2) / d)`, `emb = cat(freqs, freqs)`)
/// so that positions far into the context agree to the last bit that matters.
pub struct Rope {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl Rope {
    /// The tables of a model with `config`.
    pub fn for_config(config: &super::config::LlamaConfig, device: Device) -> Self {
        Self::new(config.head_dim, config.rope_theta, config.max_position_embeddings, device)
    }

    /// The same tables, shared (they never change): for copies and stacks of a model.
    pub fn shared(&self) -> Self {
        Self { cos: self.cos.shallow_clone(), sin: self.sin.shallow_clone() }
    }

    pub fn new(head_dim: usize, theta: f64, max_positions: usize, device: Device) -> Self {
        let dim = head_dim as i64;
        let exponent = Tensor::arange_start_step(0, dim, 2, (Kind::Int64, Device::Cpu)).to_kind(Kind::Float) / dim as f64;
        let inv_freq = Tensor::pow_scalar(theta, &exponent).reciprocal();
        let positions = Tensor::arange(max_positions as i64, (Kind::Int64, Device::Cpu)).to_kind(Kind::Float);
        let freqs = positions.unsqueeze(1).matmul(&inv_freq.unsqueeze(0));
        let emb = Tensor::cat(&[&freqs, &freqs], 1);
        Self { cos: emb.cos().to_device(device), sin: emb.sin().to_device(device) }
    }

    /// Tables for `positions` (`[batch, seq]` int64), shaped `[batch, 1, seq, head_dim]` to
    /// broadcast over heads.
    pub fn at(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let gather = |table: &Tensor| {
            let (b, t) = positions.size2().expect("positions must be [batch, seq]");
            table.index_select(0, &positions.reshape([-1])).reshape([b, 1, t, -1]).to_kind(kind)
        };
        (gather(&self.cos), gather(&self.sin))
    }
}

/// `x * cos + rotate_half(x) * sin` for `x: [batch, heads, seq, head_dim]`.
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    x * cos + rotate_half(x) * sin
}

/// `cat(-x2, x1)` over the last dimension.
pub fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size().last().copied().expect("rotate_half needs a tensor") / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[&x2.neg(), &x1], -1)
}
