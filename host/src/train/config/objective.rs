//! The objective's flat keys gathered for [`Objective::new`], which holds every rule across them.

use anyhow::Result;

use super::TrainConfig;
use crate::grpo::{EntropyKeys, Objective, ObjectiveKeys, VespoGamma};

impl TrainConfig {
    /// The objective, built once from its flat keys (every cross-key rule is `Objective::new`'s).
    pub fn objective(&self) -> Result<Objective> {
        Objective::new(&ObjectiveKeys {
            loss_type: self.loss_type,
            loss_fn: self.loss_fn,
            epsilon: self.epsilon,
            epsilon_is_set: self.epsilon != Self::default().epsilon,
            epsilon_high: self.epsilon_high,
            delta: self.delta,
            dro_beta: self.dro_beta,
            importance_sampling_level: self.importance_sampling_level,
            beta: self.beta,
            kl_estimator: self.kl_estimator,
            max_completion_length: self.max_completion_length,
            top_entropy_quantile: self.top_entropy_quantile,
            importance_sampling_correction: self.importance_sampling_correction,
            importance_sampling_mode: self.importance_sampling_mode,
            importance_sampling_clip_min: self.importance_sampling_clip_min,
            importance_sampling_clip_max: self.importance_sampling_clip_max,
            importance_sampling_correction_keys_set: {
                let default = Self::default();
                (self.importance_sampling_mode, self.importance_sampling_clip_min, self.importance_sampling_clip_max)
                    != (default.importance_sampling_mode, default.importance_sampling_clip_min, default.importance_sampling_clip_max)
            },
            sapo_temperatures: (self.sapo_temperature_pos, self.sapo_temperature_neg),
            vespo: self.vespo_gamma(),
            sapo_keys_set: (self.sapo_temperature_pos, self.sapo_temperature_neg) != (Self::default().sapo_temperature_pos, Self::default().sapo_temperature_neg),
            vespo_keys_set: self.vespo_gamma() != Self::default().vespo_gamma(),
            off_policy_mask_threshold: self.off_policy_mask_threshold,
            use_bias_correction_kl: self.use_bias_correction_kl,
            entropy: self.entropy_keys(),
        })
    }

    /// The entropy bonus's keys.
    fn entropy_keys(&self) -> EntropyKeys {
        let adaptive = |c: &Self| (c.entropy_coef_min, c.entropy_coef_max, c.entropy_coef_delta, c.entropy_target);
        EntropyKeys {
            entropy_coef: self.entropy_coef,
            use_adaptive_entropy: self.use_adaptive_entropy,
            entropy_coef_min: self.entropy_coef_min,
            entropy_coef_max: self.entropy_coef_max,
            entropy_coef_delta: self.entropy_coef_delta,
            entropy_target: self.entropy_target,
            adaptive_keys_set: adaptive(self) != adaptive(&Self::default()),
        }
    }

    /// VESPO's four keys as the objective's Gamma weighting.
    fn vespo_gamma(&self) -> VespoGamma {
        VespoGamma { k_pos: self.vespo_k_pos, lambda_pos: self.vespo_lambda_pos, k_neg: self.vespo_k_neg, lambda_neg: self.vespo_lambda_neg }
    }
}
