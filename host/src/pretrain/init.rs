//! The model a pre-training run starts from: a seeded random initialisation (HF's LLaMA init:
//! every matrix N(0, initializer_range), every RMSNorm weight 1), or a model directory or
//! checkpoint with any adapters folded into its weights.

use std::path::Path;

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};

use crate::model::{Llama, LlamaConfig};
use crate::rng::SplitMix64;

/// A freshly initialised model drawn from `seed` (our own generator, never libtorch's global
/// one), in float32 on `device`: every matrix N(0, std²), every norm weight 1, every bias
/// (Qwen2's q/k/v) 0, drawn in the
/// order [`Llama::build`] names them.
pub fn random_model(config: LlamaConfig, std: f64, seed: u64, device: Device) -> Result<Llama> {
    let mut rng = SplitMix64::new(seed);
    let mut draw = |name: &str, shape: &[usize]| {
        let tensor = match shape.len() {
            1 if name.ends_with(".bias") => Tensor::zeros([shape[0] as i64], (Kind::Float, Device::Cpu)),
            1 => Tensor::ones([shape[0] as i64], (Kind::Float, Device::Cpu)),
            _ => normal(&mut rng, shape, std),
        };
        Ok(tensor.to_device(device))
    };
    let rope = crate::model::rope::Rope::for_config(&config, device);
    Llama::build(config, &mut draw, rope, device, Kind::Float)
}

/// N(0, std²) values by the Box-Muller transform.
fn normal(rng: &mut SplitMix64, shape: &[usize], std: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut values = Vec::with_capacity(n + 1);
    while values.len() < n {
        // 1 - u lies in (0, 1], so the logarithm is finite.
        let radius = (-2.0 * (1.0 - rng.next_f64()).ln()).sqrt() * std;
        let angle = 2.0 * std::f64::consts::PI * rng.next_f64();
        values.push((radius * angle.cos()) as f32);
        values.push((radius * angle.sin()) as f32);
    }
    values.truncate(n);
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Tensor::from_slice(&values).view(dims.as_slice())
}

/// A model directory, Hub id or smallrl checkpoint, with a checkpoint's adapters merged into
/// the base weights at scale 1 (pre-training continues from the merged model). Returns the
/// model and its tokenizer file.
pub fn load_model(spec: &str, device: Device) -> Result<(Llama, std::path::PathBuf)> {
    let dir = Path::new(spec);
    if dir.join("trainer_state.json").exists() {
        let restored = crate::train::checkpoint::restore_model(dir, device)?;
        let mut model = restored.model;
        anyhow::ensure!(
            model.layers.iter().all(|b| b.mlp.adapters.is_empty()),
            "--init {spec} is a DualMLP checkpoint: pre-training continues from merged LoRA checkpoints only; export it with `smallrl export` (which widens the MLP) and give that directory"
        );
        fold_adapters(&mut model);
        return Ok((model, restored.tokenizer_path));
    }
    let loaded = crate::model::load(spec, crate::defaults::REVISION, device, Kind::Float)
        .with_context(|| format!("cannot load --init {spec}"))?;
    Ok((loaded.model, loaded.files.tokenizer))
}

fn fold_adapters(model: &mut Llama) {
    let scales = vec![1.0; model.adapter_slots()];
    for (_, linear) in model.projections_mut() {
        linear.weight = linear.merged_weight(&scales);
        linear.adapters.clear();
    }
}
