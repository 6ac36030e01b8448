//! The rules of `info()` that `wit/smallrl-reward.wit` documents, checked at load. A plugin
//! whose self-description breaks them is refused with the field named, before its name or
//! parameters reach run names, metrics keys, configs or a terminal.

use serde_json::Value;

use super::text::shown;
use super::{ParamInfo, PluginInfo};

/// The longest plugin or parameter name: names become metric keys and file names.
pub const MAX_NAME_BYTES: usize = 64;
/// The longest version string (a semantic version is short).
const MAX_VERSION_BYTES: usize = 64;
/// The JSON types a parameter may have (`type-name` in the WIT).
pub const PARAM_TYPES: [&str; 6] = ["number", "integer", "boolean", "string", "list<string>", super::datasets::HF_DATASET];

/// The first rule `info` breaks, as "`field` is VALUE: what it must be".
pub fn check_info(info: &PluginInfo) -> Result<(), String> {
    check_name("name", &info.name, |c| c.is_ascii_alphanumeric() || c == '_' || c == '-', "ASCII letters, digits, `_` and `-`")?;
    check_version(&info.version)?;
    let mut seen = std::collections::BTreeSet::new();
    for (index, param) in info.params.iter().enumerate() {
        let field = |part: &str| format!("params[{index}].{part}");
        check_name(&field("name"), &param.name, |c| c.is_ascii_alphanumeric() || c == '_', "ASCII letters, digits and `_`")?;
        if !seen.insert(param.name.as_str()) {
            return Err(format!("`{}` is {:?}, which an earlier parameter already has: parameter names must be unique", field("name"), param.name));
        }
        check_param_type(param, &field)?;
    }
    Ok(())
}

fn check_name(field: &str, name: &str, allowed: impl Fn(char) -> bool, allowed_text: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.chars().all(allowed) {
        return Err(format!(
            "`{field}` is {} ({} bytes): it must be 1 to {MAX_NAME_BYTES} bytes of {allowed_text}",
            quoted(name),
            name.len()
        ));
    }
    Ok(())
}

fn check_version(version: &str) -> Result<(), String> {
    let valid = version.len() <= MAX_VERSION_BYTES && semver::Version::parse(version).is_ok();
    if !valid {
        return Err(format!("`version` is {}: it must be a semantic version such as 0.1.0 (MAJOR.MINOR.PATCH)", quoted(version)));
    }
    Ok(())
}

fn check_param_type(param: &ParamInfo, field: &impl Fn(&str) -> String) -> Result<(), String> {
    if !PARAM_TYPES.contains(&param.type_name.as_str()) {
        return Err(format!("`{}` is {}: it must be one of {}", field("type-name"), quoted(&param.type_name), PARAM_TYPES.join(", ")));
    }
    let default: Value = serde_json::from_str(&param.default_json)
        .map_err(|error| format!("`{}` is {}, which is not JSON ({error})", field("default-json"), quoted(&param.default_json)))?;
    if !json_has_type(&default, &param.type_name) {
        return Err(format!("`{}` is {}, which is not of type {} (its `type-name`)", field("default-json"), quoted(&param.default_json), param.type_name));
    }
    Ok(())
}

fn json_has_type(value: &Value, type_name: &str) -> bool {
    match type_name {
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "list<string>" => value.as_array().is_some_and(|items| items.iter().all(Value::is_string)),
        // No dataset unless the user names one.
        super::datasets::HF_DATASET => value.is_null(),
        _ => false,
    }
}

/// A plugin-supplied value in an error message: quoted, bounded, control characters replaced.
fn quoted(text: &str) -> String {
    format!("{:?}", shown(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::PluginKind;

    fn info(name: &str, version: &str, params: &[(&str, &str, &str)]) -> PluginInfo {
        let to_param = |(name, type_name, default_json): &(&str, &str, &str)| ParamInfo {
            name: name.to_string(),
            type_name: type_name.to_string(),
            default_json: default_json.to_string(),
            description: String::new(),
        };
        PluginInfo { name: name.into(), version: version.into(), kind: PluginKind::Reward, description: String::new(), params: params.iter().map(to_param).collect() }
    }

    #[test]
    fn the_standard_shapes_pass() {
        let params = [("max_count", "integer", "5"), ("scale", "number", "0.5"), ("smooth", "boolean", "true"), ("word", "string", "\"happy\""), ("words", "list<string>", "[\"a\",\"b\"]")];
        assert_eq!(check_info(&info("happy_count", "0.1.0", &params)), Ok(()));
        assert_eq!(check_info(&info("my-reward", "1.2.3-beta.1+build.5", &[])), Ok(()));
    }

    #[test]
    fn each_broken_rule_names_its_field() {
        let cases: [(PluginInfo, &str); 9] = [
            (info("", "0.1.0", &[]), "`name` is \"\""),
            (info("bad\u{1b}[31mname", "0.1.0", &[]), "`name` is \"bad\u{FFFD}[31mname\""),
            (info(&"n".repeat(65), "0.1.0", &[]), "(65 bytes)"),
            (info("ok", "1.0", &[]), "`version` is \"1.0\""),
            (info("ok", "0.1.0", &[("x", "banana", "1")]), "`params[0].type-name` is \"banana\""),
            (info("ok", "0.1.0", &[("x", "number", "{not json")]), "`params[0].default-json` is \"{not json\", which is not JSON"),
            (info("ok", "0.1.0", &[("x", "integer", "1.5")]), "which is not of type integer"),
            (info("ok", "0.1.0", &[("x", "number", "1"), ("x", "number", "2")]), "`params[1].name` is \"x\", which an earlier parameter already has"),
            (info("ok", "0.1.0", &[("", "number", "1")]), "`params[0].name` is \"\""),
        ];
        for (info, expected) in cases {
            let error = check_info(&info).expect_err(expected);
            assert!(error.contains(expected), "expected {expected:?} in {error:?}");
        }
    }
}
