//! What is trained: the full model, one LoRA adapter, DualLoRA (a "retain" and a "forget"
//! adapter on every adapted projection) or DualMLP (a retain and a forget mini-SwiGLU beside
//! every adapted MLP block, the original's recommended adapter).
//!
//! Invariant: an [`AdapterConfig`] fully describes the adapters (ranks, alpha, layers, slot
//! names); every checkpoint stores it and evaluation reads it back, never guessing.

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::model::Llama;
use crate::model::linear::Lora;
use crate::model::mlp_adapter::MlpAdapter;
use crate::model::llama::PROJECTIONS;

crate::choice::choice! {
    /// What is trained.
    pub enum AdapterKind ("adapter") {
        /// Full fine-tuning: every base weight is trained; the reference policy is a frozen copy.
        Full = "full",
        /// One LoRA adapter (the non-routed baseline).
        Lora = "lora",
        /// Retain and forget adapters, for gradient routing.
        DualLora = "dual-lora",
        /// Retain and forget mini-SwiGLUs beside each MLP block (`mlp_config` presets), for
        /// gradient routing (the original's `DualMLPAdapter`).
        DualMlp = "dual-mlp",
    }
}

/// The target module of DualMLP adapters (whole MLP blocks).
const MLP_TARGET: &str = "mlp";

/// Slot indices of DualLoRA and DualMLP.
pub const RETAIN: usize = 0;
pub const FORGET: usize = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdapterConfig {
    pub kind: AdapterKind,
    /// One name per adapter slot: `["lora"]` or `["retain", "forget"]`; empty for full.
    pub slots: Vec<String>,
    /// Rank of each slot.
    pub ranks: Vec<usize>,
    /// The scale of slot `i` is `alpha / ranks[i]`.
    pub alpha: f64,
    /// Adapt layers `0, stride, 2 * stride, ...` (2 for the `r1h` preset).
    pub layer_stride: usize,
    /// The adapted projections (HF names) in every adapted layer.
    pub target_modules: Vec<String>,
}

/// Ranks and alpha of a DualLoRA preset name.
pub struct Preset {
    pub retain_rank: usize,
    pub forget_rank: usize,
    pub alpha: f64,
    pub layer_stride: usize,
}

pub fn preset(name: &str) -> Result<Preset> {
    let symmetric = |rank: usize, layer_stride| Preset { retain_rank: rank, forget_rank: rank, alpha: rank as f64, layer_stride };
    Ok(match name {
        "r1" => symmetric(1, 1),
        "r2" => symmetric(2, 1),
        "r4" => symmetric(4, 1),
        "r8" => symmetric(8, 1),
        "r16" => symmetric(16, 1),
        "r32" => symmetric(32, 1),
        "r1h" => symmetric(1, 2),
        "r32f16" | "r32f4" | "r32f1" => {
            let forget_rank = name["r32f".len()..].parse().expect("preset names are well formed");
            Preset { retain_rank: 32, forget_rank, alpha: 32.0, layer_stride: 1 }
        }
        other => bail!("unknown adapter preset {other:?}: use r1, r2, r4, r8, r16, r32, r1h, r32f16, r32f4 or r32f1"),
    })
}

/// Neurons of a DualMLP preset (the original's `MLP_PRESETS`, vllm_utils.py; its
/// `m64_retain_only` has no forget adapter and is not offered).
pub fn mlp_preset(name: &str) -> Result<[usize; 2]> {
    Ok(match name {
        "m5" => [5, 5],
        "m10" => [10, 10],
        "m16" => [16, 16],
        "m30" => [30, 30],
        "m32" => [32, 32],
        "m29f3" => [29, 3],
        "m24f8" => [24, 8],
        "m64" => [64, 64],
        "m128" => [128, 128],
        "m256" => [256, 256],
        other => bail!("unknown mlp_config {other:?}: use m5, m10, m16, m30, m32, m29f3, m24f8, m64, m128 or m256"),
    })
}

/// The rank settings of the `lora_*` / `retain_rank` / `forget_rank` options.
pub struct Ranks {
    pub lora_rank: usize,
    pub retain_rank: usize,
    pub forget_rank: usize,
    pub lora_alpha: f64,
    pub layer_stride: usize,
}

/// The adapter configuration of the options `adapter` (full, lora, dual-lora, dual-mlp),
/// `lora_preset` (DualLoRA only; overrides the ranks), `mlp_config` (DualMLP only, required)
/// and the ranks.
pub fn config_from(adapter: AdapterKind, lora_preset: Option<&str>, mlp_config: Option<&str>, ranks: &Ranks) -> Result<AdapterConfig> {
    ensure!(mlp_config.is_none() || adapter == AdapterKind::DualMlp, "mlp_config is set but adapter is {adapter}: it applies to dual-mlp");
    let config = match adapter {
        AdapterKind::Full => {
            ensure!(lora_preset.is_none(), "lora_preset is set but adapter is full");
            AdapterConfig::full()
        }
        AdapterKind::Lora => {
            ensure!(lora_preset.is_none(), "lora_preset applies to dual-lora; set lora_rank for lora");
            AdapterConfig::lora(ranks.lora_rank, ranks.lora_alpha, ranks.layer_stride)
        }
        AdapterKind::DualLora => match lora_preset {
            Some(name) => {
                let p = preset(name)?;
                AdapterConfig::dual_lora(p.retain_rank, p.forget_rank, p.alpha, p.layer_stride)
            }
            None => AdapterConfig::dual_lora(ranks.retain_rank, ranks.forget_rank, ranks.lora_alpha, ranks.layer_stride),
        },
        AdapterKind::DualMlp => {
            ensure!(lora_preset.is_none(), "lora_preset applies to dual-lora; set mlp_config (e.g. m16) for dual-mlp");
            let name = mlp_config.context("adapter dual-mlp needs mlp_config: a preset such as m16 (the original's recommended one)")?;
            let [retain, forget] = mlp_preset(name)?;
            AdapterConfig::dual_mlp(retain, forget, 1)
        }
    };
    config.validate()?;
    Ok(config)
}

impl AdapterConfig {
    pub fn full() -> Self {
        Self { kind: AdapterKind::Full, slots: vec![], ranks: vec![], alpha: 0.0, layer_stride: 1, target_modules: vec![] }
    }

    pub fn lora(rank: usize, alpha: f64, layer_stride: usize) -> Self {
        Self::adapters(AdapterKind::Lora, vec!["lora".into()], vec![rank], alpha, layer_stride)
    }

    pub fn dual_lora(retain_rank: usize, forget_rank: usize, alpha: f64, layer_stride: usize) -> Self {
        let slots = vec!["retain".into(), "forget".into()];
        Self::adapters(AdapterKind::DualLora, slots, vec![retain_rank, forget_rank], alpha, layer_stride)
    }

    /// `ranks` are the neurons of each mini-SwiGLU; there is no alpha.
    pub fn dual_mlp(retain_neurons: usize, forget_neurons: usize, layer_stride: usize) -> Self {
        let slots = vec!["retain".into(), "forget".into()];
        Self { kind: AdapterKind::DualMlp, slots, ranks: vec![retain_neurons, forget_neurons], alpha: 0.0, layer_stride, target_modules: vec![MLP_TARGET.into()] }
    }

    fn adapters(kind: AdapterKind, slots: Vec<String>, ranks: Vec<usize>, alpha: f64, layer_stride: usize) -> Self {
        let target_modules = PROJECTIONS.iter().map(|p| p.to_string()).collect();
        Self { kind, slots, ranks, alpha, layer_stride, target_modules }
    }

    pub fn is_dual(&self) -> bool {
        matches!(self.kind, AdapterKind::DualLora | AdapterKind::DualMlp)
    }

    pub fn validate(&self) -> Result<()> {
        ensure!(self.slots.len() == self.ranks.len(), "adapter config: one rank per slot is required");
        ensure!(self.ranks.iter().all(|&r| r > 0), "adapter ranks must be at least 1");
        ensure!(self.layer_stride >= 1, "layer_stride must be at least 1");
        match self.kind {
            AdapterKind::Full => {}
            AdapterKind::Lora | AdapterKind::DualLora => {
                ensure!(self.alpha > 0.0, "lora_alpha must be positive");
                for module in &self.target_modules {
                    ensure!(PROJECTIONS.contains(&module.as_str()), "unknown target module {module:?}");
                }
            }
            AdapterKind::DualMlp => ensure!(self.target_modules == [MLP_TARGET], "dual-mlp adapts whole MLP blocks (target_modules [\"mlp\"])"),
        }
        Ok(())
    }

    /// Adds freshly initialised adapters to `model`: `A ~ U(-1/sqrt(in), 1/sqrt(in))` (kaiming
    /// uniform with a = sqrt(5), as PEFT does) and `B = 0`, so the model starts equal to the
    /// base. Base weights are frozen. Draws from a generator seeded with `seed` (not libtorch's
    /// global one, which other threads may use).
    pub fn attach(&self, model: &mut Llama, seed: u64) -> Result<()> {
        self.validate()?;
        ensure!(self.kind != AdapterKind::Full, "full fine-tuning has no adapters to attach");
        ensure!(model.adapter_slots() == 0, "the model already has adapters");
        let mut rng = crate::rng::SplitMix64::new(seed);
        if self.kind == AdapterKind::DualMlp {
            self.attach_mlp(model, &mut rng);
            return Ok(());
        }
        let (device, kind) = (model.device, model.kind);
        let stride = self.layer_stride;
        for (name, linear) in model.projections_mut() {
            let layer = layer_index(&name);
            let targeted = self.target_modules.iter().any(|m| name.ends_with(&format!(".{m}")));
            linear.adapters = self
                .ranks
                .iter()
                .map(|&rank| {
                    (targeted && layer % stride == 0).then(|| {
                        let (out, inp) = linear.weight.size2().expect("weights are 2-d");
                        let bound = 1.0 / (inp as f64).sqrt();
                        let values: Vec<f32> = (0..rank * inp as usize).map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32).collect();
                        let a = Tensor::from_slice(&values).view([rank as i64, inp]).to_kind(kind).to(device).set_requires_grad(true);
                        let b = Tensor::zeros([out, rank as i64], (kind, device)).set_requires_grad(true);
                        Lora { a, b, scaling: self.alpha / rank as f64 }
                    })
                })
                .collect();
        }
        Ok(())
    }

    /// DualMLP: in every `layer_stride`-th layer a mini-SwiGLU per slot, gate and up
    /// `U(-1/sqrt(hidden), 1/sqrt(hidden))` (the original's kaiming-uniform, a = sqrt(5)) and
    /// down zero, so the model starts equal to the base. Projections get empty LoRA slots, so
    /// every layer takes one [`crate::model::linear::AdapterCtl`] per slot.
    fn attach_mlp(&self, model: &mut Llama, rng: &mut crate::rng::SplitMix64) {
        let (device, kind, hidden) = (model.device, model.kind, model.config.hidden_size as i64);
        let slots = self.ranks.len();
        for (_, linear) in model.projections_mut() {
            linear.adapters = (0..slots).map(|_| None).collect();
        }
        let bound = 1.0 / (hidden as f64).sqrt();
        let mut uniform = |rows: usize| {
            let values: Vec<f32> = (0..rows * hidden as usize).map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32).collect();
            Tensor::from_slice(&values).view([rows as i64, hidden]).to_kind(kind).to(device).set_requires_grad(true)
        };
        for (layer, block) in model.layers.iter_mut().enumerate() {
            block.mlp.adapters = self
                .ranks
                .iter()
                .map(|&neurons| {
                    (layer % self.layer_stride == 0).then(|| MlpAdapter {
                        gate: uniform(neurons),
                        up: uniform(neurons),
                        down: Tensor::zeros([hidden, neurons as i64], (kind, device)).set_requires_grad(true),
                    })
                })
                .collect();
        }
    }

    /// The trainable tensors with their checkpoint names. For adapters:
    /// `model.layers.{i}.self_attn.{projection}.lora_A.{slot}.weight`, for DualMLP
    /// `model.layers.{i}.mlp.adapter_gate.{slot}.weight` (`_up`, `_down`); for full fine-tuning
    /// the HF names of the base weights.
    pub fn trainable(&self, model: &Llama) -> Vec<(String, Tensor)> {
        if self.kind == AdapterKind::Full {
            return model.base_tensors().into_iter().map(|(n, t)| (n, t.shallow_clone())).collect();
        }
        let mut out = Vec::new();
        for (layer, block) in model.layers.iter().enumerate() {
            for (slot, adapter) in self.slots.iter().zip(&block.mlp.adapters) {
                if let Some(a) = adapter {
                    for (part, tensor) in [("gate", &a.gate), ("up", &a.up), ("down", &a.down)] {
                        out.push((format!("model.layers.{layer}.mlp.adapter_{part}.{slot}.weight"), tensor.shallow_clone()));
                    }
                }
            }
        }
        for (name, linear) in model.projections() {
            for (slot, lora) in self.slots.iter().zip(&linear.adapters) {
                if let Some(lora) = lora {
                    out.push((format!("{name}.lora_A.{slot}.weight"), lora.a.shallow_clone()));
                    out.push((format!("{name}.lora_B.{slot}.weight"), lora.b.shallow_clone()));
                }
            }
        }
        out
    }

    /// The L2 norm of each slot's tensors (in slot order), summed in float64: `values` pairs a
    /// trainable tensor's name with what to measure (the weight, its gradient, its update).
    pub fn slot_norms(&self, values: &[(String, Tensor)]) -> Vec<f64> {
        // One read of a number per slot (not per tensor): a step has a few hundred tensors.
        let mut squares: Vec<Vec<Tensor>> = self.slots.iter().map(|_| Vec::new()).collect();
        for (name, value) in values {
            let slot = self.slot_of(name).unwrap_or_else(|| panic!("{name} is not an adapter tensor"));
            squares[slot].push(value.to_kind(tch::Kind::Double).square().sum(tch::Kind::Double));
        }
        squares.iter().map(|s| if s.is_empty() { 0.0 } else { Tensor::stack(s, 0).sum(tch::Kind::Double).double_value(&[]).sqrt() }).collect()
    }

    /// Each slot's gradient norm of `loss` alone: a backward pass through a kept graph into
    /// fresh tensors, so the parameters' accumulated gradients are untouched.
    pub fn slot_gradient_norms(&self, model: &Llama, loss: &Tensor) -> Vec<f64> {
        let params = self.trainable(model);
        let tensors: Vec<&Tensor> = params.iter().map(|(_, t)| t).collect();
        let grads = Tensor::run_backward(&[loss], &tensors, true, false);
        let named: Vec<(String, Tensor)> = params.iter().zip(grads).map(|((name, t), g)| (name.clone(), gradient_or_zeros(g, t))).collect();
        self.slot_norms(&named)
    }

    /// Which slot a trainable tensor belongs to (`None` for base weights).
    pub fn slot_of(&self, name: &str) -> Option<usize> {
        let adapter_tensor = name.contains(".lora_") || name.contains(".adapter_");
        self.slots.iter().position(|slot| adapter_tensor && name.ends_with(&format!(".{slot}.weight")))
    }
}

/// A gradient, or zeros shaped like `param` when it has none (every row it could learn from
/// was routed away, or the loss does not reach it).
pub fn gradient_or_zeros(gradient: Tensor, param: &Tensor) -> Tensor {
    if gradient.defined() { gradient } else { param.zeros_like() }
}

/// Marks every base weight trainable (full fine-tuning) or frozen.
pub fn set_base_trainable(model: &mut Llama, trainable: bool) {
    for (_, tensor) in model.base_tensors() {
        let _ = tensor.set_requires_grad(trainable);
    }
}

fn layer_index(module_name: &str) -> usize {
    module_name
        .strip_prefix("model.layers.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|i| i.parse().ok())
        .expect("projection names are model.layers.{i}.*")
}

/// Copies tensors by name into the model's trainable tensors (checkpoint loading), checking
/// that the names and shapes match exactly.
pub fn load_trainable(trainable: &[(String, Tensor)], stored: &std::collections::BTreeMap<String, Tensor>, source: &str) -> Result<()> {
    let _guard = tch::no_grad_guard();
    for (name, tensor) in trainable {
        let Some(value) = stored.get(name) else { bail!("{source}: tensor {name} is missing") };
        ensure!(value.size() == tensor.size(), "{source}: tensor {name} has shape {:?}, expected {:?}", value.size(), tensor.size());
        tensor.shallow_clone().copy_(&value.to_kind(tensor.kind()).to_device(tensor.device()));
    }
    if let Some(extra) = stored.keys().find(|k| !trainable.iter().any(|(n, _)| n == *k)) {
        bail!("{source}: tensor {extra} does not belong to this adapter configuration");
    }
    Ok(())
}
