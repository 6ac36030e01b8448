//! The `skip_serializing_if` tests of keys written to a run's config.yaml only when set, so
//! runs that leave them at their defaults keep the config.yaml they had before the keys existed.

use super::d;
use crate::grpo::MultiObjectiveAggregation;

// multi_objective_aggregation is written to a run's config.yaml only when set, so the runs that
// sum their components first keep the config.yaml they had before the key existed.
pub(super) fn is_sum_then_normalize(value: &MultiObjectiveAggregation) -> bool {
    *value == MultiObjectiveAggregation::SumThenNormalize
}

// The judge budget's keys are written to a run's config.yaml only when set, so the runs of
// environments without a judge keep the config.yaml they had before the keys existed.
pub(super) fn is_default_judge_items(value: &u64) -> bool {
    *value == d::PLUGIN_JUDGE_ITEMS_PER_SAMPLE
}

pub(super) fn is_default_judge_tokens(value: &u64) -> bool {
    *value == d::PLUGIN_JUDGE_TOKENS_PER_SAMPLE
}

// The program runner's keys are written to a run's config.yaml only when set, so the runs whose
// plugins run no programs keep the config.yaml they had before the keys existed.
pub(super) fn is_default_program_fuel(value: &u64) -> bool {
    *value == d::PROGRAM_FUEL
}

pub(super) fn is_default_program_memory(value: &usize) -> bool {
    *value == d::PROGRAM_MAX_MEMORY_MB
}

pub(super) fn is_default_program_output(value: &usize) -> bool {
    *value == d::PROGRAM_MAX_OUTPUT_KIB
}
