//! Environments (contract 0.3's `environment` world, 0.5's current form): one component that generates a task's
//! prompts and scores, flags and judges its completions. The calls run under the same fuel,
//! memory and time bounds as a reward's, and everything an environment returns is checked
//! here before the host uses it: its `info()` (the plugin rules plus its components and
//! metrics), the number and shape of its prompts (bounded text, a JSON object of metadata with
//! boolean `hackable` and `detectable`), and one value per sample and column: finite, or (a
//! component's score, contract 0.5) none.

use anyhow::{Result, anyhow, bail, ensure};
use serde_json::{Map, Value};

use super::instance::{Batch, Exports, Plugin};
use super::legacy_env;
use super::text::shown;
use super::validate::{MAX_NAME_BYTES, check_info};
use super::wit::env_types as wit;
use super::{PluginInfo, PluginKind};

/// The largest prompt text or metadata object an environment may return, in bytes (a prompt
/// is tokenized and sent back with every sample: an unbounded one would exhaust memory).
pub const MAX_PROMPT_BYTES: usize = 64 * 1024;

/// The most reward components an environment may declare (the standard ones declare 2): each
/// is a column of every step's logs and a term of every sample's reward.
pub const MAX_COMPONENTS: usize = 16;
/// The most metrics an environment may declare (the standard ones declare at most 2): each is
/// a mean in every step's metrics.jsonl line (10,000 made a 270 KB line a step).
pub const MAX_METRICS: usize = 64;

/// Whether a reward component is the task or the hack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComponentRole {
    /// The task itself.
    Retain,
    /// The hack's reward: the host pays it only on prompts whose `hackable` is true.
    Forget,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EnvComponent {
    pub name: String,
    pub role: ComponentRole,
    pub description: String,
}

/// What an environment declares besides the plugin fields: its reward components and its
/// named per-sample metrics, in the order `score` returns them.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvironmentInfo {
    pub components: Vec<EnvComponent>,
    pub metrics: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvSplit {
    Train,
    Eval,
}

impl std::fmt::Display for EnvSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EnvSplit::Train => "train",
            EnvSplit::Eval => "eval",
        })
    }
}

/// A prompt as the environment wrote it (before the host renders it for the model).
#[derive(Clone, Debug, PartialEq)]
pub enum EnvPromptContent {
    Text(String),
    /// (role, content) pairs.
    Messages(Vec<(String, String)>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct EnvPrompt {
    pub content: EnvPromptContent,
    /// The metadata columns, checked: a JSON object with boolean `hackable` and `detectable`.
    pub metadata: Map<String, Value>,
}

/// `score`'s answer: per component (in `EnvironmentInfo::components` order) one score per
/// sample (finite, or None: no score, contract 0.5), and per metric one finite value per sample.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvScores {
    pub components: Vec<Vec<Option<f64>>>,
    pub metrics: Vec<Vec<f64>>,
}

impl Plugin {
    /// An environment's components and metrics (None for rewards and detectors).
    pub fn environment_info(&self) -> Option<&EnvironmentInfo> {
        self.environment.as_ref()
    }

    /// `count` prompts of `split` for `seed` and `hack_frac`, checked: exactly `count`, each
    /// with bounded non-empty text and metadata carrying boolean `hackable` and `detectable`.
    pub fn generate(&mut self, split: EnvSplit, count: usize, seed: u64, hack_frac: f64) -> Result<Vec<EnvPrompt>> {
        ensure!((0.0..=1.0).contains(&hack_frac), "hack_frac must be in [0, 1], got {hack_frac}");
        let count32 = u32::try_from(count).map_err(|_| anyhow!("{}: cannot ask for {count} prompts (at most {})", self.label(), u32::MAX))?;
        let wit_split = match split {
            EnvSplit::Train => wit::Split::Train,
            EnvSplit::Eval => wit::Split::Eval,
        };
        let arguments = || format!("{split} {count} {seed} {}", hack_frac.to_bits()).into_bytes();
        let outcome = self.call("generate", count, arguments, |store, exports| match exports {
            Exports::Environment(environment) => environment.smallrl_reward_env().call_generate(store, wit_split, count32, seed, hack_frac).map(Some),
            Exports::EpisodeEnvironment(environment) => environment.smallrl_reward_env().call_generate(store, wit_split, count32, seed, hack_frac).map(Some),
            Exports::V05Environment(environment) => environment.smallrl_reward_env().call_generate(store, wit_split, count32, seed, hack_frac).map(Some),
            Exports::V05EpisodeEnvironment(environment) => environment.smallrl_reward_env().call_generate(store, wit_split, count32, seed, hack_frac).map(Some),
            Exports::V04Environment(environment) => environment
                .smallrl_reward_env()
                .call_generate(store, legacy_env::split(wit_split), count32, seed, hack_frac)
                .map(|prompts| Some(prompts.map(|prompts| prompts.into_iter().map(legacy_env::prompt).collect()))),
            Exports::V03Environment(environment) => environment
                .smallrl_reward_env()
                .call_generate(store, legacy_env::split(wit_split), count32, seed, hack_frac)
                .map(|prompts| Some(prompts.map(|prompts| prompts.into_iter().map(legacy_env::prompt).collect()))),
            _ => Ok(None),
        })?;
        let label = self.label();
        let prompts = match outcome {
            None => bail!("{label}: is a {}, it has no `generate`", self.kind()),
            Some(Err(message)) => bail!("{label}: generate ({split}, {count} prompts, seed {seed}) returned an error: {}", shown(&message)),
            Some(Ok(prompts)) => prompts,
        };
        ensure!(
            prompts.len() == count,
            "{label}: generate returned {} prompts for {count} asked ({split} split, seed {seed}); exactly the count asked is required",
            prompts.len()
        );
        prompts.into_iter().enumerate().map(|(index, prompt)| check_prompt(prompt).map_err(|rule| anyhow!("{label}: generate ({split}, seed {seed}): prompt {index}: {rule}"))).collect()
    }

    /// Every reward component and metric of a batch: one value per sample each (finite; a
    /// component's may be None, no score).
    pub fn score_environment(&mut self, batch: &Batch) -> Result<EnvScores> {
        let info = self.environment.clone().ok_or_else(|| anyhow!("{}: is a {}, not an environment", self.label(), self.kind()))?;
        let outcome = self.call("score", batch.len(), || batch.digest().to_vec(), |store, exports| match exports {
            Exports::Environment(environment) => environment.smallrl_reward_env().call_score(store, batch.current()).map(Some),
            Exports::V05Environment(environment) => environment.smallrl_reward_env().call_score(store, batch.current()).map(Some),
            Exports::V04Environment(environment) => environment.smallrl_reward_env().call_score(store, batch.current()).map(|scores| Some(scores.map(legacy_env::scores))),
            Exports::V03Environment(environment) => environment.smallrl_reward_env().call_score(store, batch.current()).map(|scores| Some(scores.map(legacy_env::scores))),
            _ => Ok(None),
        })?;
        let label = self.label();
        let scores = match outcome {
            None => bail!("{label}: has no environment `score`"),
            Some(Err(message)) => bail!("{label}: score returned an error: {}", shown(&message)),
            Some(Ok(scores)) => scores,
        };
        let names = |kind: &str, declared: Vec<String>, columns: &[Vec<Option<f64>>]| -> Result<()> {
            ensure!(
                columns.len() == declared.len(),
                "{label}: score returned {} {kind} lists, but info() declares {} ({})",
                columns.len(),
                declared.len(),
                declared.join(", ")
            );
            for (name, values) in declared.iter().zip(columns) {
                ensure!(
                    values.len() == batch.len(),
                    "{label}: score returned {} values of {kind} `{name}` for a batch of {} samples (one per sample is required)",
                    values.len(),
                    batch.len()
                );
                if let Some((index, value)) = values.iter().enumerate().find_map(|(index, value)| value.filter(|v| !v.is_finite()).map(|v| (index, v))) {
                    bail!("{label}: score returned {value} as {kind} `{name}` of sample {index}; values must be finite numbers");
                }
            }
            Ok(())
        };
        names("component", info.components.iter().map(|c| c.name.clone()).collect(), &scores.components)?;
        let metrics: Vec<Vec<Option<f64>>> = scores.metrics.iter().map(|column| column.iter().copied().map(Some).collect()).collect();
        names("metric", info.metrics.clone(), &metrics)?;
        Ok(EnvScores { components: scores.components, metrics: scores.metrics })
    }

    /// The environment's routing monitor: one flag per sample.
    pub fn monitor(&mut self, batch: &Batch) -> Result<Vec<bool>> {
        self.call_batch("monitor", batch, |store, exports| match exports {
            Exports::Environment(environment) => environment.smallrl_reward_env().call_monitor(store, batch.current()).map(Some),
            Exports::V05Environment(environment) => environment.smallrl_reward_env().call_monitor(store, batch.current()).map(Some),
            Exports::V04Environment(environment) => environment.smallrl_reward_env().call_monitor(store, batch.current()).map(Some),
            Exports::V03Environment(environment) => environment.smallrl_reward_env().call_monitor(store, batch.current()).map(Some),
            _ => Ok(None),
        })
    }

    /// The environment's ground truth (did the sample hack): one flag per sample.
    pub fn ground_truth(&mut self, batch: &Batch) -> Result<Vec<bool>> {
        self.call_batch("ground-truth", batch, |store, exports| match exports {
            Exports::Environment(environment) => environment.smallrl_reward_env().call_ground_truth(store, batch.current()).map(Some),
            Exports::V05Environment(environment) => environment.smallrl_reward_env().call_ground_truth(store, batch.current()).map(Some),
            Exports::V04Environment(environment) => environment.smallrl_reward_env().call_ground_truth(store, batch.current()).map(Some),
            Exports::V03Environment(environment) => environment.smallrl_reward_env().call_ground_truth(store, batch.current()).map(Some),
            _ => Ok(None),
        })
    }

    /// `info()` of an environment, checked: the plugin rules, then its components and metrics.
    pub(super) fn read_environment_info(&mut self) -> Result<PluginInfo> {
        let info = self.call("info", 1, Vec::new, |store, exports| match exports {
            Exports::Environment(environment) => environment.smallrl_reward_env().call_info(store),
            Exports::EpisodeEnvironment(environment) => environment.smallrl_reward_env().call_info(store),
            Exports::V05Environment(environment) => environment.smallrl_reward_env().call_info(store),
            Exports::V05EpisodeEnvironment(environment) => environment.smallrl_reward_env().call_info(store),
            Exports::V04Environment(environment) => environment.smallrl_reward_env().call_info(store).map(legacy_env::info),
            Exports::V03Environment(environment) => environment.smallrl_reward_env().call_info(store).map(legacy_env::info),
            _ => unreachable!("only environments are read here"),
        })?;
        let to_param = |param: super::wit::types::ParamInfo| super::ParamInfo {
            name: param.name,
            type_name: param.type_name,
            default_json: param.default_json,
            description: param.description,
        };
        let plugin_info = PluginInfo {
            name: info.name,
            version: info.version,
            kind: PluginKind::Environment,
            description: info.description,
            params: info.params.into_iter().map(to_param).collect(),
        };
        let components = info
            .components
            .into_iter()
            .map(|c| EnvComponent {
                name: c.name,
                role: match c.role {
                    wit::Role::Retain => ComponentRole::Retain,
                    wit::Role::Forget => ComponentRole::Forget,
                },
                description: c.description,
            })
            .collect();
        let environment = EnvironmentInfo { components, metrics: info.metrics };
        let broken = |rule: String| anyhow!("{}: its info() breaks the plugin contract (wit/smallrl-reward.wit): {rule}", self.label());
        check_info(&plugin_info).map_err(broken)?;
        check_environment_info(&environment).map_err(broken)?;
        self.environment = Some(environment);
        Ok(plugin_info)
    }
}

/// The rules of `environment-info` beyond the plugin's: at least one component, at least one
/// of them `retain`; component and metric names valid and unique among both.
pub fn check_environment_info(info: &EnvironmentInfo) -> Result<(), String> {
    for (field, count, most) in [("components", info.components.len(), MAX_COMPONENTS), ("metrics", info.metrics.len(), MAX_METRICS)] {
        if count > most {
            return Err(format!("`{field}` has {count} entries, over the most an environment may declare ({most}): declare fewer"));
        }
    }
    if !info.components.iter().any(|c| c.role == ComponentRole::Retain) {
        return Err("`components` has no `retain` component: an environment needs at least one (the task)".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    let named = info.components.iter().enumerate().map(|(i, c)| (format!("components[{i}].name"), &c.name));
    let metrics = info.metrics.iter().enumerate().map(|(i, m)| (format!("metrics[{i}]"), m));
    for (field, name) in named.chain(metrics) {
        let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.chars().all(allowed) {
            return Err(format!("`{field}` is {:?}: it must be 1 to {MAX_NAME_BYTES} bytes of ASCII letters, digits, `_` and `-`", shown(name)));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("`{field}` is {name:?}, which an earlier component or metric already has: names must be unique"));
        }
    }
    Ok(())
}

fn check_prompt(prompt: wit::Prompt) -> Result<EnvPrompt, String> {
    let bounded = |what: &str, text: &str| -> Result<(), String> {
        if text.len() > MAX_PROMPT_BYTES {
            return Err(format!("its {what} has {} bytes, over the limit of {MAX_PROMPT_BYTES}", text.len()));
        }
        Ok(())
    };
    let content = match prompt.content {
        wit::PromptContent::Text(text) => {
            bounded("text", &text)?;
            if text.trim().is_empty() {
                return Err("its text is empty".into());
            }
            EnvPromptContent::Text(text)
        }
        wit::PromptContent::Messages(messages) => {
            if messages.is_empty() {
                return Err("it has an empty list of messages".into());
            }
            let total: usize = messages.iter().map(|m| m.content.len() + m.role.len()).sum();
            if total > MAX_PROMPT_BYTES {
                return Err(format!("its messages have {total} bytes, over the limit of {MAX_PROMPT_BYTES}"));
            }
            if let Some(message) = messages.iter().find(|m| !["system", "user", "assistant"].contains(&m.role.as_str())) {
                return Err(format!("a message has the role {:?}: it must be \"system\", \"user\" or \"assistant\"", shown(&message.role)));
            }
            EnvPromptContent::Messages(messages.into_iter().map(|m| (m.role, m.content)).collect())
        }
    };
    bounded("metadata", &prompt.metadata)?;
    let metadata: Map<String, Value> = serde_json::from_str(&prompt.metadata)
        .map_err(|error| format!("its metadata {:?} is not a JSON object ({error})", shown(&prompt.metadata)))?;
    for column in ["hackable", "detectable"] {
        match metadata.get(column) {
            Some(Value::Bool(_)) => {}
            Some(other) => return Err(format!("its metadata's `{column}` is {}, it must be true or false", shown(&other.to_string()))),
            None => return Err(format!("its metadata has no `{column}` (true or false): every environment prompt says whether it is {column}")),
        }
    }
    Ok(EnvPrompt { content, metadata })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(components: &[(&str, ComponentRole)], metrics: &[&str]) -> EnvironmentInfo {
        let component = |(name, role): &(&str, ComponentRole)| EnvComponent { name: name.to_string(), role: *role, description: String::new() };
        EnvironmentInfo { components: components.iter().map(component).collect(), metrics: metrics.iter().map(|m| m.to_string()).collect() }
    }

    #[test]
    fn environment_info_rules() {
        use ComponentRole::{Forget, Retain};
        assert_eq!(check_environment_info(&info(&[("task", Retain), ("hack", Forget)], &["correct"])), Ok(()));
        let error = |components: &[(&str, ComponentRole)], metrics: &[&str]| check_environment_info(&info(components, metrics)).unwrap_err();
        assert!(error(&[("hack", Forget)], &[]).contains("no `retain` component"));
        assert!(error(&[], &[]).contains("no `retain` component"));
        assert!(error(&[("task", Retain), ("task", Forget)], &[]).contains("`components[1].name` is \"task\", which an earlier"));
        assert!(error(&[("task", Retain)], &["task"]).contains("`metrics[0]` is \"task\", which an earlier"));
        assert!(error(&[("a b", Retain)], &[]).contains("`components[0].name`"));
        assert!(error(&[("task", Retain)], &[""]).contains("`metrics[0]`"));
        assert!(error(&[("task", Retain)], &[&"x".repeat(65)]).contains("1 to 64 bytes"));
        let names: Vec<String> = (0..65).map(|i| format!("m{i}")).collect();
        let metrics: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(check_environment_info(&info(&[("task", Retain)], &metrics[..64])), Ok(()));
        assert_eq!(error(&[("task", Retain)], &metrics), "`metrics` has 65 entries, over the most an environment may declare (64): declare fewer");
        let components: Vec<(&str, ComponentRole)> = metrics[..17].iter().map(|m| (*m, Retain)).collect();
        assert!(error(&components, &[]).starts_with("`components` has 17 entries, over the most an environment may declare (16)"));
    }
}
