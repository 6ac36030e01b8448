//! The GRPO objective as pure maths on tensors, no model: group-normalised advantages
//! (`scale_rewards`, and GDPO's `multi_objective_aggregation`), the token masks, the objective as a typed value built once from the flat
//! keys (TRL 1.16's clipped surrogate with token or sequence ratios, `epsilon` /
//! `epsilon_high`, `delta`, or CISPO's, SAPO's or VESPO's, or tinker's `importance_sampling` / `ppo` / `dro`), the
//! aggregation (`loss_type`) and the KL estimator, chosen separately as TRL does; TRL's
//! sampler/learner importance-sampling correction (`is_correction`), DeepSeek-V3.2's off-policy
//! sequence mask and bias-corrected KL, and TRL's entropy bonus with its adaptive control.
//!
//! Architecture invariant: nothing here runs the model. The log-probabilities come in as
//! tensors from [`crate::engine`], which owns forward and backward passes; the trainer decides
//! what goes in.

mod advantages;
mod aggregation;
mod entropy;
mod is_correction;
mod kl;
mod logged;
mod loss;
mod masks;
mod multi_objective;
mod objective;
mod replay;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod trap_tests;

pub use advantages::{ScaleRewards, group_advantages, informative_groups};
pub use aggregation::{Aggregation, WeightEss, row_token_weights, token_weights};
pub use entropy::{EntropyControl, EntropyController, EntropyKeys, bonus_weights, mean_entropy, trained_tokens};
pub use is_correction::{ImportanceSamplingMode, IsCorrection, IsStats};
pub use kl::{KlEstimator, KlPenalty, per_token_kl};
pub use logged::{LossMetric, importance_sampling_metrics, key as metric_key};
pub use loss::{ClipFractions, EntropyBonus, LossLogprobs, LossTerms, grpo_loss, sampled_loss, vespo_weights, weighted_loss};
pub use masks::{TokenMasks, high_entropy_mask, loss_mask};
pub use multi_objective::{MultiObjectiveAggregation, decoupled_advantages};
pub use replay::{REPLAY_RATIO_BAND, ReplayStats, SamplingReplay};
pub use objective::{ImportanceSamplingLevel, LossFn, LossType, Objective, ObjectiveKeys, RatioTo, Surrogate, VespoGamma};
