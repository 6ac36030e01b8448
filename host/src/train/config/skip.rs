//! The `skip_serializing_if` tests of keys written to a run's config.yaml only when set, so
//! runs that leave them at their defaults keep the config.yaml they had before the keys existed.

use super::d;
use crate::grpo::MultiObjectiveAggregation;
use crate::model::autocast::TrainDtype;
use crate::model::folded::SamplerDtype;

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

// sampler_dtype and train_dtype are written to a run's config.yaml only when set, so float32
// runs keep the config.yaml they had before the keys existed.
pub(super) fn is_float32_sampler(value: &SamplerDtype) -> bool {
    *value == SamplerDtype::Float32
}

pub(super) fn is_float32_training(value: &TrainDtype) -> bool {
    *value == TrainDtype::Float32
}

// sampling_steps_ahead and allow_unclipped_off_policy: in config.yaml only when set (older runs' unchanged).
pub(super) fn is_zero(value: &usize) -> bool {
    *value == 0
}

// max_no_score_frac: in config.yaml only when set (older runs' unchanged).
pub(super) fn is_zero_f64(value: &f64) -> bool {
    *value == 0.0
}

pub(super) fn is_false(value: &bool) -> bool {
    !*value
}

// The episode keys (issue 48) are written to a run's config.yaml only when set, so runs without
// an episode environment keep the config.yaml they had before the keys existed.
pub(super) fn is_default_episode_turns(value: &usize) -> bool {
    *value == d::EPISODE_MAX_TURNS
}

pub(super) fn is_default_turn_tokens(value: &usize) -> bool {
    *value == d::EPISODE_MAX_TURN_TOKENS
}

pub(super) fn is_default_observation_tokens(value: &usize) -> bool {
    *value == d::EPISODE_MAX_OBSERVATION_TOKENS
}

pub(super) fn is_default_observation_bytes(value: &usize) -> bool {
    *value == d::EPISODE_MAX_OBSERVATION_BYTES
}
