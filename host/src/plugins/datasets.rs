//! `hf-dataset` parameters (contract 0.3): the user names a HuggingFace dataset
//! (`"openai/gsm8k:main"`); the host reads its rows from the HF cache (`crate::dataset`) and
//! passes them to the plugin in the name's place before `configure`, so the sandbox stays closed
//! (no file system, no network) and the plugin validates what it receives.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde_json::Value;
use sha2::Digest;

use super::PluginInfo;

/// The `type-name` of such a parameter.
pub const HF_DATASET: &str = "hf-dataset";

/// The parameters `configure` receives, and the SHA-256 of each dataset read into them.
pub struct Expanded {
    pub params_json: String,
    /// `hf-dataset <owner/name[:config]>` -> SHA-256 (hex) of its rows as passed: recorded with
    /// the plugin hashes, so a resumed run refuses a dataset that changed in the cache.
    pub dataset_sha256: BTreeMap<String, String>,
}

/// `params_json` with every `hf-dataset` parameter given as a name replaced by the dataset's
/// rows; anything else (no such parameter, rows given inline, JSON the plugin will refuse) is
/// passed on unchanged.
pub fn expand(info: &PluginInfo, params_json: &str, label: &str) -> Result<Expanded> {
    let names: Vec<&str> = info.params.iter().filter(|p| p.type_name == HF_DATASET).map(|p| p.name.as_str()).collect();
    let unchanged = || Expanded { params_json: params_json.to_string(), dataset_sha256: BTreeMap::new() };
    let Ok(Value::Object(mut params)) = serde_json::from_str::<Value>(params_json) else { return Ok(unchanged()) };
    let mut dataset_sha256 = BTreeMap::new();
    for name in names {
        if let Some(Value::String(spec)) = params.get(name) {
            let spec = spec.clone();
            let rows = crate::dataset::rows_by_split(&spec).with_context(|| format!("{label}: reading the dataset {spec:?} of its parameter `{name}`"))?;
            let digest = sha2::Sha256::digest(rows.to_string().as_bytes());
            dataset_sha256.insert(format!("{HF_DATASET} {spec}"), digest.iter().map(|b| format!("{b:02x}")).collect());
            params.insert(name.to_string(), rows);
        }
    }
    match dataset_sha256.is_empty() {
        true => Ok(unchanged()),
        false => Ok(Expanded { params_json: Value::Object(params).to_string(), dataset_sha256 }),
    }
}
