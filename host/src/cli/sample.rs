//! `smallrl sample`: completions from a model, printed one per line.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::common::{ChatArgs, ModelArgs, read_prompts};
use crate::defaults;
use crate::model::decode::DecodeModel;
use crate::model::folded::SamplerDtype;
use crate::model::generate::{SamplingParams, generate};

#[derive(Args, Debug)]
pub struct SampleArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A prompt (repeatable).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// A file with one prompt per line.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    #[command(flatten)]
    pub chat: ChatArgs,
    /// Completions per prompt.
    #[arg(short = 'n', long, default_value_t = 1)]
    pub num_samples: usize,
    #[arg(long, default_value_t = defaults::MAX_COMPLETION_LENGTH)]
    pub max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = defaults::TEMPERATURE)]
    pub temperature: f64,
    #[arg(long, default_value_t = defaults::TOP_K)]
    pub top_k: usize,
    #[arg(long, default_value_t = defaults::TOP_P)]
    pub top_p: f64,
    #[arg(long, default_value_t = defaults::REPETITION_PENALTY)]
    pub repetition_penalty: f64,
    #[arg(long, default_value_t = defaults::SAMPLE_SEED)]
    pub seed: u64,
    /// The precision to sample in (float32 or bfloat16: the weights' matrices rounded to
    /// bfloat16, as a run with this `sampler_dtype` samples).
    #[arg(long, default_value_t = defaults::SAMPLER_DTYPE)]
    pub sampler_dtype: SamplerDtype,
    /// One JSON object per completion instead of text lines.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: SampleArgs) -> Result<()> {
    let loaded = args.model.load()?;
    let texts = read_prompts(&args.prompt, args.prompts.as_deref())?;
    let rendered = args.chat.prompt_texts(&loaded.files, &texts)?;
    let mut prompts = Vec::new();
    for text in &rendered {
        let ids = loaded.tokenizer.encode(text)?;
        prompts.extend(std::iter::repeat_n(ids, args.num_samples));
    }
    let params = SamplingParams {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        repetition_penalty: args.repetition_penalty,
        kept_sets: false,
    };
    let decoder = DecodeModel::sampling_in(&loaded.model, &[], args.sampler_dtype);
    let generation = generate(&decoder, &prompts, &params, args.seed)?;
    for (i, row) in generation.rows.iter().enumerate() {
        let prompt = &texts[i / args.num_samples];
        let completion = loaded.tokenizer.decode(&row.ids)?;
        if args.json {
            let line = serde_json::json!({
                "prompt": prompt, "completion": completion, "completion_ids": row.ids,
                "ended_with_eos": row.ended_with_eos,
            });
            println!("{line}");
        } else {
            let end = if row.ended_with_eos { "" } else { " [truncated]" };
            println!("{prompt} ||| {completion}{end}");
        }
    }
    Ok(())
}
