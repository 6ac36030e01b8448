//! The judge the host offers environments (contract 0.3's `judge` interface): the trait a
//! language-model judge implements (outside `plugins/`, which knows no model), the linker's
//! `judge` function, and whether a component imports it.
//!
//! Architecture invariant: a plugin reaches a judge only through the `judge` import, and only
//! when the run attached one ([`super::Plugin::set_judge`]); without one the import answers an
//! error, and `train/task.rs` refuses the run before any call.

use std::time::Duration;

pub use super::store::{Judge, JudgeItem, SharedJudge};
pub use super::wit::JUDGE_INTERFACE;

/// The most items one `judge` call may carry (a batch of samples is at most this).
pub const MAX_JUDGE_ITEMS: usize = 65_536;

/// Whether `component` imports the judge interface.
pub fn imports_judge(component: &wasmtime::component::Component, engine: &wasmtime::Engine) -> bool {
    component.component_type().imports(engine).any(|(name, _)| name == JUDGE_INTERFACE)
}

/// The judge call: the attached judge's scores, each checked to be in [0, 1], or an error
/// string for the guest. Runs outside the guest, so the call's fuel is untouched; its time is
/// returned so the caller can restart the wall-clock deadline.
pub fn call(judge: Option<&SharedJudge>, items: &[JudgeItem]) -> (Result<Vec<f64>, String>, Duration) {
    let started = std::time::Instant::now();
    let Some(judge) = judge else {
        return (Err("this run configures no judge: set `judge:` in the run's config (see docs/src/environments.md)".into()), started.elapsed());
    };
    if items.len() > MAX_JUDGE_ITEMS {
        return (Err(format!("{} items in one judge call, over the limit of {MAX_JUDGE_ITEMS}", items.len())), started.elapsed());
    }
    let mut judge = match judge.lock() {
        Ok(judge) => judge,
        Err(_) => return (Err("the judge failed in an earlier call (poisoned)".into()), started.elapsed()),
    };
    let scores = judge.judge(items).and_then(|scores| {
        if scores.len() != items.len() {
            return Err(format!("{} returned {} scores for {} items", judge.describe(), scores.len(), items.len()));
        }
        match scores.iter().find(|s| !(0.0..=1.0).contains(*s)) {
            Some(bad) => Err(format!("{} returned {bad}, outside [0, 1]", judge.describe())),
            None => Ok(scores),
        }
    });
    (scores, started.elapsed())
}
