//! What a plugin's store holds besides its memory (limits, fuel budget, the guest's log) and the
//! resource limiter that enforces the memory and table limits.
//!
//! Architecture invariant: the store's state is plain data; the runtime (`runtime.rs`) writes the
//! guest's log into it and failures (`failure.rs`) read it, neither knowing plugin lifecycles.
//! Only a component that imports WASI has a [`Sandbox`] (`wasi.rs`).

use wasmtime::ResourceLimiter;

use super::judge::{JudgeBudget, SharedJudge};
use super::wasi::{CallSeed, HasSandbox, Sandbox};

/// A component instance has a few internal core instances, memories and tables; more than this
/// is not a text reward.
const MAX_INSTANCES: usize = 16;
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// What a plugin's store holds besides its memory: its limits and what it logged.
pub struct StoreState {
    max_memory_bytes: usize,
    /// The fuel the current call started with (to say how much a plugin that ran out had).
    fuel_budget: u64,
    /// Set when the plugin asked for more memory than allowed (the cause of the trap).
    memory_limit_hit: Option<usize>,
    /// Messages from the guest's `log` during the current call (the SDK logs panic messages).
    logs: Vec<String>,
    /// The judge the `judge` import calls (None: the import answers an error).
    judge: Option<SharedJudge>,
    /// What the judge may still do in the current call (reset by every call).
    judge_budget: JudgeBudget,
    /// The deterministic WASI of a component that imports it (None for every other).
    wasi: Option<Sandbox>,
    /// The limits of each program the plugin runs through the `programs` import.
    program_limits: ProgramLimits,
}

impl StoreState {
    /// The state of a store; `wasi` for a component that imports WASI.
    pub fn new(max_memory_bytes: usize, wasi: Option<Sandbox>) -> Self {
        Self { max_memory_bytes, fuel_budget: 0, memory_limit_hit: None, logs: Vec::new(), judge: None, judge_budget: Default::default(), wasi, program_limits: ProgramLimits::default() }
    }

    /// A call (or an instantiation) starts with `fuel`, an empty log and, with WASI, the clock,
    /// random stream and output of `seed`.
    pub fn start_call(&mut self, fuel: u64, seed: CallSeed) {
        self.fuel_budget = fuel;
        self.logs.clear();
        if let Some(sandbox) = self.wasi.as_mut() {
            sandbox.start_call(seed);
        }
    }

    /// The store's WASI sandbox, if it has one.
    pub fn sandbox_ref(&self) -> Option<&Sandbox> {
        self.wasi.as_ref()
    }

    pub fn set_program_limits(&mut self, limits: ProgramLimits) {
        self.program_limits = limits;
    }

    pub fn program_limits(&self) -> ProgramLimits {
        self.program_limits
    }

    /// Whether this store runs a component that imports WASI.
    pub fn has_wasi(&self) -> bool {
        self.wasi.is_some()
    }

    pub fn set_judge(&mut self, judge: Option<SharedJudge>) {
        self.judge = judge;
    }

    pub fn judge(&self) -> Option<&SharedJudge> {
        self.judge.as_ref()
    }

    pub fn judge_budget(&self) -> &JudgeBudget {
        &self.judge_budget
    }

    pub fn judge_budget_mut(&mut self) -> &mut JudgeBudget {
        &mut self.judge_budget
    }

    pub fn record_log(&mut self, message: String) {
        const MAX_MESSAGES: usize = 16;
        if self.logs.len() < MAX_MESSAGES {
            self.logs.push(message);
        }
    }

    /// What the guest said last: its last `log` message (the SDK's panic hook), else what it
    /// wrote to stderr or stdout in this call (a Python traceback).
    pub fn last_log(&self) -> Option<String> {
        self.logs.last().cloned().or_else(|| self.wasi.as_ref().and_then(|sandbox| sandbox.call().output()))
    }

    pub fn memory_limit_hit(&self) -> Option<usize> {
        self.memory_limit_hit
    }

    pub fn fuel_budget(&self) -> u64 {
        self.fuel_budget
    }
}

/// Only a store on the WASI linker is asked for its sandbox (`runtime.rs`), and only a
/// component that imports WASI is put there, with a sandbox.
impl HasSandbox for StoreState {
    fn sandbox(&mut self) -> &mut Sandbox {
        self.wasi.as_mut().expect("WASI functions are linked only for components that have a sandbox")
    }
}

impl wasmtime_wasi::WasiView for StoreState {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        self.sandbox().view()
    }
}

impl ResourceLimiter for StoreState {
    fn memory_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.max_memory_bytes {
            self.memory_limit_hit = Some(desired);
            wasmtime::bail!("memory would grow to {desired} bytes, over the limit of {}", self.max_memory_bytes);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_INSTANCES
    }
}

/// Each program's limits (the config keys `program_fuel`, `program_max_memory_mb`,
/// `program_max_output_kib`), plus the wall-clock backstop of the plugin call that runs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProgramLimits {
    /// Fuel (about one unit per WebAssembly instruction) of one program.
    pub fuel: u64,
    /// The largest memory one program's interpreter may grow to (its initial memory included).
    pub max_memory_bytes: usize,
    /// The most one program may write to stdout and stderr together.
    pub max_output_bytes: usize,
    /// Wall-clock time one program may run: the backstop behind fuel (over it is an error, not
    /// a status, since it depends on the machine).
    pub max_time: std::time::Duration,
}

impl Default for ProgramLimits {
    fn default() -> Self {
        use crate::defaults as d;
        Self::new(d::PROGRAM_FUEL, d::PROGRAM_MAX_MEMORY_MB, d::PROGRAM_MAX_OUTPUT_KIB, std::time::Duration::from_secs_f64(d::PLUGIN_MAX_CALL_SECONDS))
            .expect("the default program limits are valid")
    }
}

impl ProgramLimits {
    /// The limits as the config keys give them; `max_time` is the plugin call's limit.
    pub fn new(fuel: u64, max_memory_mb: usize, max_output_kib: usize, max_time: std::time::Duration) -> anyhow::Result<Self> {
        anyhow::ensure!(fuel > 0, "program_fuel must be positive");
        anyhow::ensure!((1..=4096).contains(&max_memory_mb), "program_max_memory_mb must be in [1, 4096], got {max_memory_mb}");
        anyhow::ensure!((1..=1 << 20).contains(&max_output_kib), "program_max_output_kib must be in [1, 1048576], got {max_output_kib}");
        Ok(Self { fuel, max_memory_bytes: max_memory_mb << 20, max_output_bytes: max_output_kib << 10, max_time })
    }
}
