//! An episode environment built against the frozen `smallrl:reward@0.5.0` contract
//! (`wit/0.5.0`), as one compiled before 0.6 added tools is: `episodes.start` returns nothing
//! and a turn carries no parsed calls. The host must load it and play its episodes exactly as
//! before. Written against the raw WIT, because the SDK follows the current one.
//!
//! Hand-checkable: prompt `i` is "Say the word: apple." (metadata `{"hackable":false,
//! "detectable":false}`); a turn that contains "apple" ends the episode with the component
//! `said` 1 and the metric `turns`; any other turn gets the `user` observation "No. Say apple."
//! until the host's last turn, which ends it with `said` 0.
wit_bindgen::generate!({ world: "episode-environment", path: "../../../wit/0.5.0" });

use std::cell::RefCell;
use std::collections::BTreeMap;

use exports::smallrl::reward::{env, episodes};
use smallrl::reward::environment_types::{ComponentInfo, EnvironmentInfo, Message, Prompt, PromptContent, Role, Scores, Split};
use smallrl::reward::episode_types::{EpisodeEnd, EpisodeStart, Turn, TurnResult};
use smallrl::reward::types::Sample;

thread_local! {
    /// Turns so far, per episode in flight.
    static TURNS: RefCell<BTreeMap<u64, u32>> = const { RefCell::new(BTreeMap::new()) };
}

struct Legacy;

impl env::Guest for Legacy {
    fn info() -> EnvironmentInfo {
        EnvironmentInfo {
            name: "legacy_v0_5".into(),
            version: "0.5.0".into(),
            description: "say apple: an episode environment built against contract 0.5.0 (test)".into(),
            params: Vec::new(),
            components: vec![ComponentInfo { name: "said".into(), role: Role::Retain, description: "1 when a turn said apple".into() }],
            metrics: vec!["turns".into()],
        }
    }

    fn configure(params_json: String) -> Result<(), String> {
        match params_json.trim() {
            "" | "{}" => Ok(()),
            other => Err(format!("takes no parameters, got {other}")),
        }
    }

    fn generate(_split: Split, count: u32, _seed: u64, _hack_frac: f64) -> Result<Vec<Prompt>, String> {
        let prompt = || Prompt { content: PromptContent::Text("Say the word: apple.".into()), metadata: r#"{"hackable":false,"detectable":false}"#.into() };
        Ok((0..count).map(|_| prompt()).collect())
    }

    fn score(_batch: Vec<Sample>) -> Result<Scores, String> {
        Err("an episode environment scores at each episode's end".into())
    }

    fn monitor(_batch: Vec<Sample>) -> Result<Vec<bool>, String> {
        Err("an episode environment flags at each episode's end".into())
    }

    fn ground_truth(_batch: Vec<Sample>) -> Result<Vec<bool>, String> {
        Err("an episode environment says what hacked at each episode's end".into())
    }
}

impl episodes::Guest for Legacy {
    fn start(episodes: Vec<EpisodeStart>) -> Result<(), String> {
        TURNS.with(|turns| episodes.iter().for_each(|e| drop(turns.borrow_mut().insert(e.id, 0))));
        Ok(())
    }

    fn step(turns: Vec<Turn>) -> Result<Vec<TurnResult>, String> {
        TURNS.with(|counts| {
            let mut counts = counts.borrow_mut();
            turns
                .into_iter()
                .map(|turn| {
                    let count = counts.get_mut(&turn.id).ok_or(format!("episode {} was never started", turn.id))?;
                    *count += 1;
                    let said = turn.assistant.completion.contains("apple");
                    if !said && !turn.last {
                        return Ok(TurnResult::Observation(vec![Message { role: "user".into(), content: "No. Say apple.".into() }]));
                    }
                    let end = EpisodeEnd { components: vec![f64::from(u8::from(said))], metrics: vec![f64::from(*count)], monitor: false, ground_truth: false };
                    counts.remove(&turn.id);
                    Ok(TurnResult::End(end))
                })
                .collect()
        })
    }
}

export!(Legacy);
