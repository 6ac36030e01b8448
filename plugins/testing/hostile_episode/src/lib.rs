//! A hostile episode environment (issue 48), by its `mode` parameter:
//! - `ok`: ends every episode at its first turn (solved 1).
//! - `never_ends`: answers every turn, the last one included, with an observation.
//! - `huge_observation`: answers with a 10 MB observation.
//! - `wrong_role`: answers with an observation in the role "assistant".
//! - `grows`: keeps 8 MiB more state per turn and never ends before the last turn.

use smallrl_plugin_sdk::{Component, EpisodeEnd, EpisodeEnvironment, Judgement, Param, Params, Plugin, Prompt, Split, Step, Turn};

pub struct HostileEpisode {
    mode: String,
}

impl Plugin for HostileEpisode {
    const NAME: &'static str = "hostile_episode";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "test-only: misbehaves in episodes as `mode` says";

    fn params() -> Vec<Param> {
        vec![Param::string("mode", "ok", "ok, never_ends, huge_observation, wrong_role or grows")]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Self { mode: params.string("mode") })
    }
}

impl EpisodeEnvironment for HostileEpisode {
    type State = Vec<Vec<u8>>;

    fn components() -> Vec<Component> {
        vec![Component::retain("solved", "1 at the end")]
    }

    fn generate(&self, split: Split, count: usize, _seed: u64, _hack_frac: f64) -> Result<Vec<Prompt>, String> {
        Ok((0..count).map(|i| Prompt::text(format!("{} {i}", split.name()), false, false, [])).collect())
    }

    fn start(&self, _prompt: &Prompt) -> Result<Self::State, String> {
        Ok(Vec::new())
    }

    fn step(&self, state: &mut Self::State, _turn: &Turn, last: bool) -> Step {
        let end = || Step::End(EpisodeEnd { judgement: Judgement { components: vec![1.0], metrics: vec![] }, monitor: false, ground_truth: false });
        match self.mode.as_str() {
            "never_ends" => Step::user("again"),
            "huge_observation" => Step::user("x".repeat(10 << 20)),
            "wrong_role" => Step::Observation(vec![("assistant".into(), "I answer for you".into())]),
            "grows" if !last => {
                // Read back, so that no optimiser drops the allocation.
                state.push(std::hint::black_box(vec![1u8; 8 << 20]));
                let held: u64 = state.iter().map(|chunk| chunk[chunk.len() - 1] as u64 * chunk.len() as u64).sum();
                Step::user(format!("{} MiB held", held >> 20))
            }
            _ => end(),
        }
    }
}

smallrl_plugin_sdk::export_episode_environment!(HostileEpisode);
