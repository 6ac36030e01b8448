//! Runs stacked on a leading axis for one training pass: R models of one architecture (each
//! with its own weights and adapters) as one [`Llama`] whose tensors are `[R, ...]`, so a
//! pack's forward and backward pass is one batched matrix product per projection instead of R
//! passes of small kernels (what a launch-bound GPU step needs).
//!
//! The stacked tensors are `Tensor::stack`s of the runs' own tensors, inside autograd: the
//! backward pass of a loss summed over the runs leaves in each run's parameters the gradient of
//! that run's loss alone (the runs share no tensor), and the optimizer, clipping and checkpoints
//! stay each run's own. A batch of the stacked model is run-major: its first dimension is R
//! equal slices, run r's rows in the r-th. [`super::linear::times_transposed`],
//! [`super::llama::rms_norm`] and [`super::llama::embed`] give each slice its own run's weights;
//! attention, RoPE and masks work per row and need nothing.
//!
//! Architecture invariant: stacking changes rounding only (the batched products), never what a
//! run computes: `tests/train/` holds a stacked pack to the same runs trained alone.

use std::collections::HashMap;

use tch::{Kind, Tensor};

use super::linear::{AdapterCtl, Linear, Lora, RowLearn, RowScale};
use super::llama::{Block, Llama};
use super::mlp_adapter::MlpAdapter;

/// `[R, ...]` of each run's tensor (differentiable in each run's own).
fn stack(tensors: impl Iterator<Item = Tensor>) -> Tensor {
    Tensor::stack(&tensors.collect::<Vec<_>>(), 0)
}

impl Llama {
    /// The `models` stacked on a leading axis (see the module's documentation). They must share
    /// the architecture: configuration, adapter slots and their shapes and scalings.
    pub fn stacked(models: &[&Llama]) -> Llama {
        let first = models.first().expect("at least one model to stack");
        for other in &models[1..] {
            assert_eq!(other.config, first.config, "stacked models share their configuration");
            assert_eq!((other.device, other.kind, other.autocast), (first.device, first.kind, first.autocast), "stacked models share their device, dtype and train_dtype");
        }
        let bases: Vec<HashMap<String, &Tensor>> = models.iter().map(|m| m.base_tensors().into_iter().collect()).collect();
        let mut stacked = Llama::build(first.config.clone(), &mut |name, _| Ok(stack(bases.iter().map(|base| base[name].shallow_clone()))), first.rope.shared(), first.device, first.kind)
            .expect("models of one configuration stack");
        stacked.autocast = first.autocast;
        let runs: Vec<Vec<(String, &Linear)>> = models.iter().map(|m| m.projections()).collect();
        for (p, (_, linear)) in stacked.projections_mut().into_iter().enumerate() {
            let slots = runs[0][p].1.adapters.len();
            linear.adapters = (0..slots).map(|slot| stacked_slot(&runs.iter().map(|r| r[p].1).collect::<Vec<_>>(), |l| l.adapters[slot].as_ref(), stacked_lora)).collect();
        }
        for (i, block) in stacked.layers.iter_mut().enumerate() {
            let blocks: Vec<&Block> = models.iter().map(|m| &m.layers[i]).collect();
            let slots = blocks[0].mlp.adapters.len();
            block.mlp.adapters = (0..slots).map(|slot| stacked_slot(&blocks, |b| b.mlp.adapters[slot].as_ref(), stacked_mlp_adapter)).collect();
        }
        stacked
    }

    /// How many runs this model stacks (1 for a model that is not stacked).
    pub fn runs(&self) -> i64 {
        if self.embed_tokens.dim() == 3 { self.embed_tokens.size()[0] } else { 1 }
    }
}

/// One adapter slot across the runs: present in all of them or in none.
fn stacked_slot<P, A>(parts: &[&P], adapter: impl Fn(&P) -> Option<&A>, stacked: fn(&[&A]) -> A) -> Option<A> {
    let present: Vec<&A> = parts.iter().filter_map(|p| adapter(p)).collect();
    assert!(present.is_empty() || present.len() == parts.len(), "stacked models have adapters in the same layers");
    (!present.is_empty()).then(|| stacked(&present))
}

fn stacked_lora(loras: &[&Lora]) -> Lora {
    let scaling = loras[0].scaling;
    assert!(loras.iter().all(|l| l.scaling == scaling), "stacked adapters share their alpha / r");
    Lora { a: stack(loras.iter().map(|l| l.a.shallow_clone())), b: stack(loras.iter().map(|l| l.b.shallow_clone())), scaling }
}

fn stacked_mlp_adapter(adapters: &[&MlpAdapter]) -> MlpAdapter {
    let pick = |f: fn(&MlpAdapter) -> &Tensor| stack(adapters.iter().map(|a| f(a).shallow_clone()));
    MlpAdapter { gate: pick(|a| &a.gate), up: pick(|a| &a.up), down: pick(|a| &a.down) }
}

impl AdapterCtl {
    /// Each run's controls of one adapter slot (over its `rows` rows) as one control of the
    /// run-major stacked batch: a common scale or learning rule stays one; otherwise per-row
    /// tensors (a scale `s` for all of a run's rows becomes `s` on each; learning from all or
    /// none of them a row weight of 1 or 0, which has the same value and gradient).
    pub fn stacked(runs: &[&AdapterCtl], rows: i64, device: tch::Device) -> AdapterCtl {
        let per_row = |value: f64| Tensor::full([rows, 1, 1], value, (Kind::Float, device));
        let common_scale = match runs[0].scale {
            RowScale::All(s) => runs.iter().all(|c| matches!(c.scale, RowScale::All(t) if t == s)).then_some(s),
            RowScale::PerRow(_) => None,
        };
        let scale = match common_scale {
            Some(s) => RowScale::All(s),
            None => RowScale::PerRow(Tensor::cat(
                &runs
                    .iter()
                    .map(|c| match &c.scale {
                        RowScale::All(s) => per_row(*s),
                        RowScale::PerRow(scales) => scales.to_kind(Kind::Float),
                    })
                    .collect::<Vec<_>>(),
                0,
            )),
        };
        let learn = if runs.iter().all(|c| matches!(c.learn, RowLearn::All)) {
            RowLearn::All
        } else if runs.iter().all(|c| matches!(c.learn, RowLearn::Nothing)) {
            RowLearn::Nothing
        } else {
            RowLearn::Rows(Tensor::cat(
                &runs
                    .iter()
                    .map(|c| match &c.learn {
                        RowLearn::All => per_row(1.0),
                        RowLearn::Nothing => per_row(0.0),
                        RowLearn::Rows(weights) => weights.to_kind(Kind::Float),
                    })
                    .collect::<Vec<_>>(),
                0,
            ))
        };
        // A run with split_moment's natural share trains alone (its own backward passes,
        // `engine::passes`): a stacked batch is scored without gradients or has none.
        AdapterCtl::new(scale, learn)
    }
}
