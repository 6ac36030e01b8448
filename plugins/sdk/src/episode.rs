//! Multi-turn environments (issue 48; the `episode-environment` world): an environment that
//! holds an episode per sample. It generates its prompts as a single-turn [`crate::Environment`]
//! does, then the host starts an episode per sampled prompt ([`EpisodeEnvironment::start`]) and
//! hands it each assistant turn ([`EpisodeEnvironment::step`]); the environment answers with the
//! next observation (messages in the `tool` or `user` role) or the end: the reward components,
//! metrics, monitor flag and ground truth a single-turn environment gives a sample. Export it
//! with [`crate::export_episode_environment!`] (feature `episode`).
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

    /// The answer to one assistant turn (`turn.completion`: this turn's text only). On the
    /// `last` turn it must be [`Step::End`].
    fn step(&self, state: &mut Self::State, turn: &Sample, last: bool) -> Step;
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
    /// Starts episode `id` (an id in flight is an error: the host's ids are unique).
    pub fn start(&mut self, env: &E, id: u64, prompt: &Prompt) -> Result<(), String> {
        if self.states.contains_key(&id) {
            return Err(format!("episode {id} is already in flight"));
        }
        let state = env.start(prompt)?;
        self.states.insert(id, state);
        Ok(())
    }

    /// Episode `id`'s answer to `turn`; an end forgets the episode.
    pub fn step(&mut self, env: &E, id: u64, turn: &Sample, last: bool) -> Result<Step, String> {
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
