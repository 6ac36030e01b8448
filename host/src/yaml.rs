//! The one place that reads YAML. `serde_yaml` is archived upstream (0.9.34 is final); keeping
//! every YAML read behind this module means swapping the crate touches one file.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use serde_yaml::Value;

/// Reads and deserializes a YAML file; errors name the file and, from serde, the line and key.
pub fn read_file<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read YAML file {}", path.display()))?;
    from_str(&text).with_context(|| format!("invalid YAML in {}", path.display()))
}

/// Deserializes YAML text (used for files and for `key=value` command-line overrides).
///
/// A non-finite number (`.inf`, `-.inf`, `.nan`) is refused with its key: the host reads YAML
/// into JSON values, which have no such numbers, so it would arrive as null, and an optional
/// key would silently read as unset.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T> {
    refuse_non_finite(&serde_yaml::from_str(text)?, "")?;
    Ok(serde_yaml::from_str(text)?)
}

fn refuse_non_finite(value: &Value, at: &str) -> Result<()> {
    match value {
        Value::Number(number) if !number.is_finite() => {
            let place = if at.is_empty() { "the value".to_string() } else { format!("`{at}`") };
            bail!("{place} is {number}, not a finite number: smallrl takes finite numbers only")
        }
        Value::Sequence(items) => items.iter().enumerate().try_for_each(|(index, item)| refuse_non_finite(item, &format!("{at}[{index}]"))),
        Value::Mapping(map) => map.iter().try_for_each(|(key, item)| {
            let key = key.as_str().map_or_else(|| format!("{key:?}"), str::to_string);
            refuse_non_finite(item, &if at.is_empty() { key } else { format!("{at}.{key}") })
        }),
        Value::Tagged(tagged) => refuse_non_finite(&tagged.value, at),
        _ => Ok(()),
    }
}

/// Serializes a value as YAML text (resolved configurations written into run directories).
pub fn to_string<T: serde::Serialize>(value: &T) -> Result<String> {
    Ok(serde_yaml::to_string(value)?)
}

#[cfg(test)]
mod tests {
    use super::from_str;

    #[test]
    fn a_non_finite_number_is_refused_with_its_key() {
        let error = |text: &str| from_str::<serde_json::Value>(text).unwrap_err().to_string();
        assert_eq!(error("lr: .inf\n"), "`lr` is .inf, not a finite number: smallrl takes finite numbers only");
        assert_eq!(error("environment_params: {scale: [1.0, -.inf]}\n"), "`environment_params.scale[1]` is -.inf, not a finite number: smallrl takes finite numbers only");
        assert_eq!(error(".nan"), "the value is .nan, not a finite number: smallrl takes finite numbers only");
        // Finite numbers and strings that spell infinity are values as before.
        assert_eq!(from_str::<serde_json::Value>("lr: 1.0e-3\nname: .inf-run\n").unwrap(), serde_json::json!({"lr": 1.0e-3, "name": ".inf-run"}));
    }
}
