//! The standard rewards and detectors (reference §3 and §4). Each `plugins/<name>` crate
//! exports one of these types as a WebAssembly component; the host links this crate natively
//! to benchmark and test the wasm builds against the same functions.

/// Declares a plugin whose only parameter is `whole_word` (the struct, its `Plugin` impl and
/// `happy_count`, the count of "happy" it judges by). Must precede the modules that use it.
macro_rules! whole_word_plugin {
    ($(#[$doc:meta])* $type:ident, $name:literal, $description:literal) => {
        $(#[$doc])*
        pub struct $type {
            whole_word: bool,
        }

        impl smallrl_plugin_sdk::Plugin for $type {
            const NAME: &'static str = $name;
            const VERSION: &'static str = "0.1.0";
            const DESCRIPTION: &'static str = $description;

            fn params() -> Vec<smallrl_plugin_sdk::Param> {
                vec![crate::whole_word_param()]
            }

            fn from_params(params: &smallrl_plugin_sdk::Params) -> Result<Self, String> {
                Ok(Self { whole_word: params.boolean("whole_word") })
            }
        }

        impl $type {
            fn happy_count(&self, sample: &smallrl_plugin_sdk::Sample) -> usize {
                smallrl_plugin_sdk::text::count_matches(&sample.completion, crate::HAPPY, self.whole_word)
            }
        }
    };
}

mod answer;
mod detectors;
mod rewards;

pub use answer::{AnswerCount, AnswerRepeat};
pub use detectors::{ContainsWords, HappyAny, HappyCountDetector, HappyDensity};
pub use rewards::{HappyBinary, HappyCount, HappyExp, SentenceLength, StringCount};

use smallrl_plugin_sdk::Param;

/// The word every "happy" plugin looks for.
const HAPPY: &str = "happy";

fn whole_word_param() -> Param {
    Param::boolean("whole_word", false, "count whole words only (default: substrings, so \"unhappy\" counts)")
}
