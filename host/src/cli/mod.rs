//! Command-line interface: argument parsing and dispatch to one module per subcommand. Each
//! subcommand module turns its arguments into library calls and prints; no logic lives here.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod bench;
mod common;
mod corpus;
mod eval;
mod export;
mod logprobs;
mod plot;
mod plugin;
mod plugin_samples;
mod plugin_snapshot;
mod pretrain;
mod sample;
mod sweep;
mod tokenizer;
mod train;
mod wandb;

#[derive(Parser)]
#[command(name = "smallrl", version, about = "GRPO with gradient routing on tiny LLaMA models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train with GRPO (full fine-tuning, LoRA or DualLoRA with gradient routing).
    Train(Box<train::TrainArgs>),
    /// Routing evaluation of a checkpoint (its recorded adapters and rewards), with samples.
    Eval(eval::EvalArgs),
    /// A grid of training runs with automatic non-routed baselines, a summary table and charts.
    Sweep(Box<sweep::SweepArgs>),
    /// Reward, KL and completion-length curves of runs from their metrics.jsonl.
    Plot(plot::PlotArgs),
    /// Write a checkpoint as an HF model directory with its adapters merged.
    Export(export::ExportArgs),
    /// Sample completions from a model.
    Sample(sample::SampleArgs),
    /// Print the log-probability a model gives each next token of a text.
    Logprobs(logprobs::LogprobsArgs),
    /// Causal-LM pre-training (from scratch or a model; full, LoRA or DualLoRA) to an HF model directory.
    Pretrain(Box<pretrain::PretrainArgs>),
    /// Write the synthetic story corpus (offline pipeline and tests; not a substitute for SimpleStories).
    Corpus(corpus::CorpusArgs),
    /// Train a WordPiece tokenizer with the SimpleStories recipe.
    #[command(subcommand)]
    Tokenizer(tokenizer::TokenizerCommand),
    /// Benchmarks that print throughput figures.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Inspect, scaffold and run reward / hack-detector plugins (WebAssembly components).
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Copy run directories into Weights & Biases runs (config, metrics, evaluations, samples).
    WandbSync(wandb::WandbSyncArgs),
}

pub fn main() -> Result<()> {
    crate::device::keep_freed_memory();
    let command = Cli::parse().command;
    if command.runs_libtorch() {
        crate::device::short_openmp_spin()?;
    }
    match command {
        Command::Train(args) => train::run(*args),
        Command::Eval(args) => eval::run(args),
        Command::Sweep(args) => sweep::run(*args),
        Command::Plot(args) => plot::run(args),
        Command::Export(args) => export::run(args),
        Command::Sample(args) => sample::run(args),
        Command::Logprobs(args) => logprobs::run(args),
        Command::Pretrain(args) => pretrain::run(*args),
        Command::Corpus(args) => corpus::run(args),
        Command::Tokenizer(command) => tokenizer::run(command),
        Command::Bench(command) => bench::run(command),
        Command::Plugin(command) => plugin::run(command),
        Command::WandbSync(args) => wandb::run(args),
    }
}

impl Command {
    /// Whether the command computes with libtorch's threads (and so runs under
    /// [`crate::device::short_openmp_spin`]); a sweep's runs inherit its environment.
    fn runs_libtorch(&self) -> bool {
        match self {
            Command::Train(_) | Command::Eval(_) | Command::Sweep(_) | Command::Sample(_) | Command::Logprobs(_) | Command::Pretrain(_) | Command::Bench(_) => true,
            Command::Plot(_) | Command::Export(_) | Command::Corpus(_) | Command::Tokenizer(_) | Command::Plugin(_) | Command::WandbSync(_) => false,
        }
    }
}
