//! Reward and reward-hack-detector plugins: WebAssembly components run by wasmtime in a sandbox
//! with no capabilities (see `wit/smallrl-reward.wit`).
//!
//! Invariant: no wasmtime type leaves this module. The rest of the host sees [`Plugin`] with
//! plain-Rust inputs and outputs ([`Sample`], `Vec<f64>`, `Vec<bool>`, [`PluginInfo`]) and
//! `anyhow` errors that name the plugin file, the call and the cause.

pub mod bench;
mod engine;
mod failure;
mod instance;
pub mod scaffold;

use std::time::Duration;

pub use instance::{Batch, Plugin};

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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginKind {
    Reward,
    Detector,
}

impl std::fmt::Display for PluginKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PluginKind::Reward => "reward",
            PluginKind::Detector => "detector",
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
    /// "number", "integer", "boolean", "string" or "list<string>".
    pub type_name: String,
    pub default_json: String,
    pub description: String,
}

/// Per-call limits. A plugin over a limit fails that call with an error saying which limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PluginLimits {
    /// Largest linear memory a plugin may grow to, in bytes (each of its memories).
    pub max_memory_bytes: usize,
    /// Wall-clock time one call may run (epoch interruption, so a loop cannot hang the host).
    pub max_call_time: Duration,
}

impl Default for PluginLimits {
    /// Generous for text rewards (scoring 512 completions takes about 1 ms and under 2 MiB),
    /// small enough that a runaway plugin fails fast.
    fn default() -> Self {
        Self {
            max_memory_bytes: crate::defaults::PLUGIN_MAX_MEMORY_BYTES,
            max_call_time: Duration::from_secs(crate::defaults::PLUGIN_MAX_CALL_SECONDS),
        }
    }
}

/// Where wasmtime keeps compiled plugins (absolute, shared by every checkout and run).
pub fn cache_directory() -> Option<std::path::PathBuf> {
    engine::cache_directory()
}
