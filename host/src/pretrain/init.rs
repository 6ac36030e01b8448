//! The model a pre-training run starts from: a seeded random initialisation (HF's LLaMA init:
//! every matrix N(0, initializer_range), every RMSNorm weight 1), or a model directory or
//! checkpoint with any adapters folded into its weights.

use std::path::Path;

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};

use crate::model::llama::{PROJECTIONS, projection_name};
use crate::model::{Llama, LlamaConfig};
use crate::rng::SplitMix64;

/// A freshly initialised model drawn from `seed` (our own generator, never libtorch's global
/// one), in float32 on `device`.
pub fn random_model(config: LlamaConfig, std: f64, seed: u64, device: Device) -> Result<Llama> {
    let mut rng = SplitMix64::new(seed);
    let tensors: Vec<(String, Tensor)> = parameter_shapes(&config)
        .into_iter()
        .map(|(name, shape)| {
            let tensor = if shape.len() == 1 { Tensor::ones([shape[0] as i64], (Kind::Float, Device::Cpu)) } else { normal(&mut rng, &shape, std) };
            (name, tensor)
        })
        .collect();
    crate::model::weights::llama_from_tensors(config, tensors, Path::new("<random initialisation>"), device, Kind::Float)
}

/// Every base tensor of a `LlamaForCausalLM` with this configuration, in HF order and names.
fn parameter_shapes(config: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let (h, i) = (config.hidden_size, config.intermediate_size);
    let projection_shape = |p: &str| match p {
        "q_proj" => vec![config.q_size(), h],
        "k_proj" | "v_proj" => vec![config.kv_size(), h],
        "o_proj" => vec![h, config.q_size()],
        "gate_proj" | "up_proj" => vec![i, h],
        "down_proj" => vec![h, i],
        other => unreachable!("unknown projection {other}"),
    };
    let mut shapes = vec![("model.embed_tokens.weight".to_string(), vec![config.vocab_size, h])];
    for layer in 0..config.num_hidden_layers {
        shapes.push((format!("model.layers.{layer}.input_layernorm.weight"), vec![h]));
        shapes.push((format!("model.layers.{layer}.post_attention_layernorm.weight"), vec![h]));
        for (p, name) in PROJECTIONS.iter().enumerate() {
            shapes.push((format!("{}.weight", projection_name(layer, p)), projection_shape(name)));
        }
    }
    shapes.push(("model.norm.weight".to_string(), vec![h]));
    if !config.tie_word_embeddings {
        shapes.push(("lm_head.weight".to_string(), vec![config.vocab_size, h]));
    }
    shapes
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
