//! The smallrl plugin SDK: a reward or reward-hack detector is a type that implements
//! [`Plugin`] (name, parameters) and [`Reward`] or [`Detector`] (a function over one sample),
//! exported with [`export_reward!`] or [`export_detector!`]:
//!
//! ```ignore
//! use smallrl_plugin_sdk::{Param, Params, Plugin, Reward, Sample, text};
//!
//! pub struct Exclaim { max_count: u64 }
//!
//! impl Plugin for Exclaim {
//!     const NAME: &'static str = "exclaim";
//!     const VERSION: &'static str = "0.1.0";
//!     const DESCRIPTION: &'static str = "min(number of '!' / max_count, 1)";
//!     fn params() -> Vec<Param> { vec![Param::integer("max_count", 3, "count that earns 1.0")] }
//!     fn from_params(params: &Params) -> Result<Self, String> {
//!         Ok(Self { max_count: params.positive_integer("max_count")? })
//!     }
//! }
//!
//! impl Reward for Exclaim {
//!     fn score(&self, sample: &Sample) -> f64 {
//!         let count = text::count_substring(&sample.completion, "!");
//!         (count as f64 / self.max_count as f64).min(1.0)
//!     }
//! }
//!
//! smallrl_plugin_sdk::export_reward!(Exclaim);
//! ```
//!
//! Built for `wasm32-unknown-unknown` and componentized, the plugin imports nothing but the
//! host's `log` function (used by the panic hook installed here, so a panic message reaches the
//! host's error), an environment that calls [`environment::host_judge`] the host's judge, and a
//! plugin that calls [`programs::run_programs`] the host's program runner (contract 0.4).
//! Natively the same types are plain Rust, which is how the host benchmarks and
//! tests the standard plugins against their wasm builds.

pub mod environment;
pub mod episode;
mod params;
pub mod programs;
pub mod text;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod guest;

pub use environment::{Component, Environment, Judgement, Prompt, PromptContent, Role, Split};
pub use episode::{CallEntry, EpisodeEnd, EpisodeEnvironment, Episodes, Step, Tool, Turn};
pub use params::{HfDataset, Param, ParamType, Params};

/// One completion, as the host sends it (see `wit/smallrl-reward.wit`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub prompt: String,
    /// Decoded with special tokens skipped.
    pub completion: String,
    /// The completion's token strings concatenated (read them with [`Sample::tokens`]);
    /// without the trailing end-of-sequence token.
    pub completion_tokens_joined: String,
    /// End byte offset of each token in `completion_tokens_joined`.
    pub completion_token_ends: Vec<u32>,
    pub completion_ids: Vec<u32>,
    pub ended_with_eos: bool,
    /// The prompt's metadata: the extra columns of its line in a JSONL prompt file, as one JSON
    /// object text (`{"answer":"cat","hackable":true}`); None for prompts without any. Read
    /// columns with [`Sample::metadata_str`] and [`Sample::metadata_bool`].
    pub metadata: Option<String>,
}

impl Sample {
    /// A sample from separate token strings (natively, e.g. in tests).
    pub fn new<T: AsRef<str>>(prompt: &str, completion: &str, tokens: &[T], ids: &[u32], ended_with_eos: bool) -> Self {
        let mut joined = String::new();
        let mut ends = Vec::with_capacity(tokens.len());
        for token in tokens {
            joined.push_str(token.as_ref());
            ends.push(joined.len() as u32);
        }
        Self {
            prompt: prompt.to_string(),
            completion: completion.to_string(),
            completion_tokens_joined: joined,
            completion_token_ends: ends,
            completion_ids: ids.to_vec(),
            ended_with_eos,
            metadata: None,
        }
    }

    /// The same sample with the prompt's metadata (a JSON object text).
    pub fn with_metadata(mut self, json: &str) -> Self {
        self.metadata = Some(json.to_string());
        self
    }

    /// One metadata column; None when the prompt has no metadata or not this column.
    pub fn metadata_value(&self, column: &str) -> Option<serde_json::Value> {
        let json = self.metadata.as_deref()?;
        // The host sends a JSON object or nothing; anything else is a broken host, not data.
        let object: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(json).expect("smallrl sends sample metadata as a JSON object");
        object.get(column).cloned()
    }

    /// A string column of the metadata (None: absent, or not a string).
    pub fn metadata_str(&self, column: &str) -> Option<String> {
        self.metadata_value(column)?.as_str().map(str::to_string)
    }

    /// A boolean column of the metadata (None: absent, or not a boolean).
    pub fn metadata_bool(&self, column: &str) -> Option<bool> {
        self.metadata_value(column)?.as_bool()
    }

    /// The completion's token strings, in order (`##` pieces kept, no end-of-sequence token).
    pub fn tokens(&self) -> impl Iterator<Item = &str> + '_ {
        let starts = std::iter::once(0).chain(self.completion_token_ends.iter().copied());
        let ranges = starts.zip(self.completion_token_ends.iter().copied());
        // A malformed range (never sent by smallrl) reads as an empty token rather than panicking.
        ranges.map(|(start, end)| self.completion_tokens_joined.get(start as usize..end as usize).unwrap_or(""))
    }
}

/// What every plugin declares: who it is and which parameters it takes.
pub trait Plugin: Sized + 'static {
    const NAME: &'static str;
    const VERSION: &'static str;
    const DESCRIPTION: &'static str;

    /// The accepted parameters with their defaults. Keys not listed here are rejected.
    fn params() -> Vec<Param> {
        Vec::new()
    }

    /// Builds the plugin from parameters already checked against [`Plugin::params`] (every
    /// declared name is present, with its default if the user did not set it).
    fn from_params(params: &Params) -> Result<Self, String>;
}

/// A reward: one finite score per sample, or (contract 0.5) no score for a sample it cannot
/// score (override [`Reward::score_batch_optional`]).
pub trait Reward: Plugin {
    fn score(&self, sample: &Sample) -> f64;

    /// Scores a whole batch; override only for rewards that need the batch at once.
    fn score_batch(&self, batch: &[Sample]) -> Result<Vec<f64>, String> {
        Ok(batch.iter().map(|sample| self.score(sample)).collect())
    }

    /// What the host receives: one score per sample, `None` for a sample without a score (TRL's
    /// `None`, contract 0.5: `plugin score` prints `none`, and a training run stops, naming the
    /// plugin, the step and the sample). By default
    /// [`Reward::score_batch`]'s scores, every one present; override it to leave samples
    /// unscored.
    fn score_batch_optional(&self, batch: &[Sample]) -> Result<Vec<Option<f64>>, String> {
        Ok(self.score_batch(batch)?.into_iter().map(Some).collect())
    }
}

/// A reward-hack detector: one flag per sample (true = hacking detected).
pub trait Detector: Plugin {
    fn detect(&self, sample: &Sample) -> bool;

    /// Flags a whole batch; override only for detectors that need the batch at once.
    fn detect_batch(&self, batch: &[Sample]) -> Result<Vec<bool>, String> {
        Ok(batch.iter().map(|sample| self.detect(sample)).collect())
    }
}

/// Parses parameters given as JSON text (`""` or `{}`: all defaults) and builds the plugin.
/// The guest glue calls this for `configure`; natively it builds the same plugin directly.
pub fn configure<P: Plugin>(params_json: &str) -> Result<P, String> {
    let params = Params::parse(P::NAME, &P::params(), params_json)?;
    P::from_params(&params)
}

/// Exports a [`Reward`] type as the plugin's reward world (a no-op outside wasm32).
#[macro_export]
macro_rules! export_reward {
    ($plugin:ty) => {
        $crate::__export_world!($plugin, reward, reward_info, scorer, score, Option<f64>, export_reward_world);
    };
}

/// Exports a [`Detector`] type as the plugin's detector world (a no-op outside wasm32).
#[macro_export]
macro_rules! export_detector {
    ($plugin:ty) => {
        $crate::__export_world!($plugin, detector, detector_info, flagger, detect, bool, export_detector_world);
    };
}

/// The glue both export macros share: the wit-bindgen `Guest` impls that forward to
/// `guest::*`, then wit-bindgen's own export macro for the world.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_world {
    ($plugin:ty, $world:ident, $info:ident, $interface:ident, $call:ident, $output:ty, $export_world:ident) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct SmallrlGuest;
            impl $crate::guest::$world::exports::smallrl::reward::plugin::Guest for SmallrlGuest {
                fn info() -> $crate::guest::$world::smallrl::reward::types::PluginInfo {
                    $crate::guest::$info::<$plugin>()
                }
                fn configure(params_json: String) -> Result<(), String> {
                    $crate::guest::configure::<$plugin>(&params_json)
                }
            }
            impl $crate::guest::$world::exports::smallrl::reward::$interface::Guest for SmallrlGuest {
                fn $call(
                    batch: Vec<$crate::guest::$world::smallrl::reward::types::Sample>,
                ) -> Result<Vec<$output>, String> {
                    $crate::guest::$call::<$plugin>(batch)
                }
            }
            $crate::guest::$world::$export_world!(SmallrlGuest with_types_in $crate::guest::$world);
        };
    };
}

/// Exports an [`Environment`] type as the plugin's environment world (a no-op outside wasm32).
#[macro_export]
macro_rules! export_environment {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct SmallrlGuest;
            impl $crate::guest::environment::exports::smallrl::reward::env::Guest for SmallrlGuest {
                fn info() -> $crate::guest::environment::smallrl::reward::environment_types::EnvironmentInfo {
                    $crate::guest::environment_info::<$plugin>()
                }
                fn configure(params_json: String) -> Result<(), String> {
                    $crate::guest::configure::<$plugin>(&params_json)
                }
                fn generate(
                    split: $crate::guest::environment::smallrl::reward::environment_types::Split,
                    count: u32,
                    seed: u64,
                    hack_frac: f64,
                ) -> Result<Vec<$crate::guest::environment::smallrl::reward::environment_types::Prompt>, String> {
                    $crate::guest::generate::<$plugin>(split, count, seed, hack_frac)
                }
                fn score(
                    batch: Vec<$crate::guest::environment::smallrl::reward::types::Sample>,
                ) -> Result<$crate::guest::environment::smallrl::reward::environment_types::Scores, String> {
                    $crate::guest::environment_score::<$plugin>(batch)
                }
                fn monitor(batch: Vec<$crate::guest::environment::smallrl::reward::types::Sample>) -> Result<Vec<bool>, String> {
                    $crate::guest::environment_flags::<$plugin>(batch, false)
                }
                fn ground_truth(batch: Vec<$crate::guest::environment::smallrl::reward::types::Sample>) -> Result<Vec<bool>, String> {
                    $crate::guest::environment_flags::<$plugin>(batch, true)
                }
            }
            $crate::guest::environment::export_environment_world!(SmallrlGuest with_types_in $crate::guest::environment);
        };
    };
}

/// Exports an [`EpisodeEnvironment`] type as the plugin's episode-environment world (feature
/// `episode`; a no-op outside wasm32).
#[macro_export]
macro_rules! export_episode_environment {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::guest::environment::smallrl::reward::{environment_types as env_wit, episode_types as episode_wit, types::Sample as WitSample};
            struct SmallrlGuest;
            impl $crate::guest::environment::exports::smallrl::reward::env::Guest for SmallrlGuest {
                fn info() -> env_wit::EnvironmentInfo {
                    $crate::guest::episode_info::<$plugin>()
                }
                fn configure(params_json: String) -> Result<(), String> {
                    $crate::guest::configure::<$plugin>(&params_json)
                }
                fn generate(split: env_wit::Split, count: u32, seed: u64, hack_frac: f64) -> Result<Vec<env_wit::Prompt>, String> {
                    $crate::guest::episode_generate::<$plugin>(split, count, seed, hack_frac)
                }
                fn score(_batch: Vec<WitSample>) -> Result<env_wit::Scores, String> {
                    $crate::guest::not_for_episodes("score")
                }
                fn monitor(_batch: Vec<WitSample>) -> Result<Vec<bool>, String> {
                    $crate::guest::not_for_episodes("monitor")
                }
                fn ground_truth(_batch: Vec<WitSample>) -> Result<Vec<bool>, String> {
                    $crate::guest::not_for_episodes("ground-truth")
                }
            }
            impl $crate::guest::environment::exports::smallrl::reward::episodes::Guest for SmallrlGuest {
                fn start(episodes: Vec<episode_wit::EpisodeStart>) -> Result<Vec<Vec<episode_wit::Tool>>, String> {
                    $crate::guest::episode_start::<$plugin>(episodes)
                }
                fn step(turns: Vec<episode_wit::Turn>) -> Result<Vec<episode_wit::TurnResult>, String> {
                    $crate::guest::episode_step::<$plugin>(turns)
                }
            }
            $crate::guest::environment::export_episode_environment_world!(SmallrlGuest with_types_in $crate::guest::environment);
        };
    };
}
