//! The episode-environment world's glue (feature `episode`): `env`'s calls from an
//! [`EpisodeEnvironment`]'s declarations, and `episodes` over the [`Episodes`] kept here.

use std::any::Any;
use std::cell::RefCell;

use serde_json::{Map, Value};

use super::environment::smallrl::reward::environment_types as env_wit;
use super::environment::smallrl::reward::episode_types as wit;

use super::{environment_info_of, from_environment_sample, prompts_to_wit, split_from_wit, with_plugin};
use crate::{CallEntry, EpisodeEnvironment, Episodes, Prompt, PromptContent, Step, Turn};

thread_local! {
    /// The episodes in flight (an `Episodes<P>` of the exported type).
    static EPISODES: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

pub fn episode_info<P: EpisodeEnvironment>() -> env_wit::EnvironmentInfo {
    environment_info_of::<P>(P::components(), P::metrics())
}

pub fn episode_generate<P: EpisodeEnvironment>(split: env_wit::Split, count: u32, seed: u64, hack_frac: f64) -> Result<Vec<env_wit::Prompt>, String> {
    let prompts = with_plugin::<P, _>(|plugin| plugin.generate(split_from_wit(split), count as usize, seed, hack_frac))??;
    Ok(prompts_to_wit(prompts))
}

/// `env.score`, `monitor` and `ground-truth` of an episode environment: the host never calls
/// them (an episode's end carries its scores).
pub fn not_for_episodes<T>(call: &str) -> Result<T, String> {
    Err(format!("{call}: an episode environment scores at the end of each episode (episodes.step), not per sample"))
}

/// Runs `f` on the episodes in flight of plugin type `P`.
fn with_episodes<P: EpisodeEnvironment + 'static, R>(f: impl FnOnce(&P, &mut Episodes<P>) -> R) -> Result<R, String>
where
    P::State: 'static,
{
    with_plugin::<P, _>(|plugin| {
        EPISODES.with(|slot| {
            let mut slot = slot.borrow_mut();
            let episodes = slot.get_or_insert_with(|| Box::new(Episodes::<P>::default()));
            f(plugin, episodes.downcast_mut::<Episodes<P>>().expect("episodes of this plugin type"))
        })
    })
}

pub fn episode_start<P: EpisodeEnvironment + 'static>(starts: Vec<wit::EpisodeStart>) -> Result<Vec<Vec<wit::Tool>>, String>
where
    P::State: 'static,
{
    with_episodes::<P, _>(|plugin, episodes| {
        starts
            .into_iter()
            .map(|start| {
                let prompt = prompt_from_wit(start.prompt)?;
                let tools = episodes.start(plugin, start.id, &prompt)?;
                Ok(tools.into_iter().map(|t| wit::Tool { name: t.name, description: t.description, parameters: t.parameters }).collect())
            })
            .collect()
    })?
}

pub fn episode_step<P: EpisodeEnvironment + 'static>(turns: Vec<wit::Turn>) -> Result<Vec<wit::TurnResult>, String>
where
    P::State: 'static,
{
    with_episodes::<P, _>(|plugin, episodes| {
        turns
            .into_iter()
            .map(|turn| {
                let calls = turn.calls.map(|calls| {
                    calls
                        .into_iter()
                        .map(|call| match call {
                            wit::CallEntry::Call(call) => CallEntry::Call { name: call.name, arguments: call.arguments },
                            wit::CallEntry::Malformed(observation) => CallEntry::Malformed(observation),
                        })
                        .collect()
                });
                let step_turn = Turn { sample: from_environment_sample(turn.assistant), calls };
                Ok(match episodes.step(plugin, turn.id, &step_turn, turn.last)? {
                    Step::Observation(messages) => {
                        wit::TurnResult::Observation(messages.into_iter().map(|(role, content)| env_wit::Message { role, content }).collect())
                    }
                    Step::End(end) => wit::TurnResult::End(wit::EpisodeEnd {
                        components: end.judgement.components,
                        metrics: end.judgement.metrics,
                        monitor: end.monitor,
                        ground_truth: end.ground_truth,
                    }),
                })
            })
            .collect()
    })?
}

/// The prompt the host sends back, as `generate` wrote it.
fn prompt_from_wit(prompt: env_wit::Prompt) -> Result<Prompt, String> {
    let content = match prompt.content {
        env_wit::PromptContent::Text(text) => PromptContent::Text(text),
        env_wit::PromptContent::Messages(messages) => PromptContent::Messages(messages.into_iter().map(|m| (m.role, m.content)).collect()),
    };
    let metadata: Map<String, Value> = serde_json::from_str(&prompt.metadata).map_err(|error| format!("the host sent metadata that is not a JSON object: {error}"))?;
    Ok(Prompt { content, metadata })
}



