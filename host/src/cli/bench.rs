//! `smallrl bench ...`: benchmarks that print figures (speed targets are checked by people
//! reading these, not by timed tests).

use std::time::Instant;

use anyhow::Result;
use clap::{Args, Subcommand};

use super::common::ModelArgs;
use crate::model::decode::DecodeModel;
use crate::model::generate::{SamplingParams, generate};

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Sampling throughput: BATCH prompts x MAX_NEW_TOKENS new tokens, per thread count.
    Sample(SampleBench),
}

#[derive(Args, Debug)]
pub struct SampleBench {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Thread counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub thread_counts: Vec<usize>,
    /// Timed repetitions per thread count (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Sample(args) => bench_sample(args),
    }
}

fn bench_sample(args: SampleBench) -> Result<()> {
    let loaded = args.model.load()?;
    let prompt = loaded.tokenizer.encode("once upon a time there was a little")?;
    let prompts = vec![prompt; args.batch];
    let params = SamplingParams {
        max_new_tokens: args.max_new_tokens,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        repetition_penalty: 1.0,
    };
    let decoder = DecodeModel::new(&loaded.model, &[]);
    println!("sampling {} prompts x up to {} new tokens, model {}", args.batch, args.max_new_tokens, loaded.files.source);
    for &threads in &args.thread_counts {
        crate::device::set_threads(Some(threads))?;
        generate(&decoder, &prompts, &params, 0)?;
        let mut times = Vec::new();
        let mut tokens = 0;
        for seed in 0..args.repeats {
            let start = Instant::now();
            let generation = generate(&decoder, &prompts, &params, seed as u64)?;
            times.push(start.elapsed().as_secs_f64());
            tokens = generation.completion_ids.numel();
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "threads {threads}: median {:.1} ms per batch, {:.0} tokens/s ({tokens} token slots per batch)",
            median * 1e3,
            tokens as f64 / median
        );
    }
    Ok(())
}
