//! The judge the host offers environments (contract 0.3's `judge` interface): the trait a
//! language-model judge implements (outside `plugins/`, which knows no model), the linker's
//! `judge` function, whether a component imports it, and the per-call judge budget.
//!
//! Architecture invariant: a plugin reaches a judge only through the `judge` import, and only
//! when the run attached one ([`super::Plugin::set_judge`]); without one the import answers an
//! error, and `train/task.rs` refuses the run before any call. Every judge call is counted
//! against the plugin call's [`JudgeBudget`] (items, then tokens) before the judge does the
//! work, and its time counts in the call's wall-clock limit.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use super::wit::JUDGE_INTERFACES;
use super::PluginLimits;

/// One item to judge: named fields that fill the judge's template placeholders.
pub type JudgeItem = Vec<(String, String)>;

/// A judge (the `judge` import): one score in [0, 1] per item, in order, or why not.
pub trait Judge: Send {
    fn judge(&mut self, items: &[JudgeItem]) -> Result<Vec<f64>, String>;
    /// What errors call it ("judge models/judge (parse_integer)").
    fn describe(&self) -> String;
    /// The most bytes an item's fields (names and values) may have, checked before any work.
    fn max_item_bytes(&self) -> Option<usize> {
        None
    }
    /// [`Judge::judge`] that tells `charge` the tokens it will use (prompts plus the most it may
    /// generate) before its model runs, and stops with `charge`'s error when it refuses.
    fn judge_counted(&mut self, items: &[JudgeItem], charge: &mut dyn FnMut(u64) -> Result<(), String>) -> Result<Vec<f64>, String> {
        let _ = charge;
        self.judge(items)
    }
}

/// A judge shared by the plugins that may call it.
pub type SharedJudge = Arc<Mutex<dyn Judge>>;

/// The most items one `judge` call may carry (a batch of samples is at most this).
pub const MAX_JUDGE_ITEMS: usize = 65_536;

/// Whether `component` imports the judge interface.
pub fn imports_judge(component: &wasmtime::component::Component, engine: &wasmtime::Engine) -> bool {
    component.component_type().imports(engine).any(|(name, _)| JUDGE_INTERFACES.contains(&name))
}

/// What the judge may still do for the current plugin call: items and tokens, per sample of
/// the call (as fuel), counted over all its `judge` calls, never timed, so a call over it stops
/// at the same `judge` call on every machine.
#[derive(Clone, Debug, Default)]
pub struct JudgeBudget {
    samples: u64,
    items_per_sample: u64,
    tokens_per_sample: u64,
    items: u64,
    tokens: u64,
    calls: u64,
    time: Duration,
    /// When the call's wall-clock limit passes (None: not started by a call).
    deadline: Option<Instant>,
    /// Whether that limit passed during a judge call (the trap's cause, read by `failure.rs`).
    late: bool,
    /// Why the budget stopped the call (the trap's cause, read by `failure.rs`).
    overrun: Option<String>,
}

impl JudgeBudget {
    /// The budget of a call over `samples` samples (`info` and `configure` count as one).
    pub fn for_call(limits: &PluginLimits, samples: usize) -> Self {
        Self {
            samples: samples.max(1) as u64,
            items_per_sample: limits.judge_items_per_sample,
            tokens_per_sample: limits.judge_tokens_per_sample,
            deadline: Instant::now().checked_add(limits.max_call_time),
            ..Self::default()
        }
    }

    /// Why the budget stopped the call, if it did.
    pub fn overrun(&self) -> Option<&str> {
        self.overrun.as_deref()
    }

    /// The `judge` calls of this plugin call so far and the time they took.
    pub fn judge_time(&self) -> (u64, Duration) {
        (self.calls, self.time)
    }

    /// Whether the call's wall-clock limit passed during a judge call (which ended the call).
    pub fn late(&self) -> bool {
        self.late
    }

    fn charge(&mut self, what: &str, amount: u64, key: &str) -> Result<(), String> {
        let (used, per_sample) = match what {
            "items" => (&mut self.items, self.items_per_sample),
            _ => (&mut self.tokens, self.tokens_per_sample),
        };
        *used = used.saturating_add(amount);
        let budget = per_sample.saturating_mul(self.samples);
        if *used <= budget {
            return Ok(());
        }
        let flag = key.replace('_', "-");
        let why = format!(
            "its judge call {} asked for judge {what} beyond this call's budget: {} {what} so far, over the budget of {budget} \
             ({per_sample} per sample for {} samples); a loop of judge calls? If the environment really needs them, raise \
             `{key}` in the run config or pass --{flag}",
            self.calls, *used, self.samples
        );
        self.overrun = Some(why.clone());
        Err(why)
    }
}

/// The judge call: items counted against `budget`, each item's bytes checked against the
/// judge's bound, then the attached judge's scores (tokens counted before its model runs), each
/// checked to be in [0, 1]. An `Err` is a budget overrun, which ends the plugin call (a trap
/// whose cause `budget` keeps); `Ok(Err)` is an error string for the guest. Runs outside the
/// guest, so the call's fuel is untouched; its time counts in the call's wall-clock limit.
pub fn call(judge: Option<&SharedJudge>, budget: &mut JudgeBudget, items: &[JudgeItem]) -> wasmtime::Result<Result<Vec<f64>, String>> {
    let started = Instant::now();
    budget.calls += 1;
    let outcome = judge_within(judge, budget, items);
    budget.time += started.elapsed();
    if let Some(why) = budget.overrun() {
        return Err(wasmtime::format_err!("{why}"));
    }
    // The judge's time is the call's: past the limit, the call ends here rather than at the
    // guest's next epoch check (which a short tail of guest code may never reach).
    if budget.deadline.is_some_and(|deadline| Instant::now() >= deadline) {
        budget.late = true;
        return Err(wasmtime::format_err!("the call-time limit passed during a judge call"));
    }
    Ok(outcome)
}

fn judge_within(judge: Option<&SharedJudge>, budget: &mut JudgeBudget, items: &[JudgeItem]) -> Result<Vec<f64>, String> {
    let Some(judge) = judge else {
        return Err("this run configures no judge: set `judge:` in the run's config (see docs/src/environments.md)".into());
    };
    if items.len() > MAX_JUDGE_ITEMS {
        return Err(format!("{} items in one judge call, over the limit of {MAX_JUDGE_ITEMS}", items.len()));
    }
    budget.charge("items", items.len() as u64, "plugin_judge_items_per_sample")?;
    let mut judge = judge.lock().map_err(|_| "the judge failed in an earlier call (poisoned)".to_string())?;
    if let Some(bound) = judge.max_item_bytes() {
        let bytes = |item: &JudgeItem| item.iter().map(|(name, value)| name.len() + value.len()).sum::<usize>();
        if let Some((index, item)) = items.iter().enumerate().find(|(_, item)| bytes(item) > bound) {
            return Err(format!(
                "judge item {index} has {} bytes, over the {bound} bytes any item of {} may have (its model's context in tokens \
                 times {} bytes a token); it could not fit the judge's context: shorten the item's fields",
                bytes(item),
                judge.describe(),
                crate::defaults::JUDGE_ITEM_BYTES_PER_TOKEN
            ));
        }
    }
    let scores = judge.judge_counted(items, &mut |tokens| budget.charge("tokens", tokens, "plugin_judge_tokens_per_sample"))?;
    if scores.len() != items.len() {
        return Err(format!("{} returned {} scores for {} items", judge.describe(), scores.len(), items.len()));
    }
    match scores.iter().find(|s| !(0.0..=1.0).contains(*s)) {
        Some(bad) => Err(format!("{} returned {bad}, outside [0, 1]", judge.describe())),
        None => Ok(scores),
    }
}
