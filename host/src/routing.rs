//! Gradient routing: which adapter learns from which sample.
//!
//! | mode      | clean sample        | flagged sample |
//! |-----------|---------------------|----------------|
//! | none      | both adapters learn | both learn     |
//! | classic   | both learn          | only forget    |
//! | exclusive | only retain         | only forget    |
//!
//! Routing is done in a single forward/backward pass: an adapter's branch is computed with
//! detached weights for the rows it must not learn from, so its parameters get exactly the
//! gradient of the rows it may learn from, while gradient still flows through it to earlier
//! layers. Together with the class-weighted loss of [`crate::grpo::grpo_loss`] this equals the
//! original's per-class backward passes (tested).

use anyhow::Result;
use tch::{Device, Kind, Tensor};

use crate::adapters::{AdapterConfig, AdapterKind, FORGET, RETAIN};
use crate::model::linear::{AdapterCtl, RowLearn, RowScale};

crate::choice::choice! {
    /// Which adapter learns from which sample (the table above).
    pub enum RoutingMode ("routing_mode") {
        None = "none",
        Classic = "classic",
        Exclusive = "exclusive",
    }
}

/// The adapter controls and loss classes of one batch.
pub struct RoutePlan {
    pub ctl: Vec<AdapterCtl>,
    /// `[batch]` 0/1 masks partitioning the rows into the classes the original trained with
    /// separate backward passes (clean, clean-ablated, flagged; empty classes dropped).
    pub classes: Vec<Tensor>,
}

/// Plans one batch. `is_rh` are the routing labels (after the protocol knobs); `ablated`
/// marks clean rows trained with the forget adapter switched off.
pub fn plan(adapters: &AdapterConfig, mode: RoutingMode, is_rh: &[bool], ablated: &[bool], device: Device) -> RoutePlan {
    let n = is_rh.len();
    assert_eq!(ablated.len(), n, "one ablation flag per row");
    assert!(ablated.iter().zip(is_rh).all(|(a, rh)| !(*a && *rh)), "only clean rows can be ablated");
    let clean: Vec<bool> = is_rh.iter().map(|rh| !rh).collect();
    let clean_kept: Vec<bool> = (0..n).map(|i| clean[i] && !ablated[i]).collect();
    let classes = [clean_kept, ablated.to_vec(), is_rh.to_vec()]
        .into_iter()
        .filter(|rows| rows.iter().any(|&r| r))
        .map(|rows| row_mask(&rows, device))
        .collect();
    let ctl = match adapters.kind {
        AdapterKind::Full => vec![],
        AdapterKind::Lora => vec![AdapterCtl::on()],
        AdapterKind::DualLora => {
            let (retain_learns, forget_learns): (Vec<bool>, Vec<bool>) = match mode {
                RoutingMode::None => (vec![true; n], vec![true; n]),
                RoutingMode::Classic => (clean.clone(), vec![true; n]),
                RoutingMode::Exclusive => (clean.clone(), is_rh.to_vec()),
            };
            let mut ctl = vec![AdapterCtl::on(), AdapterCtl::on()];
            ctl[RETAIN].learn = learn(&retain_learns, device);
            ctl[FORGET].learn = learn(&forget_learns, device);
            if ablated.iter().any(|&a| a) {
                let scales: Vec<f32> = ablated.iter().map(|&a| if a { 0.0 } else { 1.0 }).collect();
                ctl[FORGET].scale = RowScale::PerRow(Tensor::from_slice(&scales).view([-1, 1, 1]).to(device));
            }
            ctl
        }
    };
    RoutePlan { ctl, classes }
}

fn learn(rows: &[bool], device: Device) -> RowLearn {
    if rows.iter().all(|&r| r) {
        RowLearn::All
    } else if rows.iter().all(|&r| !r) {
        RowLearn::Nothing
    } else {
        RowLearn::Rows(row_mask(rows, device).view([-1, 1, 1]))
    }
}

/// The loss classes restricted to `rows` (`[batch]` 0/1): the routed loss is a sum over its
/// classes, so the losses of complementary restrictions add up to it.
pub fn restrict_classes(classes: &[Tensor], rows: &Tensor) -> Vec<Tensor> {
    classes.iter().map(|class| class * rows).collect()
}

/// `[batch]` float 0/1 mask.
pub fn row_mask(rows: &[bool], device: Device) -> Tensor {
    let values: Vec<f32> = rows.iter().map(|&r| if r { 1.0 } else { 0.0 }).collect();
    Tensor::from_slice(&values).to_kind(Kind::Float).to(device)
}

/// The names of the evaluation modes (keys of `routing_eval.jsonl`'s `modes`).
pub mod eval_mode {
    /// Every adapter on (the only mode without DualLoRA).
    pub const BOTH: &str = "both";
    pub const RETAIN_ONLY: &str = "retain_only";
    pub const FORGET_ONLY: &str = "forget_only";
}

/// Adapter scales (one per slot) of the evaluation modes.
pub fn eval_modes(adapters: &AdapterConfig) -> Vec<(&'static str, Vec<f64>)> {
    match adapters.kind {
        AdapterKind::Full => vec![(eval_mode::BOTH, vec![])],
        AdapterKind::Lora => vec![(eval_mode::BOTH, vec![1.0])],
        AdapterKind::DualLora => vec![
            (eval_mode::BOTH, vec![1.0, 1.0]),
            (eval_mode::RETAIN_ONLY, vec![1.0, 0.0]),
            (eval_mode::FORGET_ONLY, vec![0.0, 1.0]),
        ],
    }
}

/// Evaluation modes at chosen adapter scales, in the order given: each of `scales` (one value
/// per adapter slot), then `(1, f)` for each forget scale `f` (DualLoRA only: retain on, the
/// forget adapter scaled). Named `retain<r>_forget<f>` (DualLoRA) or `lora<s>` (one LoRA), so
/// `retain1_forget0` is `retain_only`'s scales. Errors name the flag and what fits.
pub fn scaled_modes(adapters: &AdapterConfig, scales: &[Vec<f64>], forget_scales: &[f64]) -> Result<Vec<(String, Vec<f64>)>> {
    let slots = adapters.slots.len();
    anyhow::ensure!(slots > 0 || (scales.is_empty() && forget_scales.is_empty()), "--scales and --forget-scales need adapters; this checkpoint is full fine-tuning");
    anyhow::ensure!(forget_scales.is_empty() || adapters.is_dual(), "--forget-scales needs DualLoRA (retain and forget adapters); this checkpoint has {:?}", adapters.kind);
    let mut modes: Vec<(String, Vec<f64>)> = Vec::new();
    for values in scales.iter().cloned().chain(forget_scales.iter().map(|&f| vec![1.0, f])) {
        anyhow::ensure!(values.len() == slots, "--scales {values:?}: needs {slots} value(s), one per adapter {:?}", adapters.slots);
        anyhow::ensure!(values.iter().all(|v| v.is_finite()), "adapter scales must be finite numbers, got {values:?}");
        let name = match adapters.is_dual() {
            true => format!("retain{}_forget{}", values[RETAIN], values[FORGET]),
            false => format!("lora{}", values[0]),
        };
        anyhow::ensure!(!modes.iter().any(|(n, _)| *n == name), "adapter scales {values:?} are asked for twice");
        modes.push((name, values));
    }
    Ok(modes)
}
