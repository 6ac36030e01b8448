//! `smallrl bench ...`: benchmarks that print figures (speed targets are checked by people
//! reading these, not by timed tests).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use super::common::ModelArgs;
use crate::device::DeviceSpec;
use crate::stats::median;
use crate::model::autocast::TrainDtype;
use crate::model::decode::DecodeModel;
use crate::model::folded::SamplerDtype;
use crate::model::generate::{Decoder, SamplingParams, generate_stacked, generate_with};
use crate::train::metrics::key;
use crate::train::packed::{PackOptions, PackedRun, Stacking, train_packed_with};
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
    /// Instead of the step breakdown: N runs (seeds 0..N) of STEPS steps each, trained one after
    /// another and then packed in one lockstep pack (`train::packed`); prints steps/s in all.
    #[arg(long, value_name = "N")]
    pub pack: Option<usize>,
    /// With --pack: threads that step the pack's runs at once (`train --pack-workers`).
    #[arg(long, value_name = "W", default_value_t = 1, requires = "pack")]
    pub pack_workers: usize,
    /// With --pack: whether the pack samples and trains its runs stacked on a leading run axis
    /// (`auto`: sampling where libtorch samples, training on CUDA).
    #[arg(long, value_enum, default_value = "auto", requires = "pack")]
    pub pack_stacking: Stacking,
    /// Train off policy (`max_steps_off_policy`): each batch sampled ahead while earlier steps
    /// train; the step breakdown then adds the time a step waited for its batch.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub max_steps_off_policy: usize,
    /// The training passes' precisions to measure side by side (`train_dtype`), e.g.
    /// float32,bfloat16.
    #[arg(long, value_delimiter = ',', default_value = "float32")]
    pub train_dtypes: Vec<TrainDtype>,
    /// The samplers' precisions to measure side by side (`sampler_dtype`), e.g.
    /// float32,bfloat16 (bfloat16 sets `importance_sampling_correction`, which it requires).
    #[arg(long, value_delimiter = ',', default_value = "float32")]
    pub sampler_dtypes: Vec<SamplerDtype>,
    /// Further config keys for every measured run (as `train --set`), e.g. `batch_size=16`
    /// `num_generations=16` `max_completion_length=32` for the 16 x 32 SmolLM2 step.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
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
    /// The precision to sample in (`sampler_dtype`): float32, or bfloat16 (the matrices'
    /// weights rounded, half the bytes per decode step; sums in float32).
    #[arg(long, default_value = "float32")]
    pub sampler_dtype: SamplerDtype,
    /// Instead: N runs (the model N times, each run with its own seed) sampled one after
    /// another and stacked on a leading run axis (`generate_stacked`, what a pack does); prints
    /// both, in tokens/s in all.
    #[arg(long, value_name = "N")]
    pub pack: Option<usize>,
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Sample(args) => bench_sample(args)?,
        BenchCommand::Train(args) => bench_train(args)?,
    }
    print_peak_memory()
}

/// The configuration of a benchmark run: defaults, `adapter` (DualLoRA at r32), no evaluation
/// or checkpoint before the last step.
fn bench_config(args: &TrainBench, adapter: &str, threads: usize, max_steps: usize, seed: u64, output_dir: &Path, (train_dtype, sampler_dtype): (TrainDtype, SamplerDtype)) -> Result<TrainConfig> {
    let overrides = serde_json::json!({
        "model": args.model, "prompts": args.prompts,
        "reward": {"plugin": args.reward_plugin, "params": {}},
        "adapter": adapter, "lora_preset": (adapter == "dual-lora").then_some("r32"),
        "max_steps": max_steps, "eval_every": 1_000_000, "save_steps": 1_000_000,
        "logging_steps": 1_000_000, "threads": threads, "device": args.device.to_string(),
        "output_dir": output_dir, "name": format!("{adapter}-{threads}"), "seed": seed,
        "max_steps_off_policy": args.max_steps_off_policy, "train_dtype": train_dtype,
        "sampler_dtype": sampler_dtype, "importance_sampling_correction": sampler_dtype == SamplerDtype::Bfloat16,
    });
    let serde_json::Value::Object(mut overrides) = overrides else { unreachable!() };
    for text in &args.set {
        let (key, value) = crate::train::config::parse_override(text)?;
        overrides.insert(key, value);
    }
    TrainConfig::resolve(None, overrides)
}

fn bench_train(args: TrainBench) -> Result<()> {
    let out = std::env::temp_dir().join(format!("smallrl-bench-{}", std::process::id()));
    let device = args.device.resolve()?;
    println!("GRPO step, defaults (batch 32 completions, 16 per group, up to 128 new tokens) but {:?}, model {}, device {device:?}, {}", args.set, args.model, crate::device::openmp_wait());
    let thread_counts = if device.is_cuda() { &args.thread_counts[..1] } else { &args.thread_counts[..] };
    if let Some(runs) = args.pack {
        let outcome = bench_packed(&args, runs, thread_counts, &out);
        let _ = std::fs::remove_dir_all(&out);
        return outcome;
    }
    let dtypes: Vec<(TrainDtype, SamplerDtype)> = args.train_dtypes.iter().flat_map(|&t| args.sampler_dtypes.iter().map(move |&s| (t, s))).collect();
    for (adapter, &(train_dtype, sampler_dtype)) in ["full", "dual-lora"].into_iter().flat_map(|a| dtypes.iter().map(move |d| (a, d))) {
        for &threads in thread_counts {
            let config = bench_config(&args, adapter, threads, args.steps + 1, crate::defaults::SEED, &out, (train_dtype, sampler_dtype))?;
            let mut trainer = Trainer::new(config, None)?;
            let mut steps = Vec::new();
            for _ in 0..=args.steps {
                steps.push(trainer.train_one()?);
            }
            let median = |key: &str| median(steps[1..].iter().map(|m| m[key].as_f64().unwrap_or(f64::NAN)).collect());
            println!("{adapter:<9} {train_dtype:<8} sampler {sampler_dtype:<8} threads {threads}: step {:.3} s, mean completion {:.0} tokens", median(key::STEP_TIME), median(key::MEAN_LENGTH));
            print!("{}", phase_table(&steps[1..]));
            if args.max_steps_off_policy > 0 {
                println!("{:<9} {:>9}  off policy: the step waited {:.3} s for its batch (sampled ahead in {:.3} s)", "", "", median(key::TIMING_WAIT_FOR_SAMPLES), median(key::TIMING_GENERATE));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// The phases of a step (medians over `steps`' metrics lines, seconds): each row a part of the
/// step, indented rows parts of the row above. Each step's top-level phases add up to at most
/// its `step_time` (the rest: batch bookkeeping, logs); medians of several steps need not.
fn phase_table(steps: &[serde_json::Value]) -> String {
    let median = |key: &str| median(steps.iter().map(|m| m[key].as_f64().unwrap_or(f64::NAN)).collect());
    let (reference, old) = (median(key::TIMING_REFERENCE), median(key::TIMING_OLD_LOGPROBS));
    let (train, optimizer) = (median(key::TIMING_TRAIN), median(key::TIMING_OPTIMIZER));
    let (generate, setup) = (median(key::TIMING_GENERATE), median(key::TIMING_SAMPLER_SETUP));
    let rows = [
        ("sampling", generate),
        ("  set-up", setup),
        ("  decode", generate - setup),
        ("scoring", median(key::TIMING_SCORE)),
        ("reference log-probs", reference - old),
        ("old log-probs", old),
        ("forward + backward", train - optimizer),
        ("optimizer", optimizer),
        ("step", median(key::STEP_TIME)),
    ];
    rows.iter().map(|(phase, seconds)| format!("    {phase:<20} {seconds:>8.3} s\n")).collect()
}

/// `--pack N`: N whole runs (start-up, STEPS steps, the final evaluation and checkpoint) one
/// after another in this process, and the same runs as one pack, alternately three times; the
/// least wall time and the least CPU time (this process's) of each are shown: other processes
/// on the machine only ever slow a measurement down.
fn bench_packed(args: &TrainBench, runs: usize, thread_counts: &[usize], out: &Path) -> Result<()> {
    anyhow::ensure!(runs >= 1, "--pack must be at least 1");
    let [train_dtype] = args.train_dtypes[..] else {
        anyhow::bail!("--pack measures one training precision: give --train-dtypes one value (got {:?})", args.train_dtypes);
    };
    let [sampler_dtype] = args.sampler_dtypes[..] else {
        anyhow::bail!("--pack measures one sampler precision: give --sampler-dtypes one value (got {:?})", args.sampler_dtypes);
    };
    let dtypes = (train_dtype, sampler_dtype);
    println!("{runs} runs (seeds 0..{runs}) of {} steps each: one after another, and packed ({} worker threads, stacking {:?})", args.steps, args.pack_workers, args.pack_stacking);
    for adapter in ["full", "dual-lora"] {
        for &threads in thread_counts {
            let configs = |dir: String| (0..runs as u64).map(|seed| bench_config(args, adapter, threads, args.steps, seed, &out.join(&dir), dtypes)).collect::<Result<Vec<_>>>();
            // A one-step run first, so neither measurement pays the process's one-time costs.
            Trainer::new(bench_config(args, adapter, threads, 1, 0, &out.join("warm-up"), dtypes)?, None)?.train(None)?;
            let (mut alone, mut packed) = ((f64::INFINITY, f64::INFINITY), (f64::INFINITY, f64::INFINITY));
            let (mut alone_train, mut packed_train) = (Vec::new(), Vec::new());
            for round in 0..3 {
                // Each setting's runs in directories of their own: `train_seconds` reads them all.
                let (alone_dir, packed_dir) = (format!("alone-{adapter}-{threads}-{round}"), format!("packed-{adapter}-{threads}-{round}"));
                let measured = timed(|| {
                    for config in configs(alone_dir.clone())? {
                        Trainer::new(config, None)?.train(None)?;
                    }
                    Ok(())
                })?;
                alone = (alone.0.min(measured.0), alone.1.min(measured.1));
                let measured = timed(|| {
                    let packed_runs = configs(packed_dir.clone())?.into_iter().map(|config| PackedRun { config, resume: None }).collect();
                    let options = PackOptions { workers: args.pack_workers, stacking: args.pack_stacking };
                    train_packed_with(packed_runs, None, options)?.into_iter().map(|outcome| outcome.map(|_| ())).collect()
                })?;
                packed = (packed.0.min(measured.0), packed.1.min(measured.1));
                alone_train.extend(train_seconds(&out.join(&alone_dir))?);
                packed_train.extend(train_seconds(&out.join(&packed_dir))?);
            }
            let steps = (runs * args.steps) as f64;
            println!(
                "{adapter:<9} threads {threads}: one after another {:.2} s ({:.3} steps/s in all, CPU {:.1} s), packed {:.2} s ({:.3} steps/s in all, CPU {:.1} s)",
                alone.0,
                steps / alone.0,
                alone.1,
                packed.0,
                steps / packed.0,
                packed.1
            );
            println!(
                "{adapter:<9} threads {threads}: a step's training (pass and optimizer; a stacked pass's share), median: alone {:.4} s, packed {:.4} s",
                median(alone_train),
                median(packed_train)
            );
        }
    }
    Ok(())
}

/// Every step's `timing/train` in the runs under `dir` (a stacked pass counts its share).
fn train_seconds(dir: &Path) -> Result<Vec<f64>> {
    let mut seconds = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list the benchmark's runs in {}", dir.display()))? {
        let metrics = crate::runlog::Jsonl::new(entry?.path().join("metrics.jsonl"));
        for line in metrics.read()? {
            seconds.push(line[crate::train::metrics::key::TIMING_TRAIN].as_f64().context("a metrics line without timing/train")?);
        }
    }
    Ok(seconds)
}

/// Wall-clock and CPU seconds (this process, user + system) of `work`.
fn timed(work: impl FnOnce() -> Result<()>) -> Result<(f64, f64)> {
    let (wall, cpu) = (Instant::now(), process_cpu_seconds()?);
    work()?;
    Ok((wall.elapsed().as_secs_f64(), process_cpu_seconds()? - cpu))
}

fn process_cpu_seconds() -> Result<f64> {
    let usage = process_usage()?;
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Ok(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

/// This process's resource usage so far (`getrusage`).
fn process_usage() -> Result<libc::rusage> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes the struct it is given; RUSAGE_SELF is a valid target.
    let status = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    anyhow::ensure!(status == 0, "getrusage failed: {}", std::io::Error::last_os_error());
    // SAFETY: initialised by the successful call above.
    Ok(unsafe { usage.assume_init() })
}

/// Prints the process's peak resident memory (Linux reports `ru_maxrss` in KiB), the last
/// line of every benchmark.
fn print_peak_memory() -> Result<()> {
    println!("peak memory (resident, this process): {:.0} MiB", process_usage()?.ru_maxrss as f64 / 1024.0);
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
        kept_sets: false,
    };
    let decoder = DecodeModel::sampling_in(&loaded.model, &[], args.sampler_dtype);
    let on_cuda = decoder.device.is_cuda();
    println!(
        "sampling {} prompts x up to {} new tokens, model {}, device {:?}, sampler {} ({:?})",
        args.batch,
        args.max_new_tokens,
        loaded.files.source,
        decoder.device,
        args.sampler_dtype,
        decoder.kind
    );
    if let Some(runs) = args.pack {
        return bench_sample_packed(&decoder, runs, &prompts, &params, args.repeats);
    }
    if on_cuda {
        bench_engine("eager libtorch ops", Decoder::Libtorch, &decoder, &prompts, &params, args.repeats)?;
        match crate::model::cuda_graph::availability(decoder.device) {
            Ok(()) => bench_engine("CUDA graphs", Decoder::CudaGraphs, &decoder, &prompts, &params, args.repeats)?,
            Err(reason) => println!("CUDA graphs: not measured ({reason})"),
        }
        return Ok(());
    }
    for &threads in &args.thread_counts {
        crate::device::set_threads(Some(threads))?;
        let engine = if decoder.native().is_some() { Decoder::Native { threads } } else { Decoder::Libtorch };
        bench_engine(&format!("threads {threads}"), engine, &decoder, &prompts, &params, args.repeats)?;
    }
    Ok(())
}

/// Times `repeats` batches (after one warm-up, which also captures CUDA graphs) and prints
/// the median time per batch and tokens per second.
fn bench_engine(label: &str, engine: Decoder, decoder: &DecodeModel, prompts: &[Vec<u32>], params: &SamplingParams, repeats: usize) -> Result<()> {
    let (median, tokens) = median_batch(decoder, repeats, |seed| Ok(generate_with(engine, decoder, prompts, params, seed)?.completion_ids.numel()))?;
    println!("{label}: median {:.1} ms per batch, {:.0} tokens/s ({tokens} token slots per batch)", median * 1e3, tokens as f64 / median);
    if let (Decoder::Native { .. }, Some(native)) = (engine, decoder.native()) {
        // One pass over every matrix per generated token of the longest row (the prefill included).
        let (bytes, steps) = (native.weight_bytes() as f64, (tokens / prompts.len()) as f64);
        println!("{label}: {:.0} MB of weights read per step, {steps:.0} steps: {:.2} GB/s of weights", bytes / 1e6, bytes * steps / median / 1e9);
    }
    Ok(())
}

/// `bench sample --pack N`: N runs sampled one after another, then stacked, by the engine a
/// pack uses on this device (libtorch; CUDA graphs where available); on the CPU also the native
/// sampler one run after another, which is what a pack uses there.
fn bench_sample_packed(decoder: &DecodeModel, runs: usize, prompts: &[Vec<u32>], params: &SamplingParams, repeats: usize) -> Result<()> {
    anyhow::ensure!(runs >= 1, "--pack must be at least 1");
    let engine = match crate::model::cuda_graph::availability(decoder.device) {
        Ok(()) => Decoder::CudaGraphs,
        Err(_) => Decoder::Libtorch,
    };
    let stacked = DecodeModel::stacked(&vec![decoder; runs]);
    let run_prompts = vec![prompts; runs];
    let seeds = |seed: u64| (0..runs as u64).map(|run| seed * runs as u64 + run).collect::<Vec<_>>();
    let one_by_one = |engine: Decoder| {
        move |seed: u64| -> Result<usize> { seeds(seed).into_iter().map(|seed| Ok(generate_with(engine, decoder, prompts, params, seed)?.completion_ids.numel())).sum() }
    };
    let mut lines = vec![(format!("{runs} runs one after another, {engine:?}"), median_batch(decoder, repeats, one_by_one(engine))?)];
    if let Some(threads) = decoder.native().map(|_| tch::get_num_threads().max(1) as usize) {
        lines.push((format!("{runs} runs one after another, native sampler ({threads} threads)"), median_batch(decoder, repeats, one_by_one(Decoder::Native { threads }))?));
    }
    let together = |seed: u64| -> Result<usize> { generate_stacked(engine, &stacked, &run_prompts, params, &seeds(seed))?.into_iter().map(|g| Ok(g?.completion_ids.numel())).sum() };
    lines.push((format!("{runs} runs stacked, {engine:?}"), median_batch(&stacked, repeats, together)?));
    for (label, (median, tokens)) in lines {
        println!("{label}: median {:.1} ms, {:.0} tokens/s in all ({tokens} token slots)", median * 1e3, tokens as f64 / median);
    }
    Ok(())
}

/// The median wall time of `repeats` calls of `batch(seed)` (seeds 1..=repeats, after one
/// warm-up call with seed 0, which also captures CUDA graphs) and the tokens the last returned.
fn median_batch(decoder: &DecodeModel, repeats: usize, mut batch: impl FnMut(u64) -> Result<usize>) -> Result<(f64, usize)> {
    let synchronize = || {
        if let tch::Device::Cuda(index) = decoder.device {
            tch::Cuda::synchronize(index as i64);
        }
    };
    batch(0)?;
    let mut times = Vec::new();
    let mut tokens = 0;
    for seed in 1..=repeats as u64 {
        synchronize();
        let start = Instant::now();
        tokens = batch(seed)?;
        synchronize();
        times.push(start.elapsed().as_secs_f64());
    }
    Ok((median(times), tokens))
}

