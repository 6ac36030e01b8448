//! Where a model's files come from: a local directory, or a HuggingFace Hub repository through
//! the standard HF cache (`HF_HOME`, default `~/.cache/huggingface`), honouring
//! `HF_HUB_OFFLINE=1` (cache only, no network).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail, ensure};
use hf_hub::{Cache, Repo, RepoType};

/// The files of one model, wherever they live.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// What the user named (a directory or `owner/name`), for messages and run records.
    pub source: String,
    pub config: PathBuf,
    pub weights: Vec<PathBuf>,
    pub tokenizer: PathBuf,
    /// `generation_config.json` where the model has one: its `eos_token_id` are the stop tokens.
    pub generation_config: Option<PathBuf>,
    /// `chat_template.jinja` where the model has one (else `tokenizer_config.json`'s `chat_template`).
    pub chat_template: Option<PathBuf>,
    /// `tokenizer_config.json` where the model has one.
    pub tokenizer_config: Option<PathBuf>,
}

/// Resolves `spec`: an existing directory is used as is; otherwise `owner/name` is a Hub repo.
pub fn resolve(spec: &str, revision: &str) -> Result<ModelFiles> {
    let path = Path::new(spec);
    if path.is_dir() {
        return from_dir(path);
    }
    let looks_like_repo = spec.split('/').count() == 2 && !spec.starts_with('.') && !spec.starts_with('/');
    ensure!(looks_like_repo, "model {spec:?} is neither a directory nor a HuggingFace repo id (owner/name)");
    from_hub(spec, revision)
}

pub fn from_dir(dir: &Path) -> Result<ModelFiles> {
    let optional = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
    let file = |name: &str| -> Result<PathBuf> {
        let path = dir.join(name);
        ensure!(path.is_file(), "model directory {} has no {name}", dir.display());
        Ok(path)
    };
    Ok(ModelFiles {
        source: dir.display().to_string(),
        config: file("config.json")?,
        weights: super::weights::weight_files(dir)?,
        tokenizer: file("tokenizer.json")?,
        generation_config: optional("generation_config.json"),
        chat_template: optional("chat_template.jinja"),
        tokenizer_config: optional("tokenizer_config.json"),
    })
}

/// `HF_HUB_OFFLINE` set to anything but empty, 0 or false: read the HF cache only.
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"))
}

fn from_hub(repo_id: &str, revision: &str) -> Result<ModelFiles> {
    let repo = Repo::with_revision(repo_id.to_string(), RepoType::Model, revision.to_string());
    let fetch = |name: &str| -> Result<PathBuf> {
        if offline() {
            Cache::from_env().repo(repo.clone()).get(name).with_context(|| {
                format!(
                    "{repo_id}@{revision}: {name} is not in the HF cache ({}) and HF_HUB_OFFLINE is set; \
                     download it once with network access or pass a local model directory",
                    Cache::from_env().path().display()
                )
            })
        } else {
            let api = hf_hub::api::sync::ApiBuilder::from_env()
                .build()
                .map_err(|e| anyhow!("cannot start the HuggingFace Hub client: {e}"))?;
            api.repo(repo.clone()).get(name).map_err(|e| {
                anyhow!(
                    "cannot fetch {name} of {repo_id}@{revision} from the HuggingFace Hub: {e}. \
                     Without network access, pass a local model directory with --model"
                )
            })
        }
    };
    let config = fetch("config.json")?;
    let weights = match fetch("model.safetensors") {
        Ok(single) => vec![single],
        Err(single_err) => {
            let index = fetch("model.safetensors.index.json").map_err(|_| single_err)?;
            let dir = index.parent().expect("cached files live in a snapshot directory").to_owned();
            let shards = super::weights::weight_files(&dir)?;
            for shard in &shards {
                let name = shard.file_name().and_then(|n| n.to_str()).context("bad shard name")?;
                fetch(name)?;
            }
            shards
        }
    };
    let tokenizer = fetch("tokenizer.json")?;
    if weights.is_empty() {
        bail!("{repo_id}@{revision} lists no weight files");
    }
    // Optional files: a repository without them is complete (a missing one is not an error).
    let generation_config = fetch("generation_config.json").ok();
    let chat_template = fetch("chat_template.jinja").ok();
    let tokenizer_config = fetch("tokenizer_config.json").ok();
    Ok(ModelFiles { source: repo_id.to_string(), config, weights, tokenizer, generation_config, chat_template, tokenizer_config })
}
