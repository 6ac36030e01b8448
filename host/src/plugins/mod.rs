//! Reward and reward-hack-detector plugins: WebAssembly components run by wasmtime in a sandbox
//! with no capabilities (see `wit/smallrl-reward.wit`).
//!
//! Invariant: no wasmtime type leaves this module. The rest of the host sees [`Plugin`] with
//! plain-Rust inputs and outputs ([`Sample`], `Vec<f64>`, `Vec<bool>`, [`PluginInfo`]) and
//! `anyhow` errors that name the plugin file, the call and the cause.

pub mod bench;
mod component;
mod convert;
mod datasets;
mod environment;
mod episodes;
mod exports;
mod failure;
mod function_cache;
mod instance;
mod legacy_env;
pub mod judge;
pub mod programs;
pub mod programs_bench;
pub mod python;
pub mod python_cache;
mod python_check;
pub mod python_deps;
mod python_sources;
mod runtime;
pub mod scaffold;
pub mod scaffold_python;
mod scaffold_env;
mod scaffold_episode;
pub mod snapshot;
mod store;
pub mod text;
mod validate;
mod wasi;
mod wit;

use std::time::Duration;

pub use environment::{ComponentRole, EnvComponent, EnvPrompt, EnvPromptContent, EnvScores, EnvSplit, EnvironmentInfo};
pub use episodes::{CallEntry, EpisodeBounds, EpisodeEnd, OBSERVATION_ROLES, Tool, TurnResult};
pub use instance::{Batch, NO_PARAMS, Plugin, every_score, refuse_another_instance_for_tests};

/// A score as `plugin score` prints it: six decimals, or `none` for a sample without a score
/// (contract 0.5).
pub fn score_text(score: Option<f64>) -> String {
    score.map_or_else(|| "none".to_string(), |score| format!("{score:.6}"))
}

/// One completion to score (the trainer builds these from generation output).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub prompt: String,
    /// Decoded with special tokens skipped.
    pub completion: String,
    /// Vocabulary strings of the completion tokens WITHOUT the trailing EOS token (whether it
    /// was there is `ended_with_eos`), so sentence rewards never count it.
    pub completion_tokens: Vec<String>,
    /// Ids matching `completion_tokens` (same length, also without the EOS).
    pub completion_ids: Vec<u32>,
    pub ended_with_eos: bool,
    /// The prompt's metadata (a JSONL prompt file's extra columns), shared by the samples of
    /// one prompt; None for prompts without any.
    pub metadata: Option<std::sync::Arc<PromptMetadata>>,
}

/// What a prompt carries besides its text: the extra columns of its JSONL line, checked and
/// serialised once when the file is read (`train::prompts`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromptMetadata {
    /// The columns as one JSON object text: what plugins (contract 0.2) receive.
    pub json: String,
    /// `hackable` as the run uses it (the file's column, then `hack_frac`); None: the prompt
    /// does not say, and it offers the hack.
    pub hackable: Option<bool>,
    /// `detectable` (the file's column); None: the monitor may flag it.
    pub detectable: Option<bool>,
}

impl PromptMetadata {
    /// Whether a prompt with `metadata` offers the hack: true unless it says otherwise.
    pub fn hackable(metadata: Option<&Self>) -> bool {
        metadata.and_then(|m| m.hackable).unwrap_or(true)
    }

    /// Whether the monitor may flag a prompt with `metadata`: true unless it says otherwise.
    pub fn detectable(metadata: Option<&Self>) -> bool {
        metadata.and_then(|m| m.detectable).unwrap_or(true)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginKind {
    Reward,
    Detector,
    /// A whole task (contract 0.3): prompts, reward components, monitor and ground truth.
    Environment,
}

impl std::fmt::Display for PluginKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PluginKind::Reward => "reward",
            PluginKind::Detector => "detector",
            PluginKind::Environment => "environment",
        })
    }
}

/// What a plugin says about itself (`info()` in the WIT contract).
#[derive(Clone, Debug, PartialEq)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub kind: PluginKind,
    pub description: String,
    pub params: Vec<ParamInfo>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ParamInfo {
    pub name: String,
    /// "number", "integer", "boolean", "string", "list<string>" or "hf-dataset" (a dataset
    /// the host reads for the plugin, see `datasets.rs`).
    pub type_name: String,
    pub default_json: String,
    pub description: String,
}

/// Per-call limits. A plugin over a limit fails that call with an error saying which limit and
/// how to raise it.
///
/// Fuel is the primary bound: wasmtime counts executed instructions, so a reward that fits on
/// one machine fits on every machine, and a run is reproducible; the judge budget counts what a
/// call asks of the host's judge the same way. The wall-clock limit is the backstop for what
/// they do not count (host calls, a pathological compile); it covers the whole call, the
/// judge's time included.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PluginLimits {
    /// Largest linear memory a plugin may grow to, in bytes (each of its memories), its
    /// initial memory included.
    pub max_memory_bytes: usize,
    /// Wall-clock time one call may run (epoch interruption, so a loop cannot hang the host).
    pub max_call_time: Duration,
    /// Fuel (about one unit per WebAssembly instruction) per sample of a batch; a call gets
    /// `fuel_per_sample * max(1, samples)`. `info` and `configure` count as one sample.
    pub fuel_per_sample: u64,
    /// Judge items a call may send per sample (over all its `judge` calls; counted, so a
    /// call over it fails at the same place on every machine).
    pub judge_items_per_sample: u64,
    /// Judge tokens (prompts plus the most generated) a call may use per sample.
    pub judge_tokens_per_sample: u64,
    /// The limits of each program the plugin runs through the `programs` import.
    pub programs: programs::ProgramLimits,
}

impl Default for PluginLimits {
    fn default() -> Self {
        Self::new(crate::defaults::PLUGIN_MAX_CALL_SECONDS, crate::defaults::PLUGIN_MAX_MEMORY_MB, crate::defaults::PLUGIN_FUEL_PER_SAMPLE)
            .expect("the default plugin limits are valid")
    }
}

impl PluginLimits {
    /// The limits as the config keys `plugin_max_call_seconds`, `plugin_max_memory_mb` and
    /// `plugin_fuel_per_sample` give them.
    pub fn new(max_call_seconds: f64, max_memory_mb: usize, fuel_per_sample: u64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            max_call_seconds.is_finite() && max_call_seconds > 0.0 && max_call_seconds <= 86_400.0,
            "plugin_max_call_seconds must be in (0, 86400], got {max_call_seconds}"
        );
        // A 32-bit WebAssembly memory holds at most 4 GiB.
        anyhow::ensure!((1..=4096).contains(&max_memory_mb), "plugin_max_memory_mb must be in [1, 4096], got {max_memory_mb}");
        anyhow::ensure!(fuel_per_sample > 0, "plugin_fuel_per_sample must be positive");
        Ok(Self {
            max_memory_bytes: max_memory_mb << 20,
            max_call_time: Duration::from_secs_f64(max_call_seconds),
            fuel_per_sample,
            judge_items_per_sample: crate::defaults::PLUGIN_JUDGE_ITEMS_PER_SAMPLE,
            judge_tokens_per_sample: crate::defaults::PLUGIN_JUDGE_TOKENS_PER_SAMPLE,
            programs: programs::ProgramLimits::new(
                crate::defaults::PROGRAM_FUEL,
                crate::defaults::PROGRAM_MAX_MEMORY_MB,
                crate::defaults::PROGRAM_MAX_OUTPUT_KIB,
                Duration::from_secs_f64(max_call_seconds),
            )?,
        })
    }

    /// These limits with the program limits the config keys `program_fuel`,
    /// `program_max_memory_mb` and `program_max_output_kib` give (the wall-clock backstop is
    /// the plugin call's).
    pub fn with_program_limits(self, fuel: u64, max_memory_mb: usize, max_output_kib: usize) -> anyhow::Result<Self> {
        Ok(Self { programs: programs::ProgramLimits::new(fuel, max_memory_mb, max_output_kib, self.max_call_time)?, ..self })
    }

    /// These limits with the judge budget the config keys `plugin_judge_items_per_sample` and
    /// `plugin_judge_tokens_per_sample` give.
    pub fn with_judge_budget(self, items_per_sample: u64, tokens_per_sample: u64) -> anyhow::Result<Self> {
        anyhow::ensure!(items_per_sample > 0, "plugin_judge_items_per_sample must be positive");
        anyhow::ensure!(tokens_per_sample > 0, "plugin_judge_tokens_per_sample must be positive");
        Ok(Self { judge_items_per_sample: items_per_sample, judge_tokens_per_sample: tokens_per_sample, ..self })
    }

    /// The limits of a component that imports WASI (a language runtime): the fuel per sample
    /// times [`crate::defaults::PLUGIN_INTERPRETED_FUEL_FACTOR`], the rest unchanged.
    pub fn for_language_runtime(self) -> Self {
        Self { fuel_per_sample: self.fuel_per_sample.saturating_mul(crate::defaults::PLUGIN_INTERPRETED_FUEL_FACTOR), ..self }
    }

    /// The fuel of one call over `samples` samples (saturating at the most a store can hold).
    pub fn fuel_for(&self, samples: usize) -> u64 {
        self.fuel_per_sample.saturating_mul(samples.max(1) as u64).min(i64::MAX as u64)
    }
}

/// SHA-256 of a plugin file's bytes, in lowercase hex (stored in a run's config so that a
/// resumed run can tell whether its plugins changed).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The time to compile a component file's bytes without the cache (`plugin bench`).
pub fn time_uncached_compile(bytes: &[u8]) -> anyhow::Result<Duration> {
    runtime::time_uncached_compile(bytes)
}

/// Where wasmtime keeps compiled plugins (absolute, shared by every checkout and run).
pub fn cache_directory() -> Option<std::path::PathBuf> {
    runtime::cache_directory()
}

/// The folder holding the Python caches (`python-sources/`, `python-builds/`): the compiled-code
/// cache's parent. Here, above both, because `python_sources` fills it and `python_cache` prunes it.
pub fn python_cache_root() -> Option<std::path::PathBuf> {
    cache_directory()?.parent().map(std::path::Path::to_path_buf)
}

/// Where the per-function compiled code lives (Cranelift's incremental cache, beside the
/// component cache): what a rebuilt Python component reuses.
pub fn function_cache_directory() -> Option<std::path::PathBuf> {
    runtime::function_cache_directory()
}
