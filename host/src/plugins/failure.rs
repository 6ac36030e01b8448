//! Turns wasmtime errors into messages that say what the plugin did wrong and what to do.

use std::path::Path;

use anyhow::anyhow;
use wasmtime::component::Component;
use wasmtime::{Engine, Trap};

use super::PluginLimits;
use super::store::StoreState;
use super::wit::{CONTRACT, INTERFACE_PREFIX as CONTRACT_PREFIX, LEGACY_VERSION, V0_2_VERSION, V0_3_VERSION, V0_4_VERSION, V0_5_VERSION, compatible, exported_versions};
use super::text::shown;

/// Why a call trapped, from the trap code and what the store saw (a logged panic message, a
/// refused memory growth).
pub fn describe_failure(error: wasmtime::Error, state: &StoreState, limits: PluginLimits) -> String {
    if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return format!(
            "it called exit with status {} (sys.exit, os._exit or abort): a plugin returns its results, or an error \
             (in Python: raise an exception), and never ends the process",
            exit.0
        );
    }
    if let Some(flood) = error.downcast_ref::<super::wasi::OutputFlood>() {
        return flood.to_string();
    }
    // The call-time limit that passed during a judge call ends the call like an interrupt.
    let trap = if state.judge_budget().late() { Some(Trap::Interrupt) } else { error.downcast_ref::<Trap>().copied() };
    if let Some(desired) = state.memory_limit_hit() {
        return format!(
            "it tried to grow its memory to {:.1} MiB, over the limit of {:.1} MiB \
             (if it really needs that much, raise `plugin_max_memory_mb` in the run config or pass --plugin-max-memory-mb)",
            mebibytes(desired),
            mebibytes(limits.max_memory_bytes)
        );
    }
    if let Some(why) = state.judge_budget().overrun() {
        return why.to_string();
    }
    match (trap, state.last_log()) {
        (Some(Trap::OutOfFuel), _) => format!(
            "it ran out of fuel: {} instructions for this call ({} per sample{}); an endless loop? \
             If the work is real, raise `plugin_fuel_per_sample` in the run config or pass --plugin-fuel-per-sample",
            state.fuel_budget(),
            limits.fuel_per_sample,
            match state.has_wasi() {
                true => format!(", {} x plugin_fuel_per_sample for a component that imports WASI", crate::defaults::PLUGIN_INTERPRETED_FUEL_FACTOR),
                false => String::new(),
            }
        ),
        (Some(Trap::Interrupt), _) => format!(
            "it ran longer than the call-time limit of {:?}{} (an endless loop? if the work is real, raise \
             `plugin_max_call_seconds` in the run config or pass --plugin-max-call-seconds)",
            limits.max_call_time,
            match state.judge_budget().judge_time() {
                (0, _) => String::new(),
                (calls, time) => format!(", which counts the judge's time: its {calls} judge calls took {time:.1?}"),
            }
        ),
        (Some(Trap::UnreachableCodeReached), Some(message)) => format!("it panicked: {}", shown(&message)),
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
        .filter(|name| !name.starts_with(CONTRACT_PREFIX) && !super::wasi::PROVIDED.iter().any(|prefix| name.starts_with(prefix)))
        .collect();
    if !forbidden.is_empty() {
        return anyhow!(
            "plugin {} imports {}, which smallrl does not provide: plugins get no capabilities \
             (no filesystem, network, real clock, environment or real randomness) so that rewards are pure and \
             reproducible; only `{CONTRACT_PREFIX}host` (log), the program runner, the judge and a capability-free, deterministic \
             WASI 0.2 ({}) are available",
            path.display(),
            shown(&forbidden.join(", ")),
            super::wasi::PROVIDED.join(", ")
        );
    }
    let other_versions: Vec<String> = exported_versions(component, engine).into_iter().filter(|version| !compatible(version)).collect();
    if let Some(version) = other_versions.first() {
        return anyhow!(
            "plugin {} was built against smallrl:reward@{}, but this smallrl speaks {CONTRACT} (and runs plugins built \
             against {V0_5_VERSION}, {V0_4_VERSION}, {V0_3_VERSION}, {V0_2_VERSION} and {LEGACY_VERSION}): rebuild the plugin with the SDK of this smallrl (plugins/sdk) or use a matching smallrl",
            path.display(),
            shown(version)
        );
    }
    // The contract it says it was built against (its exports' version), not necessarily this
    // host's newest: a 0.2 plugin built with 0.1's sample record fails 0.2's world.
    let contract = match exported_versions(component, engine).first() {
        Some(version) => format!("{}@{}", CONTRACT_PREFIX.trim_end_matches('/'), shown(version)),
        None => CONTRACT.to_string(),
    };
    anyhow!(
        "plugin {} exports {contract} interfaces but does not implement that contract's reward, detector or environment world \
         (a type or function differs from the contract's WIT): {}; rebuild the plugin with the SDK of this smallrl (plugins/sdk), \
         or against that version's WIT (wit/, wit/0.4.0/, wit/0.3.0/, wit/0.2.0/, wit/0.1.0/) unchanged",
        path.display(),
        shown(&format!("{:#}", anyhow::Error::from(error)))
    )
}

/// A component whose initial memory is over the limit: it is refused at load, and the limit is
/// what to change, not the plugin's world.
pub fn describe_memory_at_start(path: &Path, wanted_bytes: usize, limits: PluginLimits) -> anyhow::Error {
    anyhow!(
        "plugin {} asks for {:.1} MiB of memory when it starts, over the limit of {:.1} MiB: raise the limit with \
         `plugin_max_memory_mb` in the run config or --plugin-max-memory-mb (at most 4096), or make the plugin's \
         initial memory smaller (large static arrays)",
        path.display(),
        mebibytes(wanted_bytes),
        mebibytes(limits.max_memory_bytes)
    )
}

fn mebibytes(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}
