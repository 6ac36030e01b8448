//! `smallrl plugin bench`: scoring throughput of a wasm plugin against the same function
//! compiled natively (the happy_count reward, the README's headline plugin).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use smallrl_plugin_sdk::Reward;
use smallrl_standard_plugins::HappyCount;

use super::{Plugin, PluginLimits, Sample};

pub struct BenchReport {
    pub samples: usize,
    pub wasm_per_batch: Duration,
    pub native_per_batch: Duration,
    /// Cold (or cached) load of the component, including compilation and instantiation.
    pub load: Duration,
    /// Fuel of one batch's `score`, per sample.
    pub wasm_fuel_per_sample: f64,
    /// Samples the plugin gave no score (contract 0.5's none), left out of the comparison.
    pub no_score: usize,
}

/// Another build of happy_count (its Python port): what its loads and scoring cost.
pub struct PortReport {
    /// Compiling the component with no cache (its first load on a new machine).
    pub compile: Duration,
    /// Loading it again: compiled code from the cache, instantiation, `info` and `configure`.
    pub cached_load: Duration,
    pub per_batch: Duration,
    pub fuel_per_sample: f64,
    /// Samples the port gave no score, left out of the comparison.
    pub no_score: usize,
}

impl BenchReport {
    pub fn wasm_per_second(&self) -> f64 {
        self.samples as f64 / self.wasm_per_batch.as_secs_f64()
    }

    pub fn native_per_second(&self) -> f64 {
        self.samples as f64 / self.native_per_batch.as_secs_f64()
    }
}

/// Scores `samples` completions of about `words` words, `iterations` times each way.
pub fn bench_happy_count(path: &Path, params: &str, samples: usize, words: usize, iterations: u32, limits: PluginLimits) -> Result<BenchReport> {
    let batch = synthetic_batch(samples, words);
    let started = Instant::now();
    let mut plugin = Plugin::load(path, params, limits)?;
    let load = started.elapsed();
    let native: HappyCount = smallrl_plugin_sdk::configure("{}").map_err(anyhow::Error::msg)?;
    let native_batch: Vec<smallrl_plugin_sdk::Sample> = batch.iter().map(to_sdk_sample).collect();

    let wasm_scores = plugin.score_optional(&batch)?;
    let native_scores = native.score_batch(&native_batch).map_err(anyhow::Error::msg)?;
    let no_score = agreeing_scores(&wasm_scores, &native_scores).map_err(|row| anyhow::anyhow!("wasm and native happy_count disagree on the benchmark batch (sample {row})"))?;

    let wasm_fuel_per_sample = plugin.last_call_fuel() as f64 / samples.max(1) as f64;
    let wasm_per_batch = time_per_iteration(iterations, || plugin.score_optional(&batch).map(drop))?;
    let native_per_batch = time_per_iteration(iterations, || {
        std::hint::black_box(native.score_batch(std::hint::black_box(&native_batch)).map_err(anyhow::Error::msg)?);
        Ok(())
    })?;
    Ok(BenchReport { samples, wasm_per_batch, native_per_batch, load, wasm_fuel_per_sample, no_score })
}

/// The number of samples without a score (`wasm`'s none) when every other score equals the
/// native one, else the first row that differs.
fn agreeing_scores(wasm: &[Option<f64>], native: &[f64]) -> Result<usize, usize> {
    assert_eq!(wasm.len(), native.len(), "one score per sample");
    match wasm.iter().zip(native).position(|(wasm, native)| wasm.is_some_and(|wasm| wasm != *native)) {
        Some(row) => Err(row),
        None => Ok(wasm.iter().filter(|score| score.is_none()).count()),
    }
}

/// Times a port of happy_count (`path`, e.g. plugins/python/happy_count.py built) on the same
/// batch, after checking it scores exactly as the native function.
pub fn bench_port(path: &Path, params: &str, samples: usize, words: usize, iterations: u32, limits: PluginLimits) -> Result<PortReport> {
    let bytes = std::fs::read(path).map_err(|error| anyhow::anyhow!("cannot read {}: {error}", path.display()))?;
    let compile = super::time_uncached_compile(&bytes)?;
    Plugin::load(path, params, limits)?; // fills the cache if it was empty
    let started = Instant::now();
    let mut plugin = Plugin::load(path, params, limits)?;
    let cached_load = started.elapsed();
    let batch = synthetic_batch(samples, words);
    let native: HappyCount = smallrl_plugin_sdk::configure("{}").map_err(anyhow::Error::msg)?;
    let native_scores = native.score_batch(&batch.iter().map(to_sdk_sample).collect::<Vec<_>>()).map_err(anyhow::Error::msg)?;
    let no_score = agreeing_scores(&plugin.score_optional(&batch)?, &native_scores)
        .map_err(|row| anyhow::anyhow!("{} and the native happy_count disagree on the benchmark batch (sample {row})", path.display()))?;
    let fuel_per_sample = plugin.last_call_fuel() as f64 / samples.max(1) as f64;
    let per_batch = time_per_iteration(iterations, || plugin.score_optional(&batch).map(drop))?;
    Ok(PortReport { compile, cached_load, per_batch, fuel_per_sample, no_score })
}

/// The fastest of `iterations` runs: the cost of the work itself, not of whatever else the
/// machine was doing meanwhile (tests run in parallel; CI machines are shared).
fn time_per_iteration(iterations: u32, mut run: impl FnMut() -> Result<()>) -> Result<Duration> {
    let mut fastest = Duration::MAX;
    for _ in 0..iterations.max(1) {
        let started = Instant::now();
        run()?;
        fastest = fastest.min(started.elapsed());
    }
    Ok(fastest)
}

/// Story-like completions with "happy" sprinkled in (about one word in twenty).
pub fn synthetic_batch(samples: usize, words: usize) -> Vec<Sample> {
    const VOCABULARY: [&str; 12] =
        ["the", "cat", "was", "very", "happy", "and", "ran", "to", "the", "big", "tree", "."];
    let completion = |index: usize| {
        let pick = |position: usize| VOCABULARY[(index * 31 + position * position * 7 + position) % VOCABULARY.len()];
        (0..words).map(pick).collect::<Vec<_>>()
    };
    (0..samples)
        .map(|index| {
            let tokens: Vec<String> = completion(index).into_iter().map(str::to_string).collect();
            Sample {
                prompt: "once upon a time".to_string(),
                completion: tokens.join(" "),
                completion_ids: (0..tokens.len() as u32).collect(),
                completion_tokens: tokens,
                ended_with_eos: true,
                metadata: None,
            }
        })
        .collect()
}

pub fn to_sdk_sample(sample: &Sample) -> smallrl_plugin_sdk::Sample {
    let plain = smallrl_plugin_sdk::Sample::new(
        &sample.prompt,
        &sample.completion,
        &sample.completion_tokens,
        &sample.completion_ids,
        sample.ended_with_eos,
    );
    match &sample.metadata {
        Some(metadata) => plain.with_metadata(&metadata.json),
        None => plain,
    }
}
