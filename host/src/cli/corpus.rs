//! `smallrl corpus`: writes the synthetic story corpus, one story per line. For running the
//! pipeline offline and in tests; not a substitute for SimpleStories.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::defaults;

#[derive(Args, Debug)]
pub struct CorpusArgs {
    #[arg(long, default_value_t = defaults::CORPUS_STORIES)]
    pub stories: usize,
    #[arg(long, default_value_t = defaults::CORPUS_SEED)]
    pub seed: u64,
    /// Write only the first N words of each story (prompts; use a seed other than the
    /// training corpus's so they are fresh).
    #[arg(long)]
    pub opening_words: Option<usize>,
    /// The text file to write (replaced atomically).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(args: CorpusArgs) -> Result<()> {
    crate::corpus::write(&args.out, args.stories, args.seed, args.opening_words)?;
    println!("{}: {} stories (seed {})", args.out.display(), args.stories, args.seed);
    Ok(())
}
