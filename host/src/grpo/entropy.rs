//! TRL 1.16's entropy bonus (`entropy_coef`): the loss minus `coef` times the mean entropy of
//! the tokens whose policy term trains, and Skywork-OR1's adaptive control of `coef`
//! (`use_adaptive_entropy`), as TRL's `_compute_loss` applies them.
//!
//! The bonus is the same for every `loss_type` (a mean over tokens, never the aggregation's
//! weights), so `entropy_coef` means the same with each. The mean is over the step's tokens that
//! train: loss tokens of rows in a loss class (not a filter's dropped rows), and with
//! `top_entropy_quantile` only the high-entropy ones, as TRL's `effective_mask`. TRL averages
//! each micro-batch's tokens and divides by the accumulation steps; smallrl averages the whole
//! step's, so that a step planned into micro-batches (`gradient_accumulation_steps: auto`) is the
//! same computation as one pass. The two agree with one micro-batch (`tests/grpo_trl.rs`) and
//! whenever micro-batches have equal token counts. With `top_entropy_quantile` the tokens are
//! chosen per micro-batch anyway, so there each micro-batch's mean is taken, as TRL does.

use anyhow::{Result, ensure};
use tch::{Kind, Tensor};

/// How the bonus's coefficient is set (`None` in the objective: no bonus).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EntropyControl {
    /// `entropy_coef` at every step.
    Static { coef: f64 },
    /// Skywork-OR1's control: starting at `initial`, after each optimizer step the coefficient
    /// moves up by `delta` when the step's entropy was at most `target`, down by `delta`
    /// otherwise, within `[min, max]`; a step applies it only when the previous step's entropy
    /// was at most `target` (none before the first measurement).
    Adaptive { initial: f64, min: f64, max: f64, delta: f64, target: f64 },
}

/// The configuration's keys of the bonus (TRL's names).
pub struct EntropyKeys {
    pub entropy_coef: f64,
    pub use_adaptive_entropy: bool,
    pub entropy_coef_min: f64,
    pub entropy_coef_max: f64,
    pub entropy_coef_delta: f64,
    pub entropy_target: f64,
    /// Whether a key of the adaptive control was set away from its default (refused without it).
    pub adaptive_keys_set: bool,
}

impl EntropyControl {
    /// The control the keys describe (`None`: no bonus, `entropy_coef` 0 and no adaptive
    /// control), or the first rule they break.
    pub fn of(keys: &EntropyKeys) -> Result<Option<Self>> {
        let coef = keys.entropy_coef;
        ensure!(coef.is_finite(), "entropy_coef ({coef}) must be finite");
        if !keys.use_adaptive_entropy {
            ensure!(
                !keys.adaptive_keys_set,
                "entropy_coef_min, entropy_coef_max, entropy_coef_delta and entropy_target steer the adaptive entropy control: set use_adaptive_entropy: true, or unset them"
            );
            return Ok((coef != 0.0).then_some(Self::Static { coef }));
        }
        let (min, max, delta, target) = (keys.entropy_coef_min, keys.entropy_coef_max, keys.entropy_coef_delta, keys.entropy_target);
        ensure!([min, max, delta, target].iter().all(|v| v.is_finite()), "entropy_coef_min ({min}), entropy_coef_max ({max}), entropy_coef_delta ({delta}) and entropy_target ({target}) must be finite");
        ensure!(0.0 <= min && min <= max, "entropy_coef_min ({min}) and entropy_coef_max ({max}) bound the adaptive coefficient: 0 <= min <= max");
        ensure!(min <= coef && coef <= max, "entropy_coef ({coef}) is the adaptive control's starting coefficient: it must lie within entropy_coef_min ({min}) and entropy_coef_max ({max})");
        ensure!(delta > 0.0, "entropy_coef_delta ({delta}) is the adaptive coefficient's step: it must be positive (TRL's default 0.005)");
        ensure!(target >= 0.0, "entropy_target ({target}) is a mean entropy in nats: at least 0");
        Ok(Some(Self::Adaptive { initial: coef, min, max, delta, target }))
    }
}

/// The coefficient between steps: constant, or the adaptive control's state (TRL's
/// `entropy_coef` and `_last_world_entropy`, which its checkpoints save and smallrl's metrics
/// lines hold).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntropyController {
    control: EntropyControl,
    coef: f64,
    /// The entropy of the last step's trained tokens; infinite before the first step, so that
    /// an adaptive control applies nothing until it has measured one.
    last_entropy: f64,
}

impl EntropyController {
    pub fn new(control: EntropyControl) -> Self {
        let coef = match control {
            EntropyControl::Static { coef } => coef,
            EntropyControl::Adaptive { initial, .. } => initial,
        };
        Self { control, coef, last_entropy: f64::INFINITY }
    }

    /// The state after a step whose metrics line logged `coef` and `last_entropy` (a resume).
    pub fn restored(control: EntropyControl, coef: f64, last_entropy: f64) -> Self {
        Self { control, coef, last_entropy }
    }

    /// The coefficient this step's loss applies.
    pub fn applied(&self) -> f64 {
        match self.control {
            EntropyControl::Static { coef } => coef,
            EntropyControl::Adaptive { target, .. } => {
                if self.last_entropy <= target {
                    self.coef
                } else {
                    0.0
                }
            }
        }
    }

    /// After an optimizer step whose trained tokens had mean entropy `entropy`.
    pub fn update(&mut self, entropy: f64) {
        if let EntropyControl::Adaptive { min, max, delta, target, .. } = self.control {
            self.coef = if entropy <= target { (self.coef + delta).min(max) } else { (self.coef - delta).max(min) };
            self.last_entropy = entropy;
        }
    }

    /// The coefficient (after the last update): TRL's logged `entropy_coef`.
    pub fn coef(&self) -> f64 {
        self.coef
    }
}

/// The bonus's per-token weights: `1 / n` on the `n` tokens of `trained` (`[batch, len]`, 1
/// where a token's policy term trains), `n` counted over `count_in` (the same tokens of a larger
/// batch that `trained` is a part of, or `trained` itself).
pub fn bonus_weights(trained: &Tensor, count_in: &Tensor) -> Tensor {
    trained / count_in.sum(Kind::Float).clamp_min(1.0)
}

/// The tokens whose policy term trains: loss tokens with a positive weight in the aggregation
/// (rows in a loss class), and of them the high-entropy ones when `policy` masks the rest.
pub fn trained_tokens(weights: &Tensor, policy: Option<&Tensor>) -> Tensor {
    let trained = weights.gt(0.0).to_kind(Kind::Float);
    match policy {
        Some(policy) => trained * policy,
        None => trained,
    }
}

/// The mean entropy of the `trained` tokens (no gradient): what the adaptive control reads.
pub fn mean_entropy(entropy: &Tensor, trained: &Tensor) -> f64 {
    ((entropy.detach() * trained).sum(Kind::Float) / trained.sum(Kind::Float).clamp_min(1.0)).double_value(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adaptive() -> EntropyControl {
        EntropyControl::Adaptive { initial: 0.01, min: 0.0, max: 0.02, delta: 0.005, target: 0.5 }
    }

    /// TRL's rules step by step: nothing applied before a measurement; up by delta at or below
    /// the target, capped at max; down above it, floored at min; the gate reads the last step's
    /// entropy.
    #[test]
    fn the_adaptive_coefficient_follows_trls_rules() {
        let mut c = EntropyController::new(adaptive());
        assert_eq!(c.applied(), 0.0, "no measurement yet");
        let entropies = [0.4, 0.5, 0.3, 0.9, 0.8, 0.7, 0.6, 0.2];
        let mut seen = Vec::new();
        for e in entropies {
            c.update(e);
            seen.push((c.coef(), c.applied()));
        }
        // By hand: 0.01 -> 0.015 -> 0.02 -> 0.02 (max) -> 0.015 -> 0.01 -> 0.005 -> 0.0 -> 0.005.
        let expected = [(0.015, 0.015), (0.02, 0.02), (0.02, 0.02), (0.015, 0.0), (0.01, 0.0), (0.005, 0.0), (0.0, 0.0), (0.005, 0.005)];
        for ((got, want), e) in seen.iter().zip(expected).zip(entropies) {
            assert!((got.0 - want.0).abs() < 1e-15 && (got.1 - want.1).abs() < 1e-15, "after entropy {e}: {got:?}, expected {want:?}");
        }
    }

    #[test]
    fn a_static_coefficient_never_moves() {
        let mut c = EntropyController::new(EntropyControl::Static { coef: 0.03 });
        c.update(0.0);
        c.update(9.0);
        assert_eq!((c.coef(), c.applied()), (0.03, 0.03));
    }

    fn keys(coef: f64, adaptive: bool, min: f64, max: f64) -> EntropyKeys {
        EntropyKeys { entropy_coef: coef, use_adaptive_entropy: adaptive, entropy_coef_min: min, entropy_coef_max: max, entropy_coef_delta: 0.005, entropy_target: 0.2, adaptive_keys_set: (min, max) != (0.0, 1.0) }
    }

    #[test]
    fn the_keys_are_refused_by_name() {
        assert_eq!(EntropyControl::of(&keys(0.0, false, 0.0, 1.0)).unwrap(), None);
        let refusal = |k: EntropyKeys| EntropyControl::of(&k).unwrap_err().to_string();
        assert!(refusal(keys(0.0, false, 0.1, 1.0)).contains("set use_adaptive_entropy: true"));
        assert!(refusal(keys(0.5, true, 0.0, 0.2)).contains("within entropy_coef_min"));
        assert!(refusal(keys(0.0, true, 0.3, 0.2)).contains("0 <= min <= max"));
    }

    /// The mean is over trained tokens only: a row with weight 0 and a masked token count nothing.
    #[test]
    fn the_mean_entropy_counts_trained_tokens() {
        let weights = Tensor::from_slice(&[0.25f32, 0.25, 0.0, 0.0, 0.5, 0.0]).view([2, 3]);
        let entropy = Tensor::from_slice(&[1.0f32, 3.0, 100.0, 100.0, 2.0, 100.0]).view([2, 3]);
        let trained = trained_tokens(&weights, None);
        assert!((mean_entropy(&entropy, &trained) - 2.0).abs() < 1e-7);
        let policy = Tensor::from_slice(&[0.0f32, 1.0, 1.0, 1.0, 1.0, 1.0]).view([2, 3]);
        assert!((mean_entropy(&entropy, &trained_tokens(&weights, Some(&policy))) - 2.5).abs() < 1e-7);
    }
}
