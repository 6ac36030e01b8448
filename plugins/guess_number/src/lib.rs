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
//!   `guess` chooses how a turn's guess is read: `integer` (the default, as above),
//!   `number_word` (the first integer or number word "one" to "twenty", any case, whichever
//!   comes first), or `word_length` (the letter count of the turn's first word: a protocol a
//!   model that never writes a number can play; tiny-stories writes no digit and almost never a
//!   number word, so the learning test of `tests/episodes_train.rs` plays this one).
//! - Components (retain): `solved` 1 when a guess hit the secret, else 0; `closeness`
//!   1 - |last guess - secret| / (max_number - 1), clamped to [0, 1], 0 without any guess (a
//!   dense signal for tiny models).
//! - Metrics: `turns` (assistant turns), `malformed` (turns without an integer).
//! - monitor and ground truth: false (nothing to hack).

use serde_json::Value;
use smallrl_plugin_sdk::environment::{draw_prompts, in_eval_split, ints, split_rng};
use smallrl_plugin_sdk::{Component, EpisodeEnd, EpisodeEnvironment, Judgement, Param, Params, Plugin, Prompt, Split, Step, Turn};

pub struct GuessNumber {
    max_number: u64,
    guess: Guess,
}

/// How a turn's guess is read (the `guess` parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guess {
    Integer,
    NumberWord,
    WordLength,
}

/// The number words `guess: number_word` reads, "one" (1) to "twenty" (20).
const NUMBER_WORDS: [&str; 20] = [
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty",
];

/// The byte offset and value of the first number word of `text` (a whole word).
fn first_number_word(text: &str) -> Option<(usize, i64)> {
    let mut start = None;
    for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
        if c.is_alphanumeric() {
            start.get_or_insert(i);
        } else if let Some(s) = start.take() {
            if let Some(n) = NUMBER_WORDS.iter().position(|w| text[s..i].eq_ignore_ascii_case(w)) {
                return Some((s, n as i64 + 1));
            }
        }
    }
    None
}

impl Plugin for GuessNumber {
    const NAME: &'static str = "guess_number";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "Multi-turn: guess a secret number from 1 to max_number, told higher or lower after each guess";

    fn params() -> Vec<Param> {
        vec![
            Param::integer("max_number", 16, "the secret is uniform in 1..=max_number (2 to 1,000,000)"),
            Param::string("guess", "integer", "how a turn's guess is read: integer (its first integer), number_word (its first integer or number word one to twenty) or word_length (its first word's letter count)"),
        ]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        let max_number = params.positive_integer("max_number")?;
        if !(2..=1_000_000).contains(&max_number) {
            return Err(format!("max_number must be in 2..=1000000, got {max_number}"));
        }
        let guess = match params.string("guess").as_str() {
            "integer" => Guess::Integer,
            "number_word" => Guess::NumberWord,
            "word_length" => Guess::WordLength,
            other => return Err(format!("guess must be integer, number_word or word_length, got {other:?}")),
        };
        Ok(Self { max_number, guess })
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

    /// A turn's guess, read as the `guess` parameter says (None: a malformed turn).
    pub fn guess(&self, text: &str) -> Option<i64> {
        let integer = || text.find(|c: char| c.is_ascii_digit()).map(|at| (at, ints(text)[0]));
        match self.guess {
            Guess::Integer => integer().map(|(_, value)| value),
            Guess::NumberWord => match (integer(), first_number_word(text)) {
                (Some(i), Some(w)) => Some(if w.0 < i.0 { w.1 } else { i.1 }),
                (i, w) => i.or(w).map(|(_, value)| value),
            },
            Guess::WordLength => text.split(|c: char| !c.is_alphabetic()).find(|word| !word.is_empty()).map(|word| word.chars().count() as i64),
        }
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

    fn step(&self, game: &mut Game, turn: &Turn, last: bool) -> Step {
        game.turns += 1;
        let Some(guess) = self.guess(&turn.sample.completion) else {
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
