//! `sweep --dry-run`'s estimate of device time: the steps the plan still has to train times a
//! measured step time ([`crate::defaults::ESTIMATE_STEP_SECONDS_ALONE`], and time-sliced
//! [`crate::defaults::ESTIMATE_STEP_SECONDS_PACKED`]), whose source the printout names. The
//! figures are of the canonical SmolLM2 step: other models and batch sizes scale differently.

use super::plan::{CacheState, Plan};
use crate::defaults::{ESTIMATE_PACKED_RUNS, ESTIMATE_STEP_SECONDS_ALONE, ESTIMATE_STEP_SECONDS_PACKED};

/// Runs and steps still to train (finished runs left out; a resumable run counted whole), and
/// the GPU hours they take one run to a GPU and [`ESTIMATE_PACKED_RUNS`] to a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    pub runs: usize,
    pub steps: usize,
    pub hours_alone: f64,
    pub hours_packed: f64,
}

pub fn of(plan: &Plan) -> Estimate {
    let todo: Vec<usize> = plan.runs.iter().filter(|r| r.state != CacheState::Finished).map(|r| r.config.max_steps).collect();
    let steps: usize = todo.iter().sum();
    let hours = |seconds_per_step: f64, per_gpu: usize| steps as f64 * seconds_per_step / per_gpu as f64 / 3600.0;
    Estimate { runs: todo.len(), steps, hours_alone: hours(ESTIMATE_STEP_SECONDS_ALONE, 1), hours_packed: hours(ESTIMATE_STEP_SECONDS_PACKED, ESTIMATE_PACKED_RUNS) }
}

impl std::fmt::Display for Estimate {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "estimate: {} runs to train, {} steps in all: {:.1} GPU hours one run to a GPU ({ESTIMATE_STEP_SECONDS_ALONE:.2} s a step), {:.1} GPU hours {ESTIMATE_PACKED_RUNS} time-sliced runs to a GPU ({ESTIMATE_STEP_SECONDS_PACKED:.1} s a step each); step times: the original tool's canonical SmolLM2-135M step (544 rows) on an H100, from its paper, not yet measured for smallrl (scripts/gpu-check.sh)",
            self.runs, self.steps, self.hours_alone, self.hours_packed
        )
    }
}
