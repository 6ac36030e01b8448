//! The training configuration: every hyperparameter of `smallrl train` declared once (below),
//! resolved as defaults < YAML file < flags < `--set` (see [`crate::hyperparams`]). The
//! resolved configuration is written into the run directory, whose name lists every
//! hyperparameter that differs from its default, plus the seed.
//!
//! Adding a hyperparameter: one entry in the table (name, type, default, doc line, run-name
//! label), plus its check in [`TrainConfig::validate`] if it has one, plus its test.
//!
//! Over 300 lines because the table is: about fifty keys, each with its doc line (the flag's
//! help), and the tests that hold run names to the labels they had before the table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::{Map, Value};

use crate::adapters::{self, AdapterConfig, AdapterKind};
use crate::defaults as d;
use crate::device::{DeviceSpec, Dtype};
use crate::grpo::{ImportanceSamplingLevel, KlEstimator, LossFn, LossSettings, LossType, ScaleRewards};
use crate::hyperparams::Label::{Key, Omit, Short};
use crate::hyperparams::{self, hyperparameters};
use crate::intervention::Intervention;
use crate::reward::{DetectorSpec, PluginLimits, ProtocolKnobs, RewardSpec};
use crate::routing::{self, CoherenceRhMode, RenormalizationMode, RoutingMode, RowWeights};

pub use crate::hyperparams::{UNNAMED_RUN, parse_override};

hyperparameters! {
    /// Every hyperparameter of a run, with snake_case names shared by YAML, `--set`, sweeps'
    /// `--grid`/`--fixed` and (in kebab-case) the command line.
    pub struct TrainConfig;
    /// `smallrl train`'s hyperparameter flags: one per key of [`TrainConfig`], each optional.
    pub struct TrainFlags;
    flags {
        /// A model directory or HuggingFace Hub repo id.
        model: String = d::MODEL.into(), Omit;
        /// Hub revision (branch, tag or commit) when `model` is a repo id.
        revision: String = d::REVISION.into(), Omit;
        /// One prompt per line; without it prompts come from the SimpleStories dataset's train split.
        prompts: Option<PathBuf> = None, Omit;
        /// One evaluation prompt per line.
        eval_prompts: Option<PathBuf> = None, Omit;
        /// Tokens of each SimpleStories prompt (the opening of a story).
        prompt_length: usize = 8, Key;
        /// Training prompts used (at most).
        num_prompts: usize = 10_000, Key;

        /// full, lora or dual-lora.
        adapter: AdapterKind = d::ADAPTER, Short("");
        /// DualLoRA preset: r1 r2 r4 r8 r16 r32 r1h r32f16 r32f4 r32f1 (overrides the ranks).
        lora_preset: Option<String> = None, Short("");
        /// DualMLP preset (adapter dual-mlp): m5 m10 m16 m30 m32 m29f3 m24f8 m64 m128 m256, retain
        /// and forget neurons per MLP block (the original's MLP_PRESETS; m16 its recommended).
        mlp_config: Option<String> = None, Short("");
        /// Rank of DualLoRA's retain adapter.
        retain_rank: usize = d::RETAIN_RANK, Key;
        /// Rank of DualLoRA's forget adapter.
        forget_rank: usize = d::FORGET_RANK, Key;
        /// Rank of the single LoRA adapter.
        lora_rank: usize = d::LORA_RANK, Key;
        /// LoRA alpha (an adapter's scale is alpha / rank).
        lora_alpha: f64 = d::LORA_ALPHA, Key;
        /// Adapt layers 0, stride, 2 * stride, ...
        layer_stride: usize = d::LAYER_STRIDE, Key;

        /// Peak learning rate (linear decay to 0 over max_steps).
        lr: f64 = 1e-5, Key;
        /// KL coefficient (0 skips the reference model).
        beta: f64 = 0.02, Key;
        /// The KL term's per-token estimator: k1, k2 or k3 (Schulman 2020; k3 is TRL's).
        kl_estimator: KlEstimator = KlEstimator::K3, Short("kl_");
        /// PPO clipping range (below 1, and above 1 unless epsilon_high is set).
        epsilon: f64 = 0.2, Key;
        /// PPO clipping range above 1 (DAPO's clip-higher, e.g. 0.28; default: epsilon, as TRL).
        epsilon_high: Option<f64> = None, Key;
        /// Upper clamp of the unclipped ratio (TRL's two-sided clipping; above 1 + epsilon_high).
        delta: Option<f64> = None, Key;
        /// token, or sequence (GSPO: one ratio exp(mean log-ratio) per completion).
        importance_sampling_level: ImportanceSamplingLevel = ImportanceSamplingLevel::Token, Short("is_");
        /// Advantages divided by the std of the group, of the batch, or none (TRL's scale_rewards).
        scale_rewards: ScaleRewards = ScaleRewards::Group, Short("scale_");
        /// Completions that hit max_completion_length without EOS leave the loss (DAPO).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        mask_truncated_completions: bool = false, Short("mask_truncated");
        /// grpo, dr_grpo, dapo, bnpo or cispo (CISPO's surrogate, aggregated as dapo; set
        /// epsilon_high, its weight cap, e.g. 5.0).
        loss_type: LossType = LossType::Grpo, Short("");
        /// The surrogate: trl (loss_type's), or tinker's importance_sampling, ppo or dro, with the
        /// ratio to the sampler's log-probabilities (aggregated as loss_type says).
        loss_fn: LossFn = LossFn::Trl, Short("");
        /// tinker's DRO penalty coefficient (loss_fn dro only; tinker's documentation uses 0.05).
        dro_beta: Option<f64> = None, Key;
        /// Only this top fraction of the loss tokens by entropy has a policy term (TRL's
        /// top_entropy_quantile, "Beyond the 80/20 Rule": 0.2); 1 keeps every token.
        top_entropy_quantile: f64 = 1.0, Key;
        /// Passes over each generated batch (TRL's reuse; each pass num_substeps optimizer steps).
        num_iterations: usize = 1, Short("iters");
        /// Mini-batches of whole groups each generated batch is split into, one optimizer step
        /// each (tinker's).
        num_substeps: usize = 1, Short("substeps");
        /// Micro-batches per optimizer step, each a forward and backward pass over
        /// batch_size / (num_substeps * gradient_accumulation_steps) completions (TRL's, with
        /// steps_per_generation equal to it; only bnpo's loss changes).
        gradient_accumulation_steps: usize = 1, Short("gas");
        /// DAPO's dynamic sampling: groups whose rewards are all equal are dropped and more prompts
        /// sampled until the batch is full, in at most this many generation rounds per batch (the
        /// first included; verl's max_num_gen_batches); needing more is an error. 0: off.
        dynamic_sampling_rounds: usize = 0, Short("dynsample");
        /// Completions per generated batch (per optimizer step unless num_substeps splits it).
        batch_size: usize = 32, Short("bs");
        /// Completions per prompt (the group of the advantages).
        num_generations: usize = 16, Short("g");
        /// Tokens generated per completion (at most).
        max_completion_length: usize = d::MAX_COMPLETION_LENGTH, Short("len");
        /// Sampling temperature (also applied to the log-probabilities).
        temperature: f64 = d::TEMPERATURE, Short("temp");
        /// Optimizer steps of the run.
        max_steps: usize = 2000, Short("steps");
        /// Seed of everything random in the run (always in the run name).
        seed: u64 = d::SEED, Omit;
        /// Gradient clipping (global L2 norm).
        max_grad_norm: f64 = d::MAX_GRAD_NORM, Key;
        /// AdamW weight decay (on every trainable tensor).
        weight_decay: f64 = 0.0, Key;
        /// AdamW beta1.
        adam_beta1: f64 = d::ADAM_BETA1, Key;
        /// AdamW beta2.
        adam_beta2: f64 = 0.999, Key;
        /// AdamW epsilon.
        adam_epsilon: f64 = d::ADAM_EPSILON, Key;

        /// none, classic or exclusive.
        routing_mode: RoutingMode = RoutingMode::None, Short("");
        /// Fraction of clean samples trained with the forget adapter off.
        ablated_frac: f64 = 0.0, Short("abl");
        /// Advantages of routed runs: off, retain_only or balanced (the original's
        /// renormalization_mode, advantages.py; its default is retain-only, smallrl's stays off).
        renormalization_mode: RenormalizationMode = RenormalizationMode::Off, Short("renorm_");
        /// balanced on DualLoRA: accept kappa from the ranks, which the original calls approximate
        /// (its --allow_approx_lora_kappa).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        allow_approx_lora_kappa: bool = false, Short("approx_kappa");
        /// Adam's second moment from the natural (unrouted) gradient, the first from the routed
        /// one (the original's --split_moment; needs balanced; a second backward pass per step).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        split_moment: bool = false, Short("split_moment");
        /// Coherence rows per rollout (the original's coh_samples_per_rollout): the batch's last N
        /// completions, whole groups, sampled and trained with the forget adapter off, retain
        /// alone learning (0: none).
        coh_samples_per_rollout: usize = 0, Short("coh");
        /// What a flagged coherence row does: filter, filter_renorm, penalty, zero or none (the
        /// original's coherence_rh_mode and its default).
        coherence_rh_mode: CoherenceRhMode = CoherenceRhMode::Filter, Short("coh_rh_");
        /// Reward taken from flagged coherence rows under coherence_rh_mode penalty (the
        /// original's default).
        coherence_rh_penalty: f64 = 3.0, Short("coh_penalty");
        /// Coherence rows start at step round(coherence_start_frac * max_steps) (0: from the first).
        coherence_start_frac: f64 = 0.0, Short("coh_start");
        /// Detector protocol knob: clean samples flagged anyway (drawn by the host).
        false_positive_rate: f64 = 0.0, Short("fpr");
        /// Detector protocol knob: fraction of flagged samples that stay flagged.
        recall: f64 = 1.0, Key;
        /// Detector protocol knob: fraction of samples eligible for the forget components.
        rh_eligible_frac: f64 = 1.0, Short("elig");
        /// Fraction of prompts that offer the hack (the original's hack_frac, prompt-level where
        /// rh_eligible_frac is per sample): a fixed hash of each prompt's text keeps it hackable
        /// with this probability; unhackable prompts get no forget components.
        hack_frac: f64 = 1.0, Short("hf");
        /// What the monitor's flags do: routing (where routing_mode sends them; with none,
        /// nothing), penalty (reward - rh_penalty), filter (out of the loss and the advantages)
        /// or placebo (a random subset of the same size is routed instead).
        intervention: Intervention = Intervention::Routing, Short("");
        /// Subtracted from a flagged sample's reward with intervention: penalty.
        rh_penalty: f64 = 1.0, Key;
        /// Where reward and detector plugin names resolve (`<dir>/<name>.wasm`).
        plugin_dir: PathBuf = "plugins".into(), Omit;
        /// Fuel (about one unit per WebAssembly instruction) a plugin call may use per sample: the
        /// deterministic bound on a plugin's work.
        plugin_fuel_per_sample: u64 = d::PLUGIN_FUEL_PER_SAMPLE, Omit;
        /// Wall-clock seconds a plugin call may run: the backstop behind fuel.
        plugin_max_call_seconds: f64 = d::PLUGIN_MAX_CALL_SECONDS, Omit;
        /// Largest memory a plugin may have, in MiB (its initial memory included).
        plugin_max_memory_mb: usize = d::PLUGIN_MAX_MEMORY_MB, Omit;

        /// Steps between the sample and summary lines of train.log.
        logging_steps: usize = 10, Omit;
        /// Steps between checkpoints.
        save_steps: usize = 500, Omit;
        /// Steps between routing evaluations.
        eval_every: usize = 100, Omit;
        /// Evaluation prompts (one completion per adapter mode each).
        eval_samples: usize = d::EVAL_PROMPTS, Omit;
        /// Run directories go to `<output_dir>/<run name>`.
        output_dir: PathBuf = "runs".into(), Omit;
        /// Re-score each step's batch after the update (one extra forward pass, about a third of
        /// the training pass) and log the entropy change (`entropy/measured_change`).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        measure_entropy_change: bool = false, Omit;
        /// Log the gradient noise scale (McCandlish et al. 2018's B_simple = tr(Σ) / |G|²) from the
        /// gradients of the batch's micro-batches, or with gradient_accumulation_steps 1 of its two
        /// halves (the step then runs as two backward passes of half the batch each).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        gradient_noise_scale: bool = false, Omit;
        /// Write each step's batch tensors (ids, masks, rewards, advantages, log-probs, loss) here.
        dump_batches: Option<PathBuf> = None, Omit;
        /// TensorBoard event files in the run directory (`train/live.rs`; `--tensorboard false`
        /// turns them off).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        tensorboard: bool = d::TENSORBOARD, Omit;
        /// Every completion with its rewards, detector flags and advantage in `completions.jsonl`.
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        log_completions: bool = d::LOG_COMPLETIONS, Omit;
        /// DualLoRA: each adapter's gradient norm split by flagged / unflagged samples in
        /// metrics.jsonl (two extra backward passes a step; the step's gradient is unchanged).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        absorption_by_class: bool = false, Omit;
        /// Experiment name, first part of the run directory name (default: the config file's
        /// stem, or the reward plugin's name).
        name: Option<String> = None, Omit;
        /// auto, cpu, cuda or cuda:N.
        device: DeviceSpec = d::DEVICE.parse().expect("the default device parses"), Omit;
        /// float32, or bfloat16 (on CUDA).
        dtype: Dtype = d::DTYPE.parse().expect("the default dtype parses"), Key;
        /// libtorch intra-op threads (default: one per core).
        threads: Option<usize> = None, Omit;
    }
    file_only {
        /// The reward: one plugin or a sum of components (see configs/).
        reward: Option<RewardSpec> = None, Omit;
        /// The reward-hack detector that labels samples for routing.
        rh_detector: Option<DetectorSpec> = None, Omit;
        /// Ground truth "did this sample hack" (a detector, same forms as `rh_detector:`): measures
        /// the monitor (quadrants, precision, recall in metrics.jsonl and routing_eval.jsonl);
        /// acts on nothing.
        rh_ground_truth: Option<DetectorSpec> = None, Omit;
        /// SHA-256 of every plugin file the run loaded (path as resolved -> hex), recorded when
        /// the run starts; `--resume` refuses plugins whose bytes changed.
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        plugin_sha256: BTreeMap<String, String> = BTreeMap::new(), Omit;
        /// Written by `train --resume RUN --max-steps N --extend-schedule`, never set by hand:
        /// the linear LR schedule's earlier horizons, each with the step up to which it applied
        /// (a record of what the run computed; the run keeps its directory and name).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        lr_horizons: Vec<LrHorizon> = Vec::new(), Omit;
    }
}

/// Steps `0..until_step` of a run were trained with the linear schedule over `max_steps`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrHorizon {
    pub until_step: usize,
    pub max_steps: usize,
}

/// Keys that may differ when a run is resumed: they do not change what it computes (another
/// thread count changes float summation order, which the log records).
pub const RESUME_MAY_CHANGE: &[&str] = &[
    "threads", "device", "dump_batches", "plugin_fuel_per_sample", "plugin_max_call_seconds", "plugin_max_memory_mb",
    "tensorboard", "log_completions", "absorption_by_class", "measure_entropy_change",
];

impl TrainConfig {
    /// Layers a YAML file's keys (if any) and then explicit overrides over the defaults, and
    /// validates the result.
    pub fn resolve(file: Option<&Path>, overrides: Map<String, Value>) -> Result<Self> {
        let config: Self = hyperparams::resolve(file, overrides, "training configuration")?;
        config.validate()?;
        Ok(config)
    }

    /// Rejects inconsistent settings before any work starts.
    pub fn validate(&self) -> Result<()> {
        let adapters = self.adapter_config()?;
        ensure!(self.reward.is_some(), "no reward: set `reward:` in the config or pass --reward-plugin");
        ensure!(self.batch_size > 0 && self.num_generations > 1, "batch_size must be positive and num_generations at least 2");
        ensure!(
            self.batch_size % self.num_generations == 0,
            "batch_size ({}) counts completions and must be a multiple of num_generations ({})",
            self.batch_size,
            self.num_generations
        );
        ensure!(self.max_steps > 0, "max_steps must be positive");
        ensure!((0.0..=1.0).contains(&self.hack_frac), "hack_frac is a fraction of prompts: it must be in [0, 1], got {}", self.hack_frac);
        ensure!(self.num_iterations >= 1, "num_iterations must be at least 1");
        self.check_substeps()?;
        ensure!(self.temperature > 0.0, "temperature must be positive for GRPO sampling");
        ensure!(self.lr > 0.0 && self.beta >= 0.0 && self.epsilon > 0.0, "lr must be positive, beta >= 0, epsilon > 0");
        ensure!(
            self.beta != 0.0 || self.kl_estimator == KlEstimator::K3,
            "kl_estimator {} has no effect with beta 0 (no KL term, no reference pass): set beta or leave kl_estimator unset",
            self.kl_estimator
        );
        self.check_clip()?;
        ensure!(self.logging_steps > 0 && self.save_steps > 0 && self.eval_every > 0, "logging_steps, save_steps and eval_every must be positive");
        ensure!((0.0..=1.0).contains(&self.ablated_frac), "ablated_frac must be in [0, 1], got {}", self.ablated_frac);
        self.knobs().check()?;
        self.plugin_limits()?;
        if self.routing_mode != RoutingMode::None {
            ensure!(adapters.is_dual(), "routing_mode {} needs adapter: dual-lora or dual-mlp (got {})", self.routing_mode, self.adapter);
            ensure!(self.rh_detector.is_some(), "routing_mode {} needs an rh_detector to label samples", self.routing_mode);
        }
        if self.ablated_frac > 0.0 {
            ensure!(self.routing_mode != RoutingMode::None, "ablated_frac needs a routing_mode other than none");
        }
        self.check_lr_horizons()?;
        self.check_intervention()?;
        self.check_renormalization()?;
        self.check_coherence()
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
        ensure!(
            self.gradient_accumulation_steps >= 1 && rows % self.gradient_accumulation_steps == 0,
            "gradient_accumulation_steps ({}) must be at least 1 and divide the optimizer step's {rows} completions (batch_size / num_substeps)",
            self.gradient_accumulation_steps
        );
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

    /// Optimizer steps trained on each generated batch.
    pub fn steps_per_rollout(&self) -> usize {
        self.num_iterations * self.num_substeps
    }

    /// Completions each optimizer step trains on (its mini-batch).
    pub fn mini_batch_size(&self) -> usize {
        self.batch_size / self.num_substeps
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
            ensure!(self.rh_detector.is_some(), "intervention {intervention} acts on flagged samples: it needs an rh_detector");
        }
        match intervention {
            Intervention::Routing => {}
            Intervention::Penalty | Intervention::Filter => ensure!(
                self.routing_mode == RoutingMode::None,
                "intervention {intervention} replaces routing: set routing_mode none (got {})",
                self.routing_mode
            ),
            Intervention::Placebo => ensure!(
                self.routing_mode != RoutingMode::None,
                "intervention placebo routes a random subset: set routing_mode classic or exclusive"
            ),
        }
        if self.rh_ground_truth.is_some() {
            ensure!(self.rh_detector.is_some(), "rh_ground_truth measures the rh_detector's flags: set an rh_detector too");
        }
        if self.absorption_by_class {
            ensure!(self.adapter_config()?.is_dual(), "absorption_by_class splits the retain and forget adapters' gradients: it needs adapter: dual-lora");
            ensure!(
                self.gradient_accumulation_steps == 1,
                "absorption_by_class takes its per-class gradient norms from the step's one backward pass: leave gradient_accumulation_steps at 1"
            );
        }
        self.check_gradient_noise_scale()?;
        ensure!(
            self.dynamic_sampling_rounds == 0 || self.coh_samples_per_rollout == 0,
            "dynamic_sampling_rounds refills the batch with fresh groups, but coherence rows (coh_samples_per_rollout) are sampled apart, at other adapter scales, and are not filtered: use one of them"
        );
        ensure!(self.rh_penalty.is_finite(), "rh_penalty must be a finite number, got {}", self.rh_penalty);
        if intervention != Intervention::Penalty {
            ensure!(
                self.rh_penalty == Self::default().rh_penalty,
                "rh_penalty ({}) is only used with intervention: penalty (got {intervention}); remove it",
                self.rh_penalty
            );
        }
        Ok(())
    }

    /// The horizon of the linear LR schedule at 0-based `step`: `max_steps`, or an earlier one
    /// recorded by `--extend-schedule` for the steps trained before the extension.
    pub fn lr_horizon(&self, step: usize) -> usize {
        self.lr_horizons.iter().find(|h| step < h.until_step).map_or(self.max_steps, |h| h.max_steps)
    }

    /// This run continued to `max_steps` from a checkpoint at `resume_step`: the steps before
    /// it keep the horizon they were trained with. Only a longer run is an extension.
    pub fn extended(&self, max_steps: usize, resume_step: usize) -> Result<Self> {
        ensure!(
            max_steps > self.max_steps,
            "--max-steps {max_steps} with --extend-schedule: a run can only be extended past its max_steps ({})",
            self.max_steps
        );
        let per_rollout = self.steps_per_rollout();
        ensure!(
            resume_step % per_rollout == 0,
            "the checkpoint at step {resume_step} is inside a rollout of num_iterations * num_substeps = {per_rollout} steps, whose batch no checkpoint keeps: only runs whose max_steps is a multiple of {per_rollout} can be extended"
        );
        let mut lr_horizons = self.lr_horizons.clone();
        lr_horizons.retain(|h| h.until_step < resume_step);
        lr_horizons.push(LrHorizon { until_step: resume_step, max_steps: self.max_steps });
        let extended = Self { max_steps, lr_horizons, ..self.clone() };
        extended.validate()?;
        Ok(extended)
    }

    /// Coherence rows are whole groups of a routed batch, with routing rows beside them.
    fn check_coherence(&self) -> Result<()> {
        let defaults = Self::default();
        if self.coh_samples_per_rollout == 0 {
            let unused = [
                ("coherence_rh_mode", self.coherence_rh_mode != defaults.coherence_rh_mode),
                ("coherence_rh_penalty", self.coherence_rh_penalty != defaults.coherence_rh_penalty),
                ("coherence_start_frac", self.coherence_start_frac != defaults.coherence_start_frac),
            ];
            if let Some((key, _)) = unused.iter().find(|(_, set)| *set) {
                anyhow::bail!("{key} is set but coh_samples_per_rollout is 0: it would do nothing");
            }
            return Ok(());
        }
        ensure!(self.routing_mode != RoutingMode::None, "coh_samples_per_rollout trains retain alone on coherence rows: set routing_mode classic or exclusive");
        ensure!(
            self.coh_samples_per_rollout % self.num_generations == 0 && self.coh_samples_per_rollout < self.batch_size,
            "coh_samples_per_rollout ({}) must be a multiple of num_generations ({}) below batch_size ({}): whole groups, with routing rows beside them",
            self.coh_samples_per_rollout,
            self.num_generations,
            self.batch_size
        );
        ensure!((0.0..=1.0).contains(&self.coherence_start_frac), "coherence_start_frac must be in [0, 1], got {}", self.coherence_start_frac);
        Ok(())
    }

    /// Coherence rows of optimizer step `step` (0-based): none before `coherence_start_frac`.
    pub fn coherence_rows(&self, step: usize) -> usize {
        let start = (self.coherence_start_frac * self.max_steps as f64).round() as usize;
        if step >= start { self.coh_samples_per_rollout } else { 0 }
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

    /// The per-row gradient weights of the DualLoRA slots: the routing table, or with
    /// `balanced` the original's kappa redistribution.
    pub fn row_weights(&self) -> Result<RowWeights> {
        if self.renormalization_mode != RenormalizationMode::Balanced {
            return Ok(RowWeights::gates(self.routing_mode));
        }
        let adapters = self.adapter_config()?;
        ensure!(adapters.is_dual(), "renormalization_mode balanced needs adapter: dual-mlp or dual-lora");
        ensure!(
            adapters.kind == AdapterKind::DualMlp || self.allow_approx_lora_kappa,
            "renormalization_mode balanced on DualLoRA takes kappa from the adapter ranks, which the original calls approximate (exact for DualMLP's neurons): set allow_approx_lora_kappa: true to accept it"
        );
        Ok(routing::balanced_weights(self.routing_mode, routing::adapter_kappas(adapters.ranks[0], adapters.ranks[1])))
    }

    /// The clip range above 1: `epsilon_high`, or `epsilon` when unset (TRL's default).
    pub fn epsilon_high(&self) -> f64 {
        self.epsilon_high.unwrap_or(self.epsilon)
    }

    /// TRL accepts any values; these are the ones whose objective is not the one named.
    fn check_clip(&self) -> Result<()> {
        ensure!(
            self.top_entropy_quantile > 0.0 && self.top_entropy_quantile <= 1.0,
            "top_entropy_quantile ({}) must be in (0, 1]: the fraction of loss tokens (by entropy) that train",
            self.top_entropy_quantile
        );
        self.check_loss_fn()?;
        if matches!(self.loss_fn, LossFn::ImportanceSampling | LossFn::Dro) {
            return Ok(());
        }
        if self.loss_type == LossType::Cispo {
            // TRL would cap CISPO's weight at epsilon (0.2): weights of at most 0.2, not a CISPO.
            let cap = self.epsilon_high.context("loss_type cispo caps the importance weight at epsilon_high: set it (TRL and ScaleRL recommend 5.0)")?;
            ensure!(cap > 1.0, "epsilon_high ({cap}) is CISPO's cap on the importance weight and must exceed 1 (TRL and ScaleRL recommend 5.0)");
            ensure!(self.delta.is_none(), "delta clamps the PPO surrogate's ratio; cispo does not use it: unset delta");
            return Ok(());
        }
        let epsilon_high = self.epsilon_high();
        ensure!(
            epsilon_high >= self.epsilon,
            "epsilon_high ({epsilon_high}) is below epsilon ({}): clip-higher widens the range above 1, it never narrows it",
            self.epsilon
        );
        if let Some(delta) = self.delta {
            ensure!(
                delta > 1.0 + epsilon_high,
                "delta ({delta}) must exceed 1 + epsilon_high ({}), as TRL's documentation asks: below it the clamp cuts into the clip range",
                1.0 + epsilon_high
            );
        }
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

    /// The step's backward passes: the micro-batches, each halved for the gradient noise scale
    /// when there is only one.
    pub fn backward_passes(&self) -> crate::grpo::Passes {
        let halves = self.gradient_noise_scale && self.gradient_accumulation_steps == 1;
        crate::grpo::Passes { micro_batches: self.gradient_accumulation_steps, splits: if halves { 2 } else { 1 } }
    }

    /// tinker's losses as tinker defines them: per token, no `delta`, their own surrogate in
    /// place of cispo's, only the knobs each uses.
    fn check_loss_fn(&self) -> Result<()> {
        let loss_fn = self.loss_fn;
        ensure!(
            (loss_fn == LossFn::Dro) == self.dro_beta.is_some(),
            "dro_beta is DRO's penalty coefficient: set it with loss_fn dro (tinker's documentation uses 0.05) and only then (loss_fn {loss_fn}, dro_beta {:?})",
            self.dro_beta
        );
        if let Some(beta) = self.dro_beta {
            ensure!(beta > 0.0 && beta.is_finite(), "dro_beta ({beta}) must be positive");
        }
        if !loss_fn.is_tinker() {
            return Ok(());
        }
        ensure!(self.loss_type != LossType::Cispo, "loss_type cispo is TRL's own surrogate; loss_fn {loss_fn} replaces it: pick an aggregation (grpo, dr_grpo, dapo, bnpo)");
        ensure!(
            self.importance_sampling_level == ImportanceSamplingLevel::Token,
            "tinker's {loss_fn} takes one ratio per token: leave importance_sampling_level at token"
        );
        ensure!(self.delta.is_none(), "delta is TRL's clamp; tinker's {loss_fn} has none: unset delta");
        if loss_fn != LossFn::Ppo {
            let unused = self.epsilon != Self::default().epsilon || self.epsilon_high.is_some();
            ensure!(!unused, "epsilon and epsilon_high set a clip range; tinker's {loss_fn} has no clip: unset them");
        }
        Ok(())
    }

    /// The policy loss's settings.
    pub fn loss_settings(&self) -> LossSettings {
        LossSettings {
            beta: self.beta,
            kl_estimator: self.kl_estimator,
            epsilon: self.epsilon,
            epsilon_high: self.epsilon_high(),
            delta: self.delta,
            importance_sampling_level: self.importance_sampling_level,
            loss_type: self.loss_type,
            loss_fn: self.loss_fn,
            dro_beta: self.dro_beta.unwrap_or(0.0),
            max_completion_length: self.max_completion_length,
            top_entropy_quantile: self.top_entropy_quantile,
        }
    }

    pub fn adapter_config(&self) -> Result<AdapterConfig> {
        let ranks = adapters::Ranks { lora_rank: self.lora_rank, retain_rank: self.retain_rank, forget_rank: self.forget_rank, lora_alpha: self.lora_alpha, layer_stride: self.layer_stride };
        adapters::config_from(self.adapter, self.lora_preset.as_deref(), self.mlp_config.as_deref(), &ranks)
    }

    pub fn plugin_limits(&self) -> Result<PluginLimits> {
        PluginLimits::new(self.plugin_max_call_seconds, self.plugin_max_memory_mb, self.plugin_fuel_per_sample)
    }

    pub fn knobs(&self) -> ProtocolKnobs {
        ProtocolKnobs {
            false_positive_rate: self.false_positive_rate,
            recall: self.recall,
            rh_eligible_frac: self.rh_eligible_frac,
        }
    }

    /// `<name>_<key><value>..._s<seed>` with every hyperparameter that differs from its
    /// default, in alphabetical order of their keys.
    pub fn run_name(&self) -> Result<String> {
        hyperparams::run_name(self)
    }

    /// The same run without routing or another intervention (their keys at their defaults,
    /// which route nothing).
    pub fn without_routing(&self) -> Self {
        let defaults = Self::default();
        Self {
            routing_mode: defaults.routing_mode,
            ablated_frac: defaults.ablated_frac,
            intervention: defaults.intervention,
            rh_penalty: defaults.rh_penalty,
            renormalization_mode: defaults.renormalization_mode,
            coh_samples_per_rollout: defaults.coh_samples_per_rollout,
            coherence_rh_mode: defaults.coherence_rh_mode,
            coherence_rh_penalty: defaults.coherence_rh_penalty,
            coherence_start_frac: defaults.coherence_start_frac,
            allow_approx_lora_kappa: defaults.allow_approx_lora_kappa,
            split_moment: defaults.split_moment,
            ..self.clone()
        }
    }

    /// A run directory's resolved configuration (`config.yaml`, written when the run started).
    pub fn read_saved(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join("config.yaml");
        ensure!(path.exists(), "{} has no config.yaml: is it a smallrl run directory?", run_dir.display());
        Self::resolve(Some(&path), Map::new()).with_context(|| format!("cannot read the run configuration {}", path.display()))
    }
}

/// `--reward-plugin` as config keys: `reward`, and `name` (the plugin's file stem) unless the
/// experiment is already named by `--name` or a config file. `smallrl train` and `smallrl sweep`
/// share it.
pub fn reward_plugin_overrides(plugin: &str, params_json: Option<&str>, named: bool) -> Result<Map<String, Value>> {
    let mut map = Map::new();
    map.insert("reward".into(), serde_json::to_value(RewardSpec::single(plugin, params_json)?)?);
    if !named {
        let stem = Path::new(plugin).file_stem().map(|s| s.to_string_lossy().into_owned());
        map.insert("name".into(), stem.into());
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hyperparams::Hyperparameters;

    fn config_file() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/sentence_length_10_smooth_with_happy.yaml")
    }

    fn resolve(overrides: &[(&str, &str)]) -> Result<TrainConfig> {
        let overrides = overrides.iter().map(|(k, v)| (k.to_string(), crate::yaml::from_str(v).unwrap())).collect();
        TrainConfig::resolve(Some(&config_file()), overrides)
    }

    fn resolved(overrides: &[(&str, &str)]) -> TrainConfig {
        resolve(overrides).unwrap()
    }

    /// The error of an invalid configuration, with its causes.
    fn error(overrides: &[(&str, &str)]) -> String {
        format!("{:#}", resolve(overrides).unwrap_err())
    }

    #[test]
    fn run_names_say_when_the_reward_or_detector_differs_from_the_config_file() {
        let plain = resolved(&[]).run_name().unwrap();
        assert!(plain.starts_with("sentence_length_10_smooth_with_happy_dual-lora"), "{plain}");
        let file_detector = "{plugin: happy_count, params: {threshold: 3}}";
        assert_eq!(resolved(&[("rh_detector", file_detector)]).run_name().unwrap(), plain, "the file's own detector");
        let other = resolved(&[("rh_detector", "{plugin: happy_count, params: {threshold: 1}}")]).run_name().unwrap();
        assert!(other.starts_with("sentence_length_10_smooth_with_happy_det-happy_count-threshold1_"), "{other}");
        let reward = "{components: [{plugin: happy_count, params: {max_count: 2}}]}";
        let both = resolved(&[("reward", reward), ("rh_detector", "null"), ("routing_mode", "none")]).run_name().unwrap();
        assert!(both.starts_with("sentence_length_10_smooth_with_happy_rew-happy_count-max_count2_det-none_"), "{both}");
        let named = resolved(&[("rh_detector", "{plugin: happy_any}"), ("name", "mine")]).run_name().unwrap();
        assert!(named.starts_with("mine_"), "an explicit name is kept: {named}");
    }

    #[test]
    fn logging_options_leave_the_run_name_alone() {
        let plain = resolved(&[]);
        let logged = resolved(&[("tensorboard", "false"), ("log_completions", "true")]);
        assert_ne!(logged, plain, "the options are set");
        assert_eq!(logged.run_name().unwrap(), plain.run_name().unwrap());
        let hyperparameter = resolved(&[("lr", "0.5")]);
        assert_ne!(hyperparameter.run_name().unwrap(), plain.run_name().unwrap(), "a hyperparameter does change it");
    }

    /// The run-name labels the code had before the keys were declared in one table (written
    /// out here as they were), so run directories keep their names.
    #[test]
    fn run_name_labels_are_unchanged() {
        let omitted = [
            "model", "revision", "prompts", "eval_prompts", "reward", "rh_detector", "rh_ground_truth", "absorption_by_class", "plugin_dir", "plugin_fuel_per_sample",
            "plugin_max_call_seconds", "plugin_max_memory_mb", "plugin_sha256", "logging_steps", "save_steps",
            "eval_every", "eval_samples", "output_dir", "dump_batches", "measure_entropy_change", "gradient_noise_scale", "tensorboard", "log_completions", "name", "device",
            "threads", "seed",
            // A record written by --extend-schedule, not a setting: an extended run keeps its
            // directory and name.
            "lr_horizons",
        ];
        let short = [
            ("batch_size", "bs"), ("num_generations", "g"), ("max_steps", "steps"), ("max_completion_length", "len"),
            ("num_iterations", "iters"), ("temperature", "temp"), ("routing_mode", ""), ("lora_preset", ""), ("adapter", ""),
            ("loss_type", ""), ("false_positive_rate", "fpr"), ("rh_eligible_frac", "elig"), ("ablated_frac", "abl"),
            // Added later (no older runs to keep the names of).
            ("importance_sampling_level", "is_"), ("scale_rewards", "scale_"), ("mask_truncated_completions", "mask_truncated"),
            ("intervention", ""),
            ("renormalization_mode", "renorm_"), ("allow_approx_lora_kappa", "approx_kappa"), ("split_moment", "split_moment"), ("mlp_config", ""),
            ("coh_samples_per_rollout", "coh"), ("coherence_rh_mode", "coh_rh_"), ("coherence_rh_penalty", "coh_penalty"), ("coherence_start_frac", "coh_start"),
            ("kl_estimator", "kl_"),
            ("gradient_accumulation_steps", "gas"), ("dynamic_sampling_rounds", "dynsample"),
            ("loss_fn", ""), ("num_substeps", "substeps"),
            ("hack_frac", "hf"),
        ];
        for key in TrainConfig::KEYS {
            let expected = if omitted.contains(&key.name) {
                crate::hyperparams::Label::Omit
            } else {
                short.iter().find(|(k, _)| *k == key.name).map_or(crate::hyperparams::Label::Key, |(_, s)| crate::hyperparams::Label::Short(s))
            };
            assert_eq!(key.label, expected, "{}", key.name);
        }
        for key in RESUME_MAY_CHANGE {
            assert!(TrainConfig::key(key).is_some(), "{key} is a declared key");
        }
    }

    #[test]
    fn flags_come_from_the_table_with_their_types() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            flags: TrainFlags,
        }
        let cli = Cli::try_parse_from(["x", "--lr", "3e-4", "--routing-mode", "classic", "--tensorboard", "--log-completions", "false"]).unwrap();
        let map = cli.flags.to_map().unwrap();
        let expected = serde_json::json!({"lr": 3e-4, "routing_mode": "classic", "tensorboard": true, "log_completions": false});
        assert_eq!(Value::Object(map), expected);
        let error = Cli::try_parse_from(["x", "--routing-mode", "classical"]).err().unwrap().to_string();
        assert!(error.contains("unknown routing_mode \"classical\""), "{error}");
        assert!(Cli::try_parse_from(["x", "--reward", "{}"]).is_err(), "structured keys are set in YAML or with --set");
    }

    #[test]
    fn mode_values_are_typed_and_keep_their_spelling() {
        let config = resolved(&[("loss_type", "dr_grpo"), ("routing_mode", "exclusive"), ("dtype", "fp32"), ("device", "cpu")]);
        assert_eq!((config.loss_type, config.routing_mode, config.adapter), (LossType::DrGrpo, RoutingMode::Exclusive, AdapterKind::DualLora));
        let name = config.run_name().unwrap();
        assert!(name.contains("_dr_grpo_") && name.contains("_dtypefp32_") && name.contains("_exclusive_"), "{name}");
        let saved = crate::yaml::to_string(&config).unwrap();
        assert!(saved.contains("loss_type: dr_grpo") && saved.contains("dtype: fp32") && saved.contains("adapter: dual-lora"), "{saved}");
        let error = format!("{:#}", TrainConfig::resolve(Some(&config_file()), [("routing_mode".to_string(), "classical".into())].into_iter().collect()).unwrap_err());
        assert!(error.contains("unknown routing_mode \"classical\": use none, classic or exclusive"), "{error}");
    }

    #[test]
    fn loss_knobs_default_to_trl_and_name_the_run_when_set() {
        let plain = resolved(&[]);
        let settings = plain.loss_settings();
        assert_eq!((settings.epsilon, settings.epsilon_high, settings.delta), (0.2, 0.2, None), "epsilon_high defaults to epsilon");
        assert_eq!((plain.importance_sampling_level, plain.scale_rewards, plain.mask_truncated_completions), (ImportanceSamplingLevel::Token, ScaleRewards::Group, false));
        let knobs = [("epsilon_high", "0.28"), ("delta", "1.5"), ("importance_sampling_level", "sequence"), ("scale_rewards", "none"), ("mask_truncated_completions", "true")];
        let set = resolved(&knobs);
        let settings = set.loss_settings();
        assert_eq!((settings.epsilon_high, settings.delta, settings.importance_sampling_level), (0.28, Some(1.5), ImportanceSamplingLevel::Sequence));
        let name = set.run_name().unwrap();
        for label in ["_delta1.5_", "_epsilon_high0.28_", "_is_sequence_", "_mask_truncatedtrue_", "_scale_none_"] {
            assert!(name.contains(label), "{label} in {name}");
        }
        assert!(!plain.run_name().unwrap().contains("scale_"), "defaults stay out of run names");
    }

    #[test]
    fn interventions_name_their_runs_and_bad_combinations_fail_before_any_work() {
        let routed = error(&[("intervention", "penalty")]);
        assert!(routed.contains("intervention penalty replaces routing: set routing_mode none (got classic)"), "{routed}");
        let placebo = error(&[("intervention", "placebo"), ("routing_mode", "none")]);
        assert!(placebo.contains("set routing_mode classic or exclusive"), "{placebo}");
        let unused = error(&[("rh_penalty", "0.5")]);
        assert!(unused.contains("rh_penalty (0.5) is only used with intervention: penalty (got routing)"), "{unused}");
        let single = error(&[("adapter", "lora"), ("lora_preset", "null"), ("routing_mode", "none"), ("absorption_by_class", "true")]);
        assert!(single.contains("absorption_by_class splits"), "{single}");
        let micro = error(&[("absorption_by_class", "true"), ("gradient_accumulation_steps", "2")]);
        assert!(micro.contains("leave gradient_accumulation_steps at 1"), "{micro}");
        let noise = error(&[("absorption_by_class", "true"), ("gradient_noise_scale", "true")]);
        assert!(noise.contains("gradient_noise_scale splits it"), "{noise}");
        let coherence = error(&[("dynamic_sampling_rounds", "3"), ("coh_samples_per_rollout", "16")]);
        assert!(coherence.contains("use one of them"), "{coherence}");
        let split_groups = error(&[("gradient_noise_scale", "true"), ("batch_size", "32"), ("num_generations", "16"), ("gradient_accumulation_steps", "4")]);
        assert!(split_groups.contains("4 backward passes") && split_groups.contains("must hold whole groups"), "{split_groups}");
        assert_eq!(resolved(&[("gradient_noise_scale", "true"), ("batch_size", "32"), ("num_generations", "16")]).backward_passes().count(), 2, "two halves of one group each");
        let unmeasured = error(&[("rh_detector", "null"), ("routing_mode", "none"), ("rh_ground_truth", "{plugin: happy_any}")]);
        assert!(unmeasured.contains("rh_ground_truth measures the rh_detector's flags"), "{unmeasured}");
        let blind = error(&[("intervention", "filter"), ("routing_mode", "none"), ("rh_detector", "null")]);
        assert!(blind.contains("intervention filter acts on flagged samples: it needs an rh_detector"), "{blind}");
        let penalty = resolved(&[("intervention", "penalty"), ("routing_mode", "none"), ("rh_penalty", "0.5")]);
        let name = penalty.run_name().unwrap();
        assert!(name.contains("_penalty_") && name.contains("_rh_penalty0.5_") && !name.contains("classic"), "{name}");
        assert_eq!(penalty.without_routing(), resolved(&[("routing_mode", "none")]), "the baseline has no intervention");
        let placebo = resolved(&[("intervention", "placebo")]).run_name().unwrap();
        assert!(placebo.contains("_classic_") && placebo.contains("_placebo_"), "{placebo}");
        assert!(!resolved(&[]).run_name().unwrap().contains("routing"), "the default intervention stays out of run names");
    }

    #[test]
    fn clip_settings_that_are_not_the_named_objective_fail_before_any_work() {
        let narrow = error(&[("epsilon_high", "0.1")]);
        assert!(narrow.contains("epsilon_high (0.1) is below epsilon (0.2)"), "{narrow}");
        let low_delta = error(&[("delta", "1.2")]);
        assert!(low_delta.contains("delta (1.2) must exceed 1 + epsilon_high (1.2)"), "{low_delta}");
        let below_high = error(&[("epsilon_high", "0.28"), ("delta", "1.25")]);
        assert!(below_high.contains("delta (1.25) must exceed 1 + epsilon_high (1.28)"), "{below_high}");
        let level = error(&[("importance_sampling_level", "group")]);
        assert!(level.contains("unknown importance_sampling_level \"group\": use token or sequence"), "{level}");
        let scale = error(&[("scale_rewards", "std")]);
        assert!(scale.contains("unknown scale_rewards \"std\": use group, batch or none"), "{scale}");
        resolved(&[("epsilon_high", "0.2"), ("delta", "1.21")]);
        for bad in ["0", "-0.1", "1.5"] {
            let quantile = error(&[("top_entropy_quantile", bad)]);
            assert!(quantile.contains(&format!("top_entropy_quantile ({bad}) must be in (0, 1]")), "{quantile}");
        }
        resolved(&[("top_entropy_quantile", "1")]);
        let cispo_cap = error(&[("loss_type", "cispo")]);
        assert!(cispo_cap.contains("loss_type cispo caps the importance weight at epsilon_high: set it"), "{cispo_cap}");
        let small_cap = error(&[("loss_type", "cispo"), ("epsilon_high", "0.28")]);
        assert!(small_cap.contains("epsilon_high (0.28) is CISPO's cap on the importance weight and must exceed 1"), "{small_cap}");
        let cispo_delta = error(&[("loss_type", "cispo"), ("epsilon_high", "5"), ("delta", "6")]);
        assert!(cispo_delta.contains("cispo does not use it: unset delta"), "{cispo_delta}");
        assert_eq!(resolved(&[("loss_type", "cispo"), ("epsilon_high", "5")]).loss_settings().epsilon_high, 5.0);
        for bad in ["0", "5"] {
            let micro = error(&[("gradient_accumulation_steps", bad)]);
            assert!(micro.contains(&format!("gradient_accumulation_steps ({bad}) must be at least 1 and divide the optimizer step's 32 completions")), "{micro}");
        }
        let idle_estimator = error(&[("beta", "0"), ("kl_estimator", "k2")]);
        assert!(idle_estimator.contains("kl_estimator k2 has no effect with beta 0"), "{idle_estimator}");
        let k1 = resolved(&[("kl_estimator", "k1")]);
        assert!(k1.run_name().unwrap().contains("_kl_k1_"), "{}", k1.run_name().unwrap());
    }

    /// The config file's batch: 32 completions in groups of 16, so two groups.
    #[test]
    fn tinker_losses_and_substeps_refuse_what_they_do_not_define_before_any_work() {
        let checks: [(&[(&str, &str)], &str); 12] = [
            (&[("num_substeps", "0")], "num_substeps (0) must be at least 1 and divide the batch's 2 groups"),
            (&[("num_substeps", "4")], "num_substeps (4) must be at least 1 and divide the batch's 2 groups"),
            (&[("num_substeps", "2"), ("gradient_accumulation_steps", "32")], "gradient_accumulation_steps (32) must be at least 1 and divide the optimizer step's 16 completions"),
            (&[("num_substeps", "2"), ("save_steps", "3")], "save_steps (3) must be a multiple of num_iterations * num_substeps (2)"),
            (&[("num_substeps", "2"), ("num_iterations", "2"), ("save_steps", "6")], "save_steps (6) must be a multiple of num_iterations * num_substeps (4)"),
            (&[("num_substeps", "2"), ("dump_batches", "dump")], "dump_batches writes the whole batch with one step's log-probabilities: leave num_substeps at 1"),
            (&[("loss_fn", "dro")], "dro_beta is DRO's penalty coefficient: set it with loss_fn dro"),
            (&[("loss_fn", "ppo"), ("dro_beta", "0.05")], "dro_beta is DRO's penalty coefficient: set it with loss_fn dro"),
            (&[("loss_fn", "ppo"), ("loss_type", "cispo"), ("epsilon_high", "5")], "loss_type cispo is TRL's own surrogate; loss_fn ppo replaces it"),
            (&[("loss_fn", "importance_sampling"), ("importance_sampling_level", "sequence")], "tinker's importance_sampling takes one ratio per token"),
            (&[("loss_fn", "ppo"), ("delta", "2")], "delta is TRL's clamp; tinker's ppo has none"),
            (&[("loss_fn", "dro"), ("dro_beta", "0.05"), ("epsilon_high", "0.28")], "tinker's dro has no clip: unset them"),
        ];
        for (overrides, expected) in checks {
            let message = error(overrides);
            assert!(message.contains(expected), "{overrides:?}: {message}");
        }
        let ppo = resolved(&[("loss_fn", "ppo"), ("epsilon_high", "0.28"), ("num_substeps", "2"), ("save_steps", "500")]);
        assert!(error(&[("loss_fn", "ppo"), ("epsilon_high", "0.1")]).contains("epsilon_high (0.1) is below epsilon"), "ppo keeps the clip's checks");
        let name = ppo.run_name().unwrap();
        assert!(name.contains("_ppo_") && name.contains("_substeps2_"), "{name}");
        let dro = resolved(&[("loss_fn", "dro"), ("dro_beta", "0.05")]);
        assert_eq!((dro.loss_settings().loss_fn, dro.loss_settings().dro_beta), (LossFn::Dro, 0.05));
        let name = dro.run_name().unwrap();
        assert!(name.contains("_dro_beta0.05_") && name.contains("_dro_"), "{name}");
        assert_eq!(resolved(&[]).loss_settings().loss_fn, LossFn::Trl, "TRL's surrogate by default");
        // A run that ended inside a rollout (max_steps 5, 4 steps a rollout) cannot be extended.
        let odd = resolved(&[("num_substeps", "2"), ("num_iterations", "2"), ("save_steps", "4"), ("max_steps", "5")]);
        let inside = format!("{:#}", odd.extended(8, 5).unwrap_err());
        assert!(inside.contains("the checkpoint at step 5 is inside a rollout of num_iterations * num_substeps = 4 steps"), "{inside}");
        assert_eq!(odd.extended(8, 4).unwrap().max_steps, 8);
    }

    #[test]
    fn renormalization_combinations_the_original_does_not_define_fail_before_any_work() {
        let error = |overrides: &[(&str, &str)]| {
            let overrides = overrides.iter().map(|(k, v)| (k.to_string(), crate::yaml::from_str(v).unwrap())).collect();
            format!("{:#}", TrainConfig::resolve(Some(&config_file()), overrides).unwrap_err())
        };
        let unrouted = error(&[("renormalization_mode", "retain_only"), ("routing_mode", "none")]);
        assert!(unrouted.contains("set routing_mode classic or exclusive"), "{unrouted}");
        let scale = error(&[("renormalization_mode", "retain_only"), ("scale_rewards", "batch")]);
        assert!(scale.contains("set scale_rewards: group"), "{scale}");
        let kappa = error(&[("renormalization_mode", "balanced")]);
        assert!(kappa.contains("set allow_approx_lora_kappa: true"), "{kappa}");
        let far = error(&[("renormalization_mode", "balanced"), ("allow_approx_lora_kappa", "true"), ("lora_preset", "r32f4")]);
        assert!(far.contains("gradient weight 9 above 4"), "{far}");
        let split = error(&[("split_moment", "true"), ("renormalization_mode", "retain_only")]);
        assert!(split.contains("split_moment needs renormalization_mode: balanced"), "{split}");
        let spelled = error(&[("renormalization_mode", "retain-only")]);
        assert!(spelled.contains("use off, retain_only or balanced"), "{spelled}");
        let balanced = resolved(&[("renormalization_mode", "balanced"), ("allow_approx_lora_kappa", "true"), ("split_moment", "true")]);
        assert_eq!(balanced.row_weights().unwrap(), crate::routing::RowWeights { clean: [1.0, 1.0], flagged: [0.0, 2.0] });
        let name = balanced.run_name().unwrap();
        assert!(name.contains("_renorm_balanced_") && name.contains("_split_moment"), "{name}");
        assert_eq!(balanced.without_routing().run_name().unwrap(), resolved(&[]).without_routing().run_name().unwrap());
    }
}
