//! Multi-turn environments (issue 48; the `episode-environment` world): an environment that
//! holds an episode per sample. It generates its prompts as a single-turn [`crate::Environment`]
//! does, then the host starts an episode per sampled prompt ([`EpisodeEnvironment::start`]) and
//! hands it each assistant turn ([`EpisodeEnvironment::step`]); the environment answers with the
//! next observation (messages in the `tool` or `user` role) or the end: the reward components,
//! metrics, monitor flag and ground truth a single-turn environment gives a sample. Export it
//! with [`crate::export_episode_environment!`] (feature `episode`).
//!
//! Tools (contract 0.6): an episode may declare tools ([`EpisodeEnvironment::tools`]); where the
//! model's chat template has a tool-call format (Qwen's `<tool_call>`), the host renders their
//! schemas into the prompt and parses each turn's calls ([`Turn::calls`]: `Some`); otherwise
//! (`None`: a raw-prompt run, a template without the format, or no tools declared) the
//! environment reads the turn's text with its own plain-text protocol.
//!
//! The state is [`EpisodeEnvironment::State`], kept by the glue per episode id
//! ([`Episodes`]); it must be a deterministic function of the prompt and the turns. The host
//! bounds the turns (the last one comes with `last`, and must be answered with an end), the
//! bytes of an observation and the fuel of each call.

use std::collections::BTreeMap;

use crate::{Component, Judgement, Plugin, Prompt, Sample, Split};

/// How an episode ended.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeEnd {
    /// One score per component and one value per metric, in declared order.
    pub judgement: Judgement,
    pub monitor: bool,
    pub ground_truth: bool,
}

/// A tool an episode offers the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// The JSON schema of its arguments: a JSON object text, written in the key order the
    /// template should show.
    pub parameters: String,
}

/// One call the host parsed from a turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallEntry {
    /// A call of a declared tool: its name and its arguments (a JSON object text).
    Call { name: String, arguments: String },
    /// A `<tool_call>` block that is not one: the text to show the model (a `tool` message).
    Malformed(String),
}

/// One assistant turn.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// The turn as a sample (`completion`: this turn's text only).
    pub sample: Sample,
    /// The calls the host parsed from it with the chat template's tool-call format, in order;
    /// None where it did not parse (see the module documentation).
    pub calls: Option<Vec<CallEntry>>,
}

/// The answer to an assistant turn.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// (role, content) messages: role "tool" or "user".
    Observation(Vec<(String, String)>),
    End(EpisodeEnd),
}

impl Step {
    /// One `user` message.
    pub fn user(text: impl Into<String>) -> Self {
        Step::Observation(vec![("user".into(), text.into())])
    }
}

/// A multi-turn task.
pub trait EpisodeEnvironment: Plugin {
    /// One episode's state.
    type State;

    /// The reward components an episode's end carries, in order (at least one `Retain`).
    fn components() -> Vec<Component>;

    /// Named metrics an episode's end carries, in order.
    fn metrics() -> Vec<&'static str> {
        Vec::new()
    }

    /// Exactly `count` prompts of `split`: a pure function of the parameters and the arguments.
    fn generate(&self, split: Split, count: usize, seed: u64, hack_frac: f64) -> Result<Vec<Prompt>, String>;

    /// A new episode on `prompt` (as `generate` wrote it).
    fn start(&self, prompt: &Prompt) -> Result<Self::State, String>;

    /// The tools the episode on `prompt` offers the model (none by default).
    fn tools(&self, _prompt: &Prompt) -> Vec<Tool> {
        Vec::new()
    }

    /// The answer to one assistant turn. On the `last` turn it must be [`Step::End`].
    fn step(&self, state: &mut Self::State, turn: &Turn, last: bool) -> Step;
}

/// The episodes in flight, by the host's ids: what the guest glue keeps, and how native tests
/// play episodes.
pub struct Episodes<E: EpisodeEnvironment> {
    states: BTreeMap<u64, E::State>,
}

impl<E: EpisodeEnvironment> Default for Episodes<E> {
    fn default() -> Self {
        Self { states: BTreeMap::new() }
    }
}

impl<E: EpisodeEnvironment> Episodes<E> {
    /// Starts episode `id` (an id in flight is an error: the host's ids are unique); returns
    /// the tools it offers.
    pub fn start(&mut self, env: &E, id: u64, prompt: &Prompt) -> Result<Vec<Tool>, String> {
        if self.states.contains_key(&id) {
            return Err(format!("episode {id} is already in flight"));
        }
        let state = env.start(prompt)?;
        self.states.insert(id, state);
        Ok(env.tools(prompt))
    }

    /// Episode `id`'s answer to `turn`; an end forgets the episode.
    pub fn step(&mut self, env: &E, id: u64, turn: &Turn, last: bool) -> Result<Step, String> {
        let state = self.states.get_mut(&id).ok_or_else(|| format!("episode {id} was never started (or has ended)"))?;
        let step = env.step(state, turn, last);
        if let Step::End(end) = &step {
            let (components, metrics) = (E::components().len(), E::metrics().len());
            if end.judgement.components.len() != components || end.judgement.metrics.len() != metrics {
                return Err(format!("episode {id} ended with {} components and {} metrics; the environment declares {components} and {metrics}", end.judgement.components.len(), end.judgement.metrics.len()));
            }
            self.states.remove(&id);
        }
        Ok(step)
    }

    /// How many episodes are in flight.
    pub fn in_flight(&self) -> usize {
        self.states.len()
    }
}
