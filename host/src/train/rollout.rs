//! The rollout: the batch that one or more optimizer steps train on (drawn, prepared by the
//! recipe, scored under the reference and old policies: `Trainer::rollout` in `step.rs`), and
//! the statistics and tensors it logs.

use tch::{Kind, Tensor};

use super::metrics::RolloutMetrics;
use super::recipe::Prepared;
use crate::model::generate::Generation;
use crate::reward::ScoredBatch;
use crate::routing::{Labels, RoutePlan};

/// A generated, scored batch, kept for `num_iterations * num_substeps` optimizer steps.
pub(super) struct Rollout {
    pub generation: Generation,
    /// `[batch, completion_len]` 1 on the completion tokens that train: the completion mask,
    /// without truncated completions with `mask_truncated_completions`.
    pub loss_mask: Tensor,
    pub advantages: Tensor,
    /// With `split_moment` also the natural plan's share (every adapter learning from every
    /// row), whose gradient feeds Adam's second moment.
    pub plan: RoutePlan,
    pub ref_logprobs: Option<Tensor>,
    /// The ratio's denominator: TRL's old policy (when the batch serves more than one update),
    /// or with a tinker `loss_fn` the sampler's log-probabilities.
    pub old_logprobs: Option<Tensor>,
    /// `old_logprobs` are the sampler's (with kept sets, the policy's side of the ratio is then
    /// renormalised over them: `grpo::LossLogprobs`).
    pub old_is_sampler: bool,
    /// Logged with every step that uses the rollout.
    pub metrics: RolloutMetrics,
    pub first_sample: (String, String),
    /// Per-sample tensors kept for `dump_batches` (rewards per component, labels).
    pub dump: Vec<(String, Tensor)>,
    /// The monitor's flags (routing labels before an intervention), which the absorption
    /// diagnostics split gradients by.
    pub flagged: Vec<bool>,
}

/// Reward, length and routing statistics of a scored batch (timings and the sampler's
/// fingerprint are filled in by the caller). `rewards` are those the advantages were computed from (after a penalty).
/// `counts_unscored`: the run allows samples without a score (`max_no_score_frac` > 0), so every
/// step logs how many it had, 0 included; other runs never log the metric.
pub(super) fn rollout_metrics(scored: &ScoredBatch, rewards: &[f64], component_names: &[String], generation: &Generation, frac_zero_std: f64, labels: &Labels, counts_unscored: bool) -> RolloutMetrics {
    if scored.unscored.contains(&true) {
        // Samples without a score leave every statistic: those of the scored rows alone (at
        // least one: `max_no_score_frac` is below 1).
        let rows = scored.scored_rows();
        let pick = |flags: &[bool]| rows.iter().map(|&row| flags[row]).collect::<Vec<bool>>();
        let labels = Labels { is_rh: pick(&labels.is_rh), ablated: pick(&labels.ablated), coherence: pick(&labels.coherence), dropped: pick(&labels.dropped), unscored: vec![false; rows.len()] };
        let rewards: Vec<f64> = rows.iter().map(|&row| rewards[row]).collect();
        let metrics = rollout_metrics(&scored.select(&rows), &rewards, component_names, &generation.select_rows(&rows), frac_zero_std, &labels, false);
        return RolloutMetrics { no_score_count: Some((scored.reward.len() - rows.len()) as f64), ..metrics };
    }
    let n = rewards.len() as f64;
    let reward = crate::stats::mean(rewards);
    let reward_std = (rewards.iter().map(|r| (r - reward).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    let components = component_names.iter().zip(&scored.components).map(|(name, scores)| (name.clone(), crate::stats::mean(scores))).collect();
    // An episode's length is its model tokens (its observations are not the model's output).
    let lengths: Vec<f64> = match &generation.model_mask {
        Some(_) => Vec::<f64>::try_from(&generation.model_tokens().sum_dim_intlist(1, false, Kind::Double).to_device(tch::Device::Cpu)).expect("a [rows] tensor"),
        None => generation.rows.iter().map(|r| (r.ids.len() + usize::from(r.ended_with_eos)) as f64).collect(),
    };
    let truncated = generation.rows.iter().filter(|r| !r.ended_with_eos).count() as f64;
    let frac = |flags: &[bool]| flags.iter().filter(|&&f| f).count() as f64 / n;
    RolloutMetrics {
        reward,
        reward_std,
        components,
        env_metrics: scored.metric_means(),
        frac_reward_zero_std: frac_zero_std,
        mean_length: crate::stats::mean(&lengths),
        max_length: lengths.iter().copied().fold(0.0, f64::max),
        clipped_ratio: truncated / n,
        hack_freq: scored.hack_freq(),
        frac_rh: frac(&labels.is_rh),
        frac_ablated: frac(&labels.ablated),
        frac_eligible: frac(&scored.eligible),
        frac_hackable: frac(&scored.hackable),
        monitor: scored.monitor(),
        no_score_count: counts_unscored.then_some(0.0),
        dynamic_sampling: None,
        off_policy: None,
        frac_verified: None,
        intervention: Vec::new(),
        sampler_weights: None,
        generate_seconds: 0.0,
        score_seconds: 0.0,
        reference_seconds: 0.0,
        sampler_setup_seconds: 0.0,
        old_logprobs_seconds: 0.0,
    }
}

/// The rollout's per-sample tensors that the generation does not hold: rewards (combined and
/// per component), the routing labels and, in runs that allow samples without a score
/// (`allows_no_score`), which have none (`no_score`; their rewards are placeholders 0).
pub(super) fn rollout_tensors(scored: &ScoredBatch, component_names: &[String], prepared: &Prepared, allows_no_score: bool) -> Vec<(String, Tensor)> {
    let (rewards, labels) = (Tensor::from_slice(&prepared.rewards).to_kind(Kind::Float), &prepared.labels);
    let flags = |v: &[bool]| Tensor::from_slice(&v.iter().map(|&b| b as i64).collect::<Vec<_>>());
    let mut out = vec![
        ("rewards".to_string(), rewards),
        ("is_rh".to_string(), flags(&labels.is_rh)),
        ("ablated".to_string(), flags(&labels.ablated)),
        ("coherence".to_string(), flags(&labels.coherence)),
        ("dropped".to_string(), flags(&labels.dropped)),
        ("eligible".to_string(), flags(&scored.eligible)),
    ];
    for (name, scores) in component_names.iter().zip(&scored.components) {
        out.push((format!("rewards/{name}"), Tensor::from_slice(scores)));
    }
    if allows_no_score {
        out.push(("no_score".to_string(), flags(&scored.unscored)));
    }
    out
}
