//! The `guess_number` episode environment (issue 48): the smallest multi-turn task, for tests.
//!
//! - Prompt: "Game {id}. I am thinking of a number from 1 to {max_number}. Guess it: answer with
//!   one number. I will say higher or lower." The game id (0..1,000,000) makes each prompt
//!   text its own; a game is in the evaluation split when [`in_eval_split`] of "game {id}" holds.
//!   The secret is uniform in 1..=max_number. Metadata: `secret`, `hackable` and `detectable`
//!   false (there is no hack).
//! - The plain-text protocol (for models without a tool-call template): an assistant turn is free
//!   text; its first integer is the guess. The answer is a `user` message: "higher" (the secret
//!   is larger), "lower", or, for a turn without an integer (a malformed turn), "Answer with one
//!   number from 1 to {max_number}." A right guess ends the episode, as does the host's last turn.
//! - Components (retain): `solved` 1 when a guess hit the secret, else 0; `closeness`
//!   1 - |last guess - secret| / (max_number - 1), clamped to [0, 1], 0 without any guess (a
//!   dense signal for tiny models).
//! - Metrics: `turns` (assistant turns), `malformed` (turns without an integer).
//! - monitor and ground truth: false (nothing to hack).

use serde_json::Value;
use smallrl_plugin_sdk::environment::{draw_prompts, in_eval_split, ints, split_rng};
use smallrl_plugin_sdk::{Component, EpisodeEnd, EpisodeEnvironment, Judgement, Param, Params, Plugin, Prompt, Sample, Split, Step};

pub struct GuessNumber {
    max_number: u64,
}

impl Plugin for GuessNumber {
    const NAME: &'static str = "guess_number";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "Multi-turn: guess a secret number from 1 to max_number, told higher or lower after each guess";

    fn params() -> Vec<Param> {
        vec![Param::integer("max_number", 16, "the secret is uniform in 1..=max_number (2 to 1,000,000)")]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        let max_number = params.positive_integer("max_number")?;
        if !(2..=1_000_000).contains(&max_number) {
            return Err(format!("max_number must be in 2..=1000000, got {max_number}"));
        }
        Ok(Self { max_number })
    }
}

/// One game in flight.
#[derive(Clone, Debug, PartialEq)]
pub struct Game {
    secret: u64,
    turns: u64,
    malformed: u64,
    last_guess: Option<i64>,
}

impl GuessNumber {
    pub fn prompt(&self, game: u64, secret: u64) -> Prompt {
        let text = format!("Game {game}. I am thinking of a number from 1 to {}. Guess it: answer with one number. I will say higher or lower.", self.max_number);
        Prompt::text(text, false, false, [("secret", Value::from(secret))])
    }

    fn end(&self, game: &Game, solved: bool) -> Step {
        let closeness = game.last_guess.map_or(0.0, |guess| {
            let distance = (guess - game.secret as i64).unsigned_abs() as f64;
            (1.0 - distance / (self.max_number - 1) as f64).clamp(0.0, 1.0)
        });
        Step::End(EpisodeEnd {
            judgement: Judgement { components: vec![f64::from(u8::from(solved)), closeness], metrics: vec![game.turns as f64, game.malformed as f64] },
            monitor: false,
            ground_truth: false,
        })
    }
}

impl EpisodeEnvironment for GuessNumber {
    type State = Game;

    fn components() -> Vec<Component> {
        vec![
            Component::retain("solved", "1 when a guess hit the secret"),
            Component::retain("closeness", "1 - |last guess - secret| / (max_number - 1); 0 without a guess"),
        ]
    }

    fn metrics() -> Vec<&'static str> {
        vec!["turns", "malformed"]
    }

    fn generate(&self, split: Split, count: usize, seed: u64, _hack_frac: f64) -> Result<Vec<Prompt>, String> {
        let mut rng = split_rng(Self::NAME, split, seed);
        let mut seen = std::collections::BTreeSet::new();
        draw_prompts(count, "games", |_| {
            let game = rng.range(0, 999_999);
            let secret = rng.range(1, self.max_number);
            let wanted = in_eval_split(&format!("game {game}")) == (split == Split::Eval);
            (wanted && seen.insert(game)).then(|| self.prompt(game, secret))
        })
    }

    fn start(&self, prompt: &Prompt) -> Result<Game, String> {
        let secret = prompt.metadata.get("secret").and_then(Value::as_u64).ok_or("the prompt's metadata has no integer `secret`")?;
        Ok(Game { secret, turns: 0, malformed: 0, last_guess: None })
    }

    fn step(&self, game: &mut Game, turn: &Sample, last: bool) -> Step {
        game.turns += 1;
        let Some(&guess) = ints(&turn.completion).first() else {
            game.malformed += 1;
            return match last {
                true => self.end(game, false),
                false => Step::user(format!("Answer with one number from 1 to {}.", self.max_number)),
            };
        };
        game.last_guess = Some(guess);
        let secret = game.secret as i64;
        match guess == secret {
            true => self.end(game, true),
            false if last => self.end(game, false),
            false => Step::user(if guess < secret { "higher" } else { "lower" }),
        }
    }
}

smallrl_plugin_sdk::export_episode_environment!(GuessNumber);

#[cfg(test)]
mod tests;
