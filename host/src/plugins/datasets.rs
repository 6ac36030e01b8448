//! `hf-dataset` parameters (contract 0.3): the user names a HuggingFace dataset
//! (`"openai/gsm8k:main"`); the host reads its rows from the HF cache (`crate::dataset`) and
//! passes them to the plugin in the name's place before `configure`, so the sandbox stays closed
//! (no file system, no network) and the plugin validates what it receives.

use anyhow::{Context, Result};
use serde_json::Value;

use super::PluginInfo;

/// The `type-name` of such a parameter.
pub const HF_DATASET: &str = "hf-dataset";

/// `params_json` with every `hf-dataset` parameter given as a name replaced by the dataset's
/// rows; anything else (no such parameter, rows given inline, JSON the plugin will refuse) is
/// passed on unchanged.
pub fn expand(info: &PluginInfo, params_json: &str, label: &str) -> Result<String> {
    let names: Vec<&str> = info.params.iter().filter(|p| p.type_name == HF_DATASET).map(|p| p.name.as_str()).collect();
    let Ok(Value::Object(mut params)) = serde_json::from_str::<Value>(params_json) else { return Ok(params_json.to_string()) };
    let mut expanded = false;
    for name in names {
        if let Some(Value::String(spec)) = params.get(name) {
            let rows = crate::dataset::rows_by_split(spec).with_context(|| format!("{label}: reading the dataset {spec:?} of its parameter `{name}`"))?;
            params.insert(name.to_string(), rows);
            expanded = true;
        }
    }
    Ok(if expanded { Value::Object(params).to_string() } else { params_json.to_string() })
}
