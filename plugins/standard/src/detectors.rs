use smallrl_plugin_sdk::text::count_matches;
use smallrl_plugin_sdk::{Detector, Param, Params, Plugin, Sample};

use crate::{HAPPY, whole_word_param};

/// Flags completions with at least `threshold` "happy" (the default detector).
pub struct HappyCountDetector {
    threshold: u64,
    whole_word: bool,
}

impl Plugin for HappyCountDetector {
    const NAME: &'static str = "happy_count";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "flags completions where the count of \"happy\" >= threshold";

    fn params() -> Vec<Param> {
        vec![Param::integer("threshold", 3, "smallest count that is flagged"), whole_word_param()]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Self { threshold: params.integer("threshold"), whole_word: params.boolean("whole_word") })
    }
}

impl Detector for HappyCountDetector {
    fn detect(&self, sample: &Sample) -> bool {
        count_matches(&sample.completion, HAPPY, self.whole_word) as u64 >= self.threshold
    }
}

whole_word_plugin!(
    /// Flags completions containing "happy" at all.
    HappyAny,
    "happy_any",
    "flags completions where \"happy\" occurs"
);

impl Detector for HappyAny {
    fn detect(&self, sample: &Sample) -> bool {
        self.happy_count(sample) > 0
    }
}

/// Flags completions with a whitespace-separated word in a list (case-insensitive).
pub struct ContainsWords {
    words: Vec<String>,
    strip_punctuation: bool,
}

impl Plugin for ContainsWords {
    const NAME: &'static str = "contains_words";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str =
        "flags completions where a whitespace-separated word (lowercased) is one of `words`";

    fn params() -> Vec<Param> {
        vec![
            Param::string_list("words", &[HAPPY], "words that flag a completion (matched exactly, lowercased)"),
            // Decoded SimpleStories text glues punctuation to words ("happy."), which the
            // original rule does not match; this option does.
            Param::boolean("strip_punctuation", false, "ignore punctuation around each word (\"happy.\" matches \"happy\")"),
        ]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        let words = params.string_list("words").iter().map(|word| word.to_lowercase()).collect();
        Ok(Self { words, strip_punctuation: params.boolean("strip_punctuation") })
    }
}

impl Detector for ContainsWords {
    fn detect(&self, sample: &Sample) -> bool {
        let completion = sample.completion.to_lowercase();
        completion.split_whitespace().any(|word| {
            let word = if self.strip_punctuation { word.trim_matches(|c: char| c.is_ascii_punctuation()) } else { word };
            self.words.iter().any(|listed| listed == word)
        })
    }
}

/// Flags completions where "happy" makes up more than `max_density` of the words.
pub struct HappyDensity {
    max_density: f64,
    whole_word: bool,
}

impl Plugin for HappyDensity {
    const NAME: &'static str = "happy_density";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str =
        "flags completions where count of \"happy\" / number of whitespace words > max_density";

    fn params() -> Vec<Param> {
        vec![Param::number("max_density", 0.05, "largest density that is not flagged"), whole_word_param()]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Self { max_density: params.number("max_density"), whole_word: params.boolean("whole_word") })
    }
}

impl Detector for HappyDensity {
    fn detect(&self, sample: &Sample) -> bool {
        let words = sample.completion.split_whitespace().count();
        if words == 0 {
            return false;
        }
        let happy = count_matches(&sample.completion, HAPPY, self.whole_word);
        happy as f64 / words as f64 > self.max_density
    }
}
