//! `smallrl tokenizer train`: a WordPiece tokenizer with the SimpleStories recipe.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use clap::{Args, Subcommand};

use crate::defaults;

#[derive(Subcommand, Debug)]
pub enum TokenizerCommand {
    /// Train a tokenizer on a text file (one document per line) and write tokenizer.json.
    Train(TrainTokenizerArgs),
}

#[derive(Args, Debug)]
pub struct TrainTokenizerArgs {
    /// The training text, one document per line (e.g. written by `smallrl corpus`).
    #[arg(long)]
    pub input: PathBuf,
    /// At most this many tokens (fewer when the text has fewer words and pieces; said so).
    #[arg(long, default_value_t = default_vocab_size())]
    pub vocab_size: usize,
    /// The tokenizer.json to write (replaced atomically).
    #[arg(long)]
    pub out: PathBuf,
}

fn default_vocab_size() -> usize {
    defaults::PRETRAIN_TOKENIZER.strip_prefix("train:").and_then(|n| n.parse().ok()).expect("PRETRAIN_TOKENIZER is train:N")
}

pub fn run(command: TokenizerCommand) -> Result<()> {
    let TokenizerCommand::Train(args) = command;
    let text = std::fs::read_to_string(&args.input).with_context(|| format!("cannot read {}", args.input.display()))?;
    let documents: Vec<String> = text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
    ensure!(!documents.is_empty(), "{} has no documents (every line is empty)", args.input.display());
    let trained = crate::model::wordpiece::train(&documents, args.vocab_size)
        .with_context(|| format!("cannot train a tokenizer on {}", args.input.display()))?;
    trained.save(&args.out)?;
    println!("{}: {}", args.out.display(), trained.size_note());
    Ok(())
}
