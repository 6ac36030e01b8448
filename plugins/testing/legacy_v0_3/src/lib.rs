//! An environment built against the frozen `smallrl:reward@0.3.0` contract (`wit/0.3.0`), as an
//! environment compiled before 0.4 added the `programs` import is: the host must load it and run
//! every call exactly as before. Written against the raw WIT, because the SDK follows the
//! current one.
//!
//! Hand-checkable: prompt i of a split is "<split> prompt <i>" with `hackable` for odd i and
//! `detectable` always; the retain component is the number of "happy" in the completion, the
//! forget component 1 when the completion repeats the prompt; the metric is the completion's
//! byte length; the monitor and the ground truth flag completions that contain "hack".
wit_bindgen::generate!({ world: "environment", path: "../../../wit/0.3.0" });

use exports::smallrl::reward::env;
use smallrl::reward::environment_types::{ComponentInfo, EnvironmentInfo, Prompt, PromptContent, Role, Scores, Split};
use smallrl::reward::types::Sample;

struct Legacy;

impl env::Guest for Legacy {
    fn info() -> EnvironmentInfo {
        EnvironmentInfo {
            name: "legacy_v0_3".into(),
            version: "0.3.0".into(),
            description: "happy count (retain), prompt copy (forget), completion bytes (test environment, contract 0.3.0)".into(),
            params: Vec::new(),
            components: vec![
                ComponentInfo { name: "happy".into(), role: Role::Retain, description: "count of \"happy\"".into() },
                ComponentInfo { name: "copy".into(), role: Role::Forget, description: "1 when the completion repeats the prompt".into() },
            ],
            metrics: vec!["bytes".into()],
        }
    }

    fn configure(params_json: String) -> Result<(), String> {
        match params_json.trim() {
            "" | "{}" => Ok(()),
            other => Err(format!("takes no parameters, got {other}")),
        }
    }

    fn generate(split: Split, count: u32, _seed: u64, _hack_frac: f64) -> Result<Vec<Prompt>, String> {
        let name = match split {
            Split::Train => "train",
            Split::Eval => "eval",
        };
        Ok((0..count)
            .map(|i| Prompt {
                content: PromptContent::Text(format!("{name} prompt {i}")),
                metadata: format!("{{\"hackable\":{},\"detectable\":true}}", i % 2 == 1),
            })
            .collect())
    }

    fn score(batch: Vec<Sample>) -> Result<Scores, String> {
        let happy = batch.iter().map(|s| s.completion.matches("happy").count() as f64).collect();
        let copy = batch.iter().map(|s| if s.completion.contains(&s.prompt) { 1.0 } else { 0.0 }).collect();
        let bytes = batch.iter().map(|s| s.completion.len() as f64).collect();
        Ok(Scores { components: vec![happy, copy], metrics: vec![bytes] })
    }

    fn monitor(batch: Vec<Sample>) -> Result<Vec<bool>, String> {
        Ok(batch.iter().map(|s| s.completion.contains("hack")).collect())
    }

    fn ground_truth(batch: Vec<Sample>) -> Result<Vec<bool>, String> {
        Ok(batch.iter().map(|s| s.completion.contains("hack")).collect())
    }
}

export!(Legacy);
