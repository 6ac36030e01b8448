//! The standard rewards and detectors (reference §3 and §4). Each `plugins/<name>` crate
//! exports one of these types as a WebAssembly component; the host links this crate natively
//! to benchmark and test the wasm builds against the same functions.

mod detectors;
mod rewards;

pub use detectors::{ContainsWords, HappyAny, HappyCountDetector, HappyDensity};
pub use rewards::{HappyBinary, HappyCount, HappyExp, SentenceLength, StringCount};

use smallrl_plugin_sdk::Param;

/// The word every "happy" plugin looks for.
const HAPPY: &str = "happy";

fn whole_word_param() -> Param {
    Param::boolean("whole_word", false, "count whole words only (default: substrings, so \"unhappy\" counts)")
}
