//! Reading and writing HF `model.safetensors` (single file or sharded with an index).
//!
//! Invariant: every tensor the model needs is present with the shape `config.json` implies,
//! and every tensor in the files is used; anything else is an error naming file and tensor.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use tch::{Device, Kind, Tensor};

use super::config::LlamaConfig;
use super::llama::Llama;
use super::rope::Rope;

/// A tensor read from disk, remembered with the file it came from (for error messages).
struct Stored {
    tensor: Tensor,
    file: PathBuf,
}

/// Reads a safetensors file into a name → tensor map (no shape checks).
pub fn read_safetensors(path: &Path) -> Result<BTreeMap<String, Tensor>> {
    let tensors = Tensor::read_safetensors(path)
        .with_context(|| format!("cannot read safetensors file {}", path.display()))?;
    Ok(tensors.into_iter().collect())
}

/// Writes tensors atomically: a temporary file in the same directory, then a rename.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let tmp = crate::fsutil::temp_sibling(path);
    let contiguous: Vec<(String, Tensor)> =
        tensors.iter().map(|(n, t)| (n.clone(), t.detach().to_device(Device::Cpu).contiguous())).collect();
    Tensor::write_safetensors(&contiguous, &tmp)
        .with_context(|| format!("cannot write safetensors file {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot move {} into place", path.display()))
}

/// The weight files of a model directory: `model.safetensors`, or the shards listed in
/// `model.safetensors.index.json`.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    ensure!(
        index.exists(),
        "{} has neither model.safetensors nor model.safetensors.index.json",
        dir.display()
    );
    shard_files(&index)
}

fn shard_files(index: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).with_context(|| format!("cannot read {}", index.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", index.display()))?;
    let map = json["weight_map"]
        .as_object()
        .with_context(|| format!("{} has no weight_map object", index.display()))?;
    let dir = index.parent().expect("an index file has a parent directory");
    let mut files: Vec<PathBuf> = map
        .values()
        .map(|v| v.as_str().map(|f| dir.join(f)).context("weight_map values must be file names"))
        .collect::<Result<_>>()
        .with_context(|| format!("bad weight_map in {}", index.display()))?;
    files.sort();
    files.dedup();
    Ok(files)
}

/// Loads a LLaMA from weight files, checking every tensor against the configuration.
pub fn load_llama(config: LlamaConfig, files: &[PathBuf], device: Device, kind: Kind) -> Result<Llama> {
    assemble(config, read_all(files)?, device, kind)
}

fn assemble(config: LlamaConfig, mut stored: HashMap<String, Stored>, device: Device, kind: Kind) -> Result<Llama> {
    let tied = config.tie_word_embeddings;
    let rope = Rope::for_config(&config, device);
    let model = Llama::build(config, &mut |name, shape| take_tensor(&mut stored, name, shape, device, kind), rope, device, kind)?;
    if tied {
        check_tied_head(&mut stored, &model.embed_tokens)?;
    }
    // Old checkpoints carry RoPE's inverse frequencies as a buffer; they are recomputed.
    stored.retain(|name, _| !name.ends_with("self_attn.rotary_emb.inv_freq"));
    if let Some((name, s)) = stored.iter().next() {
        bail!("{}: tensor {name} is not part of a {} with this config.json", s.file.display(), model.config.model_type.architecture());
    }
    Ok(model)
}

fn read_all(files: &[PathBuf]) -> Result<HashMap<String, Stored>> {
    let mut stored = HashMap::new();
    for file in files {
        for (name, tensor) in read_safetensors(file)? {
            if let Some(previous) = stored.insert(name.clone(), Stored { tensor, file: file.clone() }) {
                bail!("tensor {name} is in both {} and {}", previous.file.display(), file.display());
            }
        }
    }
    Ok(stored)
}

fn take_tensor(
    stored: &mut HashMap<String, Stored>,
    name: &str,
    shape: &[usize],
    device: Device,
    kind: Kind,
) -> Result<Tensor> {
    let Stored { tensor, file } = stored.remove(name).with_context(|| format!("tensor {name} is missing from the model's safetensors files"))?;
    check_tensor(&tensor, &file, name, shape)?;
    Ok(tensor.to_kind(kind).to_device(device))
}

fn check_tensor(tensor: &Tensor, file: &Path, name: &str, shape: &[usize]) -> Result<()> {
    ensure!(
        matches!(tensor.kind(), Kind::Float | Kind::BFloat16 | Kind::Half),
        "{}: tensor {name} has dtype {:?}; expected float32, bfloat16 or float16",
        file.display(),
        tensor.kind()
    );
    let actual: Vec<usize> = tensor.size().iter().map(|&d| d as usize).collect();
    ensure!(
        actual == shape,
        "{}: tensor {name} has shape {actual:?} but config.json implies {shape:?}",
        file.display()
    );
    Ok(())
}

/// A tied checkpoint may still contain `lm_head.weight`; it must then equal the embedding.
fn check_tied_head(stored: &mut HashMap<String, Stored>, embed: &Tensor) -> Result<()> {
    if let Some(Stored { tensor, file }) = stored.remove("lm_head.weight") {
        let same = tensor.size() == embed.size()
            && tensor.to_kind(Kind::Float).to_device(embed.device()).equal(&embed.to_kind(Kind::Float));
        ensure!(
            same,
            "{}: lm_head.weight differs from model.embed_tokens.weight but config.json says tie_word_embeddings = true",
            file.display()
        );
    }
    Ok(())
}
