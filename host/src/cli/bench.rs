//! `smallrl bench ...`: benchmarks that print figures (speed targets are checked by people
//! reading these, not by timed tests).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::{Args, Subcommand};

use super::common::ModelArgs;
use crate::device::DeviceSpec;
use crate::model::decode::DecodeModel;
use crate::model::generate::{Engine, SamplingParams, generate_with};
use crate::train::metrics::key;
use crate::train::{TrainConfig, Trainer};

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Sampling throughput: BATCH prompts x MAX_NEW_TOKENS new tokens, per thread count on the
    /// CPU, eager and CUDA-graph decoding on CUDA (`--device cuda`).
    Sample(SampleBench),
    /// GRPO step time (generate / score / train) for full fine-tuning and DualLoRA r32.
    Train(TrainBench),
}

#[derive(Args, Debug)]
pub struct TrainBench {
    /// A local model directory; a random model (e.g. the tiny-random fixture) never stops
    /// early, so every completion has the full length.
    #[arg(long)]
    pub model: String,
    /// One prompt per line.
    #[arg(long)]
    pub prompts: PathBuf,
    #[arg(long, default_value = "plugins/happy.wasm")]
    pub reward_plugin: String,
    /// Timed steps per setting (after one warm-up step); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// libtorch thread counts to measure (on CUDA only the first is used: the GPU does the work).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub thread_counts: Vec<usize>,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = crate::defaults::DEVICE)]
    pub device: DeviceSpec,
}

#[derive(Args, Debug)]
pub struct SampleBench {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// libtorch thread counts to measure on the CPU (on CUDA the GPU does the work).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub thread_counts: Vec<usize>,
    /// Timed repetitions per thread count (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Sample(args) => bench_sample(args),
        BenchCommand::Train(args) => bench_train(args),
    }
}

fn bench_train(args: TrainBench) -> Result<()> {
    let out = std::env::temp_dir().join(format!("smallrl-bench-{}", std::process::id()));
    let device = args.device.resolve()?;
    println!("GRPO step, defaults (batch 32 completions, 16 per group, up to 128 new tokens), model {}, device {device:?}", args.model);
    let thread_counts = if device.is_cuda() { &args.thread_counts[..1] } else { &args.thread_counts[..] };
    for adapter in ["full", "dual-lora"] {
        for &threads in thread_counts {
            let overrides = serde_json::json!({
                "model": args.model, "prompts": args.prompts,
                "reward": {"plugin": args.reward_plugin, "params": {}},
                "adapter": adapter, "lora_preset": (adapter == "dual-lora").then_some("r32"),
                "max_steps": args.steps + 1, "eval_every": 1_000_000, "save_steps": 1_000_000,
                "logging_steps": 1_000_000, "threads": threads, "device": args.device.to_string(),
                "output_dir": out, "name": format!("{adapter}-{threads}"),
            });
            let serde_json::Value::Object(overrides) = overrides else { unreachable!() };
            let config = TrainConfig::resolve(None, overrides)?;
            let mut trainer = Trainer::new(config, None)?;
            let mut steps = Vec::new();
            for _ in 0..=args.steps {
                steps.push(trainer.train_one()?);
            }
            let median = |key: &str| {
                let mut values: Vec<f64> = steps[1..].iter().map(|m| m[key].as_f64().unwrap_or(f64::NAN)).collect();
                values.sort_by(f64::total_cmp);
                values[values.len() / 2]
            };
            println!(
                "{adapter:<9} threads {threads}: step {:.3} s (generate {:.3}, score {:.4}, reference + old log-probs {:.3}, train {:.3}), mean completion {:.0} tokens",
                median(key::STEP_TIME),
                median(key::TIMING_GENERATE),
                median(key::TIMING_SCORE),
                median(key::TIMING_REFERENCE),
                median(key::TIMING_TRAIN),
                median(key::MEAN_LENGTH)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
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
    let on_cuda = decoder.device.is_cuda();
    println!("sampling {} prompts x up to {} new tokens, model {}, device {:?}", args.batch, args.max_new_tokens, loaded.files.source, decoder.device);
    if on_cuda {
        bench_engine("eager libtorch ops", Engine::Libtorch, &decoder, &prompts, &params, args.repeats)?;
        match crate::model::cuda_graph::availability(decoder.device) {
            Ok(()) => bench_engine("CUDA graphs", Engine::CudaGraphs, &decoder, &prompts, &params, args.repeats)?,
            Err(reason) => println!("CUDA graphs: not measured ({reason})"),
        }
        return Ok(());
    }
    for &threads in &args.thread_counts {
        crate::device::set_threads(Some(threads))?;
        let engine = if decoder.native().is_some() { Engine::Native { threads } } else { Engine::Libtorch };
        bench_engine(&format!("threads {threads}"), engine, &decoder, &prompts, &params, args.repeats)?;
    }
    Ok(())
}

/// Times `repeats` batches (after one warm-up, which also captures CUDA graphs) and prints
/// the median time per batch and tokens per second.
fn bench_engine(label: &str, engine: Engine, decoder: &DecodeModel, prompts: &[Vec<u32>], params: &SamplingParams, repeats: usize) -> Result<()> {
    let synchronize = || {
        if let tch::Device::Cuda(index) = decoder.device {
            tch::Cuda::synchronize(index as i64);
        }
    };
    generate_with(engine, decoder, prompts, params, 0)?;
    let mut times = Vec::new();
    let mut tokens = 0;
    for seed in 0..repeats {
        synchronize();
        let start = Instant::now();
        let generation = generate_with(engine, decoder, prompts, params, seed as u64)?;
        synchronize();
        times.push(start.elapsed().as_secs_f64());
        tokens = generation.completion_ids.numel();
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!("{label}: median {:.1} ms per batch, {:.0} tokens/s ({tokens} token slots per batch)", median * 1e3, tokens as f64 / median);
    Ok(())
}
