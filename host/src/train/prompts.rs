//! Where a run's prompts come from: a text file (one prompt per line) or the SimpleStories
//! dataset, and the endless seeded stream the trainer draws each step's prompts from.
//!
//! Architecture invariant: the prompt at position `i` of the stream follows from `(seed, i)`
//! alone (each pass is a fresh shuffle seeded by the pass number), so a resumed run draws the
//! same prompts; evaluation prompts do not depend on the run seed.

use std::path::Path;

use anyhow::{Context, Result, ensure};

use super::TrainConfig;
use crate::defaults;
use crate::model::Tokenizer;
use crate::rng::{self, SplitMix64};

/// Reads one prompt per line; blank lines are skipped, surrounding whitespace trimmed.
pub fn read_prompt_file(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read prompt file {}", path.display()))?;
    let prompts: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
    ensure!(!prompts.is_empty(), "prompt file {} has no prompts", path.display());
    Ok(prompts)
}

/// The training prompts as an endless stream: pass `p` over them is a shuffle seeded by
/// `(seed, p)`.
pub(super) struct PromptStream {
    prompts: Vec<String>,
    seed: u64,
    /// The shuffled order of the current pass: (pass, order).
    order: (usize, Vec<usize>),
}

impl PromptStream {
    pub fn new(prompts: Vec<String>, seed: u64) -> Self {
        Self { prompts, seed, order: (usize::MAX, Vec::new()) }
    }

    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    /// The prompt at position `index` of the stream.
    pub fn at(&mut self, index: usize) -> String {
        let n = self.prompts.len();
        let pass = index / n;
        if self.order.0 != pass {
            let mut order: Vec<usize> = (0..n).collect();
            SplitMix64::new(rng::derive(self.seed, "prompt-order", pass as u64)).shuffle(&mut order);
            self.order = (pass, order);
        }
        self.prompts[self.order.1[index % n]].clone()
    }
}

/// The training prompts and the first `eval_samples` evaluation prompts of a run.
pub(super) fn load(cfg: &TrainConfig, tokenizer: &Tokenizer) -> Result<(Vec<String>, Vec<String>)> {
    let prompts = training_prompts(cfg, tokenizer)?;
    let mut eval_prompts = evaluation_prompts(cfg, tokenizer)?;
    ensure!(eval_prompts.len() >= cfg.eval_samples, "eval_samples is {} but only {} evaluation prompts exist", cfg.eval_samples, eval_prompts.len());
    eval_prompts.truncate(cfg.eval_samples);
    Ok((prompts, eval_prompts))
}

/// The training prompts: the `--prompts` file (deduplicated, at most `num_prompts`), or
/// without one `num_prompts` prompts from the SimpleStories `train` split, shuffled by the seed.
pub fn training_prompts(cfg: &TrainConfig, tokenizer: &Tokenizer) -> Result<Vec<String>> {
    let Some(path) = &cfg.prompts else {
        return dataset_prompts("train", cfg, tokenizer, rng::derive(cfg.seed, "dataset-prompts", 0), cfg.num_prompts);
    };
    let mut prompts = read_prompt_file(path)?;
    dedup_keep_order(&mut prompts);
    if prompts.len() > cfg.num_prompts {
        SplitMix64::new(rng::derive(cfg.seed, "prompt-subset", 0)).shuffle(&mut prompts);
        prompts.truncate(cfg.num_prompts);
    }
    Ok(prompts)
}

/// The evaluation prompts in their fixed order (callers take the first n): the
/// `--eval-prompts` file; with dataset prompts, the SimpleStories `test` split drawn with the
/// fixed evaluation seed; with a `--prompts` file only, a fixed-seed shuffle of the training
/// prompts. All three are the same for every run seed.
pub fn evaluation_prompts(cfg: &TrainConfig, tokenizer: &Tokenizer) -> Result<Vec<String>> {
    Ok(match (&cfg.eval_prompts, &cfg.prompts) {
        (Some(path), _) => read_prompt_file(path)?,
        (None, None) => dataset_prompts("test", cfg, tokenizer, defaults::EVAL_PROMPT_SEED, cfg.eval_samples.max(defaults::EVAL_PROMPT_POOL))?,
        (None, Some(_)) => {
            let mut all = training_prompts(cfg, tokenizer)?;
            SplitMix64::new(defaults::EVAL_PROMPT_SEED).shuffle(&mut all);
            all
        }
    })
}

fn dataset_prompts(split: &str, cfg: &TrainConfig, tokenizer: &Tokenizer, seed: u64, count: usize) -> Result<Vec<String>> {
    let files = crate::dataset::split_files(crate::dataset::SIMPLESTORIES, split)?;
    let openings = crate::dataset::read_story_openings(&files, cfg.prompt_length)?;
    crate::dataset::prompts_from_stories(&openings, tokenizer, cfg.prompt_length, count, seed)
}

fn dedup_keep_order(items: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    items.retain(|item| seen.insert(item.clone()));
}
