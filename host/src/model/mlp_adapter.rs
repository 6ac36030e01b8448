//! DualMLP's adapters (the original's `DualMLPAdapter`, gradient_routing.py): beside each
//! layer's frozen MLP block, one small SwiGLU per adapter slot,
//! `scale * down(silu(gate x) * up x)` with `gate, up: [neurons, hidden]` and
//! `down: [hidden, neurons]`. Routing uses the same [`AdapterCtl`] as LoRA.
//!
//! Folding: an MLP block with adapters at fixed scales is one wider SwiGLU, the adapters'
//! neurons appended to the block's (`down` columns times the scale), so the decoders and HF
//! export run DualMLP models as plain LLaMA with a larger `intermediate_size`.

use tch::Tensor;

use super::linear::{AdapterCtl, NaturalShare, RowLearn, RowScale, gradient_only, times_transposed};

/// One adapter's mini-SwiGLU.
pub struct MlpAdapter {
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

/// `down(silu(gate x) * up x)`.
fn swiglu(x: &Tensor, [gate, up, down]: [&Tensor; 3]) -> Tensor {
    let hidden = times_transposed(x, gate).silu() * times_transposed(x, up);
    times_transposed(&hidden, down)
}

/// `sum_t down_t((silu(gate_t x) * up_t x) * w_t)` over terms `([gate_t, up_t, down_t], w_t)`
/// (`w_t` a `[batch, 1, 1]` row weight) as one SwiGLU of the terms' neurons side by side: the
/// weight scales its neurons before `down`, which is linear, so each term's weights get that
/// term's gradient times its row weight.
fn weighted_swiglu(x: &Tensor, terms: &[([Tensor; 3], &Tensor)]) -> Tensor {
    let side_by_side = |part: usize, dim: i64| Tensor::cat(&terms.iter().map(|(weights, _)| weights[part].shallow_clone()).collect::<Vec<_>>(), dim);
    let batch = x.size()[0];
    let row_weights: Vec<Tensor> = terms.iter().map(|([gate, ..], rows)| rows.expand([batch, 1, gate.size()[0]], false)).collect();
    let hidden = times_transposed(x, &side_by_side(0, 0)).silu() * times_transposed(x, &side_by_side(1, 0)) * Tensor::cat(&row_weights, -1);
    times_transposed(&hidden, &side_by_side(2, 1))
}

impl MlpAdapter {
    /// `down(silu(gate x) * up x)` with the weights live or detached.
    fn output(&self, x: &Tensor, live: bool) -> Tensor {
        let weight = |t: &Tensor| if live { t.shallow_clone() } else { t.detach() };
        swiglu(x, [&weight(&self.gate), &weight(&self.up), &weight(&self.down)])
    }

    /// The adapter's contribution under `ctl`. Rows that may update it only partly (a row
    /// weight) get the value from detached weights and the parameter gradient from the
    /// zero-valued term `w * (f(x_detached) - f(x_detached).detach())`: the input still gets
    /// every row's gradient, the weights each row's gradient times its weight (the nonlinear
    /// counterpart of `linear.rs`'s routed LoRA terms). A natural share adds the same term on
    /// its leaves with its own row weights ([`Self::with_natural_share`]).
    pub fn forward(&self, x: &Tensor, ctl: &AdapterCtl) -> Tensor {
        let out = match (&ctl.learn, &ctl.natural) {
            (RowLearn::All, None) => self.output(x, true),
            (RowLearn::Nothing, None) => self.output(x, false),
            (RowLearn::Rows(weights), None) => self.output(x, false) + gradient_only(&self.output(&x.detach(), true)) * weights,
            (learn, Some(natural)) => self.with_natural_share(x, learn, natural),
        };
        match &ctl.scale {
            RowScale::All(s) if *s == 1.0 => out,
            RowScale::All(s) => out * *s,
            RowScale::PerRow(scales) => out * scales,
        }
    }

    /// [`Self::forward`]'s value under a natural share, whose gradient terms (the routed one
    /// where rows learn partly, and the share's on its leaves) are one SwiGLU of their neurons
    /// side by side ([`weighted_swiglu`]): the input is cast once for both and each term keeps
    /// only its neurons for the backward pass, not a copy of the input of its own.
    fn with_natural_share(&self, x: &Tensor, learn: &RowLearn, natural: &NaturalShare) -> Tensor {
        let share = ([&self.gate, &self.up, &self.down].map(|w| natural.leaves.leaf(w)), &natural.rows);
        let (value, routed) = match learn {
            RowLearn::All => (self.output(x, true), None),
            RowLearn::Nothing => (self.output(x, false), None),
            RowLearn::Rows(weights) => (self.output(x, false), Some(([&self.gate, &self.up, &self.down].map(Tensor::shallow_clone), weights))),
        };
        let terms: Vec<([Tensor; 3], &Tensor)> = routed.into_iter().chain([share]).collect();
        value + gradient_only(&weighted_swiglu(&x.detach(), &terms))
    }

    pub fn neurons(&self) -> i64 {
        self.gate.size()[0]
    }
}

/// The `(gate, up, down)` weights of one wider SwiGLU equal to the base block plus its
/// adapters at `scales` (one per slot; slots at scale 0 or absent leave nothing), padded with
/// `pad_to - own neurons` zero neurons so that every layer has the same width. A zero neuron
/// adds `silu(0) * 0 = 0`.
pub fn folded(base: [&Tensor; 3], adapters: &[Option<MlpAdapter>], scales: &[f64], pad_to: i64) -> [Tensor; 3] {
    assert_eq!(adapters.len(), scales.len(), "one scale per adapter slot");
    let [gate, up, down] = base.map(Tensor::detach);
    let (mut gates, mut ups, mut downs) = (vec![gate], vec![up], vec![down]);
    for (adapter, &scale) in adapters.iter().zip(scales) {
        if let Some(a) = adapter.as_ref().filter(|_| scale != 0.0) {
            gates.push(a.gate.detach());
            ups.push(a.up.detach());
            downs.push(a.down.detach() * scale);
        }
    }
    let width: i64 = gates.iter().map(|g| g.size()[0]).sum();
    assert!(width <= pad_to, "padding target {pad_to} below the block's {width} neurons");
    if width < pad_to {
        let hidden = gates[0].size()[1];
        let options = (gates[0].kind(), gates[0].device());
        let zeros = |shape: [i64; 2]| Tensor::zeros(shape, options);
        gates.push(zeros([pad_to - width, hidden]));
        ups.push(zeros([pad_to - width, hidden]));
        downs.push(zeros([hidden, pad_to - width]));
    }
    [Tensor::cat(&gates, 0), Tensor::cat(&ups, 0), Tensor::cat(&downs, 1)]
}

/// Neurons the adapters at `scales` add to one block.
pub fn extra_neurons(adapters: &[Option<MlpAdapter>], scales: &[f64]) -> i64 {
    adapters.iter().zip(scales).filter(|(_, s)| **s != 0.0).filter_map(|(a, _)| a.as_ref().map(MlpAdapter::neurons)).sum()
}
