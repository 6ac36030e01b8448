//! The recipe: what a run makes of a scored batch before any pass over it. Rewards → the
//! intervention (penalty, filter, placebo: [`crate::intervention`]) → group advantages (or
//! GDPO's, from the components: `multi_objective_aggregation`) → coherence and routing groups →
//! labels → routing plan → which rows train, and with `adv_mod` the advantages minus the
//! penalty on each row's score.
//!
//! [`Recipe::prepare`] is a pure function of the scored batch, the step and the seed: no
//! model, engine or file, so it is tested on hand-made batches (below) and is the only place
//! a run applies its intervention (dynamic sampling asks it for [`Recipe::rewards`] and
//! [`Recipe::counted_rows`]).
//!
//! Architecture invariant: everything random here derives from `(seed, purpose, step)`
//! (`rng::derive`), so a resumed run prepares the batch the uninterrupted one did.

use tch::{Device, Kind, Tensor};

use crate::adapters::AdapterConfig;
use crate::defaults::ADVANTAGE_STD_EPSILON;
use crate::grpo::{self, Aggregation};
use crate::hyperparams::Part;
use crate::intervention::{self, Intervention};
use crate::model::generate::Generation;
use crate::reward::{ComponentInfo, ScoredBatch};
use crate::rng::{self, SplitMix64};
use crate::routing::{self, GroupedRows, Labels, RenormalizationMode, RoutePlan, RoutingMode, RowWeights};
use super::TrainConfig;
use super::metrics::key;

/// From which step a batch ends with coherence rows, and how many (`coherence_start_frac`,
/// `coh_samples_per_rollout`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoherenceSchedule {
    pub start_step: usize,
    pub rows: usize,
}

impl CoherenceSchedule {
    /// Coherence rows of optimizer step `step` (0-based): none before the start.
    pub fn rows_at(&self, step: usize) -> usize {
        if step >= self.start_step { self.rows } else { 0 }
    }
}

/// The advantage, intervention, routing, coherence, verifier, ablation and masking keys,
/// resolved once (`TrainConfig::recipe`). A key the recipe reads as it is (`intervention`,
/// `num_generations`, `routing_mode`, ...) is its row's alone: the row ends `=> Recipe`, which
/// gives the recipe the accessor `self.intervention()` ([`Part`]); the fields here are what
/// several keys, the reward's components or the device make together.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// The resolved configuration, read only through the accessors of the rows that name
    /// this part ([`Part`]).
    pub(super) table: TrainConfig,
    /// With `advantage_score: detector_score`, the reward component whose raw score `adv_mod`
    /// multiplies (None: the monitor's flag).
    pub advantage_score_component: Option<usize>,
    /// The loss's aggregation, whose token weights the matched placebo's energies follow.
    pub aggregation: Aggregation,
    /// With `multi_objective_aggregation: normalize_then_sum`, the reward components (their
    /// roles and scales) GDPO normalises one by one; `None` sums them first.
    pub normalize_then_sum: Option<Vec<ComponentInfo>>,
    pub row_weights: RowWeights,
    pub coherence: CoherenceSchedule,
    /// With `rh_detector_verifies_retain_samples`: the retain verifier's recall.
    pub retain_verifier_recall: Option<f64>,
    pub adapters: AdapterConfig,
    /// Where the plan's and the advantages' tensors live (the model's device).
    pub device: Device,
}

impl Part<TrainConfig> for Recipe {
    fn table(&self) -> &TrainConfig {
        &self.table
    }
}

/// A scored batch prepared for the loss.
pub struct Prepared {
    /// The rewards the advantages were computed from (after a penalty).
    pub rewards: Vec<f64>,
    pub advantages: Tensor,
    pub labels: Labels,
    /// The monitor's flags (routing labels before an intervention), which the absorption
    /// diagnostics split gradients by.
    pub flagged: Vec<bool>,
    /// With `split_moment` also the natural plan's share (every adapter learning from every
    /// row, for Adam's second moment), taken in the same pass.
    pub plan: RoutePlan,
    /// Rows whose tokens train: not dropped (coherence), not filtered (the intervention).
    pub trained_rows: Vec<bool>,
    /// TRL's `frac_reward_zero_std` over what trains.
    pub frac_zero_std: f64,
    /// With the retain verifier and coherence rows: the share of them it verified.
    pub frac_verified: Option<f64>,
    /// What the intervention logs (`adv_mod`'s mean modification, the matched placebo's
    /// energies and count), by metric key; empty for the others.
    pub intervention_metrics: Vec<(&'static str, f64)>,
}

impl Recipe {
    /// Prepares the batch of optimizer step `step` (0-based) of a run seeded `seed`;
    /// `generation` is the batch's (the matched placebo weighs rows by their loss tokens).
    pub fn prepare(&self, scored: &ScoredBatch, generation: &Generation, step: usize, seed: u64) -> Prepared {
        let flagged = scored.flags();
        let rewards = self.rewards(scored);
        let counted = self.counted_rows(scored);
        let (group_advantages, frac_zero_std) = self.group_advantages(scored, &rewards, &counted);
        let mut intervention_metrics = Vec::new();
        let routed = match self.intervention() {
            Intervention::Placebo => intervention::placebo_labels(&flagged, seed, step),
            Intervention::MatchedPlacebo => {
                let loss_tokens = grpo::loss_mask(generation, self.mask_truncated_completions());
                let energy = intervention::row_energies(&group_advantages, &loss_tokens, self.aggregation);
                let draw = intervention::matched_placebo_labels(&energy, &flagged, seed, step);
                let count = draw.labels.iter().filter(|&&r| r).count() as f64;
                intervention_metrics = vec![(key::PLACEBO_ENERGY_FLAGGED, draw.energy_flagged), (key::PLACEBO_ENERGY_ROUTED, draw.energy_routed), (key::PLACEBO_ROWS_ROUTED, count)];
                draw.labels
            }
            _ => flagged.clone(),
        };
        let rows = rewards.len();
        let coherence_rows = self.coherence.rows_at(step);
        let coherence: Vec<bool> = (0..rows).map(|i| i >= rows - coherence_rows).collect();
        let grouped = GroupedRows { rewards: &rewards, is_rh: &routed, coherence: &coherence, group_size: self.num_generations() };
        let verified = self.retain_verifier_recall.map(|recall| verified(scored, &coherence, recall, seed, step));
        let (advantages, dropped) = self.routed_advantages(group_advantages, &grouped, verified.as_deref());
        let advantages = match self.intervention() {
            Intervention::AdvMod => {
                let subtracted: Vec<f64> = self.advantage_scores(scored).iter().map(|score| self.advantage_penalty() * score).collect();
                // Its mean over the samples with a score (an unscored row's advantage is 0 below).
                let over_scored: Vec<f64> = scored.scored_rows().iter().map(|&row| subtracted[row]).collect();
                intervention_metrics = vec![(key::ADVANTAGE_MODIFICATION_MEAN, crate::stats::mean(&over_scored))];
                let subtracted = Tensor::from_slice(&subtracted).to_kind(Kind::Float).to(advantages.device());
                advantages - subtracted
            }
            _ => advantages,
        };
        let advantages = match scored.unscored.contains(&true) {
            // Placeholders 0, never NaN, for the samples without a score (out of every class).
            true => advantages * routing::row_mask(&scored.unscored.iter().map(|&u| !u).collect::<Vec<_>>(), self.device),
            false => advantages,
        };
        let ablated = self.draw_ablated(&routed, &coherence, seed, step);
        let labels = Labels { is_rh: routed, ablated, coherence, dropped, unscored: scored.unscored.clone() };
        let natural = self.split_moment().then(|| RowWeights::gates(RoutingMode::None));
        let plan = routing::plan_with_natural(&self.adapters, self.row_weights, natural, &self.loss_class_labels(&labels), self.device);
        let trained_rows = counted.iter().zip(&labels.dropped).map(|(&counted, &dropped)| counted && !dropped).collect();
        let frac_verified = verified.filter(|_| coherence_rows > 0).map(|verified| verified.iter().filter(|&&v| v).count() as f64 / coherence_rows as f64);
        Prepared { rewards, advantages, labels, flagged, plan, trained_rows, frac_zero_std, frac_verified, intervention_metrics }
    }

    /// `adv_mod`'s score of each row: the monitor's flag as 0 or 1, or the thresholded
    /// component's raw score where the monitor sees the row ([`intervention::AdvantageScore`]).
    fn advantage_scores(&self, scored: &ScoredBatch) -> Vec<f64> {
        match self.advantage_score_component {
            None => intervention::flag_scores(&scored.flags()),
            Some(component) => intervention::detector_scores(&scored.components[component], &scored.monitored),
        }
    }

    /// The rewards the advantages are computed from: after `intervention: penalty`'s penalty.
    pub fn rewards(&self, scored: &ScoredBatch) -> Vec<f64> {
        match self.intervention() {
            Intervention::Penalty => intervention::penalised(&scored.reward, &scored.flags(), self.rh_penalty()),
            _ => scored.reward.clone(),
        }
    }

    /// The rows whose rewards enter the advantages: those with a score; with `intervention:
    /// filter` of them the unflagged ones, with `verified` the verified ones.
    pub fn counted_rows(&self, scored: &ScoredBatch) -> Vec<bool> {
        let counted = match self.intervention() {
            Intervention::Filter => scored.flags().iter().map(|f| !f).collect(),
            Intervention::Verified => {
                let detected = scored.detector_raw.as_ref().expect("verified-only runs with a monitor (checked with the configuration)");
                intervention::verified_rows(&scored.monitored, detected)
            }
            _ => vec![true; scored.reward.len()],
        };
        counted.iter().zip(&scored.unscored).map(|(&counted, &unscored)| counted && !unscored).collect()
    }

    /// `[batch, completion_len]` 1 on the completion tokens that train: the completion mask of
    /// the prepared rows that train, without truncated completions when they are masked.
    pub fn loss_mask(&self, generation: &Generation, prepared: &Prepared) -> Tensor {
        grpo::loss_mask(generation, self.mask_truncated_completions()) * routing::row_mask(&prepared.trained_rows, self.device).unsqueeze(1)
    }

    /// Group advantages of `rewards`; with `intervention: filter` or `verified`, or samples
    /// without a score, over the `counted` rows only (see [`crate::intervention`]). With
    /// `normalize_then_sum`, GDPO's advantages of the components instead
    /// ([`Recipe::decoupled_scores`]), over the `counted` rows too.
    fn group_advantages(&self, scored: &ScoredBatch, rewards: &[f64], counted: &[bool]) -> (Tensor, f64) {
        let (group, scale, eps) = (self.num_generations(), self.scale_rewards(), ADVANTAGE_STD_EPSILON);
        if let Some(components) = &self.normalize_then_sum {
            let (scores, weights) = self.decoupled_scores(scored, components);
            return grpo::decoupled_advantages(&scores.to(self.device), &weights, &routing::row_mask(counted, self.device), group, eps);
        }
        let rewards = Tensor::from_slice(rewards).to_kind(Kind::Float).to(self.device);
        let masked = matches!(self.intervention(), Intervention::Filter | Intervention::Verified) || scored.unscored.contains(&true);
        match masked {
            true => intervention::kept_group_advantages(&rewards, &routing::row_mask(counted, self.device), group, scale, eps),
            false => grpo::group_advantages(&rewards, group, scale, eps),
        }
    }

    /// GDPO's reward functions `[batch, k]` (float32, as TRL's `rewards_per_func`) and their
    /// weights: each component's counted scores ([`ScoredBatch::counted_scores`]: a forget
    /// component is 0 where the bonus is not allowed), weighted by its scale; with
    /// `intervention: penalty` one more, -1 on flagged samples, weighted by `rh_penalty` (the
    /// penalty as a reward function of its own, normalised like the others).
    fn decoupled_scores(&self, scored: &ScoredBatch, components: &[ComponentInfo]) -> (Tensor, Vec<f64>) {
        let mut columns: Vec<Vec<f64>> = components.iter().enumerate().map(|(k, info)| scored.counted_scores(k, info.role)).collect();
        let mut weights: Vec<f64> = components.iter().map(|info| info.scale).collect();
        if self.intervention() == Intervention::Penalty {
            columns.push(scored.flags().iter().map(|&flagged| if flagged { -1.0 } else { 0.0 }).collect());
            weights.push(self.rh_penalty());
        }
        let rows = scored.reward.len() as i64;
        let scores = Tensor::from_slice(&columns.concat()).to_kind(Kind::Float).view([columns.len() as i64, rows]).transpose(0, 1).contiguous();
        (scores, weights)
    }

    /// The group advantages with coherence groups handled per `coherence_rh_mode`, and routing
    /// groups per `renormalization_mode` (the same tensor when neither applies), and the rows
    /// to drop from the loss. `verified` (the retain verifier's, one per row) replaces
    /// `coherence_rh_mode` on coherence groups.
    fn routed_advantages(&self, group_advantages: Tensor, batch: &GroupedRows, verified: Option<&[bool]>) -> (Tensor, Vec<bool>) {
        let rows = batch.rewards.len();
        let coherence = batch.coherence.iter().any(|&c| c);
        if self.renormalization_mode() == RenormalizationMode::Off && !coherence {
            return (group_advantages, vec![false; rows]);
        }
        let eps = ADVANTAGE_STD_EPSILON;
        let group: Vec<f64> = Vec::try_from(group_advantages.to_kind(Kind::Double)).expect("advantages are a 1-D tensor");
        let (advantages, dropped) = match verified {
            Some(verified) => routing::verified_coherence_advantages(batch, verified, &group, self.rp_extra_retain_advantage_multiplier(), eps),
            None => routing::coherence_advantages(self.coherence_rh_mode(), self.coherence_rh_penalty(), batch, &group, eps),
        };
        let advantages = routing::renormalized_advantages(self.renormalization_mode(), batch, &advantages, eps);
        (Tensor::from_slice(&advantages).to_kind(Kind::Float).to(group_advantages.device()), dropped)
    }

    /// The labels the loss classes are planned from. Flagged rows are a class of their own only
    /// when something treats them apart (routing, `intervention: filter` or `verified`); otherwise they train
    /// like any other row, in one class with them, so dapo, bnpo and cispo normalise over the
    /// whole batch as TRL's loss does (and the original's single backward pass without
    /// routing). The adapter controls are the same either way.
    fn loss_class_labels(&self, labels: &Labels) -> Labels {
        let treated_apart = self.routing_mode() != RoutingMode::None || matches!(self.intervention(), Intervention::Filter | Intervention::Verified);
        match treated_apart {
            true => labels.clone(),
            false => Labels { is_rh: vec![false; labels.is_rh.len()], ..labels.clone() },
        }
    }

    /// Clean routing rows trained with the forget adapter off, each with probability
    /// `ablated_frac` (one draw per row, coherence rows included, so the draws of routing rows
    /// do not depend on the coherence rows).
    fn draw_ablated(&self, is_rh: &[bool], coherence: &[bool], seed: u64, step: usize) -> Vec<bool> {
        let mut rng = SplitMix64::new(rng::derive(seed, "ablate", step as u64));
        is_rh.iter().zip(coherence).map(|(&rh, &coh)| { let draw = rng.next_f64(); !rh && !coh && draw < self.ablated_frac() }).collect()
    }
}

/// The retain verifier's verdict on each row: a coherence row whose prompt is detectable
/// (and eligible), that the monitor did not flag before recall and the false-positive rate
/// (its own output), and whose coin of probability `recall` succeeds (one draw per row, seeded
/// by `(seed, "retain-verifier", step)`). Routing rows are never verified.
fn verified(scored: &ScoredBatch, coherence: &[bool], recall: f64, seed: u64, step: usize) -> Vec<bool> {
    let raw = scored.detector_raw.as_ref().expect("the retain verifier runs with a monitor (checked with the configuration)");
    routing::verified_rows(coherence, &scored.monitored, raw, recall, rng::derive(seed, "retain-verifier", step as u64))
}

#[cfg(test)]
mod tests;
