//! A reward plugin written from the WIT contract alone (`wit/smallrl-reward.wit`), as a
//! JavaScript, Go or C component is, without either of smallrl's SDKs (which both accept an
//! empty parameter string): `configure` parses its argument as the JSON object the contract
//! promises ("`{}` = all defaults") and fails on anything else, so a host that passes anything
//! but a JSON object when no parameters are given fails to load it.
//!
//! Parameter: `bonus` (number, default 0). Score (hand-checkable): the completion's length in
//! bytes plus `bonus`.
wit_bindgen::generate!({ world: "reward", path: "../../../wit" });

use std::sync::atomic::{AtomicU64, Ordering};

use exports::smallrl::reward::{plugin, scorer};
use smallrl::reward::types::{ParamInfo, PluginInfo, PluginKind, Sample};

/// `bonus` as f64 bits (a component instance is single-threaded; an atomic avoids `static mut`).
static BONUS: AtomicU64 = AtomicU64::new(0);

struct WitOnly;

impl plugin::Guest for WitOnly {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "wit_only".into(),
            version: "0.1.0".into(),
            kind: PluginKind::Reward,
            description: "completion length in bytes + bonus; configure requires a JSON object (test plugin written from the WIT alone)".into(),
            params: vec![ParamInfo { name: "bonus".into(), type_name: "number".into(), default_json: "0".into(), description: "added to every score".into() }],
        }
    }

    fn configure(params_json: String) -> Result<(), String> {
        let params: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&params_json).map_err(|error| format!("parameters must be a JSON object, got {params_json:?}: {error}"))?;
        let mut bonus = 0.0;
        for (name, value) in params {
            match (name.as_str(), value.as_f64()) {
                ("bonus", Some(value)) => bonus = value,
                _ => return Err(format!("unknown or ill-typed parameter `{name}`: {value}")),
            }
        }
        BONUS.store(bonus.to_bits(), Ordering::Relaxed);
        Ok(())
    }
}

impl scorer::Guest for WitOnly {
    fn score(batch: Vec<Sample>) -> Result<Vec<Option<f64>>, String> {
        let bonus = f64::from_bits(BONUS.load(Ordering::Relaxed));
        Ok(batch.iter().map(|sample| Some(sample.completion.len() as f64 + bonus)).collect())
    }
}

export!(WitOnly);
