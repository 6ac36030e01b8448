use std::path::Path;

use anyhow::Result;

use super::*;
use crate::grpo::{Aggregation, RatioTo, Surrogate};
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
        "plugin_max_call_seconds", "plugin_max_memory_mb", "plugin_judge_items_per_sample", "plugin_judge_tokens_per_sample", "plugin_sha256", "logging_steps", "save_steps",
        "eval_every", "eval_samples", "output_dir", "dump_batches", "measure_entropy_change", "gradient_noise_scale", "fisher_kernel_every", "fisher_kernel_sketch", "tensorboard", "log_completions", "name", "device",
        "threads", "seed", "system_prompt", "inoculation_prompt",
        // An environment names its run through the config file's stem or `name`.
        "environment", "environment_params",
        // The judge an environment imports: named with its environment.
        "judge",
        // A record written by --extend-schedule, not a setting: an extended run keeps its
        // directory and name.
        "lr_horizons",
        // Where the run executes, and the memory planner's record (train/memory.rs).
        "max_memory", "planned_micro_batches",
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
        ("importance_sampling_correction", "iscorr"), ("importance_sampling_mode", "ismode_"), ("importance_sampling_clip_min", "isclipmin"), ("importance_sampling_clip_max", "isclipmax"),
        ("prompt_format", ""),
        ("max_steps_off_policy", "offpolicy"), ("stream_minibatches", "stream"),
        ("rh_detector_verifies_retain_samples", "verify"), ("rh_detector_retain_recall", "verify_recall"),
        ("rp_extra_retain_advantage_multiplier", "extramult"),
        ("sapo_temperature_pos", "sapo_tpos"), ("sapo_temperature_neg", "sapo_tneg"), ("vespo_k_pos", "vespo_kpos"), ("vespo_lambda_pos", "vespo_lpos"),
        ("vespo_k_neg", "vespo_kneg"), ("vespo_lambda_neg", "vespo_lneg"), ("off_policy_mask_threshold", "opsm"), ("use_bias_correction_kl", "klcorr"),
        ("sampler_dtype", "sampler_"), ("multi_objective_aggregation", ""),
        ("entropy_coef", "entcoef"), ("use_adaptive_entropy", "adaptent"), ("entropy_coef_min", "entmin"), ("entropy_coef_max", "entmax"),
        ("entropy_coef_delta", "entdelta"), ("entropy_target", "enttarget"),
        ("advantage_score", ""),
        ("replay_rollouts", "replay"),
        ("sampling_steps_ahead", "ahead"), ("allow_unclipped_off_policy", "unclipped_ok"),
        ("sampling_replay", ""), ("train_dtype", "train_"), ("max_no_score_frac", "noscore"),
        ("episode_max_turns", "turns"), ("episode_max_turn_tokens", "turn_len"), ("episode_max_observation_tokens", "obs_len"), ("episode_max_observation_bytes", "obs_bytes"),
    ];
    for key in TrainConfig::KEYS {
        let expected = if omitted.contains(&key.name) {
            crate::hyperparams::Label::Omit
        } else {
            short.iter().find(|(k, _)| *k == key.name).map_or(crate::hyperparams::Label::Key, |(_, s)| crate::hyperparams::Label::Short(s))
        };
        assert_eq!(key.label, expected, "{}", key.name);
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
    assert_eq!(plain.objective().unwrap().surrogate, Surrogate::Clip { low: 0.2, high: 0.2, delta: None }, "epsilon_high defaults to epsilon");
    assert_eq!((plain.importance_sampling_level, plain.scale_rewards, plain.mask_truncated_completions), (ImportanceSamplingLevel::Token, ScaleRewards::Group, false));
    let knobs = [("epsilon_high", "0.28"), ("delta", "1.5"), ("importance_sampling_level", "sequence"), ("scale_rewards", "none"), ("mask_truncated_completions", "true")];
    let set = resolved(&knobs);
    let objective = set.objective().unwrap();
    assert_eq!((objective.surrogate, objective.ratio_level), (Surrogate::Clip { low: 0.2, high: 0.28, delta: Some(1.5) }, ImportanceSamplingLevel::Sequence));
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
    let routed_verified = error(&[("intervention", "verified")]);
    assert!(routed_verified.contains("intervention verified replaces routing: set routing_mode none (got classic)"), "{routed_verified}");
    let coherent = error(&[("intervention", "verified"), ("routing_mode", "none"), ("coh_samples_per_rollout", "16")]);
    assert!(coherent.contains("set coh_samples_per_rollout 0 (got 16)"), "{coherent}");
    let verified = resolved(&[("intervention", "verified"), ("routing_mode", "none")]);
    assert!(verified.run_name().unwrap().contains("_verified_"), "{}", verified.run_name().unwrap());
    assert_eq!(verified.without_routing(), resolved(&[("routing_mode", "none")]), "the baseline has no intervention");
    assert!(!resolved(&[]).run_name().unwrap().contains("routing"), "the default intervention stays out of run names");
    assert!(error(&[("intervention", "adv_mod")]).contains("intervention adv_mod replaces routing: set routing_mode none (got classic)"));
    let adv = resolved(&[("intervention", "adv_mod"), ("routing_mode", "none"), ("advantage_penalty", "0.5")]);
    let name = adv.run_name().unwrap();
    assert!(name.contains("_adv_mod_") && name.contains("_advantage_penalty0.5_") && !name.contains("classic"), "{name}");
    assert!(!resolved(&[("intervention", "adv_mod"), ("routing_mode", "none")]).run_name().unwrap().contains("advantage_penalty"), "the default coefficient stays out of names");
    assert_eq!(adv.without_routing(), resolved(&[("routing_mode", "none")]), "the baseline has no intervention");
    let unused = error(&[("advantage_penalty", "0.5")]);
    assert!(unused.contains("advantage_penalty is only used with intervention: adv_mod (got routing)"), "{unused}");
    let unused = error(&[("intervention", "penalty"), ("routing_mode", "none"), ("advantage_score", "detector_score")]);
    assert!(unused.contains("advantage_score is only used with intervention: adv_mod (got penalty)"), "{unused}");
    let refilled = error(&[("intervention", "adv_mod"), ("routing_mode", "none"), ("dynamic_sampling_rounds", "3")]);
    assert!(refilled.contains("dynamic_sampling_rounds drops such groups"), "{refilled}");
    let adv_score = [("intervention", "adv_mod"), ("routing_mode", "none"), ("advantage_score", "detector_score")];
    let flags_only = error(&adv_score);
    assert!(flags_only.contains("advantage_score detector_score") && flags_only.contains("returns flags only"), "{flags_only}");
    let threshold = [adv_score.as_slice(), &[("rh_detector", "{score_threshold: {component: happy_count, threshold: 1}}")]].concat();
    let continuous = resolved(&threshold);
    assert!(continuous.run_name().unwrap().contains("_detector_score_"), "{}", continuous.run_name().unwrap());
    let drawn = error(&[threshold.as_slice(), &[("recall", "0.5")]].concat());
    assert!(drawn.contains("recall (0.5) and false_positive_rate (0)") && drawn.contains("use advantage_score flag"), "{drawn}");
    let matched = error(&[("intervention", "matched_placebo"), ("routing_mode", "none")]);
    assert!(matched.contains("intervention matched_placebo routes a random subset: set routing_mode classic or exclusive"), "{matched}");
    let matched = resolved(&[("intervention", "matched_placebo")]).run_name().unwrap();
    assert!(matched.contains("_classic_") && matched.contains("_matched_placebo_"), "{matched}");
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
    let cispo = resolved(&[("loss_type", "cispo"), ("epsilon_high", "5")]).objective().unwrap();
    assert_eq!((cispo.surrogate, cispo.aggregation), (Surrogate::Cispo { cap: 5.0 }, Aggregation::Dapo), "CISPO's cap, aggregated as dapo");
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
    let objective = dro.objective().unwrap();
    assert_eq!((objective.surrogate, objective.ratio_to), (Surrogate::Dro { beta: 0.05 }, RatioTo::Sampler));
    let name = dro.run_name().unwrap();
    assert!(name.contains("_dro_beta0.05_") && name.contains("_dro_"), "{name}");
    assert_eq!(resolved(&[]).objective().unwrap().ratio_to, RatioTo::OldPolicy, "TRL's surrogate by default");
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

/// TRL's importance-sampling correction: its keys only with it, TRL's bounds rules, TRL's loss only.
#[test]
fn the_importance_sampling_correction_refuses_what_does_not_apply() {
    let checks: [(&[(&str, &str)], &str); 6] = [
        (&[("importance_sampling_mode", "token_mask")], "shape the importance-sampling correction: set importance_sampling_correction: true, or unset them"),
        (&[("importance_sampling_clip_max", "2")], "shape the importance-sampling correction: set importance_sampling_correction: true"),
        (&[("importance_sampling_correction", "true"), ("importance_sampling_clip_min", "3")], "importance_sampling_clip_min (3) must be below importance_sampling_clip_max (3)"),
        (&[("importance_sampling_correction", "true"), ("importance_sampling_clip_min", "-1")], "importance_sampling_clip_min (-1) must be finite and at least 0"),
        (&[("importance_sampling_correction", "true"), ("importance_sampling_clip_max", "0")], "importance_sampling_clip_min (0) must be below importance_sampling_clip_max (0)"),
        (&[("importance_sampling_correction", "true"), ("loss_fn", "importance_sampling")], "loss_fn importance_sampling already takes its ratio to the sampler's log-probabilities"),
    ];
    for (overrides, expected) in checks {
        let message = error(overrides);
        assert!(message.contains(expected), "{overrides:?}: {message}");
    }
    assert!(error(&[("importance_sampling_mode", "token")]).contains("unknown importance_sampling_mode \"token\": use token_truncate, token_mask, sequence_truncate or sequence_mask"));
    assert_eq!(resolved(&[]).objective().unwrap().correction, None, "off by default");
    let on = resolved(&[("importance_sampling_correction", "true")]);
    let expected = crate::grpo::IsCorrection { mode: crate::grpo::ImportanceSamplingMode::SequenceMask, clip_min: 0.0, clip_max: 3.0 };
    assert_eq!(on.objective().unwrap().correction, Some(expected), "TRL's defaults: sequence_mask, clip_max 3");
    let name = resolved(&[("importance_sampling_correction", "true"), ("importance_sampling_mode", "token_truncate"), ("importance_sampling_clip_min", "0.5")]).run_name().unwrap();
    assert!(name.contains("_iscorrtrue_") && name.contains("_ismode_token_truncate_") && name.contains("_isclipmin0.5_"), "{name}");
    let masked = resolved(&[("importance_sampling_correction", "true"), ("importance_sampling_mode", "token_mask"), ("importance_sampling_clip_max", "1e30")]);
    assert_eq!(masked.objective().unwrap().correction.unwrap().clip_max, 1e30, "a mask no ratio reaches is plain importance sampling");
}

/// A bfloat16 sampler needs the loss to see the sampler's log-probabilities; float32 runs keep
/// their config.yaml and names.
#[test]
fn a_bfloat16_sampler_needs_the_correction_and_names_its_run() {
    let message = error(&[("sampler_dtype", "bfloat16")]);
    assert!(message.contains("sampler_dtype bfloat16 samples from other weights than the policy's float32") && message.contains("importance_sampling_correction: true"), "{message}");
    assert!(error(&[("sampler_dtype", "bf16")]).contains("unknown sampler_dtype \"bf16\": use float32 or bfloat16"));
    let corrected = resolved(&[("sampler_dtype", "bfloat16"), ("importance_sampling_correction", "true")]);
    assert!(corrected.run_name().unwrap().contains("_sampler_bfloat16_"), "{}", corrected.run_name().unwrap());
    assert!(corrected.sampler_ratio().unwrap().contains("importance_sampling_correction"));
    assert!(resolved(&[("sampler_dtype", "bfloat16"), ("max_steps_off_policy", "1")]).sampler_ratio().is_some());
    assert!(resolved(&[("sampler_dtype", "bfloat16"), ("loss_fn", "importance_sampling")]).sampler_ratio().is_some());
    let plain = serde_json::to_value(resolved(&[])).unwrap();
    assert!(plain.get("sampler_dtype").is_none(), "a float32 run's config.yaml has no sampler_dtype");
    assert_eq!(serde_json::to_value(&corrected).unwrap()["sampler_dtype"], "bfloat16");
    assert_eq!(resolved(&[("sampler_dtype", "float32")]).run_name().unwrap(), resolved(&[]).run_name().unwrap());
}

/// The judge budget's keys reach a run's config.yaml only when set (runs without them keep
/// their files), and a run with a judge gets the judge's call-time default unless it sets one.
#[test]
fn judge_budget_keys_are_written_only_when_set_and_a_judge_widens_the_call_time() {
    let plain = TrainConfig::default();
    let written = serde_json::to_value(&plain).unwrap();
    assert!(written.get("plugin_judge_items_per_sample").is_none() && written.get("plugin_judge_tokens_per_sample").is_none());
    assert!(written.get("plugin_max_call_seconds").is_some());
    let set = TrainConfig { plugin_judge_items_per_sample: 8, plugin_judge_tokens_per_sample: 99, ..TrainConfig::default() };
    let written = serde_json::to_value(&set).unwrap();
    assert_eq!((written["plugin_judge_items_per_sample"].as_u64(), written["plugin_judge_tokens_per_sample"].as_u64()), (Some(8), Some(99)));
    let limits = set.plugin_limits().unwrap();
    assert_eq!((limits.judge_items_per_sample, limits.judge_tokens_per_sample, limits.max_call_time.as_secs_f64()), (8, 99, 10.0));
    let judge: crate::judge::JudgeConfig = serde_json::from_value(serde_json::json!({"model": "m", "template": "{text}"})).unwrap();
    let judged = TrainConfig { judge: Some(judge), ..TrainConfig::default() };
    assert_eq!(judged.plugin_limits().unwrap().max_call_time.as_secs_f64(), 600.0);
    let chosen = TrainConfig { plugin_max_call_seconds: 20.0, ..judged };
    assert_eq!(chosen.plugin_limits().unwrap().max_call_time.as_secs_f64(), 20.0);
}

/// TRL 1.16's sapo, luspo and vespo and its off-policy mask and bias-corrected KL: TRL's
/// defaults, their keys only with them, the importance-sampling level each is defined at.
#[test]
fn trl_116_losses_and_options_take_trl_defaults_and_refuse_what_does_not_apply() {
    let checks: [(&[(&str, &str)], &str); 10] = [
        (&[("loss_type", "luspo")], "loss_type luspo is defined on GSPO's sequence ratios: set importance_sampling_level: sequence"),
        (&[("loss_type", "vespo"), ("importance_sampling_level", "sequence")], "loss_type vespo takes its sequence weight from the per-token log-ratios itself"),
        (&[("loss_type", "vespo"), ("importance_sampling_correction", "true")], "set importance_sampling_mode to token_truncate or token_mask (it is sequence_mask)"),
        (&[("sapo_temperature_pos", "0.5")], "sapo_temperature_pos and sapo_temperature_neg are SAPO's gate temperatures: set them with loss_type sapo only (loss_type grpo)"),
        (&[("loss_type", "dapo"), ("vespo_lambda_neg", "1")], "shape VESPO's weighting: set them with loss_type vespo only (loss_type dapo)"),
        (&[("loss_type", "sapo"), ("sapo_temperature_neg", "0")], "sapo_temperature_pos (1) and sapo_temperature_neg (0) must be positive"),
        (&[("loss_type", "vespo"), ("epsilon_high", "0.28")], "epsilon, epsilon_high and delta shape the clip; loss_type vespo has none: unset them"),
        (&[("loss_type", "sapo"), ("loss_fn", "ppo")], "loss_type sapo is TRL's own surrogate; loss_fn ppo replaces it"),
        (&[("use_bias_correction_kl", "true"), ("beta", "0")], "use_bias_correction_kl weighs the KL term by the importance ratio; beta is 0"),
        (&[("loss_type", "vespo"), ("vespo_lambda_pos", "0")], "vespo_lambda_pos (0) and vespo_lambda_neg (2) are decay rates: finite and positive"),
    ];
    for (overrides, expected) in checks {
        let message = error(overrides);
        assert!(message.contains(expected), "{overrides:?}: {message}");
    }
    let sapo = resolved(&[("loss_type", "sapo")]).objective().unwrap();
    assert_eq!((sapo.surrogate, sapo.aggregation), (Surrogate::Sapo { positive: 1.0, negative: 1.05 }, Aggregation::Grpo), "TRL's temperatures, grpo's aggregation");
    let vespo = resolved(&[("loss_type", "vespo")]).objective().unwrap();
    let gamma = crate::grpo::VespoGamma { k_pos: 2.0, lambda_pos: 3.0, k_neg: 3.0, lambda_neg: 2.0 };
    assert_eq!((vespo.surrogate, vespo.aggregation), (Surrogate::Vespo(gamma), Aggregation::Dapo), "TRL's Gamma parameters, dapo's aggregation");
    let luspo = resolved(&[("loss_type", "luspo"), ("importance_sampling_level", "sequence")]);
    assert_eq!(luspo.objective().unwrap().aggregation, Aggregation::Luspo);
    let plain = resolved(&[]).objective().unwrap();
    assert_eq!((plain.off_policy_mask_threshold, plain.kl.unwrap().bias_correction), (None, false), "off by default: the runs from before the keys");
    let both = resolved(&[("off_policy_mask_threshold", "0.5"), ("use_bias_correction_kl", "true")]);
    let name = both.run_name().unwrap();
    assert!(name.contains("_opsm0.5_") && name.contains("_klcorrtrue_"), "{name}");
    assert_eq!((both.objective().unwrap().off_policy_mask_threshold, both.objective().unwrap().kl.unwrap().bias_correction), (Some(0.5), true));
}

/// `gradient_accumulation_steps` as a number is written, named and checked as before `auto`
/// existed; `auto` names its run `gasauto`, is refused where micro-batches would change the
/// loss, and the planner's record and `max_memory` appear in config.yaml only when set.
#[test]
fn accumulation_counts_are_unchanged_and_auto_refuses_what_micro_batches_would_change() {
    let plain = serde_json::to_value(TrainConfig::default()).unwrap();
    assert_eq!(plain["gradient_accumulation_steps"], serde_json::json!(1));
    assert!(plain.get("max_memory").is_none() && plain.get("planned_micro_batches").is_none());
    let four = resolved(&[("gradient_accumulation_steps", "4")]);
    assert_eq!((four.micro_batches(), crate::yaml::to_string(&four).unwrap().contains("gradient_accumulation_steps: 4\n")), (4, true));
    assert!(four.run_name().unwrap().contains("_gas4_"), "{}", four.run_name().unwrap());
    let auto = resolved(&[("gradient_accumulation_steps", "auto"), ("max_memory", "20GB")]);
    assert!(auto.run_name().unwrap().contains("_gasauto_"), "{}", auto.run_name().unwrap());
    assert_eq!(auto.max_memory.as_ref().map(|m| m.bytes), Some(20_000_000_000));
    assert!(crate::yaml::to_string(&auto).unwrap().contains("max_memory: 20GB\n"));
    let planned = TrainConfig { planned_micro_batches: Some(4), ..auto };
    planned.validate().unwrap();
    assert_eq!(planned.micro_batches(), 4);
    let dividing = error(&[("gradient_accumulation_steps", "auto"), ("planned_micro_batches", "3")]);
    assert!(dividing.contains("gradient_accumulation_steps (3) must be at least 1 and divide the optimizer step's 32 completions"), "{dividing}");
    let stray = error(&[("planned_micro_batches", "2")]);
    assert!(stray.contains("planned_micro_batches is the memory planner's record for gradient_accumulation_steps auto (it is 1): remove the key"), "{stray}");
    for (key, value, what) in [("loss_type", "bnpo", "bnpo normalises each micro-batch"), ("top_entropy_quantile", "0.2", "top_entropy_quantile takes its threshold"), ("gradient_noise_scale", "true", "gradient_noise_scale compares")] {
        let refused = error(&[("gradient_accumulation_steps", "auto"), (key, value)]);
        assert!(refused.contains("gradient_accumulation_steps auto splits the step into micro-batches only where the loss stays the same") && refused.contains(what), "{refused}");
        assert!(refused.contains("set gradient_accumulation_steps to a number"), "{refused}");
    }
    let absorption = error(&[("gradient_accumulation_steps", "auto"), ("absorption_by_class", "true")]);
    assert!(absorption.contains("leave gradient_accumulation_steps at 1"), "{absorption}");
    let unit = error(&[("max_memory", "20")]);
    assert!(unit.contains("unknown unit"), "{unit}");
}

/// GDPO (`multi_objective_aggregation: normalize_then_sum`): absent from config.yaml and run
/// names at its default (the runs from before the key keep theirs), named when set, and refused,
/// naming the key, with everything that acts on the summed reward or normalises it otherwise.
#[test]
fn normalize_then_sum_is_named_when_set_and_refuses_what_acts_on_the_summed_reward() {
    let uncapped = "{components: [{plugin: sentence_length, params: {target: 10}, role: retain}, {plugin: happy_count, params: {max_count: 5}, scale: 0.5, role: forget}]}";
    let plain = resolved(&[("reward", uncapped)]);
    assert_eq!(plain.multi_objective_aggregation, MultiObjectiveAggregation::SumThenNormalize);
    assert!(serde_json::to_value(&plain).unwrap().get("multi_objective_aggregation").is_none(), "the default is not written to config.yaml");
    let explicit = resolved(&[("reward", uncapped), ("multi_objective_aggregation", "sum_then_normalize")]);
    assert_eq!(explicit.run_name().unwrap(), plain.run_name().unwrap());
    let gdpo = resolved(&[("reward", uncapped), ("multi_objective_aggregation", "normalize_then_sum")]);
    let name = gdpo.run_name().unwrap();
    assert!(name.contains("_normalize_then_sum_"), "{name}");
    let saved = crate::yaml::to_string(&gdpo).unwrap();
    assert!(saved.contains("multi_objective_aggregation: normalize_then_sum\n"), "{saved}");
    let gdpo_key = ("multi_objective_aggregation", "normalize_then_sum");
    let refusals: [(&[(&str, &str)], &str); 6] = [
        (&[gdpo_key], "`reward: max_reward` (1) caps the sum of the raw components, which is not what trains; remove max_reward"),
        (&[("reward", uncapped), gdpo_key, ("scale_rewards", "none")], "scale_rewards (none) has no part in it (TRL ignores it there); leave scale_rewards at group"),
        (&[("reward", uncapped), gdpo_key, ("renormalization_mode", "retain_only")], "renormalization_mode retain_only renormalises the summed reward"),
        (&[("reward", uncapped), gdpo_key, ("coh_samples_per_rollout", "16")], "coherence rows (coh_samples_per_rollout 16) get advantages rewritten from the summed reward"),
        (&[("reward", uncapped), gdpo_key, ("dynamic_sampling_rounds", "2")], "dynamic_sampling_rounds (2) drops groups whose summed rewards are equal"),
        (&[("reward", uncapped), gdpo_key, ("stream_minibatches", "true"), ("num_substeps", "2")], "stream_minibatches would normalise over each mini-batch"),
    ];
    for (overrides, expected) in refusals {
        let message = error(overrides);
        assert!(message.contains("multi_objective_aggregation normalize_then_sum normalises each reward component within its group") && message.contains(expected), "{overrides:?}: {message}");
    }
    let unknown = error(&[("reward", uncapped), ("multi_objective_aggregation", "gdpo")]);
    assert!(unknown.contains("unknown multi_objective_aggregation \"gdpo\": use sum_then_normalize or normalize_then_sum"), "{unknown}");
    // What GDPO does define: the penalty (a reward function of its own), the filter and
    // verified-only (over their kept rows), routing and the placebo.
    for intervention in [("intervention", "penalty"), ("intervention", "filter"), ("intervention", "placebo")] {
        let routing = if intervention.1 == "placebo" { "classic" } else { "none" };
        resolved(&[("reward", uncapped), gdpo_key, intervention, ("routing_mode", routing)]);
    }
}

#[test]
fn the_advantage_multiplier_names_its_runs_and_is_refused_without_verified_coherence_rows() {
    let verified = [("coh_samples_per_rollout", "16"), ("rh_detector_verifies_retain_samples", "true")];
    let with = |v: &'static str| [verified.as_slice(), &[("rp_extra_retain_advantage_multiplier", v)]].concat();
    let name = resolved(&with("5")).run_name().unwrap();
    assert!(name.contains("_extramult5"), "{name}");
    assert!(!resolved(&verified).run_name().unwrap().contains("extramult"), "the default stays out of names");
    assert_eq!(resolved(&with("5")).without_routing(), resolved(&[("routing_mode", "none")]), "the baseline has no coherence rows");
    let unused = error(&[("rp_extra_retain_advantage_multiplier", "2")]);
    assert!(unused.contains("rp_extra_retain_advantage_multiplier is set but coh_samples_per_rollout is 0"), "{unused}");
    let unverified = error(&[("coh_samples_per_rollout", "16"), ("rp_extra_retain_advantage_multiplier", "2")]);
    assert!(unverified.contains("rp_extra_retain_advantage_multiplier is set but rh_detector_verifies_retain_samples is false"), "{unverified}");
    for bad in ["0", "-1"] {
        let error = error(&with(bad));
        assert!(error.contains("rp_extra_retain_advantage_multiplier") && error.contains("finite and above 0"), "{bad}: {error}");
    }
}

/// tinker's unclipped `importance_sampling` is refused at any pipeline depth unless the run
/// says it knows (tinker-cookbook 0.6.1's AsyncConfig warning); ppo and TRL's loss run; the acknowledging key is
/// refused where it acknowledges nothing; sampling_steps_ahead's own rules.
#[test]
fn unclipped_importance_sampling_off_policy_needs_its_key() {
    for depth in [("max_steps_off_policy", "1"), ("sampling_steps_ahead", "2")] {
        let message = error(&[depth, ("loss_fn", "importance_sampling")]);
        assert!(message.contains(&format!("{} {} trains off policy", depth.0, depth.1)), "{message}");
        assert!(message.contains("tinker-cookbook 0.6.1 warns that it can become unstable") && message.contains("Use loss_fn: ppo"), "{message}");
        assert!(message.contains("allow_unclipped_off_policy: true"), "{message}");
        let allowed = resolved(&[depth, ("loss_fn", "importance_sampling"), ("allow_unclipped_off_policy", "true")]);
        assert!(allowed.run_name().unwrap().contains("unclipped_ok"), "{}", allowed.run_name().unwrap());
        resolved(&[depth, ("loss_fn", "ppo")]);
        resolved(&[depth]);
    }
    resolved(&[("loss_fn", "importance_sampling")]);
    let idle = error(&[("loss_fn", "importance_sampling"), ("allow_unclipped_off_policy", "true")]);
    assert!(idle.contains("allow_unclipped_off_policy only lets loss_fn importance_sampling train off policy"), "{idle}");
    assert!(error(&[("max_steps_off_policy", "1"), ("allow_unclipped_off_policy", "true")]).contains("remove it"));
    let both = error(&[("max_steps_off_policy", "1"), ("sampling_steps_ahead", "1")]);
    assert!(both.contains("max_steps_off_policy (1) and sampling_steps_ahead (1) both sample ahead"), "{both}");
    let substeps = error(&[("sampling_steps_ahead", "1"), ("num_substeps", "2")]);
    assert!(substeps.contains("sampling_steps_ahead 1 samples each step's batch ahead: it needs one optimizer step per batch"), "{substeps}");
    assert!(error(&[("max_steps_off_policy", "1"), ("dynamic_sampling_rounds", "2")]).contains("dynamic_sampling_rounds must be 0"));
    let filtered = resolved(&[("sampling_steps_ahead", "1"), ("dynamic_sampling_rounds", "2")]);
    assert!(filtered.samples_ahead() && filtered.sampler_ratio().is_some());
    let plain = serde_json::to_value(resolved(&[])).unwrap();
    assert!(plain.get("sampling_steps_ahead").is_none() && plain.get("allow_unclipped_off_policy").is_none(), "the runs from before the keys keep their config.yaml");
}

/// Sampling replay's key: the default kept_sets leaves the run name alone, trl_1_16 names it;
/// config.yaml always holds the key, and one written before the key existed (without it) reads
/// back, and so resumes, as trl_1_16. The correction against a trainer's old policy is refused
/// under replay with truncation, and allowed as TRL 1.16 computes it.
#[test]
fn sampling_replay_is_named_written_and_read_back_as_the_run_started() {
    let truncated = resolved(&[("top_k", "50")]);
    assert_eq!(truncated.sampling_replay, SamplingReplay::KeptSets);
    let trl = resolved(&[("top_k", "50"), ("sampling_replay", "trl_1_16")]);
    assert!(trl.run_name().unwrap().contains("_trl_1_16_") && !truncated.run_name().unwrap().contains("kept_sets"), "{}", trl.run_name().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let yaml = crate::yaml::to_string(&truncated).unwrap();
    assert!(yaml.contains("sampling_replay: kept_sets"), "{yaml}");
    std::fs::write(dir.path().join("config.yaml"), &yaml).unwrap();
    assert_eq!(TrainConfig::read_saved(dir.path()).unwrap().sampling_replay, SamplingReplay::KeptSets);
    let before_the_key: String = yaml.lines().filter(|line| !line.starts_with("sampling_replay:")).map(|line| format!("{line}\n")).collect();
    std::fs::write(dir.path().join("config.yaml"), before_the_key).unwrap();
    assert_eq!(TrainConfig::read_saved(dir.path()).unwrap().sampling_replay, SamplingReplay::Trl116);
    // Without truncation the key changes nothing: such a run reads back with the default and
    // keeps its name (tests/pre_layout_runs.rs resumes one).
    let untruncated = resolved(&[]);
    let yaml = crate::yaml::to_string(&untruncated).unwrap();
    let before_the_key: String = yaml.lines().filter(|line| !line.starts_with("sampling_replay:")).map(|line| format!("{line}\n")).collect();
    std::fs::write(dir.path().join("config.yaml"), before_the_key).unwrap();
    let reread = TrainConfig::read_saved(dir.path()).unwrap();
    assert_eq!((reread.sampling_replay, reread.run_name().unwrap()), (SamplingReplay::KeptSets, untruncated.run_name().unwrap()));
    let message = error(&[("top_p", "0.8"), ("importance_sampling_correction", "true"), ("num_iterations", "2")]);
    assert!(message.contains("sampling_replay: trl_1_16"), "{message}");
    resolved(&[("top_p", "0.8"), ("importance_sampling_correction", "true"), ("num_iterations", "2"), ("sampling_replay", "trl_1_16")]);
    resolved(&[("importance_sampling_correction", "true"), ("num_iterations", "2")]);
}

/// `train_dtype` keeps float32 master weights: a bfloat16 model is refused by name; the key is
/// named in the run and written to config.yaml only when set.
#[test]
fn train_dtype_needs_float32_weights_and_names_the_run() {
    let message = error(&[("train_dtype", "bfloat16"), ("dtype", "bfloat16")]);
    assert!(message.contains("train_dtype bfloat16 keeps float32 master weights") && message.contains("needs dtype float32 (got bfloat16)"), "{message}");
    assert!(error(&[("train_dtype", "bf16")]).contains("unknown train_dtype \"bf16\": use float32 or bfloat16"));
    let mixed = resolved(&[("train_dtype", "bfloat16")]);
    assert!(mixed.run_name().unwrap().contains("train_bfloat16"), "{}", mixed.run_name().unwrap());
    assert_eq!(serde_json::to_value(&mixed).unwrap()["train_dtype"], "bfloat16");
    assert!(serde_json::to_value(resolved(&[])).unwrap().get("train_dtype").is_none(), "a float32 run's config.yaml has no train_dtype");
    assert_eq!(resolved(&[("train_dtype", "float32")]).run_name().unwrap(), resolved(&[]).run_name().unwrap());
}
