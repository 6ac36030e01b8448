//! `smallrl plugin new NAME --episode`: the template of a multi-turn episode environment crate
//! (the rest of the crate, build script and manifest, is `scaffold.rs`'s). The template is the
//! Python `--episode` scaffold's game in Rust: "Game 12. Say the word: apple."; a turn that says
//! the word ends the episode, any other is answered "No. Say the word: apple." until the host's
//! last turn. Its tests play episodes natively through the SDK's `Episodes`, each answer worked
//! out by hand; `tests/plugin_scaffold.rs` builds it and plays the same episode in the host.

/// The template's words (the prompt's word is drawn from the first `max_word`).
const TEMPLATE_WORDS: &[&str] = &["apple", "river", "stone", "cloud", "garden", "lantern", "meadow", "violin", "harbor", "orchard", "pebble", "thunder"];

/// The crate's `src/lib.rs` (`type_name` the Rust type for `name`).
pub fn lib_rs(name: &str, type_name: &str) -> String {
    format!(
        r##"//! `{name}`: a smallrl multi-turn episode environment. Edit the generator, `start` and `step`,
//! then `./build.sh` and train: `smallrl train --environment {name}.wasm --model ...`.
//!
//! The template: "Game 12. Say the word: apple." The model answers; a turn that says the word
//! (any case) ends the episode, any other gets "No. Say the word: apple." back (a `user`
//! message), until the host's last turn, which must end it. Components (retain): `said` (1 when
//! a turn said the word) and `speed` (1 / turns when it did, else 0); metric `turns`. Nothing
//! to hack: no prompt is hackable, monitor and ground truth are false.

use serde_json::Value;
use smallrl_plugin_sdk::environment::{{draw_prompts, in_eval_split, split_rng}};
use smallrl_plugin_sdk::{{Component, EpisodeEnd, EpisodeEnvironment, Judgement, Param, Params, Plugin, Prompt, Split, Step, Turn}};

const WORDS: &[&str] = &{words:?};

pub struct {type_name} {{
    max_word: u64,
}}

impl Plugin for {type_name} {{
    const NAME: &'static str = "{name}";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "Say a word, told again after each miss";

    fn params() -> Vec<Param> {{
        vec![Param::integer("max_word", {max_word}, "draw the word from the first max_word of the list")]
    }}

    fn from_params(params: &Params) -> Result<Self, String> {{
        Ok(Self {{ max_word: params.positive_integer("max_word")? }})
    }}
}}

/// One episode's state: whatever `step` needs, changed in place. It must be a deterministic
/// function of the prompt and the turns (the host replays episodes on resume).
#[derive(Clone, Debug, PartialEq)]
pub struct Game {{
    word: String,
    turns: u64,
}}

/// The end of `game`: said or not.
fn end(game: &Game, said: bool) -> Step {{
    let (said, speed) = if said {{ (1.0, 1.0 / game.turns as f64) }} else {{ (0.0, 0.0) }};
    Step::End(EpisodeEnd {{ judgement: Judgement {{ components: vec![said, speed], metrics: vec![game.turns as f64] }}, monitor: false, ground_truth: false }})
}}

impl EpisodeEnvironment for {type_name} {{
    type State = Game;

    fn components() -> Vec<Component> {{
        vec![
            Component::retain("said", "1 when a turn said the word"),
            Component::retain("speed", "1 / turns when a turn said the word, else 0"),
        ]
    }}

    fn metrics() -> Vec<&'static str> {{
        vec!["turns"]
    }}

    /// Exactly `count` prompts; a game is in the eval split by a hash of its id, so the splits
    /// never share a prompt.
    fn generate(&self, split: Split, count: usize, seed: u64, _hack_frac: f64) -> Result<Vec<Prompt>, String> {{
        let mut rng = split_rng(Self::NAME, split, seed);
        let words = self.max_word.min(WORDS.len() as u64);
        // `draw_prompts` calls this until `count` prompts are kept (None rejects a candidate) and
        // fails, rather than looping, if they cannot be found.
        draw_prompts(count, "games", |_| {{
            let word = WORDS[rng.range(0, words - 1) as usize];
            let game = rng.range(0, 999_999);
            let wanted = in_eval_split(&format!("game {{game}}")) == (split == Split::Eval);
            wanted.then(|| Prompt::text(format!("Game {{game}}. Say the word: {{word}}."), false, false, [("word", Value::from(word))]))
        }})
    }}

    fn start(&self, prompt: &Prompt) -> Result<Game, String> {{
        let word = prompt.metadata.get("word").and_then(Value::as_str).ok_or("the prompt's metadata has no string `word`")?;
        Ok(Game {{ word: word.to_string(), turns: 0 }})
    }}

    /// `turn.sample.completion` is this turn's text only (`turn.calls`: the tool calls the host
    /// parsed, where the episode declares tools with `fn tools` and the model's chat template
    /// has a tool-call format); on the `last` turn the answer must be an end.
    fn step(&self, game: &mut Game, turn: &Turn, last: bool) -> Step {{
        game.turns += 1;
        let said = turn.sample.completion.to_lowercase().contains(&game.word);
        if said || last {{
            return end(game, said);
        }}
        Step::user(format!("No. Say the word: {{}}.", game.word))
    }}
}}

smallrl_plugin_sdk::export_episode_environment!({type_name});

#[cfg(test)]
mod tests {{
    use smallrl_plugin_sdk::{{Episodes, Sample, configure}};

    use super::*;

    fn env() -> {type_name} {{
        configure("{{}}").unwrap()
    }}

    fn turn(text: &str) -> Turn {{
        Turn {{ sample: Sample::new("", text, &[text], &[0], true), calls: None }}
    }}

    fn apple() -> Prompt {{
        Prompt::text("Game 1. Say the word: apple.", false, false, [("word", Value::from("apple"))])
    }}

    fn ended(said: f64, speed: f64, turns: f64) -> Step {{
        Step::End(EpisodeEnd {{ judgement: Judgement {{ components: vec![said, speed], metrics: vec![turns] }}, monitor: false, ground_truth: false }})
    }}

    #[test]
    fn an_episode_played_by_hand() {{
        let env = env();
        let mut episodes = Episodes::default();
        episodes.start(&env, 7, &apple()).unwrap();
        assert_eq!(episodes.step(&env, 7, &turn("a pear"), false).unwrap(), Step::user("No. Say the word: apple."));
        // Said at the second turn: said 1, speed 1/2, turns 2.
        assert_eq!(episodes.step(&env, 7, &turn("An APPLE!"), false).unwrap(), ended(1.0, 0.5, 2.0));
        assert_eq!(episodes.in_flight(), 0);
        episodes.start(&env, 8, &apple()).unwrap();
        assert_eq!(episodes.step(&env, 8, &turn("no"), true).unwrap(), ended(0.0, 0.0, 1.0), "the last turn ends it");
    }}

    #[test]
    fn prompts_are_exact_in_count_and_split_apart() {{
        let (train, eval) = (env().generate(Split::Train, 40, 7, 0.0).unwrap(), env().generate(Split::Eval, 10, 7, 0.0).unwrap());
        assert_eq!((train.len(), eval.len()), (40, 10));
        assert!(eval.iter().all(|p| !train.iter().any(|t| t.content == p.content)));
        assert_eq!(train, env().generate(Split::Train, 40, 7, 0.0).unwrap(), "a pure function of its arguments");
        assert!(configure::<{type_name}>(r#"{{"max_word": 0}}"#).is_err());
    }}
}}
"##,
        words = TEMPLATE_WORDS,
        max_word = TEMPLATE_WORDS.len(),
    )
}
