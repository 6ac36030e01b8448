//! A reward plugin built against the frozen `smallrl:reward@0.2.0` contract (`wit/0.2.0`), as a
//! plugin compiled before 0.3 added the `environment` world is: the host must load it and score
//! exactly as before, metadata included. Written against the raw WIT, because the SDK follows
//! the current one.
//!
//! Score (hand-checkable): the number of "happy" in the completion, plus 0.5 when it ended with
//! the end-of-sequence token, plus 0.01 per completion token, plus 100 when the prompt's
//! metadata is present (so a test sees that it arrived).
wit_bindgen::generate!({ world: "reward", path: "../../../wit/0.2.0" });

use exports::smallrl::reward::{plugin, scorer};
use smallrl::reward::types::{PluginInfo, PluginKind, Sample};

struct Legacy;

impl plugin::Guest for Legacy {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "legacy_v0_2".into(),
            version: "0.2.0".into(),
            kind: PluginKind::Reward,
            description: "count of \"happy\" + 0.5 if ended with EOS + 0.01 per token + 100 with metadata (test plugin, contract 0.2.0)".into(),
            params: Vec::new(),
        }
    }

    fn configure(params_json: String) -> Result<(), String> {
        match params_json.trim() {
            "" | "{}" => Ok(()),
            other => Err(format!("takes no parameters, got {other}")),
        }
    }
}

impl scorer::Guest for Legacy {
    fn score(batch: Vec<Sample>) -> Result<Vec<f64>, String> {
        let score = |sample: &Sample| {
            let happy = sample.completion.matches("happy").count() as f64;
            let eos = if sample.ended_with_eos { 0.5 } else { 0.0 };
            let metadata = if sample.metadata.is_some() { 100.0 } else { 0.0 };
            happy + eos + 0.01 * sample.completion_token_ends.len() as f64 + metadata
        };
        Ok(batch.iter().map(score).collect())
    }
}

export!(Legacy);
