//! The `reward:` and `rh_detector:` sections of a run configuration (YAML), and how plugin
//! names resolve to files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::plugins::PluginKind;

/// `reward:`: one plugin, or a sum of components capped at `max_reward`. Read through
/// [`RewardSection`] (the mapping as written), so a malformed section fails with a message
/// saying what is wrong (an untagged enum would only say that no variant matched).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "RewardSection", into = "RewardSection")]
pub enum RewardSpec {
    /// `plugin` (with optional `params`): one `retain` component of scale 1.
    Single { plugin: String, params: Option<Value> },
    /// `components`, at least one; `min(sum_k scale_k * r_k, max_reward)`.
    Combined { components: Vec<ComponentSpec>, max_reward: Option<f64> },
}

/// `reward:` as written in YAML.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub components: Option<Vec<ComponentSpec>>,
    /// Cap on the combined reward: `min(sum_k scale_k * r_k, max_reward)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reward: Option<f64>,
}

impl TryFrom<RewardSection> for RewardSpec {
    type Error = anyhow::Error;

    fn try_from(section: RewardSection) -> Result<Self> {
        let RewardSection { plugin, params, components, max_reward } = section;
        match (plugin, components) {
            (Some(plugin), None) => {
                if max_reward.is_some() {
                    bail!("`reward:` has `max_reward` but a single `plugin`: `max_reward` caps a sum of `components`");
                }
                Ok(Self::Single { plugin, params })
            }
            (None, Some(components)) if !components.is_empty() => {
                if params.is_some() {
                    bail!("`reward:` has `params` next to `components`: give each component its own `params`");
                }
                if let Some(cap) = max_reward {
                    ensure!(cap.is_finite(), "`reward: max_reward` must be a finite number, got {cap}");
                }
                Ok(Self::Combined { components, max_reward })
            }
            (None, Some(_)) => bail!("`reward: components:` is empty: list at least one component"),
            (Some(_), Some(_)) => bail!("`reward:` has both `plugin` and `components`: use one or the other"),
            (None, None) => bail!("`reward:` needs `plugin: NAME_OR_PATH` (with optional `params`) or `components: [...]`"),
        }
    }
}

impl From<RewardSpec> for RewardSection {
    fn from(spec: RewardSpec) -> Self {
        match spec {
            RewardSpec::Single { plugin, params } => Self { plugin: Some(plugin), params, ..Self::default() },
            RewardSpec::Combined { components, max_reward } => Self { components: Some(components), max_reward, ..Self::default() },
        }
    }
}

/// One term of a combined reward.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentSpec {
    /// A name (`happy_count` = `<plugin_dir>/happy_count.wasm`) or a path (contains `/` or ends
    /// in `.wasm`).
    pub plugin: String,
    /// Metric name (`rewards/<name>/mean`); defaults to the plugin name or file stem (a new run
    /// names a Python reward's component by what it declares: [`RewardSpec::named_by_declared`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default = "empty_params")]
    pub params: Value,
    #[serde(default = "unit_scale")]
    pub scale: f64,
    #[serde(default)]
    pub role: Role,
}

/// `retain` = the true task; `forget` = the hackable bonus (dropped for ineligible samples).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    Retain,
    Forget,
}

/// `rh_detector:`: a detector plugin (`plugin`, `params`), or `score_threshold` on a reward
/// component. Detector names resolve to `<plugin_dir>/detect_<name>.wasm`. Read through
/// [`DetectorSection`], as [`RewardSpec`] is.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "DetectorSection", into = "DetectorSection")]
pub enum DetectorSpec {
    Plugin { plugin: String, params: Option<Value> },
    ScoreThreshold(ScoreThreshold),
}

/// `rh_detector:` as written in YAML.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DetectorSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_threshold: Option<ScoreThreshold>,
}

impl TryFrom<DetectorSection> for DetectorSpec {
    type Error = anyhow::Error;

    fn try_from(section: DetectorSection) -> Result<Self> {
        match (section.plugin, section.score_threshold) {
            (Some(plugin), None) => Ok(Self::Plugin { plugin, params: section.params }),
            (None, Some(rule)) => {
                ensure!(section.params.is_none(), "`rh_detector:` has `params` next to `score_threshold`: remove them");
                Ok(Self::ScoreThreshold(rule))
            }
            (Some(_), Some(_)) => bail!("`rh_detector:` has both `plugin` and `score_threshold`: use one or the other"),
            (None, None) => bail!("`rh_detector:` needs `plugin: NAME_OR_PATH` or `score_threshold: {{component, threshold}}`"),
        }
    }
}

impl From<DetectorSpec> for DetectorSection {
    fn from(spec: DetectorSpec) -> Self {
        match spec {
            DetectorSpec::Plugin { plugin, params } => Self { plugin: Some(plugin), params, ..Self::default() },
            DetectorSpec::ScoreThreshold(rule) => Self { score_threshold: Some(rule), ..Self::default() },
        }
    }
}

impl DetectorSpec {
    /// The command-line shortcut `--rh-detector PATH_OR_NAME [--rh-detector-params JSON]`.
    pub fn single(plugin: &str, params_json: Option<&str>) -> Result<Self> {
        let params = parse_flag_params(params_json, "--rh-detector-params")?;
        Ok(Self::Plugin { plugin: plugin.to_string(), params })
    }
}

fn parse_flag_params(params_json: Option<&str>, flag: &str) -> Result<Option<Value>> {
    params_json.map(|json| serde_json::from_str(json).with_context(|| format!("{flag} is not valid JSON: {json}"))).transpose()
}

/// Flags a sample when the named reward component's raw score is >= `threshold`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScoreThreshold {
    pub component: String,
    pub threshold: f64,
}

fn empty_params() -> Value {
    Value::Object(Default::default())
}

fn unit_scale() -> f64 {
    1.0
}

impl RewardSpec {
    /// The command-line shortcut `--reward-plugin PATH [--reward-params JSON]`.
    pub fn single(plugin: &str, params_json: Option<&str>) -> Result<Self> {
        let params = parse_flag_params(params_json, "--reward-params")?;
        Ok(Self::Single { plugin: plugin.to_string(), params })
    }

    /// The components to load: the single plugin as one `retain` component of scale 1, or the
    /// listed ones.
    pub fn component_specs(&self) -> Vec<ComponentSpec> {
        match self {
            Self::Single { plugin, params } => {
                let params = params.clone().unwrap_or_else(empty_params);
                vec![ComponentSpec { plugin: plugin.clone(), name: None, params, scale: 1.0, role: Role::Retain }]
            }
            Self::Combined { components, .. } => components.clone(),
        }
    }

    /// The cap on the combined reward, if any.
    pub fn max_reward(&self) -> Option<f64> {
        match self {
            Self::Single { .. } => None,
            Self::Combined { max_reward, .. } => *max_reward,
        }
    }
}

impl ComponentSpec {
    /// The metric name: `name`, else the plugin name, else the file stem of its path.
    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| plugin_stem(&self.plugin))
    }
}

/// A value containing `/` or ending in `.wasm` is a path (relative to the current directory);
/// anything else is a standard plugin name: rewards are `<plugin_dir>/<name>.wasm`, detectors
/// `<plugin_dir>/detect_<name>.wasm`.
pub fn resolve_plugin(value: &str, plugin_dir: &Path, kind: PluginKind) -> PathBuf {
    if is_path(value) {
        return PathBuf::from(value);
    }
    match kind {
        PluginKind::Reward | PluginKind::Environment => plugin_dir.join(format!("{value}.wasm")),
        PluginKind::Detector => plugin_dir.join(format!("detect_{value}.wasm")),
    }
}

fn plugin_stem(value: &str) -> String {
    let stem = Path::new(value).file_stem().map(|stem| stem.to_string_lossy().into_owned());
    stem.unwrap_or_else(|| value.to_string())
}

/// Parameters as the JSON text plugins receive.
pub fn params_json(params: Option<&Value>) -> String {
    params.map_or_else(|| crate::plugins::NO_PARAMS.to_string(), Value::to_string)
}

/// A value naming a plugin by its path, not a standard name (see [`resolve_plugin`]).
pub fn is_path(value: &str) -> bool {
    value.contains('/') || value.ends_with(".wasm")
}

impl RewardSpec {
    /// A new run's reward with each component given by a path and without `name` named by what
    /// its plugin declares, where `declared(plugin, params)` gives a name (a Python reward's: a
    /// TRL function's name, as `plugin info` shows it; `None` keeps the file stem), not the
    /// file stem (issue 47). The names are written into the spec, which the run records in
    /// config.yaml: a run resumed later keeps them, and runs recorded without them keep their
    /// stems. A component keeps its stem where a `score_threshold` detector or ground truth names it, or
    /// where two would share one name. A single plugin becomes one component.
    pub fn named_by_declared(&self, detectors: &[Option<&DetectorSpec>], declared: impl Fn(&str, &Value) -> Result<Option<String>>) -> Result<Self> {
        let thresholded: Vec<&str> = detectors
            .iter()
            .filter_map(|detector| match detector {
                Some(DetectorSpec::ScoreThreshold(rule)) => Some(rule.component.as_str()),
                _ => None,
            })
            .collect();
        let mut specs = self.component_specs();
        let mut names = Vec::new();
        for spec in &specs {
            let unnamed = spec.name.is_none() && is_path(&spec.plugin) && !thresholded.contains(&spec.display_name().as_str());
            names.push(if unnamed { declared(&spec.plugin, &spec.params)? } else { None });
        }
        let taken: Vec<String> = specs.iter().zip(&names).map(|(spec, name)| name.clone().unwrap_or_else(|| spec.display_name())).collect();
        let unique = |name: &String| taken.iter().filter(|other| *other == name).count() == 1;
        if !names.iter().flatten().any(unique) {
            return Ok(self.clone());
        }
        for (spec, name) in specs.iter_mut().zip(names) {
            spec.name = spec.name.take().or(name.filter(unique));
        }
        Ok(Self::Combined { components: specs, max_reward: self.max_reward() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: Value) -> RewardSpec {
        serde_json::from_value(value).unwrap()
    }

    /// A stand-in for loading: `dir/a.wasm` declares `alpha`, `b.wasm` `beta`, `same*.wasm`
    /// `same`; `rust.wasm` is not a Python reward (no declared name taken).
    fn declared(plugin: &str, _params: &Value) -> Result<Option<String>> {
        let stem = plugin_stem(plugin);
        Ok(match stem.as_str() {
            "a" => Some("alpha".into()),
            "b" => Some("beta".into()),
            "rust" => None,
            other if other.starts_with("same") => Some("same".into()),
            other => panic!("no plugin {other} here"),
        })
    }

    fn names(spec: &RewardSpec) -> Vec<String> {
        spec.component_specs().iter().map(ComponentSpec::display_name).collect()
    }

    #[test]
    fn paths_without_names_take_their_declared_names_and_the_rest_is_kept() {
        let single = spec(json!({"plugin": "dir/a.wasm", "params": {"k": 1}})).named_by_declared(&[], declared).unwrap();
        let expected = ComponentSpec { plugin: "dir/a.wasm".into(), name: Some("alpha".into()), params: json!({"k": 1}), scale: 1.0, role: Role::Retain };
        assert_eq!(single, RewardSpec::Combined { components: vec![expected], max_reward: None });
        let combined = spec(json!({"components": [{"plugin": "b.wasm", "role": "forget", "scale": 2}, {"plugin": "dir/a.wasm", "name": "mine"}, {"plugin": "happy_count"}], "max_reward": 3}));
        let named = combined.named_by_declared(&[], declared).unwrap();
        assert_eq!(names(&named), ["beta", "mine", "happy_count"], "an explicit name and a standard name are kept");
        assert_eq!((named.component_specs()[0].role, named.component_specs()[0].scale, named.max_reward()), (Role::Forget, 2.0, Some(3.0)));
        for unchanged in [json!({"plugin": "happy_count"}), json!({"plugin": "dir/rust.wasm"}), json!({"components": [{"plugin": "dir/a.wasm", "name": "x"}, {"plugin": "rust.wasm"}]})] {
            assert_eq!(spec(unchanged.clone()).named_by_declared(&[], declared).unwrap(), spec(unchanged.clone()), "{unchanged}");
        }
    }

    #[test]
    fn a_stem_a_threshold_names_or_a_shared_declared_name_is_kept() {
        let threshold: DetectorSpec = serde_json::from_value(json!({"score_threshold": {"component": "a", "threshold": 0.5}})).unwrap();
        let single = spec(json!({"plugin": "dir/a.wasm"}));
        assert_eq!(single.named_by_declared(&[None, Some(&threshold)], declared).unwrap(), single, "the detector reads component `a`");
        let twins = spec(json!({"components": [{"plugin": "same1.wasm"}, {"plugin": "same2.wasm"}, {"plugin": "b.wasm"}]}));
        assert_eq!(names(&twins.named_by_declared(&[], declared).unwrap()), ["same1", "same2", "beta"]);
    }
}
