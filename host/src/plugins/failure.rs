//! Turns wasmtime errors into messages that say what the plugin did wrong and what to do.

use std::path::Path;

use anyhow::anyhow;
use wasmtime::component::Component;
use wasmtime::{Engine, Trap};

use super::PluginLimits;
use super::instance::StoreState;

/// The contract this host speaks (matches `package` in `wit/smallrl-reward.wit`).
const CONTRACT: &str = "smallrl:reward@0.1.0";
const CONTRACT_PREFIX: &str = "smallrl:reward/";

/// Why a call trapped, from the trap code and what the store saw (a logged panic message, a
/// refused memory growth).
pub fn describe_failure(error: wasmtime::Error, state: &StoreState, limits: PluginLimits) -> String {
    let trap = error.downcast_ref::<Trap>().copied();
    if let Some(desired) = state.memory_limit_hit() {
        return format!(
            "it tried to grow its memory to {:.1} MiB, over the limit of {:.1} MiB (PluginLimits::max_memory_bytes)",
            mebibytes(desired),
            mebibytes(limits.max_memory_bytes)
        );
    }
    match (trap, state.last_log()) {
        (Some(Trap::Interrupt), _) => format!(
            "it ran longer than the call-time limit of {:?} (an endless loop? raise PluginLimits::max_call_time if the work is real)",
            limits.max_call_time
        ),
        (Some(Trap::UnreachableCodeReached), Some(message)) => format!("it panicked: {message}"),
        (Some(Trap::UnreachableCodeReached), None) => {
            "it trapped on `unreachable` (a panic or abort; no message was logged)".to_string()
        }
        (Some(Trap::StackOverflow), _) => "it overflowed its stack (unbounded recursion?)".to_string(),
        (Some(trap), _) => format!("it trapped: {trap}"),
        (None, _) => format!("{:#}", anyhow::Error::from(error)),
    }
}

/// Why a component cannot be used as a plugin: forbidden imports, another contract version, or
/// exports that do not match either world.
pub fn describe_incompatible(path: &Path, component: &Component, engine: &Engine, error: wasmtime::Error) -> anyhow::Error {
    let component_type = component.component_type();
    let forbidden: Vec<String> = component_type
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .filter(|name| !name.starts_with(CONTRACT_PREFIX))
        .collect();
    if !forbidden.is_empty() {
        return anyhow!(
            "plugin {} imports {}, which smallrl does not provide: plugins get no capabilities \
             (no WASI, filesystem, network, clock, environment or randomness) so that rewards are pure and \
             reproducible; only `{CONTRACT_PREFIX}host` (log) is available",
            path.display(),
            forbidden.join(", ")
        );
    }
    let other_versions: Vec<String> = component_type
        .exports(engine)
        .filter_map(|(name, _)| name.strip_prefix(CONTRACT_PREFIX).and_then(|rest| rest.split_once('@')))
        .map(|(_, version)| version.to_string())
        .filter(|version| !version.starts_with("0.1."))
        .collect();
    if let Some(version) = other_versions.first() {
        return anyhow!(
            "plugin {} was built against smallrl:reward@{version}, but this smallrl speaks {CONTRACT}: \
             rebuild the plugin with the SDK of this smallrl (plugins/sdk) or use a matching smallrl",
            path.display()
        );
    }
    anyhow!(
        "plugin {} does not implement the {CONTRACT} reward or detector world: {:#}",
        path.display(),
        anyhow::Error::from(error)
    )
}

fn mebibytes(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}
