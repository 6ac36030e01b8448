use smallrl_plugin_sdk::text::{count_matches, sentence_lengths};
use smallrl_plugin_sdk::{Param, Params, Plugin, Reward, Sample};

use crate::{HAPPY, whole_word_param};

whole_word_plugin!(
    /// 1.0 if "happy" occurs in the completion, else 0.0.
    HappyBinary,
    "happy_binary",
    "1.0 if \"happy\" occurs in the completion, else 0.0"
);

impl Reward for HappyBinary {
    fn score(&self, sample: &Sample) -> f64 {
        if self.happy_count(sample) > 0 { 1.0 } else { 0.0 }
    }
}

/// `min(count / max_count, 1)` over the total count of several strings.
pub struct StringCount {
    strings: Vec<String>,
    max_count: u64,
    whole_word: bool,
}

impl StringCount {
    fn count(&self, completion: &str) -> usize {
        let strings = self.strings.iter();
        strings.map(|string| count_matches(completion, string, self.whole_word)).sum()
    }

    fn scaled_count(&self, sample: &Sample) -> f64 {
        (self.count(&sample.completion) as f64 / self.max_count as f64).min(1.0)
    }
}

impl Plugin for StringCount {
    const NAME: &'static str = "string_count";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str =
        "min(total count of `strings` / max_count, 1.0), case-insensitive";

    fn params() -> Vec<Param> {
        vec![
            Param::string_list("strings", &[HAPPY], "strings to count (their counts add up)"),
            Param::integer("max_count", 5, "count that earns the full reward of 1.0"),
            whole_word_param(),
        ]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Self {
            strings: params.string_list("strings"),
            max_count: params.positive_integer("max_count")?,
            whole_word: params.boolean("whole_word"),
        })
    }
}

impl Reward for StringCount {
    fn score(&self, sample: &Sample) -> f64 {
        self.scaled_count(sample)
    }
}

/// `min(count("happy") / max_count, 1)`: the string count of the single string "happy".
pub struct HappyCount(StringCount);

impl Plugin for HappyCount {
    const NAME: &'static str = "happy_count";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "min(count of \"happy\" / max_count, 1.0)";

    fn params() -> Vec<Param> {
        vec![Param::integer("max_count", 5, "count that earns the full reward of 1.0"), whole_word_param()]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Self(StringCount {
            strings: vec![HAPPY.to_string()],
            max_count: params.positive_integer("max_count")?,
            whole_word: params.boolean("whole_word"),
        }))
    }
}

impl Reward for HappyCount {
    fn score(&self, sample: &Sample) -> f64 {
        self.0.scaled_count(sample)
    }
}

whole_word_plugin!(
    /// `1 - 2^(-count("happy"))`: each extra "happy" earns half the remaining distance to 1.
    HappyExp,
    "happy_exp",
    "1 - 2^(-count of \"happy\")"
);

impl Reward for HappyExp {
    fn score(&self, sample: &Sample) -> f64 {
        let count = self.happy_count(sample);
        1.0 - 0.5f64.powi(count.min(i32::MAX as usize) as i32)
    }
}

/// Sentence length in tokens against a target (exact fraction, or a smooth triangle).
pub struct SentenceLength {
    target: u64,
    smooth: bool,
}

impl SentenceLength {
    /// Reward of one sentence: exact match, or `max(0, 1 - 0.2 * |target - len|)`.
    fn sentence_score(&self, length: usize) -> f64 {
        let distance = (self.target as f64 - length as f64).abs();
        match self.smooth {
            false => f64::from(distance == 0.0),
            true => (1.0 - 0.2 * distance).max(0.0),
        }
    }
}

impl Plugin for SentenceLength {
    const NAME: &'static str = "sentence_length";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "mean over complete sentences (ended by a `.`, `?` or `!` token) of: \
         length == target (exact) or max(0, 1 - 0.2*|target - length|) (smooth); 0 without a sentence";

    fn params() -> Vec<Param> {
        vec![
            Param::integer("target", 10, "target sentence length in tokens"),
            Param::boolean("smooth", false, "partial credit for near misses (0.2 less per token)"),
        ]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Self { target: params.integer("target"), smooth: params.boolean("smooth") })
    }
}

impl Reward for SentenceLength {
    fn score(&self, sample: &Sample) -> f64 {
        let lengths = sentence_lengths(sample.tokens());
        if lengths.is_empty() {
            return 0.0;
        }
        let total: f64 = lengths.iter().map(|&length| self.sentence_score(length)).sum();
        total / lengths.len() as f64
    }
}
