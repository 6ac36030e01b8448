//! A reward built against the frozen `smallrl:reward@0.4.0` contract (`wit/0.4.0`), as a reward
//! compiled before 0.5 made scores optional is: a score for every sample (`list<f64>`), and
//! programs run through 0.4's `programs` import. The host must load it and score exactly as
//! before. Written against the raw WIT, because the SDK follows the current one.
//!
//! Hand-checkable: each completion is run as a Python program; the score is the number of
//! "happy" in the completion, plus 10 when the program ran to its end.
wit_bindgen::generate!({ world: "reward", path: "../../../wit/0.4.0" });

use exports::smallrl::reward::{plugin, scorer};
use smallrl::reward::programs::{Program, Status, run};
use smallrl::reward::types::{PluginInfo, PluginKind, Sample};

struct Legacy;

impl plugin::Guest for Legacy {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "legacy_v0_4".into(),
            version: "0.4.0".into(),
            kind: PluginKind::Reward,
            description: "count of \"happy\", plus 10 when the completion runs as a Python program to its end (test reward, contract 0.4.0)".into(),
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
        let programs: Vec<Program> = batch.iter().map(|s| Program { source: s.completion.clone(), stdin: None, files: Vec::new() }).collect();
        let outcomes = run(&programs)?;
        Ok(batch.iter().zip(outcomes).map(|(s, o)| s.completion.matches("happy").count() as f64 + if matches!(o.status, Status::Normal) { 10.0 } else { 0.0 }).collect())
    }
}

export!(Legacy);
