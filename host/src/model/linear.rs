//! A frozen-or-trainable linear layer with optional low-rank adapters.
//!
//! Each adapter slot (for DualLoRA: 0 = retain, 1 = forget; for plain LoRA a single slot) adds
//! `scale * (alpha / r) * B A x`. What each slot does for each row of a batch is decided by the
//! caller through [`AdapterCtl`]: its scale (for adapter modes and `ablated_frac`) and which rows
//! may update it (gradient routing).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tch::Tensor;

use super::autocast;

/// One low-rank adapter `B A` with `A: [r, in]`, `B: [out, r]` and `scaling = alpha / r`.
pub struct Lora {
    pub a: Tensor,
    pub b: Tensor,
    pub scaling: f64,
}

/// Every active adapter of a layer as one low-rank product pair: `x [A_1; A_2]^T`, then
/// `[B_1 | B_2]^T` with each adapter's scaling folded into its `B` block. For DualLoRA this
/// halves the number of (thin, slow) matrix products.
///
/// Routing: an adapter that may learn from some rows only enters the value path with detached
/// weights (so gradient reaches `x` from every row but not its weights), and its weights get
/// their gradient from zero-valued terms `t - t.detach()` whose products see only the learning
/// rows: `t_A = (x ⊙ rows) A^T` added to its columns of the low-rank product, and
/// `t_B = (u ⊙ rows) B^T` added to the output. That is the gradient of separate live and
/// detached branches mixed by the row mask, with two extra products instead of a second branch.
/// A [`NaturalShare`] adds the same pair of terms on its leaves, with its own row weights.
#[derive(Default)]
struct JointBranch {
    a_blocks: Vec<Tensor>,
    /// Scaled by `scaling * scale`.
    b_blocks: Vec<Tensor>,
    /// Per block, `Some([batch, 1, 1])` when rows see the adapter at different scales.
    row_scales: Vec<Option<Tensor>>,
    /// Per block, the live weights and `[batch, 1, 1]` row mask of an adapter that learns
    /// from some rows only, then those of its natural share's leaves.
    routed: Vec<Vec<Routed>>,
}

struct Routed {
    a: Tensor,
    /// Scaled like the block's `B`.
    b: Tensor,
    rows: Tensor,
}

impl JointBranch {
    fn push(&mut self, lora: &Lora, ctl: &AdapterCtl) {
        let (scale, row_scale) = match &ctl.scale {
            RowScale::All(s) => (*s, None),
            RowScale::PerRow(scales) => (1.0, Some(scales.shallow_clone())),
        };
        let scaled = |b: &Tensor| b * (lora.scaling * scale);
        let b = scaled(&lora.b);
        let (a_block, b_block, mut routed) = match &ctl.learn {
            RowLearn::All => (lora.a.shallow_clone(), b, vec![]),
            RowLearn::Nothing => (lora.a.detach(), b.detach(), vec![]),
            RowLearn::Rows(rows) => (lora.a.detach(), b.detach(), vec![Routed { a: lora.a.shallow_clone(), b, rows: rows.shallow_clone() }]),
        };
        if let Some(natural) = &ctl.natural {
            routed.push(Routed { a: natural.leaves.leaf(&lora.a), b: scaled(&natural.leaves.leaf(&lora.b)), rows: natural.rows.shallow_clone() });
        }
        self.a_blocks.push(a_block);
        self.b_blocks.push(b_block);
        self.row_scales.push(row_scale);
        self.routed.push(routed);
    }

    /// `y + x A^T B^T`, with per-row scales applied to the rank dimension.
    fn add_to(self, y: Tensor, x: &Tensor) -> Tensor {
        if self.a_blocks.is_empty() {
            return y;
        }
        let ranks: Vec<i64> = self.a_blocks.iter().map(|a| a.size()[a.dim() - 2]).collect();
        let low_rank = times_transposed(x, &Tensor::cat(&self.a_blocks, -2));
        let low_rank = self.scale_rows(self.add_routed_a_gradients(low_rank, x, &ranks), &ranks);
        let (out, total_rank) = (*y.size().last().expect("linear output has features"), ranks.iter().sum::<i64>());
        let b = Tensor::cat(&self.b_blocks, -1);
        let y = if b.dim() == 2 {
            autocast::addmm(&y.reshape([-1, out]), &low_rank.reshape([-1, total_rank]), &b.tr()).view(y.size().as_slice())
        } else {
            y + times_transposed(&low_rank, &b)
        };
        self.add_routed_b_gradients(y, &low_rank, &ranks)
    }

    /// `t_A` of each routed block, added to its columns of `x A^T`.
    fn add_routed_a_gradients(&self, low_rank: Tensor, x: &Tensor, ranks: &[i64]) -> Tensor {
        if self.routed.iter().all(Vec::is_empty) {
            return low_rank;
        }
        let blocks: Vec<Tensor> = low_rank
            .split_with_sizes(ranks, -1)
            .into_iter()
            .zip(&self.routed)
            .map(|(block, routed)| match routed.as_slice() {
                [] => block,
                // One term: `(x ⊙ rows) A^T` as routed runs always had it (the same bits).
                [r] => block + gradient_only(&times_transposed(&(x.detach() * &r.rows), &r.a)),
                terms => block + gradient_only(&summed_a_terms(&x.detach(), terms)),
            })
            .collect();
        Tensor::cat(&blocks, -1)
    }

    /// The rank dimension times each row's scale of each block (`[batch, seq, rank]` input).
    fn scale_rows(&self, low_rank: Tensor, ranks: &[i64]) -> Tensor {
        if self.row_scales.iter().all(Option::is_none) {
            return low_rank;
        }
        let batch = low_rank.size()[0];
        let columns: Vec<Tensor> = self
            .row_scales
            .iter()
            .zip(ranks)
            .map(|(scale, &rank)| match scale {
                Some(scales) => scales.expand([batch, 1, rank], false),
                None => Tensor::ones([batch, 1, rank], (low_rank.kind(), low_rank.device())),
            })
            .collect();
        low_rank * Tensor::cat(&columns, 2)
    }

    /// `t_B` of each routed block, added to the output.
    fn add_routed_b_gradients(&self, mut y: Tensor, low_rank: &Tensor, ranks: &[i64]) -> Tensor {
        if self.routed.iter().all(Vec::is_empty) {
            return y;
        }
        let blocks = low_rank.detach().split_with_sizes(ranks, -1);
        for (block, routed) in blocks.iter().zip(&self.routed) {
            for r in routed {
                y = y + gradient_only(&times_transposed(&(block * &r.rows), &r.b));
            }
        }
        y
    }
}

/// `sum_t (x ⊙ rows_t) A_t^T` over a block's routed terms (the routed one and a natural share's,
/// of one rank) as one product with their `A`s side by side, each term's columns then times its
/// row weight: `x` is cast once for all and no `x ⊙ rows_t` is kept for the backward pass.
fn summed_a_terms(x: &Tensor, terms: &[Routed]) -> Tensor {
    let a = Tensor::cat(&terms.iter().map(|r| r.a.shallow_clone()).collect::<Vec<_>>(), -2);
    let rank = terms[0].a.size()[a.dim() - 2];
    let batch = x.size()[0];
    let row_weights: Vec<Tensor> = terms.iter().map(|r| r.rows.expand([batch, 1, rank], false)).collect();
    let weighted = times_transposed(x, &a) * Tensor::cat(&row_weights, -1);
    weighted.split(rank, -1).into_iter().reduce(|sum, t| sum + t).expect("a block has terms")
}

/// `x W^T` for a weight `[out, in]`, or `[runs, out, in]` ([`run_matmul`]).
pub fn times_transposed(x: &Tensor, weight: &Tensor) -> Tensor {
    run_matmul(x, &weight.transpose(-2, -1))
}

/// `x W` for a weight `[in, out]`; for runs stacked on a leading axis (`super::stacked`, a
/// stacked decoder) a weight `[runs, in, out]` whose run `r` multiplies the `r`-th of `runs`
/// equal slices of `x`'s first dimension (one batched product).
pub fn run_matmul(x: &Tensor, weight: &Tensor) -> Tensor {
    if weight.dim() == 2 {
        return autocast::matmul(x, weight);
    }
    let (runs, features, out) = weight.size3().expect("a stacked weight is [runs, in, out]");
    let mut shape = x.size();
    rows_per_run(shape[0], runs);
    *shape.last_mut().expect("the input has features") = out;
    autocast::bmm(&x.reshape([runs, -1, features]), weight).reshape(shape)
}

/// `op(x, w)` for a per-feature tensor `w` of `dims` dimensions (a bias `[out]`: 1) broadcast
/// over the last dimensions of `x`; for runs stacked on a leading axis, `w` is `[runs, ...]`
/// (`dims + 1` dimensions) and run `r`'s applies to the `r`-th of `runs` equal slices of `x`'s
/// first dimension.
pub fn per_run(x: &Tensor, w: &Tensor, dims: usize, op: impl Fn(&Tensor, &Tensor) -> Tensor) -> Tensor {
    if w.dim() == dims {
        return op(x, w);
    }
    assert_eq!(w.dim(), dims + 1, "a per-run tensor has {dims} dimensions, or one more for stacked runs");
    let shape = x.size();
    let runs = w.size()[0];
    rows_per_run(shape[0], runs);
    let mut view = vec![runs, -1];
    view.extend_from_slice(&shape[shape.len() - dims..]);
    op(&x.reshape(view.as_slice()), &w.unsqueeze(1)).view(shape.as_slice())
}

/// The rows of each run in a stacked batch of `rows` rows (run-major, equal slices).
pub fn rows_per_run(rows: i64, runs: i64) -> i64 {
    assert!(rows % runs == 0, "a stacked batch of {rows} rows does not split into {runs} runs");
    rows / runs
}

/// `t - t.detach()`: exactly zero, with `t`'s gradient. Adds a gradient path to a value computed
/// elsewhere (routed adapters here, the output head's analytic gradient in `grpo`).
pub fn gradient_only(t: &Tensor) -> Tensor {
    t - t.detach()
}

/// How much of an adapter each row sees.
pub enum RowScale {
    /// The same scale for every row (1 = on, 0 = off).
    All(f64),
    /// One scale per row, shaped `[batch, 1, 1]` (e.g. forget switched off for ablated rows).
    PerRow(Tensor),
}

/// Which rows update an adapter's parameters.
pub enum RowLearn {
    All,
    Nothing,
    /// A `[batch, 1, 1]` float weight per row: the row's loss reaches the adapter's
    /// parameters times it (0 or 1 when routing; the survivor's kappa under `balanced`
    /// renormalisation). The gradient terms are linear in the weight.
    Rows(Tensor),
}

/// `split_moment`'s natural gradient taken in the routed pass: per row, the natural plan's
/// gradient weight less the routed plan's (`routing::plan_with_natural`), applied as the routed
/// weights are (zero-valued terms) but on [`NaturalLeaves`], so that each weight's own gradient
/// stays the routed one and its leaf's gradient is the difference.
pub struct NaturalShare {
    /// `[batch, 1, 1]` weights (the gradient terms are linear in them).
    pub rows: Tensor,
    pub leaves: NaturalLeaves,
}

/// One leaf per adapter weight that a pass under a [`NaturalShare`] reads: the weight's values
/// (its storage, so an optimizer step moves both) with a gradient of its own. Shared by the
/// slots, layers and micro-batches of an optimizer step, so each leaf's gradient sums them.
/// Keyed by the weight's address (adapter weights are tensors of their own).
#[derive(Clone, Default)]
pub struct NaturalLeaves(Arc<Mutex<HashMap<usize, (Tensor, Tensor)>>>);

impl NaturalLeaves {
    /// The leaf of `weight`, made at its first use.
    pub fn leaf(&self, weight: &Tensor) -> Tensor {
        let mut leaves = self.0.lock().expect("the natural leaves' lock");
        let (held, leaf) = leaves.entry(weight.data_ptr() as usize).or_insert_with(|| (weight.shallow_clone(), weight.detach().set_requires_grad(true)));
        assert_eq!(held.size(), weight.size(), "two adapter weights at one address");
        leaf.shallow_clone()
    }

    /// The natural gradient of each of `params` after the step's backward passes: its own
    /// gradient (the routed plan's) plus its leaf's (zeros where either is absent). The leaves
    /// are dropped: the next optimizer step's passes make their own.
    pub fn take_gradients(&self, params: &[Tensor]) -> Vec<Tensor> {
        let leaves = std::mem::take(&mut *self.0.lock().expect("the natural leaves' lock"));
        params
            .iter()
            .map(|p| {
                let own = p.grad();
                let routed = if own.defined() { own.copy() } else { p.zeros_like() };
                match leaves.get(&(p.data_ptr() as usize)) {
                    Some((_, leaf)) if leaf.grad().defined() => routed + leaf.grad(),
                    _ => routed,
                }
            })
            .collect()
    }
}

/// What one adapter slot does during a forward pass.
pub struct AdapterCtl {
    pub scale: RowScale,
    pub learn: RowLearn,
    /// With `split_moment`: the natural plan's share of the gradient, on leaves of its own.
    pub natural: Option<NaturalShare>,
}

impl AdapterCtl {
    pub fn new(scale: RowScale, learn: RowLearn) -> Self {
        Self { scale, learn, natural: None }
    }

    pub fn on() -> Self {
        Self::new(RowScale::All(1.0), RowLearn::All)
    }

    pub fn off() -> Self {
        Self::new(RowScale::All(0.0), RowLearn::Nothing)
    }

    /// A fixed inference scale (no gradient to the adapter).
    pub fn frozen(scale: f64) -> Self {
        Self::new(RowScale::All(scale), RowLearn::Nothing)
    }

    /// This control for rows `start..start + len` of the batch (a micro-batch).
    pub fn rows(&self, start: i64, len: i64) -> Self {
        let scale = match &self.scale {
            RowScale::All(s) => RowScale::All(*s),
            RowScale::PerRow(t) => RowScale::PerRow(t.narrow(0, start, len)),
        };
        let learn = match &self.learn {
            RowLearn::All => RowLearn::All,
            RowLearn::Nothing => RowLearn::Nothing,
            RowLearn::Rows(t) => RowLearn::Rows(t.narrow(0, start, len)),
        };
        let natural = self.natural.as_ref().map(|n| NaturalShare { rows: n.rows.narrow(0, start, len), leaves: n.leaves.clone() });
        Self { scale, learn, natural }
    }

    pub fn is_off(&self) -> bool {
        matches!(self.scale, RowScale::All(s) if s == 0.0)
    }
}

pub struct Linear {
    /// `[out, in]`, the HF layout.
    pub weight: Tensor,
    /// `[out]` (`[runs, out]` stacked), added after the product; Qwen2's q/k/v projections.
    pub bias: Option<Tensor>,
    /// One entry per adapter slot of the model; `None` where this layer has no adapter (e.g.
    /// the `r1h` preset adapts every second layer only).
    pub adapters: Vec<Option<Lora>>,
}

impl Linear {
    pub fn new(weight: Tensor) -> Self {
        Self { weight, bias: None, adapters: Vec::new() }
    }

    pub fn with_bias(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias, adapters: Vec::new() }
    }

    pub fn forward(&self, x: &Tensor, ctl: &[AdapterCtl]) -> Tensor {
        assert_eq!(
            ctl.len(),
            self.adapters.len(),
            "adapter controls ({}) do not match the layer's adapter slots ({})",
            ctl.len(),
            self.adapters.len()
        );
        let y = times_transposed(x, &self.weight);
        let y = match &self.bias {
            Some(bias) => per_run(&y, bias, 1, |y, b| y + b),
            None => y,
        };
        let mut joint = JointBranch::default();
        for (lora, ctl) in self.adapters.iter().zip(ctl) {
            if let Some(lora) = lora.as_ref().filter(|_| !ctl.is_off()) {
                joint.push(lora, ctl);
            }
        }
        joint.add_to(y, x)
    }

    /// The weight with the adapters folded in at fixed scales (one per slot): `weight + B A *
    /// scaling * scale` per adapter, in slot order. Each adapter's product is the only matrix it
    /// allocates: the scalings and the sum are written into it in place, rounded as the
    /// expression's operators round them (`x + y` is `y + x` bit for bit), so a merge costs one
    /// matrix per adapter and no copy of the weight.
    pub fn merged_weight(&self, scales: &[f64]) -> Tensor {
        assert_eq!(scales.len(), self.adapters.len(), "one scale per adapter slot is required");
        let _guard = tch::no_grad_guard();
        let mut merged: Option<Tensor> = None;
        for (lora, &scale) in self.adapters.iter().zip(scales) {
            if let Some(lora) = lora.as_ref().filter(|_| scale != 0.0) {
                let mut delta = lora.b.detach().matmul(&lora.a.detach());
                let _ = delta.g_mul_scalar_(lora.scaling);
                // `x * 1` is `x` bit for bit (a product's NaN is quiet already): no pass for it.
                if scale != 1.0 {
                    let _ = delta.g_mul_scalar_(scale);
                }
                let _ = delta.g_add_(merged.as_ref().unwrap_or(&self.weight));
                merged = Some(delta);
            }
        }
        merged.unwrap_or_else(|| self.weight.detach())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn random(shape: [i64; 2], seed: i64) -> Tensor {
        tch::manual_seed(seed);
        Tensor::randn(shape, (Kind::Float, Device::Cpu))
    }

    /// The in-place merge is the expression `weight + (B A * scaling) * scale` per adapter,
    /// evaluated with a new tensor per operator as before, bit for bit (exact comparison: the
    /// fold and the weight-delivery fingerprints must not move), with two adapters at scales
    /// other than 1, one slot at scale 0, and none; the weight itself is left as it was.
    #[test]
    fn the_merge_in_place_rounds_as_the_expression() {
        let weight = random([12, 10], 1);
        let lora = |seed: i64, scaling: f64| Some(Lora { a: random([3, 10], seed), b: random([12, 3], seed + 1), scaling });
        let linear = Linear { weight: weight.copy(), bias: None, adapters: vec![lora(2, 0.37), None, lora(4, 2.9)] };
        let expression = |scales: &[f64]| {
            let mut merged = weight.copy();
            for (slot, &scale) in scales.iter().enumerate() {
                if let Some(l) = linear.adapters[slot].as_ref().filter(|_| scale != 0.0) {
                    merged = merged.g_add(&(l.b.matmul(&l.a) * l.scaling * scale));
                }
            }
            merged
        };
        let bits = |t: &Tensor| Vec::<f32>::try_from(&t.view([-1])).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for scales in [[1.0, 1.0, 1.0], [0.3, 0.0, -1.7], [0.0, 0.5, 0.0], [0.0, 0.0, 0.0]] {
            let merged = linear.merged_weight(&scales);
            assert_eq!(bits(&merged), bits(&expression(&scales)), "scales {scales:?}");
        }
        assert_eq!(bits(&linear.weight), bits(&weight), "the merge left the weight as it was");
        assert!(linear.merged_weight(&[1.0, 0.0, 0.0]).f_sub(&weight).unwrap().abs().max().double_value(&[]) > 0.0, "an adapter that merges changes the weight");
    }
}
