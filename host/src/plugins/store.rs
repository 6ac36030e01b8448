//! What a plugin's store holds besides its memory (limits, fuel budget, the guest's log) and the
//! resource limiter that enforces the memory and table limits.
//!
//! Architecture invariant: the store's state is plain data; the engine (`engine.rs`) writes the
//! guest's log into it and failures (`failure.rs`) read it, neither knowing plugin lifecycles.

use wasmtime::ResourceLimiter;

use super::judge::{JudgeBudget, SharedJudge};

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
}

impl StoreState {
    pub fn new(max_memory_bytes: usize) -> Self {
        Self { max_memory_bytes, fuel_budget: 0, memory_limit_hit: None, logs: Vec::new(), judge: None, judge_budget: Default::default() }
    }

    /// A call (or an instantiation) starts with `fuel` and an empty log.
    pub fn start_call(&mut self, fuel: u64) {
        self.fuel_budget = fuel;
        self.logs.clear();
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

    pub fn last_log(&self) -> Option<&str> {
        self.logs.last().map(String::as_str)
    }

    pub fn memory_limit_hit(&self) -> Option<usize> {
        self.memory_limit_hit
    }

    pub fn fuel_budget(&self) -> u64 {
        self.fuel_budget
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
