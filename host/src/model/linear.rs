//! A frozen-or-trainable linear layer with optional low-rank adapters.
//!
//! Each adapter slot (for DualLoRA: 0 = retain, 1 = forget; for plain LoRA a single slot) adds
//! `scale * (alpha / r) * B A x`. What each slot does for each row of a batch is decided by the
//! caller through [`AdapterCtl`]: its scale (for adapter modes and `ablated_frac`) and which rows
//! may update it (gradient routing).

use tch::Tensor;

/// One low-rank adapter `B A` with `A: [r, in]`, `B: [out, r]` and `scaling = alpha / r`.
pub struct Lora {
    pub a: Tensor,
    pub b: Tensor,
    pub scaling: f64,
}

impl Lora {
    /// `scaling * (x A^T) B^T`, with gradients to `A`/`B` only when `detach_weights` is false.
    /// The input always keeps its gradient path: routing blocks parameter updates, not the flow
    /// of gradient to earlier layers.
    fn branch(&self, x: &Tensor, detach_weights: bool) -> Tensor {
        let (a, b) = if detach_weights {
            (self.a.detach(), self.b.detach())
        } else {
            (self.a.shallow_clone(), self.b.shallow_clone())
        };
        x.matmul(&a.tr()).matmul(&b.tr()) * self.scaling
    }

    /// `B A * scaling`, the adapter folded into a weight matrix (for merged inference weights).
    pub fn delta_weight(&self) -> Tensor {
        self.b.matmul(&self.a) * self.scaling
    }
}

/// The adapters whose parameters learn from every row or from none, computed as one low-rank
/// product: `x [A_1; A_2]^T` then `[B_1 | B_2]^T` with each adapter's scaling folded into its
/// `B` block. For DualLoRA this halves the number of (thin, slow) matrix products; the value
/// and every gradient are those of the separate branches.
#[derive(Default)]
struct JointBranch {
    a_blocks: Vec<Tensor>,
    b_blocks: Vec<Tensor>,
    /// Per block, `Some([batch, 1, 1])` when rows see the adapter at different scales.
    row_scales: Vec<Option<Tensor>>,
}

impl JointBranch {
    fn push(&mut self, lora: &Lora, detach_weights: bool, scale: &RowScale) {
        let (a, b) = if detach_weights { (lora.a.detach(), lora.b.detach()) } else { (lora.a.shallow_clone(), lora.b.shallow_clone()) };
        let (scale, row_scale) = match scale {
            RowScale::All(s) => (*s, None),
            RowScale::PerRow(scales) => (1.0, Some(scales.shallow_clone())),
        };
        self.a_blocks.push(a);
        self.b_blocks.push(b * (lora.scaling * scale));
        self.row_scales.push(row_scale);
    }

    /// `y + x A^T B^T` (with per-row scales applied to the rank dimension).
    fn add_to(self, y: Tensor, x: &Tensor) -> Tensor {
        if self.a_blocks.is_empty() {
            return y;
        }
        let a = Tensor::cat(&self.a_blocks, 0);
        let b = Tensor::cat(&self.b_blocks, 1);
        let mut low_rank = x.matmul(&a.tr());
        if self.row_scales.iter().any(Option::is_some) {
            let batch = x.size()[0];
            let columns: Vec<Tensor> = self
                .row_scales
                .iter()
                .zip(&self.a_blocks)
                .map(|(scale, a)| {
                    let rank = a.size()[0];
                    match scale {
                        Some(scales) => scales.expand([batch, 1, rank], false),
                        None => Tensor::ones([batch, 1, rank], (low_rank.kind(), low_rank.device())),
                    }
                })
                .collect();
            low_rank = low_rank * Tensor::cat(&columns, 2);
        }
        let out = *y.size().last().expect("linear output has a feature dimension");
        let rank = *low_rank.size().last().expect("low-rank product has a rank dimension");
        y.reshape([-1, out]).addmm(&low_rank.reshape([-1, rank]), &b.tr()).view(y.size().as_slice())
    }
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
    /// A `[batch, 1, 1]` float mask: 1 = this row's loss reaches the adapter's parameters.
    Rows(Tensor),
}

/// What one adapter slot does during a forward pass.
pub struct AdapterCtl {
    pub scale: RowScale,
    pub learn: RowLearn,
}

impl AdapterCtl {
    pub fn on() -> Self {
        Self { scale: RowScale::All(1.0), learn: RowLearn::All }
    }

    pub fn off() -> Self {
        Self { scale: RowScale::All(0.0), learn: RowLearn::Nothing }
    }

    /// A fixed inference scale (no gradient to the adapter).
    pub fn frozen(scale: f64) -> Self {
        Self { scale: RowScale::All(scale), learn: RowLearn::Nothing }
    }

    fn is_off(&self) -> bool {
        matches!(self.scale, RowScale::All(s) if s == 0.0)
    }
}

pub struct Linear {
    /// `[out, in]`, the HF layout.
    pub weight: Tensor,
    /// One entry per adapter slot of the model; `None` where this layer has no adapter (e.g.
    /// the `r1h` preset adapts every second layer only).
    pub adapters: Vec<Option<Lora>>,
}

impl Linear {
    pub fn new(weight: Tensor) -> Self {
        Self { weight, adapters: Vec::new() }
    }

    pub fn forward(&self, x: &Tensor, ctl: &[AdapterCtl]) -> Tensor {
        assert_eq!(
            ctl.len(),
            self.adapters.len(),
            "adapter controls ({}) do not match the layer's adapter slots ({})",
            ctl.len(),
            self.adapters.len()
        );
        let mut y = x.matmul(&self.weight.tr());
        let mut joint = JointBranch::default();
        for (lora, ctl) in self.adapters.iter().zip(ctl) {
            let Some(lora) = lora else { continue };
            if ctl.is_off() {
                continue;
            }
            match &ctl.learn {
                RowLearn::All => joint.push(lora, false, &ctl.scale),
                RowLearn::Nothing => joint.push(lora, true, &ctl.scale),
                RowLearn::Rows(mask) => {
                    let branch = lora.branch(x, false) * mask + lora.branch(x, true) * (1.0 - mask);
                    y = match &ctl.scale {
                        RowScale::All(s) if *s == 1.0 => y + branch,
                        RowScale::All(s) => y + branch * *s,
                        RowScale::PerRow(scales) => y + branch * scales,
                    };
                }
            }
        }
        joint.add_to(y, x)
    }

    /// The weight with the adapters folded in at fixed scales (one per slot).
    pub fn merged_weight(&self, scales: &[f64]) -> Tensor {
        assert_eq!(scales.len(), self.adapters.len(), "one scale per adapter slot is required");
        let mut weight = self.weight.detach();
        for (lora, &scale) in self.adapters.iter().zip(scales) {
            if let Some(lora) = lora.as_ref().filter(|_| scale != 0.0) {
                weight = weight + lora.delta_weight().detach() * scale;
            }
        }
        weight
    }
}
