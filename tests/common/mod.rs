//! Shared helpers of the plugin tests: where the repository, the built plugins and the
//! SimpleStories tokenizer are, and samples built from text the way the trainer builds them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use smallrl::model::tokenizer::Tokenizer;
use smallrl::plugins::{Plugin, PluginLimits};
use smallrl::reward::Sample;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host/ has a parent").to_path_buf()
}

pub fn plugin_dir() -> PathBuf {
    repo_root().join("plugins")
}

/// A built standard plugin; missing means the plugins were not built (never skipped).
pub fn standard_plugin(file_stem: &str) -> PathBuf {
    existing(plugin_dir().join(format!("{file_stem}.wasm")))
}

/// A built test-only plugin from `target/test-plugins/`.
pub fn test_plugin(file_stem: &str) -> PathBuf {
    existing(repo_root().join("target/test-plugins").join(format!("{file_stem}.wasm")))
}

fn existing(path: PathBuf) -> PathBuf {
    assert!(path.exists(), "{} is missing: run `make plugins` first", path.display());
    path
}

pub fn load(path: &Path, params_json: &str) -> Plugin {
    Plugin::load(path, params_json, PluginLimits::default())
        .unwrap_or_else(|error| panic!("cannot load {}: {error:#}", path.display()))
}

/// The real SimpleStories tokenizer from the shared fixtures (next to the repository).
pub fn tokenizer() -> Tokenizer {
    let path = repo_root().join("../shared/fixtures/simplestories-4096.json");
    assert!(path.exists(), "{} is missing: the shared fixtures must sit next to the repository", path.display());
    Tokenizer::from_file(&path).expect("the SimpleStories tokenizer loads")
}

pub fn sample(tokenizer: &Tokenizer, completion: &str) -> Sample {
    smallrl::reward::sample_from_text("once upon a time", completion, tokenizer).expect("tokenizes")
}

/// A sample whose tokens are given directly (the worked examples use `w` for any word).
pub fn sample_from_tokens(tokens: &str) -> Sample {
    let completion_tokens: Vec<String> = tokens.split_whitespace().map(str::to_string).collect();
    Sample {
        prompt: String::new(),
        completion: completion_tokens.join(" "),
        completion_ids: vec![0; completion_tokens.len()],
        completion_tokens,
        ended_with_eos: true,
    }
}
