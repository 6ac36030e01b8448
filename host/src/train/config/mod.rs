//! The training configuration: every hyperparameter of `smallrl train` declared once (below),
//! resolved as defaults < YAML file < flags < `--set` (see [`crate::hyperparams`]). The
//! resolved configuration is written into the run directory, whose name lists every
//! hyperparameter that differs from its default, plus the seed.
//!
//! Adding a hyperparameter is one row in the table: name, type, default, doc line (the flag's
//! help), `#[rule(..)]` (what its value must be on its own, [`crate::hyperparams::Rule`]),
//! run-name label, properties, and after `=>` the parts that read it (`StepKeys`, `Recipe`,
//! `DrawKeys`), which get an accessor named after it ([`crate::hyperparams::Part`]); then its
//! test. Only a rule across keys goes to `checks.rs`. What several keys make together is
//! computed once: `parts.rs`, `objective.rs` (the objective's keys cross into `grpo`, which
//! cannot read this table), `derived.rs`.
//!
//! Long because the table is: over a hundred keys, each with its doc line (the flag's help).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::adapters::AdapterKind;
use crate::defaults as d;
use crate::device::{DeviceSpec, Dtype};
use crate::grpo::{ImportanceSamplingLevel, ImportanceSamplingMode, KlEstimator, LossFn, LossType, MultiObjectiveAggregation, SamplingReplay, ScaleRewards};
use crate::hyperparams::Label::{Key, Omit, Short};
use crate::hyperparams::Rule::{self, AtLeast, Finite, FinitePositive, Positive};
use crate::hyperparams::hyperparameters;
use crate::intervention::{AdvantageScore, Intervention};
use crate::model::chat::PromptFormat;
use crate::model::autocast::TrainDtype;
use crate::model::folded::SamplerDtype;
use crate::reward::{DetectorSpec, RewardSpec};
use crate::routing::{CoherenceRhMode, RenormalizationMode, RoutingMode};
use crate::train::draw::DrawKeys;
use crate::train::recipe::Recipe;

mod accumulation;
mod batching;
mod checks;
mod derived;
mod objective;
mod parts;
mod saved;
pub use saved::LrHorizon;
mod skip;
pub use parts::{LrSchedule, StepKeys};

pub use accumulation::{Accumulation, MemorySize};
pub use derived::reward_plugin_overrides;

pub use crate::hyperparams::{UNNAMED_RUN, parse_override};

hyperparameters! {
    /// Every hyperparameter of a run, with snake_case names shared by YAML, `--set`, sweeps'
    /// `--grid`/`--fixed` and (in kebab-case) the command line.
    pub struct TrainConfig;
    /// `smallrl train`'s hyperparameter flags: one per key of [`TrainConfig`], each optional.
    pub struct TrainFlags;
    flags {
        /// A model directory or HuggingFace Hub repo id.
        model: String = d::MODEL.into(), Omit, [Pack];
        /// Hub revision (branch, tag or commit) when `model` is a repo id.
        revision: String = d::REVISION.into(), Omit, [Pack];
        /// One prompt per line; without it prompts come from the SimpleStories dataset's train split.
        prompts: Option<PathBuf> = None, Omit;
        /// One evaluation prompt per line.
        eval_prompts: Option<PathBuf> = None, Omit;
        /// raw (the text as it is), or chat: each prompt rendered by the model's chat template as
        /// one user message (a prompt file's `messages` line as its conversation) with the
        /// generation prompt, as transformers' apply_chat_template(..., add_generation_prompt=True).
        prompt_format: PromptFormat = PromptFormat::Raw, Short("");
        /// With prompt_format chat: a system message before each prompt (default: the template's own).
        system_prompt: Option<String> = None, Omit;
        /// Inoculation prompting (an intervention arm; environment runs): every training prompt
        /// starts with `inoculation_prompt`, which invites the hack; evaluation prompts never do.
        inoculation: bool = false, Key, [Routing];
        /// The paragraph inoculation puts before each training prompt's text (the first user message of a conversation).
        inoculation_prompt: String = d::INOCULATION_PROMPT.into(), Omit;
        /// Tokens of each SimpleStories prompt (the opening of a story).
        prompt_length: usize = 8, Key, [Pack];
        /// Training prompts used (at most).
        num_prompts: usize = 10_000, Key;
        /// An environment (a `.wasm` path, or a name in plugin_dir): one component that supplies the
        /// prompts (training split seeded by the run seed, evaluation split by a fixed seed), the
        /// reward components, the monitor and the ground truth; replaces prompts, eval_prompts,
        /// reward, rh_detector and rh_ground_truth.
        environment: Option<String> = None, Omit;
        /// A multi-turn episode environment's turns per episode (max_completion_length then bounds
        /// the whole episode: its turns and observations; docs/src/environments.md).
        #[rule(Positive)]
        #[serde(skip_serializing_if = "skip::is_default_episode_turns")]
        episode_max_turns: usize = d::EPISODE_MAX_TURNS, Short("turns");
        /// Tokens of one assistant turn of an episode (at most; cut to what is left of the episode).
        #[rule(Positive)]
        #[serde(skip_serializing_if = "skip::is_default_turn_tokens")]
        episode_max_turn_tokens: usize = d::EPISODE_MAX_TURN_TOKENS, Short("turn_len");
        /// Tokens of one rendered observation of an episode (a longer one is the environment's error).
        #[rule(Positive)]
        #[serde(skip_serializing_if = "skip::is_default_observation_tokens")]
        episode_max_observation_tokens: usize = d::EPISODE_MAX_OBSERVATION_TOKENS, Short("obs_len");
        /// Bytes of one observation of an episode, its messages' roles and contents together.
        #[rule(Positive)]
        #[serde(skip_serializing_if = "skip::is_default_observation_bytes")]
        episode_max_observation_bytes: usize = d::EPISODE_MAX_OBSERVATION_BYTES, Short("obs_bytes");

        /// full, lora or dual-lora.
        adapter: AdapterKind = d::ADAPTER, Short(""), [Pack];
        /// DualLoRA preset: r1 r2 r4 r8 r16 r32 r1h r32f16 r32f4 r32f1 (overrides the ranks).
        lora_preset: Option<String> = None, Short(""), [Pack];
        /// DualMLP preset (adapter dual-mlp): m5 m10 m16 m30 m32 m29f3 m24f8 m64 m128 m256, retain
        /// and forget neurons per MLP block (the original's MLP_PRESETS; m16 its recommended).
        mlp_config: Option<String> = None, Short(""), [Pack];
        /// Rank of DualLoRA's retain adapter.
        retain_rank: usize = d::RETAIN_RANK, Key, [Pack];
        /// Rank of DualLoRA's forget adapter.
        forget_rank: usize = d::FORGET_RANK, Key, [Pack];
        /// Rank of the single LoRA adapter.
        lora_rank: usize = d::LORA_RANK, Key, [Pack];
        /// LoRA alpha (an adapter's scale is alpha / rank).
        lora_alpha: f64 = d::LORA_ALPHA, Key, [Pack];
        /// Adapt layers 0, stride, 2 * stride, ...
        layer_stride: usize = d::LAYER_STRIDE, Key, [Pack];

        /// Peak learning rate (linear decay to 0 over max_steps).
        #[rule(Positive)]
        lr: f64 = 1e-5, Key;
        /// KL coefficient (0 skips the reference model).
        #[rule(AtLeast(0.0))]
        beta: f64 = 0.02, Key;
        /// The KL term's per-token estimator: k1, k2 or k3 (Schulman 2020; k3 is TRL's).
        kl_estimator: KlEstimator = KlEstimator::K3, Short("kl_");
        /// PPO clipping range (below 1, and above 1 unless epsilon_high is set).
        #[rule(Positive)]
        epsilon: f64 = 0.2, Key;
        /// PPO clipping range above 1 (DAPO's clip-higher, e.g. 0.28; default: epsilon, as TRL).
        epsilon_high: Option<f64> = None, Key;
        /// Upper clamp of the unclipped ratio (TRL's two-sided clipping; above 1 + epsilon_high).
        delta: Option<f64> = None, Key;
        /// token, or sequence (GSPO: one ratio exp(mean log-ratio) per completion).
        importance_sampling_level: ImportanceSamplingLevel = ImportanceSamplingLevel::Token, Short("is_");
        /// Advantages divided by the std of the group, of the batch, or none (TRL's scale_rewards).
        scale_rewards: ScaleRewards = ScaleRewards::Group, Short("scale_") => Recipe;
        /// How the reward components make the advantage (TRL's multi_objective_aggregation):
        /// sum_then_normalize (their weighted sum, normalised as scale_rewards says), or
        /// normalize_then_sum (GDPO: each component normalised within its group, their weighted
        /// sum normalised over the batch).
        #[serde(skip_serializing_if = "skip::is_sum_then_normalize")]
        multi_objective_aggregation: MultiObjectiveAggregation = MultiObjectiveAggregation::SumThenNormalize, Short("");
        /// Completions that hit max_completion_length without EOS leave the loss (DAPO).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        mask_truncated_completions: bool = false, Short("mask_truncated") => Recipe;
        /// grpo, dr_grpo, dapo, bnpo or cispo (CISPO's surrogate, aggregated as dapo; set
        /// epsilon_high, its weight cap, e.g. 5.0), or sapo, luspo (with importance_sampling_level
        /// sequence) or vespo.
        loss_type: LossType = LossType::Grpo, Short("");
        /// The surrogate: trl (loss_type's), or tinker's importance_sampling, ppo or dro, with the
        /// ratio to the sampler's log-probabilities (aggregated as loss_type says).
        loss_fn: LossFn = LossFn::Trl, Short("");
        /// tinker's DRO penalty coefficient (loss_fn dro only; tinker's documentation uses 0.05).
        dro_beta: Option<f64> = None, Key;
        /// Only this top fraction of the loss tokens by entropy has a policy term (TRL's
        /// top_entropy_quantile, "Beyond the 80/20 Rule": 0.2); 1 keeps every token.
        top_entropy_quantile: f64 = 1.0, Key;
        /// TRL's vllm_importance_sampling_correction (the sampler is smallrl's own engine, hence no
        /// vllm_ prefix): the policy loss weighted by the old policy's over the sampler's probability.
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        importance_sampling_correction: bool = false, Short("iscorr");
        /// The correction's ratio: token_truncate, token_mask, sequence_truncate or sequence_mask
        /// (TRL's default): per token or per completion, clamped into or zero outside the bounds.
        importance_sampling_mode: ImportanceSamplingMode = ImportanceSamplingMode::SequenceMask, Short("ismode_");
        /// The correction's lower bound (TRL's vllm_importance_sampling_clip_min; 0: none).
        importance_sampling_clip_min: f64 = 0.0, Short("isclipmin");
        /// The correction's upper bound (TRL's vllm_importance_sampling_clip_max; none: e.g. 1e30).
        importance_sampling_clip_max: f64 = 3.0, Short("isclipmax");
        /// SAPO's gate temperature where the advantage is positive (loss_type sapo; TRL's default).
        sapo_temperature_pos: f64 = 1.0, Short("sapo_tpos");
        /// SAPO's gate temperature where the advantage is not positive (loss_type sapo; TRL's default).
        sapo_temperature_neg: f64 = 1.05, Short("sapo_tneg");
        /// VESPO's power k where the advantage is at least 0 (loss_type vespo; TRL's default).
        vespo_k_pos: f64 = 2.0, Short("vespo_kpos");
        /// VESPO's decay lambda where the advantage is at least 0 (loss_type vespo; TRL's default).
        vespo_lambda_pos: f64 = 3.0, Short("vespo_lpos");
        /// VESPO's power k where the advantage is negative (loss_type vespo; TRL's default).
        vespo_k_neg: f64 = 3.0, Short("vespo_kneg");
        /// VESPO's decay lambda where the advantage is negative (loss_type vespo; TRL's default).
        vespo_lambda_neg: f64 = 2.0, Short("vespo_lneg");
        /// DeepSeek-V3.2's off-policy sequence mask (TRL's): completions with a negative advantage
        /// whose mean log-probability gap to the sampler exceeds this leave the policy term (e.g. 0.5).
        off_policy_mask_threshold: Option<f64> = None, Short("opsm");
        /// The KL term times the importance ratio (TRL's use_bias_correction_kl, whose default is
        /// true; false here keeps the loss of the runs from before the key).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        use_bias_correction_kl: bool = false, Short("klcorr");
        /// TRL's entropy bonus: loss minus this times the trained tokens' mean entropy (0: none).
        entropy_coef: f64 = 0.0, Short("entcoef");
        /// Skywork-OR1's adaptive control of entropy_coef (TRL's rules: docs/src/objectives.md).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        use_adaptive_entropy: bool = false, Short("adaptent");
        /// The adaptive entropy coefficient's lower bound (TRL's default).
        entropy_coef_min: f64 = 0.0, Short("entmin");
        /// The adaptive entropy coefficient's upper bound (TRL's default).
        entropy_coef_max: f64 = 1.0, Short("entmax");
        /// The adaptive entropy coefficient's step per optimizer step (TRL's default).
        entropy_coef_delta: f64 = 0.005, Short("entdelta");
        /// The mean entropy (nats) at or below which the adaptive bonus applies (TRL's default).
        entropy_target: f64 = 0.2, Short("enttarget");
        /// Passes over each generated batch (TRL's reuse; each pass num_substeps optimizer steps).
        #[rule(AtLeast(1.0))]
        num_iterations: usize = 1, Short("iters"), [Pack];
        /// Mini-batches of whole groups each generated batch is split into, one optimizer step
        /// each (tinker's).
        num_substeps: usize = 1, Short("substeps");
        /// Micro-batches per optimizer step, each a forward and backward pass over
        /// batch_size / (num_substeps * gradient_accumulation_steps) completions (TRL's, with
        /// steps_per_generation equal to it; only bnpo's loss changes), or auto: the fewest that
        /// fit the memory available (max_memory), planned before the first step (train/memory.rs)
        /// and recorded in config.yaml as planned_micro_batches.
        gradient_accumulation_steps: Accumulation = Accumulation::Steps(1), Short("gas"), [Pack];
        /// The memory the run may use, its weights included, e.g. 20GB or 512MiB (default: what
        /// is available when it starts, MemAvailable on the CPU or the device's free memory,
        /// shared among a pack's runs); gradient_accumulation_steps auto plans for it.
        #[serde(skip_serializing_if = "Option::is_none")]
        max_memory: Option<MemorySize> = None, Omit, [Resume];
        /// Off-policy training as tinker-cookbook 0.6.1's AsyncConfig(max_steps_off_policy): each
        /// step's batch is sampled ahead, by a sampler thread working while earlier steps train,
        /// with the weights this many steps old (the first steps with the first weights); the loss
        /// takes its ratio to the sampler's log-probabilities. 0: on-policy (sampled at the step,
        /// with its own weights).
        max_steps_off_policy: usize = 0, Short("offpolicy");
        /// max_steps_off_policy's queue with dynamic_sampling_rounds' group filter (tinker-cookbook
        /// 0.6.1's AsyncConfig with constant-reward groups removed): this many steps' worth of groups
        /// sampled ahead, the oldest trained first, none dropped for staleness (objectives.md). 0: off.
        #[serde(skip_serializing_if = "skip::is_zero")]
        sampling_steps_ahead: usize = 0, Short("ahead");
        /// Lets loss_fn importance_sampling (unclipped) train off policy, which tinker found unstable.
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        #[serde(skip_serializing_if = "skip::is_false")]
        allow_unclipped_off_policy: bool = false, Short("unclipped_ok");
        /// tinker's StreamMinibatchConfig: the batch's num_substeps mini-batches (whole groups)
        /// are sampled and scored one by one by the run's sampler thread, all from the weights at
        /// the batch's first step, and each optimizer step takes its mini-batch as soon as it is
        /// sampled; each mini-batch is a rollout of its own (its groups' advantages).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        stream_minibatches: bool = false, Short("stream");
        /// DAPO's dynamic sampling: groups whose rewards are all equal are dropped and more prompts
        /// sampled until the batch is full, in at most this many generation rounds per batch (the
        /// first included; verl's max_num_gen_batches); needing more is an error. 0: off.
        dynamic_sampling_rounds: usize = 0, Short("dynsample") => DrawKeys;
        /// Completions per generated batch (per optimizer step unless num_substeps splits it).
        #[rule(Positive)]
        batch_size: usize = 32, Short("bs"), [Pack] => DrawKeys;
        /// Completions per prompt (the group of the advantages).
        #[rule(AtLeast(2.0))]
        num_generations: usize = 16, Short("g"), [Pack] => Recipe, DrawKeys;
        /// Tokens generated per completion (at most).
        max_completion_length: usize = d::MAX_COMPLETION_LENGTH, Short("len"), [Pack] => StepKeys;
        /// Sampling temperature (also applied to the log-probabilities).
        #[rule(Positive)]
        temperature: f64 = d::TEMPERATURE, Short("temp");
        /// Sampling keeps the top_k most likely tokens (HF's TopKLogitsWarper; 0: all). The
        /// sampler's log-probabilities are those of the distribution it draws from (truncated and
        /// renormalised, as vLLM's processed_logprobs under TRL); the policy's stay the full softmax.
        top_k: usize = d::TOP_K, Key;
        /// Sampling keeps the smallest set of tokens whose probability reaches top_p (HF's
        /// TopPLogitsWarper, after top_k; 1: all); log-probabilities as with top_k.
        #[rule(Rule::open_closed(0.0, 1.0))]
        top_p: f64 = d::TOP_P, Key;
        /// With top_k or top_p: kept_sets (the sampler records each token's kept set and every
        /// log-probability compared with the sampler's is renormalised over it, as TRL 1.17 and
        /// prime-rl) or trl_1_16 (the policy's full softmax, as TRL 1.16). A run resumes as it
        /// started (one started before this key: trl_1_16).
        sampling_replay: SamplingReplay = SamplingReplay::KeptSets, Short("");
        /// Optimizer steps of the run.
        #[rule(Positive)]
        max_steps: usize = 2000, Short("steps"), [Pack] => StepKeys, DrawKeys;
        /// Seed of everything random in the run (always in the run name).
        seed: u64 = d::SEED, Omit => StepKeys, DrawKeys;
        /// Gradient clipping (global L2 norm).
        max_grad_norm: f64 = d::MAX_GRAD_NORM, Key => StepKeys;
        /// AdamW weight decay (on every trainable tensor).
        weight_decay: f64 = 0.0, Key;
        /// AdamW beta1.
        adam_beta1: f64 = d::ADAM_BETA1, Key;
        /// AdamW beta2.
        adam_beta2: f64 = 0.999, Key;
        /// AdamW epsilon.
        adam_epsilon: f64 = d::ADAM_EPSILON, Key;

        /// none, classic or exclusive.
        routing_mode: RoutingMode = RoutingMode::None, Short(""), [Routing] => Recipe;
        /// Fraction of clean samples trained with the forget adapter off.
        #[rule(Rule::closed(0.0, 1.0))]
        ablated_frac: f64 = 0.0, Short("abl"), [Routing] => Recipe;
        /// Advantages of routed runs: off, retain_only or balanced (the original's
        /// renormalization_mode, advantages.py; its default is retain-only, smallrl's stays off).
        renormalization_mode: RenormalizationMode = RenormalizationMode::Off, Short("renorm_"), [Routing] => Recipe;
        /// balanced on DualLoRA: accept kappa from the ranks, which the original calls approximate
        /// (its --allow_approx_lora_kappa).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        allow_approx_lora_kappa: bool = false, Short("approx_kappa"), [Routing];
        /// Adam's second moment from the natural (unrouted) gradient, the first from the routed
        /// one (the original's --split_moment; needs balanced; both from the one backward pass).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        split_moment: bool = false, Short("split_moment"), [Routing] => StepKeys, Recipe;
        /// Coherence rows per rollout (the original's coh_samples_per_rollout): the batch's last N
        /// completions, whole groups, sampled and trained with the forget adapter off, retain
        /// alone learning (0: none).
        coh_samples_per_rollout: usize = 0, Short("coh"), [Routing];
        /// What a flagged coherence row does: filter, filter_renorm, penalty, zero or none (the
        /// original's coherence_rh_mode and its default).
        coherence_rh_mode: CoherenceRhMode = CoherenceRhMode::Filter, Short("coh_rh_"), [Routing] => Recipe;
        /// Reward taken from flagged coherence rows under coherence_rh_mode penalty (the
        /// original's default).
        coherence_rh_penalty: f64 = 3.0, Short("coh_penalty"), [Routing] => Recipe;
        /// The original's retain verifier: coherence prompts are drawn from the hackable and
        /// detectable training prompts, and only verified coherence rows train (detectable, not
        /// flagged by the monitor before recall, and a coin of probability
        /// rh_detector_retain_recall); their advantages are renormalised over the verified rows of
        /// the group, the rest get 0 and leave the loss (coherence_rh_mode is then inert).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        rh_detector_verifies_retain_samples: bool = false, Short("verify"), [Routing];
        /// Probability that the retain verifier vouches for a detectable, unflagged coherence row.
        #[rule(Rule::closed(0.0, 1.0))]
        rh_detector_retain_recall: f64 = 1.0, Short("verify_recall"), [Routing];
        /// The verified coherence rows' advantages, after the verifier's renormalisation, times
        /// this (the original's rp_extra_retain_advantage_multiplier, advantages.py:510-515, any
        /// intervention; its paper's best_rp doses v=2 and v=5). 1: unchanged.
        #[rule(FinitePositive)]
        rp_extra_retain_advantage_multiplier: f64 = 1.0, Short("extramult"), [Routing] => Recipe;
        /// Coherence rows start at step round(coherence_start_frac * max_steps) (0: from the first).
        #[rule(Rule::closed(0.0, 1.0))]
        coherence_start_frac: f64 = 0.0, Short("coh_start"), [Routing];
        /// Detector protocol knob: clean samples flagged anyway (drawn by the host).
        false_positive_rate: f64 = 0.0, Short("fpr");
        /// Detector protocol knob: fraction of flagged samples that stay flagged.
        recall: f64 = 1.0, Key;
        /// Detector protocol knob: fraction of samples eligible for the forget components.
        rh_eligible_frac: f64 = 1.0, Short("elig");
        /// Fraction of prompts that offer the hack (the original's hack_frac, prompt-level where
        /// rh_eligible_frac is per sample): a fixed hash of each prompt's text keeps it hackable
        /// with this probability (an environment applies it as it defines it); unhackable
        /// prompts get no forget components.
        #[rule(Rule::closed(0.0, 1.0))]
        hack_frac: f64 = 1.0, Short("hf");
        /// What the monitor's flags do: routing (where routing_mode sends them; with none,
        /// nothing), penalty (reward - rh_penalty), filter (out of the loss and the advantages),
        /// placebo (a random subset of the same size is routed instead), verified (only rows
        /// the monitor saw and did not flag train: the original's verified-only baseline),
        /// adv_mod (advantage - advantage_penalty * score) or matched_placebo (a random subset of
        /// the same gradient energy is routed instead).
        intervention: Intervention = Intervention::Routing, Short(""), [Routing] => Recipe;
        /// Subtracted from a flagged sample's reward with intervention: penalty.
        #[rule(Finite)]
        rh_penalty: f64 = 1.0, Key, [Routing] => Recipe;
        /// Times each sample's score, subtracted from its advantage with intervention: adv_mod.
        #[rule(Finite)]
        advantage_penalty: f64 = 1.0, Key, [Routing] => Recipe;
        /// adv_mod's score: flag (the monitor's, 0 or 1) or detector_score (the raw score of the
        /// component an rh_detector: score_threshold thresholds, 0 where the monitor cannot see).
        advantage_score: AdvantageScore = AdvantageScore::Flag, Short(""), [Routing];
        /// Largest share of a scored batch whose samples may have no score (a reward's or an
        /// environment's none, contract 0.5): they leave the loss and every statistic, counted by
        /// rewards/no_score_count; above it the step fails naming the plugin and the samples. 0:
        /// every sample needs a score. Refused with coherence rows, renormalization_mode and placebos.
        #[rule(Rule::closed_open(0.0, 1.0))]
        #[serde(skip_serializing_if = "skip::is_zero_f64")]
        max_no_score_frac: f64 = 0.0, Short("noscore") => Recipe;
        /// Where reward and detector plugin names resolve (`<dir>/<name>.wasm`).
        plugin_dir: PathBuf = "plugins".into(), Omit;
        /// Fuel (about one unit per WebAssembly instruction) a plugin call may use per sample: the
        /// deterministic bound on a plugin's work.
        plugin_fuel_per_sample: u64 = d::PLUGIN_FUEL_PER_SAMPLE, Omit, [Resume];
        /// Wall-clock seconds a plugin call may run, the judge's time included: the backstop
        /// behind fuel and the judge budget (left at 10 in a run with a judge: 600).
        plugin_max_call_seconds: f64 = d::PLUGIN_MAX_CALL_SECONDS, Omit, [Resume];
        /// Largest memory a plugin may have, in MiB (its initial memory included).
        plugin_max_memory_mb: usize = d::PLUGIN_MAX_MEMORY_MB, Omit, [Resume];
        /// Items an environment's call may send the judge per sample, over all its judge
        /// calls: the deterministic bound on its judge calls.
        #[serde(skip_serializing_if = "skip::is_default_judge_items")]
        plugin_judge_items_per_sample: u64 = d::PLUGIN_JUDGE_ITEMS_PER_SAMPLE, Omit, [Resume];
        /// Judge tokens (prompts plus the most generated) an environment's call may use per
        /// sample: the deterministic bound on the judge's work.
        #[serde(skip_serializing_if = "skip::is_default_judge_tokens")]
        plugin_judge_tokens_per_sample: u64 = d::PLUGIN_JUDGE_TOKENS_PER_SAMPLE, Omit, [Resume];
        /// Fuel of each program a plugin runs through the program runner (contract 0.4's
        /// `programs`): a program over it ends with status out-of-fuel, which its grader scores.
        #[serde(skip_serializing_if = "skip::is_default_program_fuel")]
        program_fuel: u64 = d::PROGRAM_FUEL, Key;
        /// Largest memory of each program's interpreter in MiB, its initial memory included.
        #[serde(skip_serializing_if = "skip::is_default_program_memory")]
        program_max_memory_mb: usize = d::PROGRAM_MAX_MEMORY_MB, Key;
        /// Most KiB each program may write to stdout and stderr together.
        #[serde(skip_serializing_if = "skip::is_default_program_output")]
        program_max_output_kib: usize = d::PROGRAM_MAX_OUTPUT_KIB, Key;

        /// Steps between the sample and summary lines of train.log.
        #[rule(Positive)]
        logging_steps: usize = 10, Omit => StepKeys;
        /// Steps between checkpoints.
        #[rule(Positive)]
        save_steps: usize = 500, Omit => StepKeys;
        /// Steps between routing evaluations.
        #[rule(Positive)]
        eval_every: usize = 100, Omit => StepKeys;
        /// Evaluation prompts (one completion per adapter mode each).
        eval_samples: usize = d::EVAL_PROMPTS, Omit;
        /// Run directories go to `<output_dir>/<run name>`.
        output_dir: PathBuf = "runs".into(), Omit;
        /// Re-score each step's batch after the update (one extra forward pass, about a third of
        /// the training pass) and log the entropy change (`entropy/measured_change`).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        measure_entropy_change: bool = false, Omit, [Resume] => StepKeys;
        /// Every N steps (0: never), the sketched Fisher kernel of the step's sequences, K(i, j) =
        /// <g_i, g_j> of their log-probabilities' gradients, in fisher/step_<N>.json and as fisher/*
        /// metrics (one forward and backward pass per sequence; the training is unchanged).
        fisher_kernel_every: usize = 0, Omit, [Resume];
        /// Buckets of the Fisher kernel's CountSketch of each gradient: the expected relative
        /// error is at most sqrt((effective rank + 1) / N); the cost does not grow with N.
        fisher_kernel_sketch: usize = 16_384, Omit, [Resume];
        /// Log the gradient noise scale (McCandlish et al. 2018's B_simple = tr(Σ) / |G|²) from the
        /// gradients of the batch's micro-batches, or with gradient_accumulation_steps 1 of its two
        /// halves (the step then runs as two backward passes of half the batch each).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        gradient_noise_scale: bool = false, Omit => StepKeys;
        /// Write each step's batch tensors (ids, masks, rewards, advantages, log-probs, loss) here.
        dump_batches: Option<PathBuf> = None, Omit, [Resume] => StepKeys;
        /// Offline repair: train on the rollouts this dump_batches directory recorded, not sampling.
        replay_rollouts: Option<PathBuf> = None, Short("replay");
        /// TensorBoard event files in the run directory (`train/live.rs`; `--tensorboard false`
        /// turns them off).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        tensorboard: bool = d::TENSORBOARD, Omit, [Resume];
        /// Every completion with its rewards, detector flags and advantage in `completions.jsonl`.
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        log_completions: bool = d::LOG_COMPLETIONS, Omit, [Resume];
        /// DualLoRA: each adapter's gradient norm split by flagged / unflagged samples in
        /// metrics.jsonl (two extra backward passes a step; the step's gradient is unchanged).
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        absorption_by_class: bool = false, Omit, [Resume] => StepKeys;
        /// Experiment name, first part of the run directory name (default: the config file's
        /// stem, or the reward plugin's name).
        name: Option<String> = None, Omit;
        /// auto, cpu, cuda or cuda:N.
        device: DeviceSpec = d::DEVICE.parse().expect("the default device parses"), Omit, [Resume, Pack];
        /// float32, or bfloat16 (on CUDA).
        dtype: Dtype = d::DTYPE.parse().expect("the default dtype parses"), Key, [Pack];
        /// The precision sampling draws in: float32, or bfloat16 (the sampler's matrices rounded to
        /// bfloat16, its sums in float32; training and scoring stay in dtype). Needs
        /// importance_sampling_correction, or a loss whose ratio is to the sampler.
        #[serde(skip_serializing_if = "skip::is_float32_sampler")]
        sampler_dtype: SamplerDtype = d::SAMPLER_DTYPE, Short("sampler_"), [Pack];
        /// The precision of the training passes' matrix products: float32, or bfloat16 with the
        /// weights, gradients, optimizer, norms, softmax and loss in float32 (TRL's bf16=True).
        #[serde(skip_serializing_if = "skip::is_float32_training")]
        train_dtype: TrainDtype = d::TRAIN_DTYPE, Short("train_"), [Pack];
        /// libtorch intra-op threads (default: one per core).
        threads: Option<usize> = None, Omit, [Resume, Pack];
    }
    file_only {
        /// The reward: one plugin or a sum of components (see configs/).
        reward: Option<RewardSpec> = None, Omit;
        /// The reward-hack detector that labels samples for routing.
        rh_detector: Option<DetectorSpec> = None, Omit;
        /// The environment's parameters (a JSON object; with `environment` only).
        environment_params: Option<Value> = None, Omit;
        /// The judge an environment may import (`model` a local directory, `template` with `{name}`
        /// placeholders, `mode` parse_integer or answer_logprobs, `min`, `max`, `answers`,
        /// `max_new_tokens`, `chat`, `batch_size`; see docs/src/environments.md); refused unless
        /// the environment imports it, and required when it does.
        judge: Option<crate::judge::JudgeConfig> = None, Omit;
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
        /// Written by the memory planner when a run with gradient_accumulation_steps auto starts,
        /// never set by hand: the micro-batches it chose, which a resumed run keeps.
        #[serde(skip_serializing_if = "Option::is_none")]
        planned_micro_batches: Option<usize> = None, Omit;
    }
}

#[cfg(test)]
mod rules_tests;
#[cfg(test)]
mod tests;
