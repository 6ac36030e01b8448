//! DualMLP's adapters (the original's `DualMLPAdapter`, gradient_routing.py): beside each
//! layer's frozen MLP block, one small SwiGLU per adapter slot,
//! `scale * down(silu(gate x) * up x)` with `gate, up: [neurons, hidden]` and
//! `down: [hidden, neurons]`. Routing uses the same [`AdapterCtl`] as LoRA.
//!
//! Folding: an MLP block with adapters at fixed scales is one wider SwiGLU, the adapters'
//! neurons appended to the block's (`down` columns times the scale), so the decoders and HF
//! export run DualMLP models as plain LLaMA with a larger `intermediate_size`.

use tch::Tensor;

use super::linear::{AdapterCtl, RowLearn, RowScale, gradient_only, times_transposed};

/// One adapter's mini-SwiGLU.
pub struct MlpAdapter {
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

impl MlpAdapter {
    /// `down(silu(gate x) * up x)` with the weights live or detached.
    fn output(&self, x: &Tensor, live: bool) -> Tensor {
        let weight = |t: &Tensor| if live { t.shallow_clone() } else { t.detach() };
        let hidden = times_transposed(x, &weight(&self.gate)).silu() * times_transposed(x, &weight(&self.up));
        times_transposed(&hidden, &weight(&self.down))
    }

    /// The adapter's contribution under `ctl`. Rows that may update it only partly (a row
    /// weight) get the value from detached weights and the parameter gradient from the
    /// zero-valued term `w * (f(x_detached) - f(x_detached).detach())`: the input still gets
    /// every row's gradient, the weights each row's gradient times its weight (the nonlinear
    /// counterpart of `linear.rs`'s routed LoRA terms).
    pub fn forward(&self, x: &Tensor, ctl: &AdapterCtl) -> Tensor {
        let out = match &ctl.learn {
            RowLearn::All => self.output(x, true),
            RowLearn::Nothing => self.output(x, false),
            RowLearn::Rows(weights) => self.output(x, false) + gradient_only(&self.output(&x.detach(), true)) * weights,
        };
        match &ctl.scale {
            RowScale::All(s) if *s == 1.0 => out,
            RowScale::All(s) => out * *s,
            RowScale::PerRow(scales) => out * scales,
        }
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
