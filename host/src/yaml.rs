//! The one place that reads YAML. `serde_yaml` is archived upstream (0.9.34 is final); keeping
//! every YAML read behind this module means swapping the crate touches one file.

use std::path::Path;

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;

/// Reads and deserializes a YAML file; errors name the file and, from serde, the line and key.
pub fn read_file<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read YAML file {}", path.display()))?;
    from_str(&text).with_context(|| format!("invalid YAML in {}", path.display()))
}

/// Deserializes YAML text (used for files and for `key=value` command-line overrides).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T> {
    Ok(serde_yaml::from_str(text)?)
}

/// Serializes a value as YAML text (resolved configurations written into run directories).
pub fn to_string<T: serde::Serialize>(value: &T) -> Result<String> {
    Ok(serde_yaml::to_string(value)?)
}
