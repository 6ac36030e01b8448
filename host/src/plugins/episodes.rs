//! Multi-turn episodes (issue 48; the `episodes` interface of `wit/smallrl-reward.wit`): an
//! environment that holds an episode per sample. The host starts the episodes from their
//! prompts, hands each one its assistant turns, and gets back the next observation or the end
//! with the reward components, metrics, monitor flag and ground truth. Everything the guest
//! returns is checked here before the host uses it: one answer per turn, observations of
//! messages in the `tool` or `user` role within [`EpisodeBounds::max_observation_bytes`],
//! one list of tools per started episode (each with a unique non-empty name and a JSON-object
//! schema),
//! an end (not an observation) on the last turn, one finite value per declared component and
//! metric. The fuel of a call is that of one sample per episode of the call (`plugin_fuel_per_sample`
//! per step), and the guest's state is bounded by `plugin_max_memory_mb`.

use anyhow::{Result, anyhow, bail, ensure};

use super::environment::EnvPrompt;
use super::instance::{Batch, Exports, Plugin};
use super::text::shown;
use super::wit::episode_types as wit;
use super::wit::{env_types, v0_5};

/// The bounds of a run's episodes; defaults in `crate::defaults` (`EPISODE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpisodeBounds {
    /// Assistant turns per episode: the last one is sent with `last` and must end it.
    pub max_turns: usize,
    /// Bytes of one observation (its messages' roles and contents together).
    pub max_observation_bytes: usize,
    /// Tokens of one rendered observation. A turn is the last when what is left of
    /// `max_episode_tokens` after it could not hold an observation this long and one more model
    /// token, so a longer observation is the environment's error, never the budget's.
    pub max_observation_tokens: usize,
    /// Tokens of one episode after its prompt (model and observation tokens together).
    pub max_episode_tokens: usize,
}

impl Default for EpisodeBounds {
    fn default() -> Self {
        Self {
            max_turns: crate::defaults::EPISODE_MAX_TURNS,
            max_observation_bytes: crate::defaults::EPISODE_MAX_OBSERVATION_BYTES,
            max_observation_tokens: crate::defaults::EPISODE_MAX_OBSERVATION_TOKENS,
            max_episode_tokens: crate::defaults::EPISODE_MAX_TOKENS,
        }
    }
}

/// How an episode ended: as single-turn environments score a sample.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeEnd {
    /// One per declared component, in order (forget components not gated: the host gates).
    pub components: Vec<f64>,
    /// One per declared metric, in order.
    pub metrics: Vec<f64>,
    pub monitor: bool,
    pub ground_truth: bool,
}

/// The environment's answer to one assistant turn.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnResult {
    /// (role, content) messages, each role `tool` or `user`.
    Observation(Vec<(String, String)>),
    End(EpisodeEnd),
}

/// A tool an episode declares (contract 0.6): its schema is rendered into the prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// The JSON schema of its arguments: a JSON object text (checked), keys in the guest's order.
    pub parameters: String,
}

/// One tool call the host parsed from a turn, or what was wrong with it (the text the model
/// would be shown).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallEntry {
    /// The tool's name and its arguments (a JSON object text).
    Call { name: String, arguments: String },
    Malformed(String),
}

/// The roles an observation's messages may have.
pub const OBSERVATION_ROLES: [&str; 2] = ["tool", "user"];

impl Plugin {
    /// Whether this environment runs multi-turn episodes (the episode-environment world).
    pub fn is_episodic(&self) -> bool {
        self.episodic
    }

    /// Starts one episode per `(id, prompt)`; returns the tools each declares (none for a 0.5
    /// plugin), checked.
    pub fn start_episodes(&mut self, episodes: &[(u64, &EnvPrompt)]) -> Result<Vec<Vec<Tool>>> {
        let starts: Vec<wit::EpisodeStart> = episodes.iter().map(|(id, prompt)| wit::EpisodeStart { id: *id, prompt: prompt_to_wit(prompt) }).collect();
        let v0_5_starts = || starts.iter().map(|s| v0_5::episode_types::EpisodeStart { id: s.id, prompt: s.prompt.clone() }).collect::<Vec<_>>();
        let no_tools = |count: usize| move |()| vec![Vec::new(); count];
        let arguments = || episodes.iter().flat_map(|(id, prompt)| [id.to_le_bytes().to_vec(), format!("{:?}", prompt.content).into_bytes()]).flatten().collect();
        let outcome = self.call("start", episodes.len(), arguments, |store, exports| match exports {
            Exports::EpisodeEnvironment(environment) => environment.smallrl_reward_episodes().call_start(store, &starts).map(Some),
            Exports::V05EpisodeEnvironment(environment) => {
                environment.smallrl_reward_episodes().call_start(store, &v0_5_starts()).map(|result| Some(result.map(no_tools(episodes.len()))))
            }
            _ => Ok(None),
        })?;
        let label = self.label();
        let tools = match outcome {
            None => bail!("{label}: is not an episode environment (it has no `episodes.start`)"),
            Some(Err(message)) => bail!("{label}: start ({} episodes) returned an error: {}", episodes.len(), shown(&message)),
            Some(Ok(tools)) => tools,
        };
        ensure!(tools.len() == episodes.len(), "{label}: start returned {} tool lists for {} episodes (one per episode is required)", tools.len(), episodes.len());
        tools
            .into_iter()
            .zip(episodes)
            .map(|(tools, (id, _))| check_tools(tools).map_err(|rule| anyhow!("{label}: start: episode {id}: {rule}")))
            .collect()
    }

    /// One answer per turn: `turns` holds each episode's id and whether it is its last turn,
    /// `batch` the assistant turns as samples, in the same order; no turn carries parsed calls.
    pub fn step_episodes(&mut self, turns: &[(u64, bool)], batch: &Batch, bounds: &EpisodeBounds) -> Result<Vec<TurnResult>> {
        let turns: Vec<(u64, bool, Option<Vec<CallEntry>>)> = turns.iter().map(|&(id, last)| (id, last, None)).collect();
        self.step_episodes_with_calls(&turns, batch, bounds)
    }

    /// [`Plugin::step_episodes`] with the calls parsed from each turn (None: not parsed). A 0.5
    /// plugin declared no tools, so its turns carry no calls (checked).
    pub fn step_episodes_with_calls(&mut self, turns: &[(u64, bool, Option<Vec<CallEntry>>)], batch: &Batch, bounds: &EpisodeBounds) -> Result<Vec<TurnResult>> {
        ensure!(turns.len() == batch.len(), "{} episode ids for {} turns", turns.len(), batch.len());
        let info = self.environment.clone().ok_or_else(|| anyhow!("{}: is a {}, not an environment", self.label(), self.kind()))?;
        let request: Vec<wit::Turn> = turns
            .iter()
            .zip(batch.current())
            .map(|((id, last, calls), sample)| wit::Turn { id: *id, assistant: sample.clone(), last: *last, calls: calls.as_ref().map(|calls| calls.iter().map(call_to_wit).collect()) })
            .collect();
        let has_calls = turns.iter().any(|(_, _, calls)| calls.is_some());
        let v0_5_request = || -> wasmtime::Result<Vec<v0_5::episode_types::Turn>> {
            if has_calls {
                return Err(wasmtime::format_err!("a 0.5 episode environment declares no tools, so its turns carry no calls (a host error)"));
            }
            Ok(request.iter().map(|t| v0_5::episode_types::Turn { id: t.id, assistant: t.assistant.clone(), last: t.last }).collect())
        };
        let arguments = || {
            let mut bytes = batch.digest().to_vec();
            bytes.extend(turns.iter().flat_map(|(id, last, _)| [id.to_le_bytes().as_slice(), &[u8::from(*last)]].concat()));
            // Only turns with parsed calls add them: a plain-text run's seed bytes stay 0.5's.
            if has_calls {
                bytes.extend(format!("{:?}", turns.iter().map(|(_, _, calls)| calls).collect::<Vec<_>>()).into_bytes());
            }
            bytes
        };
        let outcome = self.call("step", turns.len(), arguments, |store, exports| match exports {
            Exports::EpisodeEnvironment(environment) => environment.smallrl_reward_episodes().call_step(store, &request).map(Some),
            Exports::V05EpisodeEnvironment(environment) => {
                let results = environment.smallrl_reward_episodes().call_step(store, &v0_5_request()?)?;
                Ok(Some(results.map(|results| results.into_iter().map(turn_result_from_v0_5).collect())))
            }
            _ => Ok(None),
        })?;
        let label = self.label();
        let results = match outcome {
            None => bail!("{label}: is not an episode environment (it has no `episodes.step`)"),
            Some(Err(message)) => bail!("{label}: step ({} turns) returned an error: {}", turns.len(), shown(&message)),
            Some(Ok(results)) => results,
        };
        ensure!(results.len() == turns.len(), "{label}: step returned {} answers for {} turns (one per turn is required)", results.len(), turns.len());
        let shape = (info.components.len(), info.metrics.len());
        results
            .into_iter()
            .zip(turns)
            .map(|(result, (id, last, _))| check_turn(result, *last, shape, bounds).map_err(|rule| anyhow!("{label}: step: episode {id}: {rule}")))
            .collect()
    }
}

/// A parsed call as the contract carries it.
fn call_to_wit(call: &CallEntry) -> wit::CallEntry {
    match call {
        CallEntry::Call { name, arguments } => wit::CallEntry::Call(wit::ToolCall { name: name.clone(), arguments: arguments.clone() }),
        CallEntry::Malformed(observation) => wit::CallEntry::Malformed(observation.clone()),
    }
}

/// A 0.5 answer in the current contract's types (the same fields).
fn turn_result_from_v0_5(result: v0_5::episode_types::TurnResult) -> wit::TurnResult {
    match result {
        v0_5::episode_types::TurnResult::Observation(messages) => wit::TurnResult::Observation(messages),
        v0_5::episode_types::TurnResult::End(end) => {
            wit::TurnResult::End(wit::EpisodeEnd { components: end.components, metrics: end.metrics, monitor: end.monitor, ground_truth: end.ground_truth })
        }
    }
}

/// One episode's tools checked: unique non-empty names, schemas that are JSON objects.
fn check_tools(tools: Vec<wit::Tool>) -> Result<Vec<Tool>, String> {
    let mut names = std::collections::BTreeSet::new();
    tools
        .into_iter()
        .map(|tool| {
            if tool.name.trim().is_empty() {
                return Err("declared a tool without a name".to_string());
            }
            if !names.insert(tool.name.clone()) {
                return Err(format!("declared the tool {:?} twice", shown(&tool.name)));
            }
            match serde_json::from_str::<serde_json::Value>(&tool.parameters) {
                Ok(serde_json::Value::Object(_)) => Ok(Tool { name: tool.name, description: tool.description, parameters: tool.parameters }),
                _ => Err(format!("declared the tool {:?} with parameters that are not a JSON object: {}", shown(&tool.name), shown(&tool.parameters))),
            }
        })
        .collect()
}

/// The prompt as the guest wrote it, sent back to it.
fn prompt_to_wit(prompt: &EnvPrompt) -> env_types::Prompt {
    let content = match &prompt.content {
        super::EnvPromptContent::Text(text) => env_types::PromptContent::Text(text.clone()),
        super::EnvPromptContent::Messages(messages) => env_types::PromptContent::Messages(
            messages.iter().map(|(role, content)| env_types::Message { role: role.clone(), content: content.clone() }).collect(),
        ),
    };
    env_types::Prompt { content, metadata: serde_json::Value::Object(prompt.metadata.clone()).to_string() }
}

/// One answer checked: the contract's rules, as the message that names what broke.
fn check_turn(result: wit::TurnResult, last: bool, (components, metrics): (usize, usize), bounds: &EpisodeBounds) -> Result<TurnResult, String> {
    match result {
        wit::TurnResult::Observation(messages) => {
            if last {
                return Err(format!(
                    "answered its last turn (max_turns {}, or the episode's token budget spent) with an observation: the last turn must end the episode",
                    bounds.max_turns
                ));
            }
            if messages.is_empty() {
                return Err("returned an observation without messages".into());
            }
            let bytes: usize = messages.iter().map(|m| m.role.len() + m.content.len()).sum();
            if bytes > bounds.max_observation_bytes {
                return Err(format!("returned an observation of {bytes} bytes, over episode_max_observation_bytes ({})", bounds.max_observation_bytes));
            }
            if let Some(message) = messages.iter().find(|m| !OBSERVATION_ROLES.contains(&m.role.as_str())) {
                return Err(format!("returned an observation message in the role {:?}: it must be \"tool\" or \"user\"", shown(&message.role)));
            }
            Ok(TurnResult::Observation(messages.into_iter().map(|m| (m.role, m.content)).collect()))
        }
        wit::TurnResult::End(end) => {
            for (what, values, declared) in [("component", &end.components, components), ("metric", &end.metrics, metrics)] {
                if values.len() != declared {
                    return Err(format!("ended with {} {what} values, but info() declares {declared}", values.len()));
                }
                if let Some((index, value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                    return Err(format!("ended with {value} as {what} {index}; values must be finite numbers"));
                }
            }
            Ok(TurnResult::End(EpisodeEnd { components: end.components, metrics: end.metrics, monitor: end.monitor, ground_truth: end.ground_truth }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observation(role: &str, content: &str) -> wit::TurnResult {
        wit::TurnResult::Observation(vec![env_types::Message { role: role.into(), content: content.into() }])
    }

    #[test]
    fn turn_rules() {
        let bounds = EpisodeBounds { max_turns: 4, max_observation_bytes: 16, max_observation_tokens: 8, max_episode_tokens: 64 };
        let check = |result, last| check_turn(result, last, (1, 0), &bounds);
        assert_eq!(check(observation("user", "higher"), false), Ok(TurnResult::Observation(vec![("user".into(), "higher".into())])));
        assert!(check(observation("user", "higher"), true).unwrap_err().contains("the last turn must end the episode"));
        assert!(check(observation("tool", &"x".repeat(13)), false).unwrap_err().contains("17 bytes, over episode_max_observation_bytes (16)"));
        assert!(check(observation("assistant", "hi"), false).unwrap_err().contains("role \"assistant\""));
        assert!(check(wit::TurnResult::Observation(vec![]), false).unwrap_err().contains("without messages"));
        let end = |components: Vec<f64>, metrics: Vec<f64>| wit::TurnResult::End(wit::EpisodeEnd { components, metrics, monitor: true, ground_truth: false });
        assert_eq!(
            check(end(vec![0.5], vec![]), true),
            Ok(TurnResult::End(EpisodeEnd { components: vec![0.5], metrics: vec![], monitor: true, ground_truth: false }))
        );
        assert!(check(end(vec![0.5, 1.0], vec![]), false).unwrap_err().contains("2 component values, but info() declares 1"));
        assert!(check(end(vec![f64::NAN], vec![]), false).unwrap_err().contains("NaN as component 0"));
        assert!(check(end(vec![1.0], vec![1.0]), false).unwrap_err().contains("1 metric values, but info() declares 0"));
    }

    #[test]
    fn tool_rules() {
        let tool = |name: &str, parameters: &str| wit::Tool { name: name.into(), description: "d".into(), parameters: parameters.into() };
        let schema = r#"{"type":"object","properties":{"code":{"type":"string"}}}"#;
        assert_eq!(check_tools(vec![tool("run_tests", schema)]), Ok(vec![Tool { name: "run_tests".into(), description: "d".into(), parameters: schema.into() }]));
        assert!(check_tools(vec![tool("a", "{}"), tool("a", "{}")]).unwrap_err().contains("declared the tool \"a\" twice"));
        assert!(check_tools(vec![tool(" ", "{}")]).unwrap_err().contains("without a name"));
        assert!(check_tools(vec![tool("a", "[1]")]).unwrap_err().contains("not a JSON object"));
    }
}
