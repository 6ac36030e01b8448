//! `smallrl train`: GRPO on a model with a reward plugin. Precedence: defaults < `--config`
//! YAML < flags. Every hyperparameter flag is the snake_case config key in kebab-case.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::reward::{DetectorSpec, RewardSpec};

use crate::train::config::parse_override;
use crate::train::{TrainConfig, Trainer};

#[derive(Args, Debug, Serialize)]
pub struct TrainArgs {
    /// A YAML experiment config (see configs/); flags override its keys.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Continue a run directory from its newest checkpoint (its config.yaml is used).
    #[arg(long)]
    #[serde(skip)]
    pub resume: Option<PathBuf>,
    /// One reward plugin (.wasm path or a name in --plugin-dir), instead of `reward:` in YAML.
    #[arg(long)]
    #[serde(skip)]
    pub reward_plugin: Option<String>,
    /// JSON parameters for --reward-plugin, e.g. '{"max_count": 5}'.
    #[arg(long, requires = "reward_plugin")]
    #[serde(skip)]
    pub reward_params: Option<String>,
    /// A reward-hack detector plugin (.wasm path or a detector name), instead of `rh_detector:`.
    #[arg(long)]
    #[serde(skip)]
    pub rh_detector: Option<String>,
    /// JSON parameters for --rh-detector.
    #[arg(long, requires = "rh_detector")]
    #[serde(skip)]
    pub rh_detector_params: Option<String>,
    /// Any config key as key=value (repeatable), for keys without a flag.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    #[serde(skip)]
    pub set: Vec<String>,
    /// With --resume: continue even if a plugin file's bytes differ from those the run started
    /// with (the new hashes are recorded in config.yaml and the change in train.log).
    #[arg(long, requires = "resume")]
    #[serde(skip)]
    pub accept_changed_plugins: bool,
    /// Stop after this many steps in this invocation (the run can be resumed).
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub stop_after: Option<usize>,

    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub model: Option<String>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub revision: Option<String>,
    /// One prompt per line.
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub prompts: Option<PathBuf>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub eval_prompts: Option<PathBuf>,
    /// full, lora or dual-lora.
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub adapter: Option<String>,
    /// DualLoRA preset: r1 r2 r4 r8 r16 r32 r1h r32f16 r32f4 r32f1.
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub lora_preset: Option<String>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub retain_rank: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub forget_rank: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub lora_rank: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub lora_alpha: Option<f64>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub lr: Option<f64>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub beta: Option<f64>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub epsilon: Option<f64>,
    /// grpo, dr_grpo, dapo or bnpo.
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub loss_type: Option<String>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub num_iterations: Option<usize>,
    /// Completions per optimizer step.
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub batch_size: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub num_generations: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub max_completion_length: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub temperature: Option<f64>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub max_steps: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub seed: Option<u64>,
    /// none, classic or exclusive.
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub routing_mode: Option<String>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub ablated_frac: Option<f64>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub false_positive_rate: Option<f64>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub recall: Option<f64>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub rh_eligible_frac: Option<f64>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub logging_steps: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub save_steps: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub eval_every: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub eval_samples: Option<usize>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub output_dir: Option<PathBuf>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub plugin_dir: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub plugin_limits: super::plugin::PluginLimitArgs,
    /// Write each step's batch tensors (ids, masks, rewards, advantages, log-probs, loss) here.
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub dump_batches: Option<PathBuf>,
    /// TensorBoard event files in the run directory (on by default; `--tensorboard false`).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensorboard: Option<bool>,
    /// Every completion with its rewards, detector flags and advantage in completions.jsonl.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_completions: Option<bool>,
    /// Experiment name (first part of the run directory name).
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub name: Option<String>,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub device: Option<String>,
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub dtype: Option<String>,
    /// libtorch intra-op threads (default: one per core).
    #[arg(long)] #[serde(skip_serializing_if = "Option::is_none")] pub threads: Option<usize>,
}

impl TrainArgs {
    /// The flags given, as config keys (`--set` last, so it wins).
    pub fn overrides(&self) -> Result<Map<String, Value>> {
        let Value::Object(mut map) = serde_json::to_value(self)? else { unreachable!("a struct serializes to an object") };
        if let Some(plugin) = &self.reward_plugin {
            let named = self.name.is_some() || self.config.is_some();
            map.extend(reward_plugin_overrides(plugin, self.reward_params.as_deref(), named)?);
        }
        if let Some(plugin) = &self.rh_detector {
            map.insert("rh_detector".into(), serde_json::to_value(DetectorSpec::single(plugin, self.rh_detector_params.as_deref())?)?);
        }
        for text in &self.set {
            let (key, value) = parse_override(text)?;
            map.insert(key, value);
        }
        Ok(map)
    }
}

/// `--reward-plugin` as config keys: `reward`, and `name` (the plugin's file stem) unless the
/// experiment is already named by `--name` or a config file. Shared with `smallrl sweep`.
pub fn reward_plugin_overrides(plugin: &str, params_json: Option<&str>, named: bool) -> Result<Map<String, Value>> {
    let mut map = Map::new();
    map.insert("reward".into(), serde_json::to_value(RewardSpec::single(plugin, params_json)?)?);
    if !named {
        let stem = std::path::Path::new(plugin).file_stem().map(|s| s.to_string_lossy().into_owned());
        map.insert("name".into(), stem.into());
    }
    Ok(map)
}

/// Options that may differ when a run is resumed (they do not change what it computes, except
/// that another thread count changes float summation order, which the log records).
const RESUME_MAY_CHANGE: &[&str] = &[
    "threads", "device", "dump_batches", "plugin_fuel_per_sample", "plugin_max_call_seconds", "plugin_max_memory_mb",
    "tensorboard", "log_completions",
];

pub fn run(args: TrainArgs) -> Result<()> {
    let overrides = args.overrides()?;
    let (config, resume) = match &args.resume {
        Some(run_dir) => {
            let changing: Vec<&String> = overrides.keys().filter(|k| !RESUME_MAY_CHANGE.contains(&k.as_str())).collect();
            anyhow::ensure!(changing.is_empty(), "--resume continues a run exactly as configured; these options would change it: {changing:?}");
            let saved = run_dir.join("config.yaml");
            anyhow::ensure!(
                saved.exists(),
                "{} has no config.yaml: it is not a smallrl run directory, or its run failed before it started \
                 (then run the original `smallrl train` command again: it starts the run afresh)",
                run_dir.display()
            );
            (TrainConfig::resolve(Some(&saved), overrides)?, Some(run_dir.as_path()))
        }
        None => (TrainConfig::resolve(args.config.as_deref(), overrides)?, None),
    };
    let mut trainer = Trainer::start(config, resume, args.accept_changed_plugins)?;
    let summary = trainer.train(args.stop_after)?;
    println!("run directory: {} ({} steps)", summary.run_dir.display(), summary.steps);
    Ok(())
}
