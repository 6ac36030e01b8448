//! The values of the memory keys: `gradient_accumulation_steps` (a count, or `auto` for the
//! memory planner, `train/memory.rs`) and `max_memory` (a size with a unit).

use anyhow::{Context, Result, bail, ensure};

/// `gradient_accumulation_steps`: a number of micro-batches, or `auto`, which the memory planner
/// resolves before the first step. A number is written back as a number, so the configurations,
/// run names and checkpoints of runs that give one are what they were before `auto` existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulation {
    Auto,
    Steps(usize),
}

impl Accumulation {
    pub fn parse(text: &str) -> Result<Self> {
        match text.trim() {
            "auto" => Ok(Self::Auto),
            number => Ok(Self::Steps(number.parse().with_context(|| format!("gradient_accumulation_steps {number:?}: expected a positive integer or auto"))?)),
        }
    }
}

impl std::fmt::Display for Accumulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Steps(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for Accumulation {
    type Err = anyhow::Error;
    fn from_str(text: &str) -> Result<Self> {
        Self::parse(text)
    }
}

impl serde::Serialize for Accumulation {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Self::Auto => serializer.serialize_str("auto"),
            Self::Steps(n) => serializer.serialize_u64(*n as u64),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Accumulation {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u64),
            Text(String),
        }
        match <Raw as serde::Deserialize>::deserialize(deserializer)? {
            Raw::Count(n) => Ok(Self::Steps(n as usize)),
            Raw::Text(text) => Self::parse(&text).map_err(|e| serde::de::Error::custom(format!("{e:#}"))),
        }
    }
}

impl crate::hyperparams::FlagValue for Accumulation {
    type Flag = Self;
}

/// `max_memory`: the memory a run may use, its weights included, written as given (`20GB`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemorySize {
    pub bytes: u64,
    text: String,
}

impl MemorySize {
    /// A number with a unit: `20GB`, `512MB`, `1.5GiB` (B, KB, MB, GB, TB in powers of 1000;
    /// KiB, MiB, GiB, TiB in powers of 1024).
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: f64 = number.parse().with_context(|| format!("max_memory {text:?}: expected a number and a unit, e.g. 20GB or 512MiB"))?;
        let scale: f64 = match unit.trim() {
            "B" => 1.0,
            "KB" => 1e3,
            "MB" => 1e6,
            "GB" => 1e9,
            "TB" => 1e12,
            "KiB" => 1024.0,
            "MiB" => 1024.0 * 1024.0,
            "GiB" => 1024.0 * 1024.0 * 1024.0,
            "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            other => bail!("max_memory {text:?}: unknown unit {other:?} (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"),
        };
        let bytes = number * scale;
        ensure!(bytes >= 1.0 && bytes.is_finite(), "max_memory {text:?} must be at least one byte");
        Ok(Self { bytes: bytes as u64, text: text.to_string() })
    }
}

impl std::fmt::Display for MemorySize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for MemorySize {
    type Err = anyhow::Error;
    fn from_str(text: &str) -> Result<Self> {
        Self::parse(text)
    }
}

impl serde::Serialize for MemorySize {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MemorySize {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        // A bare number is read as text, so that its error asks for the unit.
        let text = match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(text) => text,
            other => other.to_string(),
        };
        Self::parse(&text).map_err(|e| serde::de::Error::custom(format!("{e:#}")))
    }
}

impl crate::hyperparams::FlagValue for MemorySize {
    type Flag = Self;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_stay_numbers_and_auto_is_a_word() {
        assert_eq!(serde_json::to_value(Accumulation::Steps(4)).unwrap(), serde_json::json!(4));
        assert_eq!(serde_json::to_value(Accumulation::Auto).unwrap(), serde_json::json!("auto"));
        assert_eq!(serde_json::from_value::<Accumulation>(serde_json::json!(2)).unwrap(), Accumulation::Steps(2));
        assert_eq!(serde_json::from_value::<Accumulation>(serde_json::json!("auto")).unwrap(), Accumulation::Auto);
        assert_eq!("8".parse::<Accumulation>().unwrap(), Accumulation::Steps(8));
        let bad = serde_json::from_value::<Accumulation>(serde_json::json!("many")).unwrap_err().to_string();
        assert!(bad.contains("expected a positive integer or auto"), "{bad}");
    }

    #[test]
    fn sizes_take_decimal_and_binary_units() {
        assert_eq!(MemorySize::parse("20GB").unwrap().bytes, 20_000_000_000);
        assert_eq!(MemorySize::parse("1.5GiB").unwrap().bytes, 1_610_612_736);
        assert_eq!(MemorySize::parse("512 MB").unwrap().bytes, 512_000_000);
        assert_eq!(MemorySize::parse("20GB").unwrap().to_string(), "20GB");
        assert!(MemorySize::parse("20").unwrap_err().to_string().contains("unknown unit \"\""));
        assert!(MemorySize::parse("20gb").unwrap_err().to_string().contains("unknown unit \"gb\""));
        assert!(MemorySize::parse("GB").unwrap_err().to_string().contains("expected a number and a unit"));
    }
}
