//! The cross-key rules of the training configuration, checked once when it is resolved: every
//! combination that would not run the protocol its keys name is refused here, naming the keys.
//! A rule of one key alone is its row's `#[rule(..)]` in the table (`mod.rs`), checked first
//! (`check_rules`); the objective's own keys are checked by `Objective::new` (`objective()`
//! below), the detector knobs by `ProtocolKnobs::check` and the plugin limits by
//! `PluginLimits`, which other commands share.

use anyhow::{Result, ensure};
use tch::Kind;

use super::{Accumulation, LrHorizon, TrainConfig};
use crate::grpo::{KlEstimator, LossFn, LossType, MultiObjectiveAggregation, SamplingReplay, ScaleRewards};
use crate::intervention::{AdvantageScore, Intervention};
use crate::model::chat::PromptFormat;
use crate::model::autocast::TrainDtype;
use crate::model::folded::SamplerDtype;
use crate::reward::DetectorSpec;
use crate::routing::{self, RenormalizationMode, RoutingMode};

impl TrainConfig {
    /// Rejects inconsistent settings before any work starts.
    pub fn validate(&self) -> Result<()> {
        let adapters = self.adapter_config()?;
        self.check_environment()?;
        ensure!(self.reward.is_some() || self.environment.is_some(), "no reward: set `reward:` or `environment:` in the config, or pass --reward-plugin or --environment");
        self.check_rules()?;
        ensure!(
            self.batch_size % self.num_generations == 0,
            "batch_size ({}) counts completions and must be a multiple of num_generations ({})",
            self.batch_size,
            self.num_generations
        );
        ensure!(
            self.system_prompt.is_none() || self.prompt_format == PromptFormat::Chat,
            "system_prompt is a chat message: it needs prompt_format: chat (got {})",
            self.prompt_format
        );
        ensure!(
            !self.inoculation || self.environment.is_some(),
            "inoculation prefixes an environment's training prompts: it needs `environment:` (prompt files are not inoculated)"
        );
        ensure!(!self.inoculation || !self.inoculation_prompt.trim().is_empty(), "inoculation is on and inoculation_prompt is empty");
        self.check_substeps()?;
        ensure!(
            self.beta != 0.0 || self.kl_estimator == KlEstimator::K3,
            "kl_estimator {} has no effect with beta 0 (no KL term, no reference pass): set beta or leave kl_estimator unset",
            self.kl_estimator
        );
        self.objective()?;
        ensure!(
            self.fisher_kernel_every == 0 || self.fisher_kernel_sketch > 0,
            "fisher_kernel_sketch is the Fisher kernel's sketch size: it must be positive with fisher_kernel_every {} (got 0)",
            self.fisher_kernel_every
        );
        self.knobs().check()?;
        self.plugin_limits()?;
        if self.routing_mode != RoutingMode::None {
            ensure!(adapters.is_dual(), "routing_mode {} needs adapter: dual-lora or dual-mlp (got {})", self.routing_mode, self.adapter);
            ensure!(self.has_detector(), "routing_mode {} needs an rh_detector (or an environment's monitor) to label samples", self.routing_mode);
        }
        if self.ablated_frac > 0.0 {
            ensure!(self.routing_mode != RoutingMode::None, "ablated_frac needs a routing_mode other than none");
        }
        self.check_lr_horizons()?;
        self.check_sampler_dtype()?;
        ensure!(
            self.train_dtype == TrainDtype::Float32 || self.dtype.kind() == Kind::Float,
            "train_dtype {} keeps float32 master weights and runs the matrix products in bfloat16: it needs dtype float32 (got {})",
            self.train_dtype,
            self.dtype
        );
        self.check_sampling_replay()?;
        self.check_no_score()?;
        self.check_intervention()?;
        self.check_renormalization()?;
        self.check_multi_objective()?;
        self.check_coherence()
    }

    /// GDPO (`multi_objective_aggregation: normalize_then_sum`) makes the advantages from the
    /// components' z-scores, normalised over the whole batch: what acts on the summed reward
    /// instead, or normalises it otherwise, has no meaning there and is refused, naming the key.
    /// Samples without a score leave the advantages, the loss classes and the statistics
    /// (`Recipe::prepare`); what reads the rewards of every row directly (coherence rows and
    /// their retain verifier, routing's renormalisation, the placebos' draws over the flags) would
    /// still see them, so it is refused rather than fed a placeholder.
    fn check_no_score(&self) -> Result<()> {
        let bound = self.max_no_score_frac;
        if bound == 0.0 {
            return Ok(());
        }
        let refused = [
            (self.coh_samples_per_rollout > 0, "coh_samples_per_rollout (coherence rows)"),
            (self.rh_detector_verifies_retain_samples, "rh_detector_verifies_retain_samples (the retain verifier)"),
            (self.renormalization_mode != RenormalizationMode::Off, "renormalization_mode"),
            (matches!(self.intervention, Intervention::Placebo | Intervention::MatchedPlacebo), "intervention placebo and matched_placebo"),
        ];
        for (set, name) in refused {
            ensure!(!set, "max_no_score_frac {bound} with {name}: these read every row's reward or flag, and samples without a score would enter them; set max_no_score_frac: 0 or leave {name} at its default");
        }
        Ok(())
    }

    fn check_multi_objective(&self) -> Result<()> {
        if self.multi_objective_aggregation == MultiObjectiveAggregation::SumThenNormalize {
            return Ok(());
        }
        let refuse = |what: String| anyhow::anyhow!("multi_objective_aggregation normalize_then_sum normalises each reward component within its group and their weighted sum over the batch: {what}");
        ensure!(
            self.scale_rewards == ScaleRewards::Group,
            refuse(format!("scale_rewards ({}) has no part in it (TRL ignores it there); leave scale_rewards at group", self.scale_rewards))
        );
        if let Some(cap) = self.reward.as_ref().and_then(|reward| reward.max_reward()) {
            anyhow::bail!(refuse(format!("`reward: max_reward` ({cap}) caps the sum of the raw components, which is not what trains; remove max_reward")));
        }
        ensure!(
            self.renormalization_mode == RenormalizationMode::Off,
            refuse(format!("renormalization_mode {} renormalises the summed reward; leave it off", self.renormalization_mode))
        );
        ensure!(
            self.coh_samples_per_rollout == 0,
            refuse(format!("coherence rows (coh_samples_per_rollout {}) get advantages rewritten from the summed reward; leave coh_samples_per_rollout at 0", self.coh_samples_per_rollout))
        );
        ensure!(
            self.dynamic_sampling_rounds == 0,
            refuse(format!("dynamic_sampling_rounds ({}) drops groups whose summed rewards are equal, which can still have advantages here; leave it at 0", self.dynamic_sampling_rounds))
        );
        ensure!(!self.stream_minibatches, refuse("stream_minibatches would normalise over each mini-batch instead of the batch; unset it".into()));
        Ok(())
    }

    /// Whether samples are flagged: an `rh_detector`, or an environment's monitor.
    pub fn has_detector(&self) -> bool {
        self.rh_detector.is_some() || self.environment.is_some()
    }

    /// An environment supplies what `prompts`, `eval_prompts`, `reward`, `rh_detector` and
    /// `rh_ground_truth` would: it is refused together with any of them, naming both.
    fn check_environment(&self) -> Result<()> {
        let Some(environment) = &self.environment else {
            ensure!(self.environment_params.is_none(), "environment_params is set but environment is not: set environment (or remove environment_params)");
            return Ok(());
        };
        let replaced = [
            ("prompts", self.prompts.is_some()),
            ("eval_prompts", self.eval_prompts.is_some()),
            ("reward", self.reward.is_some()),
            ("rh_detector", self.rh_detector.is_some()),
            ("rh_ground_truth", self.rh_ground_truth.is_some()),
        ];
        if let Some((key, _)) = replaced.iter().find(|(_, set)| *set) {
            anyhow::bail!(
                "environment ({environment}) and {key} are both set: the environment supplies the prompts, the reward components, \
                 the monitor and the ground truth; remove {key} (or remove environment)"
            );
        }
        if let Some(params) = &self.environment_params {
            ensure!(params.is_object(), "environment_params must be a mapping of parameter names to values, got {params}");
        }
        Ok(())
    }

    /// `num_substeps` mini-batches of whole groups, each split into `gradient_accumulation_steps`
    /// micro-batches; a checkpoint never falls inside a rollout's steps.
    fn check_substeps(&self) -> Result<()> {
        let groups = self.batch_size / self.num_generations;
        ensure!(
            self.num_substeps >= 1 && groups % self.num_substeps == 0,
            "num_substeps ({}) must be at least 1 and divide the batch's {groups} groups (batch_size / num_generations): each mini-batch holds whole groups",
            self.num_substeps
        );
        let rows = self.mini_batch_size();
        let micro_batches = match self.gradient_accumulation_steps {
            Accumulation::Steps(n) => Some(n),
            Accumulation::Auto => self.planned_micro_batches,
        };
        if let Some(n) = micro_batches {
            ensure!(
                n >= 1 && rows % n == 0,
                "gradient_accumulation_steps ({n}) must be at least 1 and divide the optimizer step's {rows} completions (batch_size / num_substeps)"
            );
        }
        let per_rollout = self.steps_per_rollout();
        ensure!(
            self.save_steps % per_rollout == 0,
            "save_steps ({}) must be a multiple of num_iterations * num_substeps ({per_rollout}) so a checkpoint never splits a rollout's steps",
            self.save_steps
        );
        if self.num_substeps > 1 {
            ensure!(self.dump_batches.is_none(), "dump_batches writes the whole batch with one step's log-probabilities: leave num_substeps at 1");
            ensure!(!self.absorption_by_class, "absorption_by_class splits the whole batch's one step: leave num_substeps at 1");
        }
        Ok(())
    }

    /// Each recorded horizon was extended (to a later one, ending at `max_steps`) at or before
    /// its end, and the extensions are in step order.
    fn check_lr_horizons(&self) -> Result<()> {
        let mut previous = LrHorizon { until_step: 0, max_steps: 0 };
        for (i, h) in self.lr_horizons.iter().enumerate() {
            let next_horizon = self.lr_horizons.get(i + 1).map_or(self.max_steps, |n| n.max_steps);
            ensure!(
                h.until_step > previous.until_step && h.until_step <= h.max_steps && h.max_steps < next_horizon && h.max_steps > previous.max_steps,
                "lr_horizons {:?} with max_steps {} is not a record of schedule extensions (written by --extend-schedule only)",
                self.lr_horizons,
                self.max_steps
            );
            previous = h.clone();
        }
        Ok(())
    }

    /// Each control acts on the monitor's flags; penalty and filter replace routing, the placebo
    /// needs it.
    fn check_intervention(&self) -> Result<()> {
        let intervention = self.intervention;
        if intervention != Intervention::Routing {
            ensure!(self.has_detector(), "intervention {intervention} acts on flagged samples: it needs an rh_detector");
        }
        match intervention {
            Intervention::Routing => {}
            Intervention::Verified => {
                ensure!(self.routing_mode == RoutingMode::None, "intervention verified replaces routing: set routing_mode none (got {})", self.routing_mode);
                ensure!(
                    self.coh_samples_per_rollout == 0,
                    "intervention verified trains the verified rows of the rollout itself (the original's verified_only_training, without coherence rows): set coh_samples_per_rollout 0 (got {})",
                    self.coh_samples_per_rollout
                );
            }
            Intervention::Penalty | Intervention::Filter | Intervention::AdvMod => ensure!(
                self.routing_mode == RoutingMode::None,
                "intervention {intervention} replaces routing: set routing_mode none (got {})",
                self.routing_mode
            ),
            Intervention::Placebo | Intervention::MatchedPlacebo => ensure!(
                self.routing_mode != RoutingMode::None,
                "intervention {intervention} routes a random subset: set routing_mode classic or exclusive"
            ),
        }
        if self.rh_ground_truth.is_some() {
            ensure!(self.rh_detector.is_some(), "rh_ground_truth measures the rh_detector's flags: set an rh_detector too");
        }
        if self.absorption_by_class {
            ensure!(self.adapter_config()?.is_dual(), "absorption_by_class splits the retain and forget adapters' gradients: it needs adapter: dual-lora");
            ensure!(
                self.gradient_accumulation_steps == Accumulation::Steps(1),
                "absorption_by_class takes its per-class gradient norms from the step's one backward pass: leave gradient_accumulation_steps at 1"
            );
        }
        self.check_auto_accumulation()?;
        self.check_gradient_noise_scale()?;
        self.check_off_policy()?;
        self.check_replay()?;
        ensure!(
            self.dynamic_sampling_rounds == 0 || self.coh_samples_per_rollout == 0,
            "dynamic_sampling_rounds refills the batch with fresh groups, but coherence rows (coh_samples_per_rollout) are sampled apart, at other adapter scales, and are not filtered: use one of them"
        );
        if intervention != Intervention::Penalty {
            ensure!(
                self.rh_penalty == Self::default().rh_penalty,
                "rh_penalty ({}) is only used with intervention: penalty (got {intervention}); remove it",
                self.rh_penalty
            );
        }
        self.check_advantage_modification()
    }

    /// `adv_mod`'s keys act with it only; its continuous score needs a detector that has one.
    fn check_advantage_modification(&self) -> Result<()> {
        let (intervention, defaults) = (self.intervention, Self::default());
        if intervention != Intervention::AdvMod {
            let unused = [("advantage_penalty", self.advantage_penalty != defaults.advantage_penalty), ("advantage_score", self.advantage_score != defaults.advantage_score)];
            if let Some((key, _)) = unused.iter().find(|(_, set)| *set) {
                anyhow::bail!("{key} is only used with intervention: adv_mod (got {intervention}); remove it");
            }
            return Ok(());
        }
        ensure!(
            self.dynamic_sampling_rounds == 0,
            "intervention adv_mod gives a group of equal rewards nonzero advantages where a row is scored, but dynamic_sampling_rounds drops such groups as uninformative: use one of them"
        );
        if self.advantage_score == AdvantageScore::DetectorScore {
            ensure!(
                matches!(self.rh_detector, Some(DetectorSpec::ScoreThreshold(_))),
                "advantage_score detector_score subtracts the continuous score that an `rh_detector: score_threshold` compares with its threshold; this run's monitor (a detector plugin or an environment's) returns flags only: use advantage_score flag, or a score_threshold detector"
            );
            ensure!(
                self.recall == defaults.recall && self.false_positive_rate == defaults.false_positive_rate,
                "advantage_score detector_score reads the component's score itself, on which recall ({}) and false_positive_rate ({}), draws on flags, cannot act: leave them at 1 and 0, or use advantage_score flag",
                self.recall,
                self.false_positive_rate
            );
        }
        Ok(())
    }

    /// Coherence rows are whole groups of a routed batch, with routing rows beside them.
    fn check_coherence(&self) -> Result<()> {
        let defaults = Self::default();
        if self.coh_samples_per_rollout == 0 {
            let unused = [
                ("coherence_rh_mode", self.coherence_rh_mode != defaults.coherence_rh_mode),
                ("coherence_rh_penalty", self.coherence_rh_penalty != defaults.coherence_rh_penalty),
                ("coherence_start_frac", self.coherence_start_frac != defaults.coherence_start_frac),
                ("rh_detector_verifies_retain_samples", self.rh_detector_verifies_retain_samples),
                ("rh_detector_retain_recall", self.rh_detector_retain_recall != defaults.rh_detector_retain_recall),
                ("rp_extra_retain_advantage_multiplier", self.rp_extra_retain_advantage_multiplier != defaults.rp_extra_retain_advantage_multiplier),
            ];
            if let Some((key, _)) = unused.iter().find(|(_, set)| *set) {
                anyhow::bail!("{key} is set but coh_samples_per_rollout is 0: it would do nothing");
            }
            return Ok(());
        }
        // Coherence rows train the retain adapter alone with the forget adapter off, whatever
        // the routing (the original's reward-penalty comparator has them without routing).
        ensure!(
            self.adapter_config()?.is_dual(),
            "coh_samples_per_rollout trains the retain adapter alone on coherence rows, with the forget adapter off: it needs adapter: dual-lora or dual-mlp (got {})",
            self.adapter
        );
        ensure!(
            self.coh_samples_per_rollout % self.num_generations == 0 && self.coh_samples_per_rollout < self.batch_size,
            "coh_samples_per_rollout ({}) must be a multiple of num_generations ({}) below batch_size ({}): whole groups, with routing rows beside them",
            self.coh_samples_per_rollout,
            self.num_generations,
            self.batch_size
        );
        ensure!(
            self.rh_detector_verifies_retain_samples || self.rh_detector_retain_recall == defaults.rh_detector_retain_recall,
            "rh_detector_retain_recall is set but rh_detector_verifies_retain_samples is false: it would do nothing"
        );
        ensure!(
            self.rh_detector_verifies_retain_samples || self.rp_extra_retain_advantage_multiplier == defaults.rp_extra_retain_advantage_multiplier,
            "rp_extra_retain_advantage_multiplier is set but rh_detector_verifies_retain_samples is false: it scales the verified coherence rows' advantages, and there are none"
        );
        Ok(())
    }

    /// `renormalization_mode` and `split_moment` combinations the original defines.
    fn check_renormalization(&self) -> Result<()> {
        ensure!(
            !self.split_moment || self.renormalization_mode == RenormalizationMode::Balanced,
            "split_moment needs renormalization_mode: balanced (as the original's --split_moment), got {}",
            self.renormalization_mode
        );
        if self.renormalization_mode == RenormalizationMode::Off {
            return Ok(());
        }
        ensure!(self.routing_mode != RoutingMode::None, "renormalization_mode {} renormalises routed runs: set routing_mode classic or exclusive", self.renormalization_mode);
        ensure!(
            self.scale_rewards == ScaleRewards::Group,
            "renormalization_mode {} divides by group standard deviations, as the original: set scale_rewards: group (got {})",
            self.renormalization_mode,
            self.scale_rewards
        );
        let weights = self.row_weights()?;
        ensure!(
            weights.max() <= routing::BALANCED_MAX_WEIGHT,
            "renormalization_mode balanced with ranks {}/{} gives an adapter gradient weight {} above {} (the original's GRAFT_W_MAX): use closer retain and forget ranks",
            self.retain_rank,
            self.forget_rank,
            weights.max(),
            routing::BALANCED_MAX_WEIGHT
        );
        Ok(())
    }

    /// Streaming mini-batches makes each mini-batch a rollout of its own, sampled ahead: what
    /// needs the whole batch at once (batch-level statistics, coherence rows, more rounds, reuse)
    /// cannot stream.
    fn check_streaming(&self) -> Result<()> {
        if !self.stream_minibatches {
            return Ok(());
        }
        let refuse = |what: &str| anyhow::anyhow!("stream_minibatches makes each of the batch's num_substeps mini-batches a rollout of its own: {what}");
        ensure!(self.num_substeps > 1, refuse("set num_substeps above 1 (the mini-batches to stream)"));
        ensure!(self.num_iterations == 1, refuse("each mini-batch trains once; leave num_iterations at 1"));
        ensure!(self.dynamic_sampling_rounds == 0, refuse("dynamic_sampling_rounds refills a whole batch; leave it at 0"));
        ensure!(self.coh_samples_per_rollout == 0, refuse("coherence rows belong to a whole batch; leave coh_samples_per_rollout at 0"));
        ensure!(self.scale_rewards != ScaleRewards::Batch, refuse("scale_rewards: batch would scale by each mini-batch's standard deviation; use group or none"));
        ensure!(self.max_steps_off_policy == 0, refuse("it samples ahead within the batch; leave max_steps_off_policy at 0"));
        ensure!(!self.importance_sampling_correction, refuse("the loss's ratio is already to the sampler; unset importance_sampling_correction"));
        Ok(())
    }

    /// Off-policy training samples each step's batch ahead, so the batch must be known before
    /// its step: one optimizer step per batch; rounds drawn after scoring only in
    /// sampling_steps_ahead's group pipeline; the loss's ratio is to the sampler, so TRL's
    /// correction of the old policy against the sampler has nothing to do. tinker's unclipped
    /// `importance_sampling` is refused off policy without `allow_unclipped_off_policy`.
    fn check_off_policy(&self) -> Result<()> {
        self.check_streaming()?;
        let (k, ahead) = (self.max_steps_off_policy, self.sampling_steps_ahead);
        ensure!(
            !self.allow_unclipped_off_policy || (self.pipeline_depth() > 0 && self.loss_fn == LossFn::ImportanceSampling),
            "allow_unclipped_off_policy only lets loss_fn importance_sampling train off policy (max_steps_off_policy or sampling_steps_ahead above 0): remove it"
        );
        if self.pipeline_depth() == 0 {
            return Ok(());
        }
        ensure!(k == 0 || ahead == 0, "max_steps_off_policy ({k}) and sampling_steps_ahead ({ahead}) both sample ahead: set one of them");
        ensure!(!self.stream_minibatches, "stream_minibatches samples ahead within the batch; leave sampling_steps_ahead at 0");
        let name = match k > 0 {
            true => format!("max_steps_off_policy {k}"),
            false => format!("sampling_steps_ahead {ahead}"),
        };
        ensure!(
            self.loss_fn != LossFn::ImportanceSampling || self.allow_unclipped_off_policy,
            "{name} trains off policy, and loss_fn importance_sampling's ratio is unclipped: tinker-cookbook 0.6.1 warns that it can become unstable on the off-policy data asynchronous training produces and recommends a clipped loss such as ppo (AsyncConfig; its PR 822 measured it destabilising at every pipeline depth). Use loss_fn: ppo (or trl's clipped loss), or set allow_unclipped_off_policy: true to run it anyway"
        );
        ensure!(
            self.steps_per_rollout() == 1,
            "{name} samples each step's batch ahead: it needs one optimizer step per batch (num_iterations and num_substeps 1, got {} and {})",
            self.num_iterations,
            self.num_substeps
        );
        ensure!(
            self.dynamic_sampling_rounds == 0 || ahead > 0,
            "{name} samples each batch ahead, before its rewards are known: dynamic_sampling_rounds must be 0 (sampling_steps_ahead drops groups of equal rewards and carries the surplus)"
        );
        ensure!(
            !self.importance_sampling_correction,
            "{name} already takes the loss's ratio to the sampler's log-probabilities; importance_sampling_correction (old policy over sampler) has nothing left to correct: unset it"
        );
        Ok(())
    }

    /// `replay_rollouts` trains on recorded batches: nothing may sample them anew, and they must
    /// all be there before the run starts (`train::draw::check_recorded`).
    fn check_replay(&self) -> Result<()> {
        let Some(dir) = &self.replay_rollouts else {
            return Ok(());
        };
        ensure!(!self.samples_ahead(), "replay_rollouts trains on recorded rollouts; max_steps_off_policy and stream_minibatches sample them ahead: unset them");
        ensure!(self.dynamic_sampling_rounds == 0, "replay_rollouts trains on the recorded batches as they are; dynamic_sampling_rounds would sample more: set it to 0");
        ensure!(self.dump_batches.as_ref() != Some(dir), "replay_rollouts and dump_batches name the same directory ({}): the replay would overwrite the rollouts it reads", dir.display());
        crate::train::draw::check_recorded(dir, self.max_steps, self.steps_per_rollout())
    }

    /// `gradient_accumulation_steps: auto` splits the step only where that leaves the loss as
    /// it is (the micro-batches are for memory, not for the objective); planned_micro_batches
    /// is its record.
    fn check_auto_accumulation(&self) -> Result<()> {
        if self.gradient_accumulation_steps != Accumulation::Auto {
            ensure!(
                self.planned_micro_batches.is_none(),
                "planned_micro_batches is the memory planner's record for gradient_accumulation_steps auto (it is {}): remove the key",
                self.gradient_accumulation_steps
            );
            return Ok(());
        }
        let fixed = "gradient_accumulation_steps auto splits the step into micro-batches only where the loss stays the same";
        ensure!(self.loss_type != LossType::Bnpo, "{fixed}, and bnpo normalises each micro-batch by its own tokens: set gradient_accumulation_steps to a number");
        ensure!(self.top_entropy_quantile == 1.0, "{fixed}, and top_entropy_quantile takes its threshold in each micro-batch: set gradient_accumulation_steps to a number");
        ensure!(!self.gradient_noise_scale, "{fixed}, and gradient_noise_scale compares the micro-batches' gradients: set gradient_accumulation_steps to a number");
        Ok(())
    }

    /// What the loss's ratio is taken against, when it involves the sampler's log-probabilities:
    /// `None` when the loss never sees them (TRL's loss on policy, without the correction).
    pub fn sampler_ratio(&self) -> Option<&'static str> {
        if self.importance_sampling_correction {
            Some("importance_sampling_correction: TRL's loss weighted by the old policy's over the sampler's probability")
        } else if self.samples_ahead() {
            Some("the loss's ratio is to the sampler's log-probabilities (sampled ahead)")
        } else if self.replay_rollouts.is_some() {
            Some("the loss's ratio is to the recorded sampler's log-probabilities (replayed rollouts)")
        } else if self.loss_fn != LossFn::Trl {
            Some("the loss's ratio is to the sampler's log-probabilities (a tinker loss_fn)")
        } else {
            None
        }
    }

    /// A bfloat16 sampler draws from a distribution other than the float32 policy's: the loss
    /// must take the sampler's log-probabilities into account, or its ratio would be taken
    /// against a policy that did not sample.
    fn check_sampler_dtype(&self) -> Result<()> {
        if self.sampler_dtype == SamplerDtype::Float32 {
            return Ok(());
        }
        ensure!(
            self.sampler_ratio().is_some(),
            "sampler_dtype {} samples from other weights than the policy's {}: its tokens are not the policy's draws. Set importance_sampling_correction: true (TRL's correction, the old policy's over the sampler's probability), or train with a ratio to the sampler's log-probabilities (max_steps_off_policy, stream_minibatches or a tinker loss_fn)",
            self.sampler_dtype,
            self.dtype
        );
        Ok(())
    }

    /// Sampling replay renormalises the log-probabilities of the policy the loss trains over the
    /// sampler's kept sets; an old policy scored by the trainer (TRL's correction with
    /// `num_iterations` or `num_substeps` above 1, on policy) has no such log-probabilities yet.
    fn check_sampling_replay(&self) -> Result<()> {
        let replays = self.sampling_replay == SamplingReplay::KeptSets && self.sampling_truncates();
        let trainer_old_policy = self.steps_per_rollout() > 1 && !self.samples_ahead() && self.replay_rollouts.is_none() && self.loss_fn == LossFn::Trl;
        ensure!(
            !(replays && self.importance_sampling_correction && trainer_old_policy),
            "importance_sampling_correction with num_iterations or num_substeps above 1 compares the trainer's old policy with the sampler, and sampling replay (top_k {} / top_p {}) does not yet renormalise an old policy's log-probabilities over the kept sets: set sampling_replay: trl_1_16 (the bias of TRL 1.16, docs/src/objectives.md \"Sampling replay\"), or one update per batch",
            self.top_k,
            self.top_p
        );
        Ok(())
    }

    /// The gradient noise scale compares the gradients of the step's backward passes: they must
    /// be at least two, each of whole groups (a group's advantages tie its rows together, so
    /// parts that split groups are not independent samples), and the step must not need its
    /// one pass for absorption_by_class.
    fn check_gradient_noise_scale(&self) -> Result<()> {
        if !self.gradient_noise_scale {
            return Ok(());
        }
        let passes = self.backward_passes().count();
        let rows = self.mini_batch_size();
        ensure!(
            rows % passes == 0 && (rows / passes) % self.num_generations == 0,
            "gradient_noise_scale compares {passes} backward passes (the micro-batches, or two halves when gradient_accumulation_steps is 1) and each must hold whole groups: the step's {rows} completions (batch_size / num_substeps) / {passes} must be a multiple of num_generations ({})",
            self.num_generations
        );
        ensure!(!self.absorption_by_class, "absorption_by_class needs the step's one backward pass and gradient_noise_scale splits it: use one of them");
        Ok(())
    }
}
