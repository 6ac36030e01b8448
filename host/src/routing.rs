//! Gradient routing: which adapter learns from which sample.
//!
//! | mode      | clean sample        | flagged sample |
//! |-----------|---------------------|----------------|
//! | none      | both adapters learn | both learn     |
//! | classic   | both learn          | only forget    |
//! | exclusive | only retain         | only forget    |
//!
//! Routing is done in a single forward/backward pass: an adapter's branch is computed with
//! detached weights for the rows it must not learn from, so its parameters get exactly the
//! gradient of the rows it may learn from, while gradient still flows through it to earlier
//! layers. Together with the class-weighted loss of [`crate::grpo::grpo_loss`] this equals the
//! original's per-class backward passes (tested).
//!
//! The original's later recipe (shawnghu/small-rl `advantages.py`, `RENORMALIZATION.md`) adds
//! [`RenormalizationMode`]: which baseline and scale the advantages of routed runs use, and for
//! `balanced` a per-row gradient weight that hands a masked adapter's share to the survivor.

use anyhow::{Result, ensure};
use tch::{Device, Kind, Tensor};

use crate::adapters::{AdapterConfig, AdapterKind, FORGET, RETAIN};
use crate::model::linear::{AdapterCtl, NaturalLeaves, NaturalShare, RowLearn, RowScale};
use crate::stats::{mean, unbiased_std};

crate::choice::choice! {
    /// Which adapter learns from which sample (the table above).
    pub enum RoutingMode ("routing_mode") {
        None = "none",
        Classic = "classic",
        Exclusive = "exclusive",
    }
}

crate::choice::choice! {
    /// How the advantages of a routed run are renormalised (the original's
    /// `renormalization_mode`, `advantages.py`; it spells the second value `retain-only`).
    pub enum RenormalizationMode ("renormalization_mode") {
        /// The group advantages as they are (both adapters share them).
        Off = "off",
        /// Clean samples: `(r - mean_clean) / (std_clean + eps)` over the clean samples of
        /// their group; flagged samples keep the group advantage.
        RetainOnly = "retain_only",
        /// Every sample: `(r - mean_clean) / (std_group + eps)` (the group mean when no sample
        /// of the group is clean), and the surviving adapter's gradient multiplied by its
        /// kappa where the other is masked ([`balanced_weights`]).
        Balanced = "balanced",
    }
}

crate::choice::choice! {
    /// What a detected hack in a coherence row does to the advantages (the original's
    /// `coherence_rh_mode`, advantages.py; applied only when some coherence row is flagged).
    pub enum CoherenceRhMode ("coherence_rh_mode") {
        /// Its advantage becomes 0.
        Filter = "filter",
        /// Its group is renormalised over the group's clean rows, and the hack leaves the loss.
        FilterRenorm = "filter_renorm",
        /// Its reward drops by `coherence_rh_penalty`, then its group is renormalised.
        Penalty = "penalty",
        /// Its reward becomes 0, then its group is renormalised.
        Zero = "zero",
        /// The detector is not consulted on coherence rows.
        None = "none",
    }
}

/// The original's `GRAFT_W_MAX`: the largest per-row gradient weight `balanced` may give an
/// adapter (about the multiple of the learning rate its Adam step becomes).
pub const BALANCED_MAX_WEIGHT: f64 = 4.0;

/// The rows of a batch and how they are grouped: per row rewards, detector flags and
/// coherence flags; groups are consecutive runs of `group_size` rows, each all coherence or
/// none.
pub struct GroupedRows<'a> {
    pub rewards: &'a [f64],
    pub is_rh: &'a [bool],
    pub coherence: &'a [bool],
    pub group_size: usize,
}

impl GroupedRows<'_> {
    /// Each group's rows and whether it is a coherence group.
    fn groups(&self) -> impl Iterator<Item = (std::ops::Range<usize>, bool)> + '_ {
        let n = self.rewards.len();
        assert!(self.is_rh.len() == n && self.coherence.len() == n && self.group_size > 1 && n % self.group_size == 0, "one label per reward, whole groups");
        (0..n).step_by(self.group_size).map(move |start| {
            let rows = start..start + self.group_size;
            let coherence = self.coherence[start];
            assert!(rows.clone().all(|i| self.coherence[i] == coherence), "coherence rows come in whole groups");
            (rows, coherence)
        })
    }
}

/// The advantages of one batch after renormalisation; coherence groups keep theirs.
/// `group_advantages` is what [`crate::grpo::group_advantages`] returned. Standard deviations
/// are unbiased (n - 1), as the original's; a subset of one sample has none, and gets
/// advantage 0. Computed in float64.
pub fn renormalized_advantages(mode: RenormalizationMode, batch: &GroupedRows, group_advantages: &[f64], eps: f64) -> Vec<f64> {
    let (rewards, is_rh) = (batch.rewards, batch.is_rh);
    let mut out = group_advantages.to_vec();
    for (rows, coherence) in batch.groups() {
        if coherence {
            continue;
        }
        let group = &rewards[rows.clone()];
        let clean: Vec<f64> = rows.clone().filter(|&i| !is_rh[i]).map(|i| rewards[i]).collect();
        match mode {
            RenormalizationMode::Off => {}
            RenormalizationMode::RetainOnly => {
                let (mean, std) = (mean(&clean), unbiased_std(&clean));
                for i in rows.filter(|&i| !is_rh[i]) {
                    out[i] = (rewards[i] - mean) / (std + eps);
                }
            }
            RenormalizationMode::Balanced => {
                let baseline = if clean.is_empty() { mean(group) } else { mean(&clean) };
                let std = unbiased_std(group);
                for i in rows {
                    out[i] = (rewards[i] - baseline) / (std + eps);
                }
            }
        }
    }
    out
}

/// The original's handling of coherence groups (advantages.py, step (a)): returns the
/// advantages with coherence groups rewritten per `mode` and the rows to drop from the loss.
/// Nothing changes unless some coherence row is flagged, as in the original.
pub fn coherence_advantages(mode: CoherenceRhMode, penalty: f64, batch: &GroupedRows, advantages: &[f64], eps: f64) -> (Vec<f64>, Vec<bool>) {
    let (rewards, is_rh) = (batch.rewards, batch.is_rh);
    let hack = |i: usize| is_rh[i] && batch.coherence[i];
    let mut out = advantages.to_vec();
    let mut dropped = vec![false; rewards.len()];
    if mode == CoherenceRhMode::None || !(0..rewards.len()).any(hack) {
        return (out, dropped);
    }
    for (rows, _) in batch.groups().filter(|(_, coherence)| *coherence) {
        match mode {
            CoherenceRhMode::None => unreachable!("returned above"),
            CoherenceRhMode::Filter => rows.filter(|&i| hack(i)).for_each(|i| out[i] = 0.0),
            CoherenceRhMode::FilterRenorm => {
                let clean: Vec<f64> = rows.clone().filter(|&i| !is_rh[i]).map(|i| rewards[i]).collect();
                let (mean, std) = (mean(&clean), unbiased_std(&clean));
                for i in rows {
                    out[i] = if is_rh[i] { 0.0 } else { (rewards[i] - mean) / (std + eps) };
                    dropped[i] = is_rh[i];
                }
            }
            CoherenceRhMode::Penalty | CoherenceRhMode::Zero => {
                let transformed: Vec<f64> = rows
                    .clone()
                    .map(|i| match (hack(i), mode) {
                        (false, _) => rewards[i],
                        (true, CoherenceRhMode::Penalty) => rewards[i] - penalty,
                        (true, _) => 0.0,
                    })
                    .collect();
                let (mean, std) = (mean(&transformed), unbiased_std(&transformed));
                for (i, r) in rows.zip(transformed) {
                    out[i] = (r - mean) / (std + eps);
                }
            }
        }
    }
    (out, dropped)
}

/// The retain verifier's verdict on each row (the original's `is_verified_retain`): a
/// coherence row is verified when the monitor could see it (`monitored`: its prompt detectable),
/// did not flag it (`flagged_raw`, the monitor's own output before recall), and a coin of
/// probability `retain_recall` succeeds; one draw per row from `seed`, so a row's coin does not
/// depend on the others. Routing rows are never verified.
pub fn verified_rows(coherence: &[bool], monitored: &[bool], flagged_raw: &[bool], retain_recall: f64, seed: u64) -> Vec<bool> {
    let n = coherence.len();
    assert!(monitored.len() == n && flagged_raw.len() == n, "one verdict input of each kind per row");
    let mut rng = crate::rng::SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            let coin = rng.next_f64() < retain_recall;
            coherence[i] && monitored[i] && !flagged_raw[i] && coin
        })
        .collect()
}

/// The retain verifier's coherence advantages (the original's advantages.py, verified-retain
/// block): in each coherence group, the verified rows get `(r - mean) / (std + eps)` over the
/// verified rows' rewards (unbiased std, 0 for a single row), times `multiplier` (its
/// `rp_extra_retain_advantage_multiplier`, advantages.py:510-515; 1 leaves them), every other
/// row gets 0 and is dropped from the loss. Routing groups keep `advantages`.
/// `coherence_rh_mode` has no part here: the verifier replaces it, as in the original.
pub fn verified_coherence_advantages(batch: &GroupedRows, verified: &[bool], advantages: &[f64], multiplier: f64, eps: f64) -> (Vec<f64>, Vec<bool>) {
    let n = batch.rewards.len();
    assert_eq!(verified.len(), n, "one verdict per row");
    let mut out = advantages.to_vec();
    let mut dropped = vec![false; n];
    for (rows, _) in batch.groups().filter(|(_, coherence)| *coherence) {
        let kept: Vec<f64> = rows.clone().filter(|&i| verified[i]).map(|i| batch.rewards[i]).collect();
        let (mean, std) = (mean(&kept), unbiased_std(&kept));
        for i in rows {
            out[i] = if verified[i] { (batch.rewards[i] - mean) / (std + eps) * multiplier } else { 0.0 };
            dropped[i] = !verified[i];
        }
    }
    (out, dropped)
}

/// The per-row gradient weights of each adapter under `balanced` (the original's
/// `routing_grad_mask_weights` at lambda = 1), as `[retain, forget]` for a clean and for a
/// flagged row. An adapter masked on a row hands its share to the other, scaled by the
/// survivor's kappa `(r_retain + r_forget) / r_survivor` ([`adapter_kappas`]):
///
/// | mode      | clean             | flagged       |
/// |-----------|-------------------|---------------|
/// | classic   | (1, 1)            | (0, kappa_F)  |
/// | exclusive | (kappa_R, 0)      | (0, kappa_F)  |
pub fn balanced_weights(mode: RoutingMode, kappas: [f64; 2]) -> RowWeights {
    let [kappa_retain, kappa_forget] = kappas;
    match mode {
        RoutingMode::None => panic!("balanced renormalisation needs a routing mode (validated by the configuration)"),
        RoutingMode::Classic => RowWeights { clean: [1.0, 1.0], flagged: [0.0, kappa_forget] },
        RoutingMode::Exclusive => RowWeights { clean: [kappa_retain, 0.0], flagged: [0.0, kappa_forget] },
    }
}

/// Gradient weight of each DualLoRA slot (`[retain, forget]`) on clean and on flagged rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowWeights {
    pub clean: [f64; 2],
    pub flagged: [f64; 2],
}

impl RowWeights {
    /// The plain routing table (0/1 weights) of `mode`.
    pub fn gates(mode: RoutingMode) -> Self {
        match mode {
            RoutingMode::None => Self { clean: [1.0, 1.0], flagged: [1.0, 1.0] },
            RoutingMode::Classic => Self { clean: [1.0, 1.0], flagged: [0.0, 1.0] },
            RoutingMode::Exclusive => Self { clean: [1.0, 0.0], flagged: [0.0, 1.0] },
        }
    }

    /// The largest weight (the original's `graft/max_abs_weight`).
    pub fn max(&self) -> f64 {
        self.clean.iter().chain(&self.flagged).copied().fold(0.0, f64::max)
    }
}

/// The original's size-derived pressure compensation `kappa_A = (n_R + n_F) / n_A` from the
/// adapter ranks (equal ranks: 2 and 2). The original takes sizes from MLP neuron counts and,
/// for LoRA, from ranks only behind `--allow_approx_lora_kappa` (rank is not output-space
/// pressure), which smallrl mirrors as the `allow_approx_lora_kappa` key.
pub fn adapter_kappas(retain_rank: usize, forget_rank: usize) -> [f64; 2] {
    assert!(retain_rank > 0 && forget_rank > 0, "both adapters have a rank");
    let total = (retain_rank + forget_rank) as f64;
    [total / retain_rank as f64, total / forget_rank as f64]
}

/// The adapter controls and loss classes of one batch.
pub struct RoutePlan {
    pub ctl: Vec<AdapterCtl>,
    /// `[batch]` 0/1 masks partitioning the rows that train into the classes the original
    /// trained with separate backward passes (clean, clean-ablated, flagged, coherence; empty
    /// classes dropped). Dropped rows are a class of their own, all of whose tokens are out of
    /// the loss mask: they add nothing and count in the loss's `n`, as the original's dropped
    /// rows did ([`crate::grpo::token_weights`]). Rows without a score are in none, so out of `n`.
    pub classes: Vec<Tensor>,
    /// With a natural plan ([`plan_with_natural`]): the leaves its gradient's difference lands on.
    pub natural: Option<NaturalLeaves>,
}

/// The routing labels of a batch's rows.
#[derive(Debug, Clone)]
pub struct Labels {
    /// Flagged by the detector (after the protocol knobs).
    pub is_rh: Vec<bool>,
    /// Clean routing rows trained with the forget adapter off (`ablated_frac`).
    pub ablated: Vec<bool>,
    /// Coherence rows (`coh_samples_per_rollout`): sampled and trained with the forget adapter
    /// off, and only the retain adapter learns from them, whatever the detector says.
    pub coherence: Vec<bool>,
    /// Rows left out of the loss entirely (coherence hacks under `coherence_rh_mode:
    /// filter_renorm`, the original's `should_filter`).
    pub dropped: Vec<bool>,
    /// Samples without a score (`max_no_score_frac`): in no loss class, so out of the loss and
    /// of the count of rows it divides by.
    pub unscored: Vec<bool>,
}

impl Labels {
    /// Labels of a batch without coherence rows.
    pub fn routed(is_rh: Vec<bool>, ablated: Vec<bool>) -> Self {
        let n = is_rh.len();
        Self { is_rh, ablated, coherence: vec![false; n], dropped: vec![false; n], unscored: vec![false; n] }
    }
}

/// Plans one batch. `weights` are the gradient weights of each dual slot on clean and flagged
/// routing rows (`RowWeights::gates(mode)` for plain routing, [`balanced_weights`] for
/// `balanced`); coherence rows train retain only.
pub fn plan(adapters: &AdapterConfig, weights: RowWeights, labels: &Labels, device: Device) -> RoutePlan {
    plan_with_natural(adapters, weights, None, labels, device)
}

/// [`plan`], and with `natural` (`split_moment`: the natural plan's weights,
/// `RowWeights::gates(RoutingMode::None)`) each dual slot's [`NaturalShare`]: the natural
/// plan's weight of each row less the routed one, so that one backward pass leaves the routed
/// gradient in the parameters and the natural one's difference in [`RoutePlan::natural`]'s
/// leaves. The loss classes do not depend on the weights, so both plans share them, and the
/// gradient terms are linear in the weights: the sum is the natural plan's own pass's gradient.
pub fn plan_with_natural(adapters: &AdapterConfig, weights: RowWeights, natural: Option<RowWeights>, labels: &Labels, device: Device) -> RoutePlan {
    let Labels { is_rh, ablated, coherence, dropped, unscored } = labels;
    let n = is_rh.len();
    assert!(ablated.len() == n && coherence.len() == n && dropped.len() == n && unscored.len() == n, "one label of each kind per row");
    assert!((0..n).all(|i| !(ablated[i] && (is_rh[i] || coherence[i]))), "only clean routing rows can be ablated");
    assert!((0..n).all(|i| !dropped[i] || coherence[i]), "only coherence rows are dropped");
    let routing_row = |i: usize| !coherence[i];
    let class = |keep: &dyn Fn(usize) -> bool| (0..n).map(|i| !unscored[i] && keep(i)).collect::<Vec<bool>>();
    let classes = [
        class(&|i| routing_row(i) && !is_rh[i] && !ablated[i]),
        class(&|i| ablated[i]),
        class(&|i| routing_row(i) && is_rh[i]),
        class(&|i| coherence[i] && !dropped[i]),
        class(&|i| dropped[i]),
    ]
    .into_iter()
    .filter(|rows| rows.iter().any(|&r| r))
    .map(|rows| row_mask(&rows, device))
    .collect();
    let dual = matches!(adapters.kind, AdapterKind::DualLora | AdapterKind::DualMlp);
    assert!(natural.is_none() || dual, "split_moment needs dual adapters (checked by the configuration)");
    let leaves = natural.map(|_| NaturalLeaves::default());
    let ctl = match adapters.kind {
        AdapterKind::Full => vec![],
        AdapterKind::Lora => vec![AdapterCtl::on()],
        AdapterKind::DualLora | AdapterKind::DualMlp => {
            let mut ctl = vec![AdapterCtl::on(), AdapterCtl::on()];
            let coherence_weights = [1.0, 0.0];
            let row_weights = |weights: RowWeights, slot: usize| -> Vec<f64> {
                (0..n)
                    .map(|i| match (coherence[i], is_rh[i]) {
                        (true, _) => coherence_weights[slot],
                        (false, true) => weights.flagged[slot],
                        (false, false) => weights.clean[slot],
                    })
                    .collect()
            };
            for slot in [RETAIN, FORGET] {
                let routed = row_weights(weights, slot);
                ctl[slot].learn = learn(&routed, device);
                if let (Some(natural), Some(leaves)) = (natural, &leaves) {
                    let share: Vec<f32> = row_weights(natural, slot).iter().zip(&routed).map(|(n, r)| (n - r) as f32).collect();
                    if share.iter().any(|&w| w != 0.0) {
                        ctl[slot].natural = Some(NaturalShare { rows: Tensor::from_slice(&share).to(device).view([-1, 1, 1]), leaves: leaves.clone() });
                    }
                }
            }
            let forget_off: Vec<bool> = (0..n).map(|i| ablated[i] || coherence[i]).collect();
            if forget_off.iter().any(|&off| off) {
                let scales: Vec<f32> = forget_off.iter().map(|&off| if off { 0.0 } else { 1.0 }).collect();
                ctl[FORGET].scale = RowScale::PerRow(Tensor::from_slice(&scales).view([-1, 1, 1]).to(device));
            }
            ctl
        }
    };
    RoutePlan { ctl, classes, natural: leaves }
}

fn learn(row_weights: &[f64], device: Device) -> RowLearn {
    if row_weights.iter().all(|&w| w == 1.0) {
        RowLearn::All
    } else if row_weights.iter().all(|&w| w == 0.0) {
        RowLearn::Nothing
    } else {
        let values: Vec<f32> = row_weights.iter().map(|&w| w as f32).collect();
        RowLearn::Rows(Tensor::from_slice(&values).to(device).view([-1, 1, 1]))
    }
}

/// `[batch]` float 0/1 mask.
pub fn row_mask(rows: &[bool], device: Device) -> Tensor {
    let values: Vec<f32> = rows.iter().map(|&r| if r { 1.0 } else { 0.0 }).collect();
    Tensor::from_slice(&values).to_kind(Kind::Float).to(device)
}

/// The original's deployment rule (CLAUDE.md, COUNTDOWN_CODE_NOTES.md "Forget-scale
/// selection protocol", `_pick_scale` in figures_pareto/proto_figure1_v2.py): of a forget-scale
/// curve (`(forget scale, monitored hack rate)` points, 0.0 to 1.0 in the original), the highest
/// scale whose monitored hack rate is strictly below `base_rate` (the base model's), else 0.0
/// (full ablation) as the original falls back, whether or not 0.0 itself passes. The curve need
/// not be monotone: the highest passing scale wins even above a failing one.
pub fn deployed_forget_scale(curve: &[(f64, f64)], base_rate: f64) -> Result<f64> {
    ensure!(!curve.is_empty(), "the forget-scale curve has no points");
    ensure!(base_rate.is_finite(), "the base hack rate is {base_rate}");
    for &(scale, rate) in curve {
        ensure!((0.0..=1.0).contains(&scale) && (0.0..=1.0).contains(&rate), "forget scale {scale} with hack rate {rate}: both must be in [0, 1]");
    }
    Ok(curve.iter().filter(|(_, rate)| *rate < base_rate).map(|(scale, _)| *scale).fold(0.0, f64::max))
}

/// The names of the evaluation modes (keys of `routing_eval.jsonl`'s `modes`).
pub mod eval_mode {
    /// Every adapter on (the only mode without DualLoRA).
    pub const BOTH: &str = "both";
    pub const RETAIN_ONLY: &str = "retain_only";
    pub const FORGET_ONLY: &str = "forget_only";
}

/// Adapter scales (one per slot) of the evaluation modes.
pub fn eval_modes(adapters: &AdapterConfig) -> Vec<(&'static str, Vec<f64>)> {
    match adapters.kind {
        AdapterKind::Full => vec![(eval_mode::BOTH, vec![])],
        AdapterKind::Lora => vec![(eval_mode::BOTH, vec![1.0])],
        AdapterKind::DualLora | AdapterKind::DualMlp => vec![
            (eval_mode::BOTH, vec![1.0, 1.0]),
            (eval_mode::RETAIN_ONLY, vec![1.0, 0.0]),
            (eval_mode::FORGET_ONLY, vec![0.0, 1.0]),
        ],
    }
}

/// Evaluation modes at chosen adapter scales, in the order given: each of `scales` (one value
/// per adapter slot), then `(1, f)` for each forget scale `f` (DualLoRA only: retain on, the
/// forget adapter scaled). Named `retain<r>_forget<f>` (DualLoRA) or `lora<s>` (one LoRA), so
/// `retain1_forget0` is `retain_only`'s scales. Errors name the flag and what fits.
pub fn scaled_modes(adapters: &AdapterConfig, scales: &[Vec<f64>], forget_scales: &[f64]) -> Result<Vec<(String, Vec<f64>)>> {
    let slots = adapters.slots.len();
    anyhow::ensure!(slots > 0 || (scales.is_empty() && forget_scales.is_empty()), "--scales and --forget-scales need adapters; this checkpoint is full fine-tuning");
    anyhow::ensure!(forget_scales.is_empty() || adapters.is_dual(), "--forget-scales needs DualLoRA or DualMLP (retain and forget adapters); this checkpoint has {:?}", adapters.kind);
    let mut modes: Vec<(String, Vec<f64>)> = Vec::new();
    for values in scales.iter().cloned().chain(forget_scales.iter().map(|&f| vec![1.0, f])) {
        anyhow::ensure!(values.len() == slots, "--scales {values:?}: needs {slots} value(s), one per adapter {:?}", adapters.slots);
        anyhow::ensure!(values.iter().all(|v| v.is_finite()), "adapter scales must be finite numbers, got {values:?}");
        let name = match adapters.is_dual() {
            true => format!("retain{}_forget{}", values[RETAIN], values[FORGET]),
            false => format!("lora{}", values[0]),
        };
        anyhow::ensure!(!modes.iter().any(|(n, _)| *n == name), "adapter scales {values:?} are asked for twice");
        modes.push((name, values));
    }
    Ok(modes)
}

#[cfg(test)]
mod tests;
