//! Parameter declaration and checking: plugins declare names, types and defaults; the host's
//! JSON is rejected with a clear message on unknown keys or wrong types.

use std::collections::BTreeMap;

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    Number,
    /// A non-negative integer.
    Integer,
    Boolean,
    String,
    StringList,
    /// A HuggingFace dataset the host reads for the plugin (contract 0.3 environments): the user
    /// names it (`"owner/name"` or `"owner/name:config"`), the host reads its parquet files from
    /// the HF cache and passes `{"repo", "config", "splits": {split: [row, ...]}}` (each row an
    /// object of its columns); the default, null, is no dataset.
    HfDataset,
}

impl ParamType {
    /// The name used in `param-info.type-name` and in error messages.
    pub fn name(self) -> &'static str {
        match self {
            ParamType::Number => "number",
            ParamType::Integer => "integer",
            ParamType::Boolean => "boolean",
            ParamType::String => "string",
            ParamType::StringList => "list<string>",
            ParamType::HfDataset => "hf-dataset",
        }
    }

    fn accepts(self, value: &Value) -> bool {
        match self {
            ParamType::Number => value.is_number(),
            ParamType::Integer => value.is_u64(),
            ParamType::Boolean => value.is_boolean(),
            ParamType::String => value.is_string(),
            ParamType::StringList => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
            ParamType::HfDataset => value.is_null() || HfDataset::from_value(value).is_ok(),
        }
    }
}

/// One declared parameter.
#[derive(Clone, Debug)]
pub struct Param {
    pub name: &'static str,
    pub param_type: ParamType,
    pub default: Value,
    pub description: &'static str,
}

impl Param {
    pub fn number(name: &'static str, default: f64, description: &'static str) -> Self {
        Self::new(name, ParamType::Number, Value::from(default), description)
    }

    pub fn integer(name: &'static str, default: u64, description: &'static str) -> Self {
        Self::new(name, ParamType::Integer, Value::from(default), description)
    }

    pub fn boolean(name: &'static str, default: bool, description: &'static str) -> Self {
        Self::new(name, ParamType::Boolean, Value::from(default), description)
    }

    pub fn string(name: &'static str, default: &str, description: &'static str) -> Self {
        Self::new(name, ParamType::String, Value::from(default), description)
    }

    pub fn string_list(name: &'static str, default: &[&str], description: &'static str) -> Self {
        Self::new(name, ParamType::StringList, Value::from(default.to_vec()), description)
    }

    /// A dataset the host reads (see [`ParamType::HfDataset`]); none by default.
    pub fn hf_dataset(name: &'static str, description: &'static str) -> Self {
        Self::new(name, ParamType::HfDataset, Value::Null, description)
    }

    fn new(name: &'static str, param_type: ParamType, default: Value, description: &'static str) -> Self {
        Self { name, param_type, default, description }
    }
}

/// Checked parameter values: every declared parameter is present (user value or default).
#[derive(Clone, Debug)]
pub struct Params {
    plugin: &'static str,
    values: BTreeMap<&'static str, Value>,
}

impl Params {
    /// Checks `json` (an object, or empty text for all defaults) against the declarations.
    pub fn parse(plugin: &'static str, declared: &[Param], json: &str) -> Result<Self, String> {
        let given = parse_object(plugin, json)?;
        for (key, value) in &given {
            let param = declared.iter().find(|param| param.name == key).ok_or_else(|| {
                let accepted: Vec<&str> = declared.iter().map(|param| param.name).collect();
                format!(
                    "{plugin}: unknown parameter `{key}` (accepted: {})",
                    if accepted.is_empty() { "none".to_string() } else { accepted.join(", ") }
                )
            })?;
            if !param.param_type.accepts(value) {
                return Err(format!(
                    "{plugin}: parameter `{key}` must be of type {}, got {value}",
                    param.param_type.name()
                ));
            }
        }
        let values = declared
            .iter()
            .map(|param| (param.name, given.get(param.name).unwrap_or(&param.default).clone()))
            .collect();
        Ok(Self { plugin, values })
    }

    pub fn number(&self, name: &str) -> f64 {
        self.get(name).as_f64().expect("checked by Params::parse")
    }

    pub fn integer(&self, name: &str) -> u64 {
        self.get(name).as_u64().expect("checked by Params::parse")
    }

    /// An integer that must be at least 1 (e.g. a divisor), with an error naming it.
    pub fn positive_integer(&self, name: &str) -> Result<u64, String> {
        match self.integer(name) {
            0 => Err(format!("{}: parameter `{name}` must be at least 1", self.plugin)),
            value => Ok(value),
        }
    }

    pub fn boolean(&self, name: &str) -> bool {
        self.get(name).as_bool().expect("checked by Params::parse")
    }

    pub fn string(&self, name: &str) -> String {
        self.get(name).as_str().expect("checked by Params::parse").to_string()
    }

    pub fn string_list(&self, name: &str) -> Vec<String> {
        let items = self.get(name).as_array().expect("checked by Params::parse");
        items.iter().map(|item| item.as_str().expect("checked").to_string()).collect()
    }

    /// The dataset the host read for an [`ParamType::HfDataset`] parameter (None: not given).
    pub fn hf_dataset(&self, name: &str) -> Option<HfDataset> {
        let value = self.get(name);
        (!value.is_null()).then(|| HfDataset::from_value(value).expect("checked by Params::parse"))
    }

    /// Reading an undeclared parameter is a bug in the plugin, reported through its panic.
    fn get(&self, name: &str) -> &Value {
        self.values
            .get(name)
            .unwrap_or_else(|| panic!("{}: parameter `{name}` is read but not declared", self.plugin))
    }
}

/// The rows of a dataset the host read, by split (`train`, `test`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct HfDataset {
    pub repo: String,
    pub config: Option<String>,
    pub splits: BTreeMap<String, Vec<serde_json::Map<String, Value>>>,
}

impl HfDataset {
    /// The host's expansion of the parameter; the name alone (a string) means the host did not
    /// read it, which only happens outside smallrl.
    pub fn from_value(value: &Value) -> Result<Self, String> {
        let object = value.as_object().ok_or_else(|| {
            format!("an hf-dataset parameter is read by the host (smallrl) from the HF cache; got {value} instead of its rows")
        })?;
        let repo = object.get("repo").and_then(Value::as_str).ok_or("an hf-dataset has a `repo` string")?.to_string();
        let config = match object.get("config") {
            None | Some(Value::Null) => None,
            Some(Value::String(config)) => Some(config.clone()),
            Some(other) => return Err(format!("an hf-dataset's `config` is a string or null, got {other}")),
        };
        let mut splits = BTreeMap::new();
        for (split, rows) in object.get("splits").and_then(Value::as_object).ok_or("an hf-dataset has `splits`, an object of split -> rows")? {
            let rows = rows.as_array().ok_or_else(|| format!("split {split}: rows are a list"))?;
            let rows = rows.iter().map(|row| row.as_object().cloned().ok_or_else(|| format!("split {split}: a row is an object of its columns"))).collect::<Result<Vec<_>, String>>()?;
            splits.insert(split.clone(), rows);
        }
        Ok(Self { repo, config, splits })
    }

    /// The rows of `split`, or an error naming the splits there are.
    pub fn split(&self, split: &str) -> Result<&[serde_json::Map<String, Value>], String> {
        self.splits.get(split).map(Vec::as_slice).ok_or_else(|| {
            format!("dataset {} has no split `{split}` (it has: {})", self.repo, self.splits.keys().cloned().collect::<Vec<_>>().join(", "))
        })
    }
}

fn parse_object(plugin: &str, json: &str) -> Result<serde_json::Map<String, Value>, String> {
    if json.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!("{plugin}: parameters must be a JSON object, got {other}")),
        Err(error) => Err(format!("{plugin}: parameters are not valid JSON ({error}): {json}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared() -> Vec<Param> {
        vec![Param::integer("max_count", 5, ""), Param::string_list("words", &["happy"], "")]
    }

    #[test]
    fn defaults_fill_missing_keys() {
        let params = Params::parse("p", &declared(), "").unwrap();
        assert_eq!(params.integer("max_count"), 5);
        assert_eq!(params.string_list("words"), vec!["happy"]);
    }

    #[test]
    fn unknown_and_ill_typed_keys_are_rejected() {
        let unknown = Params::parse("p", &declared(), r#"{"max_cont": 3}"#).unwrap_err();
        assert!(unknown.contains("unknown parameter `max_cont`"), "{unknown}");
        assert!(unknown.contains("max_count, words"), "{unknown}");
        let ill_typed = Params::parse("p", &declared(), r#"{"max_count": 2.5}"#).unwrap_err();
        assert!(ill_typed.contains("must be of type integer, got 2.5"), "{ill_typed}");
        let not_object = Params::parse("p", &declared(), "[1]").unwrap_err();
        assert!(not_object.contains("JSON object"), "{not_object}");
    }
}
