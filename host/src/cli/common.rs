//! Arguments shared by the commands that load a model.

use anyhow::{Result, bail};
use clap::Args;

use crate::defaults;
use crate::model::{self, LoadedModel};

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A local model directory (config.json, model.safetensors, tokenizer.json) or a HuggingFace
    /// repo id fetched into the HF cache (HF_HOME; HF_HUB_OFFLINE=1 for cache only).
    #[arg(long, default_value = defaults::MODEL)]
    pub model: String,
    /// Hub revision (branch, tag or commit) when --model is a repo id.
    #[arg(long, default_value = defaults::REVISION)]
    pub revision: String,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = defaults::DEVICE)]
    pub device: String,
    /// float32, or bfloat16 (on CUDA).
    #[arg(long, default_value = defaults::DTYPE)]
    pub dtype: String,
    /// libtorch intra-op threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
}

impl ModelArgs {
    pub fn load(&self) -> Result<LoadedModel> {
        crate::device::set_threads(self.threads)?;
        let device = crate::device::parse_device(&self.device)?;
        model::load(&self.model, &self.revision, device, crate::device::parse_dtype(&self.dtype)?)
    }
}

/// Prompts from `--prompt` values and/or a `--prompts` file (one per line, blank lines skipped).
pub fn read_prompts(inline: &[String], file: Option<&std::path::Path>) -> Result<Vec<String>> {
    let mut prompts = inline.to_vec();
    if let Some(path) = file {
        prompts.extend(crate::train::prompts::read_prompt_file(path, &crate::train::prompts::PromptRender::Raw)?.into_iter().map(|prompt| prompt.text));
    }
    if prompts.is_empty() {
        bail!("no prompts: pass --prompt TEXT or --prompts FILE");
    }
    Ok(prompts)
}

/// `--chat` and `--system`: a prompt as one user message through the model's chat template.
#[derive(Args, Debug, Clone)]
pub struct ChatArgs {
    /// Render each prompt as one user message with the model's chat template
    /// (chat_template.jinja or tokenizer_config.json), ending with the generation prompt.
    #[arg(long)]
    pub chat: bool,
    /// A system message before the user's (with --chat; without it, the template's default).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
}

impl ChatArgs {
    /// The text to tokenize for `prompt`: itself, or its chat rendering.
    pub fn prompt_texts(&self, files: &model::ModelFiles, prompts: &[String]) -> Result<Vec<String>> {
        if !self.chat {
            return Ok(prompts.to_vec());
        }
        let template = model::chat::ChatTemplate::for_model(files)?;
        prompts.iter().map(|p| template.user_prompt(self.system.as_deref(), p)).collect()
    }
}
