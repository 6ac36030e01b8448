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
    /// Metric name (`rewards/<name>/mean`); defaults to the plugin name or file stem.
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
    if value.contains('/') || value.ends_with(".wasm") {
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
