//! The component glue (wasm32 only): wit-bindgen bindings for both worlds, the configured
//! plugin's storage, the panic hook that forwards messages to the host's `log`, and the
//! conversions between the bindings' types and the SDK's plain ones. Used by the export macros.

use std::any::Any;
use std::cell::RefCell;

use crate::{Param, Plugin, Sample};
#[cfg(feature = "detector")]
use crate::Detector;
#[cfg(feature = "reward")]
use crate::Reward;

#[cfg(any(all(feature = "reward", feature = "detector"), all(feature = "reward", feature = "environment"), all(feature = "detector", feature = "environment")))]
compile_error!("smallrl-plugin-sdk: enable only one of the features `reward`, `detector` and `environment` (build each kind of plugin in its own cargo invocation)");
#[cfg(not(any(feature = "reward", feature = "detector", feature = "environment")))]
compile_error!("smallrl-plugin-sdk: enable the feature `reward`, `detector` or `environment` for a wasm plugin");

#[cfg(feature = "reward")]
pub mod reward {
    wit_bindgen::generate!({
        world: "reward",
        path: "../../wit",
        default_bindings_module: "smallrl_plugin_sdk::guest::reward",
        pub_export_macro: true,
        export_macro_name: "export_reward_world",
    });
}

#[cfg(feature = "detector")]
pub mod detector {
    wit_bindgen::generate!({
        world: "detector",
        path: "../../wit",
        default_bindings_module: "smallrl_plugin_sdk::guest::detector",
        pub_export_macro: true,
        export_macro_name: "export_detector_world",
    });
}

#[cfg(all(feature = "environment", not(feature = "episode")))]
pub mod environment {
    wit_bindgen::generate!({
        world: "environment",
        path: "../../wit",
        default_bindings_module: "smallrl_plugin_sdk::guest::environment",
        pub_export_macro: true,
        export_macro_name: "export_environment_world",
    });
}

/// A multi-turn environment's bindings (feature `episode`), under the environment's module
/// name: the two worlds share every import and the `env` export, so the environment glue
/// serves both.
#[cfg(feature = "episode")]
pub mod environment {
    wit_bindgen::generate!({
        world: "episode-environment",
        path: "../../wit",
        default_bindings_module: "smallrl_plugin_sdk::guest::environment",
        pub_export_macro: true,
        export_macro_name: "export_episode_environment_world",
    });
}

#[cfg(feature = "episode")]
mod episode_glue;
#[cfg(feature = "episode")]
pub use episode_glue::*;

thread_local! {
    /// The plugin built by the last successful `configure` (a guest is single-threaded).
    static CONFIGURED: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Sends panic messages to the host before the panic aborts (a trap loses the message).
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| host_log(&info.to_string())));
    });
}

#[cfg(feature = "reward")]
fn host_log(message: &str) {
    reward::smallrl::reward::host::log(message);
}

#[cfg(feature = "detector")]
fn host_log(message: &str) {
    detector::smallrl::reward::host::log(message);
}

#[cfg(feature = "environment")]
fn host_log(message: &str) {
    environment::smallrl::reward::host::log(message);
}

/// The host's program runner through the world's `programs` import (the same interface in
/// every world; wit-bindgen generates it once per world module).
macro_rules! run_programs_in {
    ($world:ident, $programs:expr) => {{
        use $world::smallrl::reward::programs as wit;
        let request: Vec<wit::Program> = $programs
            .iter()
            .map(|program| wit::Program {
                source: program.source.clone(),
                stdin: program.stdin.clone(),
                files: program.files.iter().map(|(name, contents)| wit::ProgramFile { name: name.clone(), contents: contents.clone() }).collect(),
            })
            .collect();
        let outcomes = wit::run(&request)?;
        Ok(outcomes
            .into_iter()
            .map(|outcome| crate::programs::Outcome {
                status: match outcome.status {
                    wit::Status::Normal => crate::programs::Status::Normal,
                    wit::Status::Exit(code) => crate::programs::Status::Exit(code),
                    wit::Status::Exception(e) => crate::programs::Status::Exception { type_name: e.type_name, message: e.message },
                    wit::Status::OutOfFuel => crate::programs::Status::OutOfFuel,
                    wit::Status::OutOfMemory => crate::programs::Status::OutOfMemory,
                    wit::Status::OutputOverLimit => crate::programs::Status::OutputOverLimit,
                    wit::Status::StackOverflow => crate::programs::Status::StackOverflow,
                    wit::Status::Crashed(what) => crate::programs::Status::Crashed(what),
                },
                stdout: outcome.stdout,
                stderr: outcome.stderr,
            })
            .collect())
    }};
}

#[cfg(feature = "reward")]
pub fn run_programs(programs: &[crate::programs::Program]) -> Result<Vec<crate::programs::Outcome>, String> {
    run_programs_in!(reward, programs)
}

#[cfg(feature = "detector")]
pub fn run_programs(programs: &[crate::programs::Program]) -> Result<Vec<crate::programs::Outcome>, String> {
    run_programs_in!(detector, programs)
}

#[cfg(feature = "environment")]
pub fn run_programs(programs: &[crate::programs::Program]) -> Result<Vec<crate::programs::Outcome>, String> {
    run_programs_in!(environment, programs)
}

pub fn configure<P: Plugin>(params_json: &str) -> Result<(), String> {
    install_panic_hook();
    let plugin = crate::configure::<P>(params_json)?;
    CONFIGURED.with(|slot| *slot.borrow_mut() = Some(Box::new(plugin)));
    Ok(())
}

/// Runs `f` on the configured plugin (built with default parameters if the host never called
/// `configure`).
fn with_plugin<P: Plugin, R>(f: impl FnOnce(&P) -> R) -> Result<R, String> {
    install_panic_hook();
    if CONFIGURED.with(|slot| slot.borrow().is_none()) {
        configure::<P>("")?;
    }
    CONFIGURED.with(|slot| {
        let slot = slot.borrow();
        let plugin = slot.as_ref().and_then(|boxed| boxed.downcast_ref::<P>());
        Ok(f(plugin.expect("configured with this plugin type")))
    })
}

#[cfg(feature = "reward")]
pub fn score<P: Reward>(batch: Vec<reward::smallrl::reward::types::Sample>) -> Result<Vec<Option<f64>>, String> {
    let samples: Vec<Sample> = batch.into_iter().map(from_reward_sample).collect();
    with_plugin::<P, _>(|plugin| plugin.score_batch_optional(&samples))?
}

#[cfg(feature = "detector")]
pub fn detect<P: Detector>(batch: Vec<detector::smallrl::reward::types::Sample>) -> Result<Vec<bool>, String> {
    let samples: Vec<Sample> = batch.into_iter().map(from_detector_sample).collect();
    with_plugin::<P, _>(|plugin| plugin.detect_batch(&samples))?
}

/// Each world's bindings define the WIT `sample` type again; this writes its conversion once.
#[allow(unused_macros)]
macro_rules! from_sample {
    ($world:ident, $from_sample:ident) => {
        fn $from_sample(sample: $world::smallrl::reward::types::Sample) -> Sample {
            Sample {
                prompt: sample.prompt,
                completion: sample.completion,
                completion_tokens_joined: sample.completion_tokens_joined,
                completion_token_ends: sample.completion_token_ends,
                completion_ids: sample.completion_ids,
                ended_with_eos: sample.ended_with_eos,
                metadata: sample.metadata,
            }
        }
    };
}

/// The reward and detector worlds' bindings define the same WIT types twice; this writes the
/// conversions once.
#[allow(unused_macros)]
macro_rules! conversions {
    ($world:ident, $from_sample:ident, $info:ident, $kind:ident) => {
        from_sample!($world, $from_sample);

        pub fn $info<P: Plugin>() -> $world::smallrl::reward::types::PluginInfo {
            use $world::smallrl::reward::types as wit;
            let param_info = |param: Param| wit::ParamInfo {
                name: param.name.to_string(),
                type_name: param.param_type.name().to_string(),
                default_json: param.default.to_string(),
                description: param.description.to_string(),
            };
            wit::PluginInfo {
                name: P::NAME.to_string(),
                version: P::VERSION.to_string(),
                kind: wit::PluginKind::$kind,
                description: P::DESCRIPTION.to_string(),
                params: P::params().into_iter().map(param_info).collect(),
            }
        }
    };
}

#[cfg(feature = "reward")]
conversions!(reward, from_reward_sample, reward_info, Reward);
#[cfg(feature = "detector")]
conversions!(detector, from_detector_sample, detector_info, Detector);
#[cfg(feature = "environment")]
from_sample!(environment, from_environment_sample);

#[cfg(feature = "environment")]
pub fn environment_info<P: crate::Environment>() -> environment::smallrl::reward::environment_types::EnvironmentInfo {
    environment_info_of::<P>(P::components(), P::metrics())
}

/// The `environment-info` of plugin `P` declaring `components` and `metrics`.
#[cfg(feature = "environment")]
fn environment_info_of<P: Plugin>(components: Vec<crate::Component>, metrics: Vec<&'static str>) -> environment::smallrl::reward::environment_types::EnvironmentInfo {
    use environment::smallrl::reward::environment_types as wit;
    use environment::smallrl::reward::types::ParamInfo;
    let param_info = |param: Param| ParamInfo {
        name: param.name.to_string(),
        type_name: param.param_type.name().to_string(),
        default_json: param.default.to_string(),
        description: param.description.to_string(),
    };
    let component = |c: crate::Component| wit::ComponentInfo {
        name: c.name.to_string(),
        role: match c.role {
            crate::Role::Retain => wit::Role::Retain,
            crate::Role::Forget => wit::Role::Forget,
        },
        description: c.description.to_string(),
    };
    wit::EnvironmentInfo {
        name: P::NAME.to_string(),
        version: P::VERSION.to_string(),
        description: P::DESCRIPTION.to_string(),
        params: P::params().into_iter().map(param_info).collect(),
        components: components.into_iter().map(component).collect(),
        metrics: metrics.into_iter().map(str::to_string).collect(),
    }
}

#[cfg(feature = "environment")]
pub fn generate<P: crate::Environment>(
    split: environment::smallrl::reward::environment_types::Split,
    count: u32,
    seed: u64,
    hack_frac: f64,
) -> Result<Vec<environment::smallrl::reward::environment_types::Prompt>, String> {
    let prompts = with_plugin::<P, _>(|plugin| plugin.generate(split_from_wit(split), count as usize, seed, hack_frac))??;
    Ok(prompts_to_wit(prompts))
}

#[cfg(feature = "environment")]
fn split_from_wit(split: environment::smallrl::reward::environment_types::Split) -> crate::Split {
    use environment::smallrl::reward::environment_types as wit;
    match split {
        wit::Split::Train => crate::Split::Train,
        wit::Split::Eval => crate::Split::Eval,
    }
}

#[cfg(feature = "environment")]
fn prompts_to_wit(prompts: Vec<crate::Prompt>) -> Vec<environment::smallrl::reward::environment_types::Prompt> {
    use environment::smallrl::reward::environment_types as wit;
    let to_wit = |prompt: crate::Prompt| wit::Prompt {
        content: match prompt.content {
            crate::PromptContent::Text(text) => wit::PromptContent::Text(text),
            crate::PromptContent::Messages(messages) => {
                wit::PromptContent::Messages(messages.into_iter().map(|(role, content)| wit::Message { role, content }).collect())
            }
        },
        metadata: serde_json::Value::Object(prompt.metadata).to_string(),
    };
    prompts.into_iter().map(to_wit).collect()
}

#[cfg(feature = "environment")]
pub fn environment_score<P: crate::Environment>(
    batch: Vec<environment::smallrl::reward::types::Sample>,
) -> Result<environment::smallrl::reward::environment_types::Scores, String> {
    let samples: Vec<Sample> = batch.into_iter().map(from_environment_sample).collect();
    let (components, metrics) = (P::components().len(), P::metrics().len());
    with_plugin::<P, _>(|plugin| {
        let mut scores = environment::smallrl::reward::environment_types::Scores {
            components: vec![Vec::with_capacity(samples.len()); components],
            metrics: vec![Vec::with_capacity(samples.len()); metrics],
        };
        let judgements = plugin.judge_batch(&samples)?;
        if judgements.len() != samples.len() {
            return Err(format!("judge_batch returned {} judgements for {} samples", judgements.len(), samples.len()));
        }
        for judgement in judgements {
            if judgement.components.len() != components || judgement.metrics.len() != metrics {
                return Err(format!(
                    "judge returned {} components and {} metrics, but the environment declares {components} and {metrics}",
                    judgement.components.len(),
                    judgement.metrics.len()
                ));
            }
            for (column, value) in scores.components.iter_mut().zip(judgement.components) {
                column.push(Some(value));
            }
            for (column, value) in scores.metrics.iter_mut().zip(judgement.metrics) {
                column.push(value);
            }
        }
        Ok(scores)
    })?
}

#[cfg(feature = "environment")]
pub fn environment_flags<P: crate::Environment>(batch: Vec<environment::smallrl::reward::types::Sample>, ground_truth: bool) -> Result<Vec<bool>, String> {
    let samples: Vec<Sample> = batch.into_iter().map(from_environment_sample).collect();
    with_plugin::<P, _>(|plugin| samples.iter().map(|sample| if ground_truth { plugin.ground_truth(sample) } else { plugin.monitor(sample) }).collect())
}
