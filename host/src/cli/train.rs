//! `smallrl train`: GRPO on a model with a reward plugin. Precedence: defaults < `--config`
//! YAML < flags < `--set`. Every hyperparameter flag is the snake_case config key in kebab-case
//! (declared once, in `train/config/`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{Map, Value};

use crate::plugins::PluginKind;
use crate::reward::{DetectorSpec, is_path};
use crate::hyperparams::{Hyperparameters, Prop};
use crate::train::config::{TrainFlags, parse_override, reward_plugin_overrides};
use crate::train::packed::{self, PackedRun};
use crate::train::{TrainConfig, Trainer, checkpoint};

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// A YAML experiment config (see configs/); flags override its keys.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Continue a run directory from its newest checkpoint (its config.yaml is used).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// One reward plugin (.wasm path or a name in --plugin-dir), instead of `reward:` in YAML.
    #[arg(long)]
    pub reward_plugin: Option<String>,
    /// JSON parameters for --reward-plugin, e.g. '{"max_count": 5}'.
    #[arg(long, requires = "reward_plugin")]
    pub reward_params: Option<String>,
    /// A reward-hack detector plugin (.wasm path or a detector name), instead of `rh_detector:`.
    #[arg(long)]
    pub rh_detector: Option<String>,
    /// JSON parameters for --rh-detector.
    #[arg(long, requires = "rh_detector")]
    pub rh_detector_params: Option<String>,
    /// Any config key as key=value (repeatable), for keys without a flag.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// With --resume: continue even if a plugin file's bytes differ from those the run started
    /// with (the new hashes are recorded in config.yaml and the change in train.log).
    #[arg(long, requires = "resume")]
    pub accept_changed_plugins: bool,
    /// With --resume and a larger --max-steps: continue the run to the new max_steps. The
    /// linear LR schedule's horizon sets the rate of every step, so the steps already taken
    /// keep the horizon they were trained with (recorded as `lr_horizons` in config.yaml) and
    /// the rest follow the schedule over the new max_steps: the rate jumps up where the run
    /// continues. Without this flag a different --max-steps is refused.
    #[arg(long, requires = "resume")]
    pub extend_schedule: bool,
    /// Packed runs: a new run's YAML config (repeatable, with --pack-resume). The runs train in
    /// this process in lockstep, each exactly as `smallrl train --config YAML` would; they must
    /// share their architecture and shapes (docs/src/sweeps.md, "Packed runs"). `smallrl sweep --pack N`
    /// starts these.
    #[arg(long, value_name = "YAML", conflicts_with_all = ["config", "resume"])]
    pub pack_config: Vec<PathBuf>,
    /// Packed runs: a run directory to resume, as `smallrl train --resume DIR` (repeatable).
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["config", "resume"])]
    pub pack_resume: Vec<PathBuf>,
    /// Packed runs: threads that step the runs at once, each a fixed share of them (1: one after
    /// another). What a run computes does not depend on it. On the CPU give each run
    /// `--threads` cores / N.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub pack_workers: usize,
    /// Stop after this many steps in this invocation (the run can be resumed).
    #[arg(long, hide = true)]
    pub stop_after: Option<usize>,
    /// After the run: copy it into this wandb project (`smallrl wandb-sync`; docs/src/outputs.md, "Weights &
    /// Biases"). A failed sync is reported and leaves the run as it is; redo it with wandb-sync.
    #[arg(long, value_name = "PROJECT")]
    pub wandb: Option<String>,
    /// With --wandb: the wandb entity (user or team).
    #[arg(long, value_name = "ENTITY", requires = "wandb")]
    pub wandb_entity: Option<String>,
    /// With --wandb: the wandb group.
    #[arg(long, value_name = "GROUP", requires = "wandb")]
    pub wandb_group: Option<String>,
    /// With --wandb: wandb's mode [default: $WANDB_MODE, else online].
    #[arg(long, value_name = "MODE", requires = "wandb", value_parser = ["online", "offline", "disabled"])]
    pub wandb_mode: Option<String>,
    #[command(flatten)]
    pub flags: TrainFlags,
}

impl TrainArgs {
    /// The flags given, as config keys (`--set` last, so it wins).
    pub fn overrides(&self) -> Result<Map<String, Value>> {
        let mut map = self.flags.to_map()?;
        if let Some(plugin) = &self.reward_plugin {
            let named = self.flags.name.is_some() || self.config.is_some();
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

pub fn run(args: TrainArgs) -> Result<()> {
    let overrides = args.overrides()?;
    if !args.pack_config.is_empty() || !args.pack_resume.is_empty() {
        return run_packed(&args, overrides);
    }
    anyhow::ensure!(args.pack_workers == 1, "--pack-workers steps packed runs: it needs --pack-config or --pack-resume");
    let (config, resume) = match &args.resume {
        Some(run_dir) => (resumed_config(run_dir, overrides, args.extend_schedule)?, Some(run_dir.as_path())),
        None => (TrainConfig::resolve(args.config.as_deref(), named_by_plugins(&args, overrides)?)?, None),
    };
    let mut trainer = Trainer::start(config, resume, args.accept_changed_plugins)?;
    let summary = trainer.train(args.stop_after)?;
    println!("run directory: {} ({} steps)", summary.run_dir.display(), summary.steps);
    sync_to_wandb(&args, &summary.run_dir);
    Ok(())
}

/// A new run's name from what its plugins declare (issue 47), unless `--name` (or `--set
/// name=`) gives one: without a config file, an environment's run is named by the
/// environment's declared name (not `run`), and `--reward-plugin PATH`'s by the reward's (a TRL
/// function's name, as `plugin info` shows it, not the file stem); with a config file, a reward
/// or detector given by a path appears in the name by its declared name, not its path. A
/// plugin given by a standard name keeps that name (the names sweeps find existing runs by);
/// resumed runs keep their directories' names.
fn named_by_plugins(args: &TrainArgs, mut overrides: Map<String, Value>) -> Result<Map<String, Value>> {
    if args.flags.name.is_some() || args.set.iter().any(|text| text.trim_start().starts_with("name=")) {
        return Ok(overrides);
    }
    if args.config.is_some() {
        return crate::train::task::named_by_declared_specs(args.config.as_deref(), overrides);
    }
    let config = TrainConfig::resolve(None, overrides.clone())?;
    let declared = |value: &str, kind: PluginKind, params: Option<&Value>| crate::train::task::declared_name(value, kind, params, &config);
    if let Some(environment) = &config.environment {
        overrides.insert("name".into(), declared(environment, PluginKind::Environment, config.environment_params.as_ref())?.into());
    } else if let Some(plugin) = args.reward_plugin.as_deref().filter(|plugin| is_path(plugin)) {
        let params = overrides.get("reward").and_then(|reward| reward.get("params")).cloned();
        overrides.insert("name".into(), declared(plugin, PluginKind::Reward, params.as_ref())?.into());
    }
    Ok(overrides)
}

/// `--wandb PROJECT`: the finished run into wandb. A failure is reported once and does not fail
/// the command: the run is complete, and `smallrl wandb-sync` redoes the sync.
fn sync_to_wandb(args: &TrainArgs, run_dir: &Path) {
    let Some(project) = &args.wandb else { return };
    let options = crate::wandb::SyncOptions {
        project: Some(project.clone()),
        entity: args.wandb_entity.clone(),
        group: args.wandb_group.clone(),
        mode: args.wandb_mode.clone(),
    };
    if let Err(error) = crate::wandb::sync(run_dir, &options) {
        eprintln!("warning: the run finished, but its wandb sync failed: {error:#}\n  redo it with: smallrl wandb-sync {} --project {project}", run_dir.display());
    }
}

/// The keys of `overrides` that would change what a run computes (not marked `Resume` in the
/// hyperparameter table).
fn changing_keys(overrides: &Map<String, Value>) -> Vec<&String> {
    overrides.keys().filter(|k| TrainConfig::key(k).is_none_or(|key| !key.has(Prop::Resume))).collect()
}

/// `--pack-config` / `--pack-resume`: the runs of one pack, each reported; an error if any
/// failed (the others have finished).
fn run_packed(args: &TrainArgs, overrides: Map<String, Value>) -> Result<()> {
    let changing = changing_keys(&overrides);
    anyhow::ensure!(
        changing.is_empty(),
        "packed runs take their configuration from each --pack-config file or --pack-resume directory; \
         only options that do not change what a run computes ({:?}) apply to all of them, not {changing:?}",
        TrainConfig::keys_with(Prop::Resume)
    );
    let mut runs = Vec::new();
    for path in &args.pack_config {
        runs.push(PackedRun { config: TrainConfig::resolve(Some(path), overrides.clone())?, resume: None });
    }
    for dir in &args.pack_resume {
        runs.push(PackedRun { config: resumed_config(dir, overrides.clone(), false)?, resume: Some(dir.clone()) });
    }
    let total = runs.len();
    let options = packed::PackOptions { workers: args.pack_workers, ..Default::default() };
    let outcomes = packed::train_packed_with(runs, args.stop_after, options)?;
    let mut failed = 0;
    for outcome in outcomes {
        match outcome {
            Ok(summary) => {
                println!("run directory: {} ({} steps)", summary.run_dir.display(), summary.steps);
                sync_to_wandb(args, &summary.run_dir);
            }
            Err(error) => {
                failed += 1;
                println!("a packed run failed: {error:#}");
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} of {total} packed runs failed (the others finished); each failed run's train.log says why");
    Ok(())
}

/// The configuration a resumed run continues with: its saved one, with only the keys that do
/// not change what it computes overridden, or extended to a larger `--max-steps` with
/// `--extend-schedule`.
fn resumed_config(run_dir: &Path, mut overrides: Map<String, Value>, extend_schedule: bool) -> Result<TrainConfig> {
    let max_steps = overrides.remove("max_steps").map(|v| v.as_u64().map(|n| n as usize).with_context(|| format!("--max-steps {v} is not a step count"))).transpose()?;
    let changing = changing_keys(&overrides);
    anyhow::ensure!(changing.is_empty(), "--resume continues a run exactly as configured; these options would change it: {changing:?}");
    let saved = run_dir.join("config.yaml");
    anyhow::ensure!(
        saved.exists(),
        "{} has no config.yaml: it is not a smallrl run directory, or its run failed before it started \
         (then run the original `smallrl train` command again: it starts the run afresh)",
        run_dir.display()
    );
    let config = TrainConfig::resolve_saved(&saved, overrides)?;
    let Some(n) = max_steps.filter(|&n| n != config.max_steps) else {
        anyhow::ensure!(!extend_schedule, "--extend-schedule needs --max-steps N larger than the run's max_steps ({})", config.max_steps);
        return Ok(config);
    };
    anyhow::ensure!(
        extend_schedule,
        "--max-steps {n} differs from the run's max_steps {}: the linear LR schedule decays to 0 at max_steps, so every step \
         already taken had its rate set by {} steps. Add --extend-schedule to continue to step {n} anyway (the steps taken keep \
         their rates, recorded in config.yaml as lr_horizons; the rest follow the {n}-step schedule, so the rate jumps up where the \
         run continues), or start a new run with --max-steps {n}",
        config.max_steps,
        config.max_steps
    );
    let checkpoint = checkpoint::latest(run_dir).context("--extend-schedule continues from a checkpoint")?;
    config.extended(n, checkpoint::read_state(&checkpoint)?.step)
}
