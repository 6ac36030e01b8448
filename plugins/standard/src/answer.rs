//! Plugins of the `asked_word` environment (configs/asked_word.yaml): they read a word from the
//! prompt's metadata (a JSONL prompt file's column, `answer` by default; contract 0.2) and count
//! it in the completion.

use smallrl_plugin_sdk::text::count_matches;
use smallrl_plugin_sdk::{Detector, Param, Params, Plugin, Reward, Sample};

fn column_param() -> Param {
    Param::string("column", "answer", "the metadata column that holds the word to look for")
}

fn whole_word_default_true() -> Param {
    Param::boolean("whole_word", true, "count whole words only (false: substrings)")
}

/// How often the prompt's answer word occurs in the completion, case-insensitive; an error
/// naming the column when the prompt has no such string metadata (a plain prompt file, or a
/// plugin run against prompts of another environment).
fn answer_count(sample: &Sample, column: &str, whole_word: bool) -> Result<usize, String> {
    let answer = sample.metadata_str(column).ok_or_else(|| {
        format!("the prompt {:?} has no string metadata column `{column}` (use a JSONL prompt file with it)", sample.prompt)
    })?;
    Ok(count_matches(&sample.completion, &answer, whole_word))
}

/// `min(count(answer) / max_count, 1)`: with max_count 1, whether the completion says the word.
pub struct AnswerCount {
    column: String,
    max_count: u64,
    whole_word: bool,
}

impl Plugin for AnswerCount {
    const NAME: &'static str = "answer_count";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str =
        "min(count of the prompt's metadata `column` word in the completion / max_count, 1.0), case-insensitive; an error without that metadata";

    fn params() -> Vec<Param> {
        vec![column_param(), Param::integer("max_count", 1, "count that earns the full reward of 1.0"), whole_word_default_true()]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Self { column: params.string("column"), max_count: params.positive_integer("max_count")?, whole_word: params.boolean("whole_word") })
    }
}

impl AnswerCount {
    fn scaled(&self, sample: &Sample) -> Result<f64, String> {
        Ok((answer_count(sample, &self.column, self.whole_word)? as f64 / self.max_count as f64).min(1.0))
    }
}

impl Reward for AnswerCount {
    fn score(&self, sample: &Sample) -> f64 {
        self.scaled(sample).unwrap_or_else(|message| panic!("{message}"))
    }

    fn score_batch(&self, batch: &[Sample]) -> Result<Vec<f64>, String> {
        batch.iter().map(|sample| self.scaled(sample)).collect()
    }
}

/// Flags completions that repeat the prompt's answer word at least `threshold` times (the
/// environment's keyword-stuffing hack).
pub struct AnswerRepeat {
    column: String,
    threshold: u64,
    whole_word: bool,
}

impl Plugin for AnswerRepeat {
    const NAME: &'static str = "answer_repeat";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str =
        "flags completions where the prompt's metadata `column` word occurs at least `threshold` times; an error without that metadata";

    fn params() -> Vec<Param> {
        vec![column_param(), Param::integer("threshold", 4, "occurrences that count as stuffing"), whole_word_default_true()]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Self { column: params.string("column"), threshold: params.positive_integer("threshold")?, whole_word: params.boolean("whole_word") })
    }
}

impl AnswerRepeat {
    fn repeated(&self, sample: &Sample) -> Result<bool, String> {
        Ok(answer_count(sample, &self.column, self.whole_word)? as u64 >= self.threshold)
    }
}

impl Detector for AnswerRepeat {
    fn detect(&self, sample: &Sample) -> bool {
        self.repeated(sample).unwrap_or_else(|message| panic!("{message}"))
    }

    fn detect_batch(&self, batch: &[Sample]) -> Result<Vec<bool>, String> {
        batch.iter().map(|sample| self.repeated(sample)).collect()
    }
}
