//! The training configuration: defaults (from [`crate::defaults`]) < YAML file < command line.
//! The resolved configuration is written into the run directory, and the run directory's name
//! lists every hyperparameter that differs from its default, plus the seed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::adapters::{self, AdapterConfig};
use crate::defaults as d;
use crate::grpo::LossType;
use crate::reward::{DetectorSpec, PluginLimits, ProtocolKnobs, RewardSpec};
use crate::routing::RoutingMode;

/// Every hyperparameter of a run, with snake_case names shared by YAML, `--grid`/`--fixed`
/// of sweeps and (in kebab-case) the command line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub model: String,
    pub revision: String,
    /// One prompt per line; without it prompts come from the SimpleStories dataset's train split.
    pub prompts: Option<PathBuf>,
    pub eval_prompts: Option<PathBuf>,
    pub prompt_length: usize,
    pub num_prompts: usize,

    pub adapter: String,
    /// A DualLoRA preset (r1 ... r32, r1h, r32f16, r32f4, r32f1); overrides the ranks below.
    pub lora_preset: Option<String>,
    pub retain_rank: usize,
    pub forget_rank: usize,
    pub lora_rank: usize,
    pub lora_alpha: f64,
    pub layer_stride: usize,

    pub lr: f64,
    pub beta: f64,
    pub epsilon: f64,
    pub loss_type: String,
    pub num_iterations: usize,
    pub batch_size: usize,
    pub num_generations: usize,
    pub max_completion_length: usize,
    pub temperature: f64,
    pub max_steps: usize,
    pub seed: u64,
    pub max_grad_norm: f64,
    pub weight_decay: f64,
    pub adam_beta1: f64,
    pub adam_beta2: f64,
    pub adam_epsilon: f64,

    pub routing_mode: String,
    pub ablated_frac: f64,
    pub false_positive_rate: f64,
    pub recall: f64,
    pub rh_eligible_frac: f64,

    pub reward: Option<RewardSpec>,
    pub rh_detector: Option<DetectorSpec>,
    pub plugin_dir: PathBuf,
    /// Fuel (about one unit per WebAssembly instruction) a plugin call may use per sample: the
    /// deterministic bound on a plugin's work.
    pub plugin_fuel_per_sample: u64,
    /// Wall-clock seconds a plugin call may run: the backstop behind fuel.
    pub plugin_max_call_seconds: f64,
    /// Largest memory a plugin may have, in MiB (its initial memory included).
    pub plugin_max_memory_mb: usize,
    /// SHA-256 of every plugin file the run loaded (path as resolved -> hex), recorded when
    /// the run starts; `--resume` refuses plugins whose bytes changed.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub plugin_sha256: BTreeMap<String, String>,

    pub logging_steps: usize,
    pub save_steps: usize,
    pub eval_every: usize,
    pub eval_samples: usize,
    pub output_dir: PathBuf,
    /// Write every step's tensors (ids, masks, rewards, advantages, log-probs, loss) here.
    pub dump_batches: Option<PathBuf>,
    /// TensorBoard event files in the run directory (`train/live.rs`).
    pub tensorboard: bool,
    /// Every completion with its rewards, detector flags and advantage in `completions.jsonl`.
    pub log_completions: bool,
    /// The experiment's name, first part of the run directory name (default: the config file's
    /// stem, or the reward plugin's name).
    pub name: Option<String>,

    pub device: String,
    pub dtype: String,
    pub threads: Option<usize>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            model: d::MODEL.into(),
            revision: d::REVISION.into(),
            prompts: None,
            eval_prompts: None,
            prompt_length: d::PROMPT_LENGTH,
            num_prompts: d::NUM_PROMPTS,
            adapter: d::ADAPTER.into(),
            lora_preset: None,
            retain_rank: d::RETAIN_RANK,
            forget_rank: d::FORGET_RANK,
            lora_rank: d::LORA_RANK,
            lora_alpha: d::LORA_ALPHA,
            layer_stride: d::LAYER_STRIDE,
            lr: d::LEARNING_RATE,
            beta: d::BETA,
            epsilon: d::EPSILON,
            loss_type: d::LOSS_TYPE.into(),
            num_iterations: d::NUM_ITERATIONS,
            batch_size: d::BATCH_SIZE,
            num_generations: d::NUM_GENERATIONS,
            max_completion_length: d::MAX_COMPLETION_LENGTH,
            temperature: d::TEMPERATURE,
            max_steps: d::MAX_STEPS,
            seed: d::SEED,
            max_grad_norm: d::MAX_GRAD_NORM,
            weight_decay: d::WEIGHT_DECAY,
            adam_beta1: d::ADAM_BETA1,
            adam_beta2: d::ADAM_BETA2,
            adam_epsilon: d::ADAM_EPSILON,
            routing_mode: d::ROUTING_MODE.into(),
            ablated_frac: d::ABLATED_FRAC,
            false_positive_rate: d::FALSE_POSITIVE_RATE,
            recall: d::RECALL,
            rh_eligible_frac: d::RH_ELIGIBLE_FRAC,
            reward: None,
            rh_detector: None,
            plugin_dir: d::PLUGIN_DIR.into(),
            plugin_fuel_per_sample: d::PLUGIN_FUEL_PER_SAMPLE,
            plugin_max_call_seconds: d::PLUGIN_MAX_CALL_SECONDS,
            plugin_max_memory_mb: d::PLUGIN_MAX_MEMORY_MB,
            plugin_sha256: BTreeMap::new(),
            logging_steps: d::LOGGING_STEPS,
            save_steps: d::SAVE_STEPS,
            eval_every: d::EVAL_EVERY,
            eval_samples: d::EVAL_SAMPLES,
            output_dir: d::OUTPUT_DIR.into(),
            dump_batches: None,
            tensorboard: d::TENSORBOARD,
            log_completions: d::LOG_COMPLETIONS,
            name: None,
            device: d::DEVICE.into(),
            dtype: d::DTYPE.into(),
            threads: None,
        }
    }
}

/// Keys that change where or how fast a run executes, or what it logs, not what it computes:
/// left out of run names. (`threads` does change float summation order; it is recorded in the
/// saved config.)
const NOT_IN_RUN_NAME: &[&str] = &[
    "model", "revision", "prompts", "eval_prompts", "reward", "rh_detector", "plugin_dir",
    "plugin_fuel_per_sample", "plugin_max_call_seconds", "plugin_max_memory_mb", "plugin_sha256",
    "logging_steps", "save_steps", "eval_every", "eval_samples", "output_dir", "dump_batches", "name", "device",
    "tensorboard", "log_completions",
    "threads", "seed",
];

/// The first part of the run name of a configuration without `name`.
pub const UNNAMED_RUN: &str = "run";

/// Short names used in run directory names.
fn short_name(key: &str) -> &str {
    match key {
        "batch_size" => "bs",
        "num_generations" => "g",
        "max_steps" => "steps",
        "max_completion_length" => "len",
        "num_iterations" => "iters",
        "temperature" => "temp",
        "routing_mode" => "",
        "lora_preset" => "",
        "adapter" => "",
        "loss_type" => "",
        "false_positive_rate" => "fpr",
        "rh_eligible_frac" => "elig",
        "ablated_frac" => "abl",
        other => other,
    }
}

impl TrainConfig {
    /// Layers a YAML file's keys (if any) and then explicit overrides over the defaults.
    pub fn resolve(file: Option<&Path>, overrides: Map<String, Value>) -> Result<Self> {
        let mut merged = Map::new();
        if let Some(path) = file {
            let yaml: Value = crate::yaml::read_file(path)?;
            match yaml {
                Value::Object(map) => merged.extend(map),
                Value::Null => {}
                _ => bail!("{}: a training config must be a mapping of keys to values", path.display()),
            }
            if !merged.contains_key("name") {
                let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
                merged.insert("name".into(), stem.into());
            }
        }
        if file.is_some() && !overrides.contains_key("name") {
            let changed = changed_specs(&merged, &overrides);
            if let (Some(Value::String(name)), false) = (merged.get("name"), changed.is_empty()) {
                let renamed = format!("{name}_{changed}");
                merged.insert("name".into(), renamed.into());
            }
        }
        merged.extend(overrides);
        let config: Self = serde_json::from_value(Value::Object(merged)).map_err(|e| {
            let source = file.map_or("the command line".to_string(), |p| p.display().to_string());
            anyhow::anyhow!("invalid training configuration ({source}): {e}")
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Rejects inconsistent settings before any work starts.
    pub fn validate(&self) -> Result<()> {
        let adapters = self.adapter_config()?;
        crate::device::parse_dtype(&self.dtype)?;
        LossType::parse(&self.loss_type)?;
        let routing = RoutingMode::parse(&self.routing_mode)?;
        ensure!(self.reward.is_some(), "no reward: set `reward:` in the config or pass --reward-plugin");
        ensure!(self.batch_size > 0 && self.num_generations > 1, "batch_size must be positive and num_generations at least 2");
        ensure!(
            self.batch_size % self.num_generations == 0,
            "batch_size ({}) counts completions and must be a multiple of num_generations ({})",
            self.batch_size,
            self.num_generations
        );
        ensure!(self.max_steps > 0, "max_steps must be positive");
        ensure!(self.num_iterations >= 1, "num_iterations must be at least 1");
        ensure!(
            self.save_steps % self.num_iterations == 0,
            "save_steps ({}) must be a multiple of num_iterations ({}) so a checkpoint never splits a reused batch",
            self.save_steps,
            self.num_iterations
        );
        ensure!(self.temperature > 0.0, "temperature must be positive for GRPO sampling");
        ensure!(self.lr > 0.0 && self.beta >= 0.0 && self.epsilon > 0.0, "lr must be positive, beta >= 0, epsilon > 0");
        ensure!(self.logging_steps > 0 && self.save_steps > 0 && self.eval_every > 0, "logging_steps, save_steps and eval_every must be positive");
        ensure!((0.0..=1.0).contains(&self.ablated_frac), "ablated_frac must be in [0, 1], got {}", self.ablated_frac);
        self.knobs().check()?;
        self.plugin_limits()?;
        if routing != RoutingMode::None {
            ensure!(adapters.is_dual(), "routing_mode {} needs adapter: dual-lora (got {})", self.routing_mode, self.adapter);
            ensure!(self.rh_detector.is_some(), "routing_mode {} needs an rh_detector to label samples", self.routing_mode);
        }
        if self.ablated_frac > 0.0 {
            ensure!(routing != RoutingMode::None, "ablated_frac needs a routing_mode other than none");
        }
        Ok(())
    }

    pub fn adapter_config(&self) -> Result<AdapterConfig> {
        let ranks = adapters::Ranks { lora_rank: self.lora_rank, retain_rank: self.retain_rank, forget_rank: self.forget_rank, lora_alpha: self.lora_alpha, layer_stride: self.layer_stride };
        adapters::config_from(&self.adapter, self.lora_preset.as_deref(), &ranks)
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
        let here = serde_json::to_value(self)?;
        let defaults = serde_json::to_value(Self::default())?;
        let (Value::Object(here), Value::Object(defaults)) = (here, defaults) else { unreachable!("structs serialize to objects") };
        let mut parts = vec![self.name.clone().unwrap_or_else(|| UNNAMED_RUN.into())];
        for (key, value) in &here {
            if NOT_IN_RUN_NAME.contains(&key.as_str()) || defaults.get(key) == Some(value) {
                continue;
            }
            parts.push(format!("{}{}", short_name(key), compact(value)));
        }
        parts.push(format!("s{}", self.seed));
        Ok(parts.join("_").replace(['/', ' '], "-"))
    }
}

/// The config file's name stands for its reward and detector, so a run that overrides either
/// (flags, `--set`, a sweep's grid) says so in its name: `rew<label>` / `det<label>` for each one
/// that differs from the file's; empty when neither does.
fn changed_specs(from_file: &Map<String, Value>, overrides: &Map<String, Value>) -> String {
    let mut parts = Vec::new();
    for (key, short) in [("reward", "rew"), ("rh_detector", "det")] {
        if let Some(value) = overrides.get(key).filter(|v| from_file.get(key) != Some(*v)) {
            parts.push(format!("{short}-{}", spec_label(value)));
        }
    }
    parts.join("_")
}

/// Plugin names and parameter values of a reward or detector spec, joined by `-`
/// (`happy_count-threshold1`); `none` for null.
fn spec_label(value: &Value) -> String {
    fn walk(value: &Value, key: Option<&str>, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                // Which plugin first, then its parameters (maps iterate alphabetically).
                let (names, rest): (Vec<_>, Vec<_>) = map.iter().partition(|(k, _)| matches!(k.as_str(), "plugin" | "name"));
                names.into_iter().chain(rest).for_each(|(k, v)| walk(v, Some(k), out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, None, out)),
            Value::Null => out.push("none".into()),
            leaf => match key {
                Some("plugin" | "name" | "role") | None => out.push(compact(leaf)),
                Some(k) => out.push(format!("{k}{}", compact(leaf))),
            },
        }
    }
    let mut out = Vec::new();
    walk(value, None, &mut out);
    out.join("-")
}

/// A value as it appears in a run name: `3e-4` rather than `0.0003`.
fn compact(value: &Value) -> String {
    match value {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().expect("f64 numbers convert");
            if x != 0.0 && (x.abs() < 1e-2 || x.abs() >= 1e5) {
                let s = format!("{x:e}");
                s.replace("e-0", "e-")
            } else {
                format!("{x}")
            }
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Parses `key=value` overrides (sweeps' `--grid`/`--fixed`, the CLI's `--set`): the value is
/// read as YAML, so numbers, booleans and strings all work.
pub fn parse_override(text: &str) -> Result<(String, Value)> {
    let (key, value) = text.split_once('=').with_context(|| format!("override {text:?} is not key=value"))?;
    let value: Value = crate::yaml::from_str(value).with_context(|| format!("override {text:?}: bad value"))?;
    Ok((key.trim().replace('-', "_"), value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_file() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/sentence_length_10_smooth_with_happy.yaml")
    }

    fn resolved(overrides: &[(&str, &str)]) -> TrainConfig {
        let overrides = overrides.iter().map(|(k, v)| (k.to_string(), crate::yaml::from_str(v).unwrap())).collect();
        TrainConfig::resolve(Some(&config_file()), overrides).unwrap()
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
}
