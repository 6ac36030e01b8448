//! Sweep planning: `--grid`/`--fixed` into resolved training configurations, one per run
//! directory, plus the automatic non-routed baselines, and what is already on disk (cache).
//! Pure apart from reading run directories; nothing here starts a run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Map, Value};

use crate::hyperparams::{self, UNNAMED_RUN, parse_override};
use crate::intervention::Intervention;
use crate::routing::RoutingMode;
use crate::train::TrainConfig;
use crate::runlog::Jsonl;

/// Keys the sweep itself sets for every run: `--output-dir` and `--jobs` choose them.
const SWEEP_OWNED_KEYS: &[&str] = &["output_dir", "threads"];

/// What to sweep: base configurations (YAML files and fixed keys) and the grid over each.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    /// `--config` files, the outermost factor of the grid (each with every grid point and
    /// arm); empty: no file, every key from the defaults, `fixed` and the grid.
    pub config_files: Vec<PathBuf>,
    /// Keys every run shares (`--fixed`, `--reward-plugin`, ...), as config keys.
    pub fixed: Map<String, Value>,
    /// `--grid` keys in the order given, each with its values.
    pub grid: Vec<(String, Vec<Value>)>,
    pub output_dir: PathBuf,
    /// Each grid point (a routed configuration) becomes these intervention arms
    /// ([`intervention_arms`]); empty: the grid point as it is.
    pub intervention_arms: Vec<Arm>,
}

/// An intervention arm of `--intervention-arms` (docs/src/training.md, "Controls"): how a
/// routed grid point's monitor flags are used. Every intervention is an arm, made as its own
/// declaration says ([`Intervention::arm`]), so a new intervention needs no line here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arm {
    /// No routing and no control: the non-routed baseline.
    None,
    /// An intervention's arm; `routing` is the grid point as given (`routing_mode` classic or
    /// exclusive).
    Intervention(Intervention),
    /// No routing; training prompts start with `inoculation_prompt`, which invites the hack
    /// (evaluation prompts do not). Planned only when named.
    Inoculation,
}

/// The number of interventions, each an arm.
const INTERVENTIONS: usize = Intervention::ALL.len();

impl Arm {
    /// The arms bare `--intervention-arms` plans, in the order a sweep plans them: none, then
    /// every intervention in the order it declares them.
    pub const ALL: [Arm; INTERVENTIONS + 1] = {
        let mut arms = [Arm::None; INTERVENTIONS + 1];
        let mut i = 0;
        while i < INTERVENTIONS {
            arms[i + 1] = Arm::Intervention(Intervention::ALL[i]);
            i += 1;
        }
        arms
    };
    /// Every arm a sweep can plan: [`Arm::ALL`] and inoculation (environment runs only).
    pub const NAMED: [Arm; INTERVENTIONS + 2] = {
        let mut arms = [Arm::Inoculation; INTERVENTIONS + 2];
        let mut i = 0;
        while i < INTERVENTIONS + 1 {
            arms[i] = Arm::ALL[i];
            i += 1;
        }
        arms
    };

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Intervention(intervention) => intervention.as_str(),
            Self::Inoculation => "inoculation",
        }
    }

    /// The arm's place in [`Arm::NAMED`], the order arms are planned, listed and sorted in.
    fn rank(self) -> usize {
        Self::NAMED.iter().position(|&arm| arm == self).expect("every arm is named")
    }

    /// `--intervention-arms`'s value: a comma list of arm names (in [`Arm::ALL`]'s order,
    /// each once); none given: every arm.
    pub fn parse_list(text: Option<&str>) -> Result<Vec<Arm>> {
        let Some(text) = text else { return Ok(Self::ALL.to_vec()) };
        let valid = || Self::NAMED.map(Self::name).join(", ");
        let mut arms = Vec::new();
        for word in text.split(',').map(str::trim) {
            let arm = Self::NAMED.into_iter().find(|a| a.name() == word).with_context(|| format!("--intervention-arms {text:?}: unknown arm {word:?}; the arms are {} (comma-separated; the flag alone plans all)", valid()))?;
            ensure!(!arms.contains(&arm), "--intervention-arms {text:?}: {word} is listed twice");
            arms.push(arm);
        }
        arms.sort();
        Ok(arms)
    }

    /// The arm a run's configuration belongs to (its saved `config.yaml` read back).
    pub fn of(config: &TrainConfig) -> Arm {
        match config.intervention {
            Intervention::Routing if config.routing_mode == RoutingMode::None && config.inoculation => Self::Inoculation,
            Intervention::Routing if config.routing_mode == RoutingMode::None => Self::None,
            intervention => Self::Intervention(intervention),
        }
    }
}

impl Ord for Arm {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl PartialOrd for Arm {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunRole {
    /// A point of the grid.
    Grid,
    /// The non-routed baseline of a routed run (derived, or a grid point that is one).
    Baseline,
}

impl RunRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grid => "run",
            Self::Baseline => "baseline",
        }
    }
}

/// A run directory's state before the sweep starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    /// No directory: the run starts from scratch.
    New,
    /// Finished with the same configuration: reused, not re-run.
    Finished,
    /// Interrupted after a checkpoint: resumed from it (`train --resume`).
    Resumable,
    /// Interrupted before any checkpoint: moved aside and started again.
    Stale,
}

#[derive(Debug, Clone)]
pub struct PlannedRun {
    pub name: String,
    pub config: TrainConfig,
    pub role: RunRole,
    /// The run directory name of this run's baseline (routed runs only).
    pub baseline: Option<String>,
    pub state: CacheState,
}

impl PlannedRun {
    pub fn dir(&self, output_dir: &Path) -> PathBuf {
        output_dir.join(&self.name)
    }
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub output_dir: PathBuf,
    pub runs: Vec<PlannedRun>,
}

/// Parses `--grid key=v1,v2,...`; each value is read as YAML like `--set` values. Values are
/// split at every comma, so a value containing one (a YAML mapping) belongs in `--fixed`.
pub fn parse_grid(text: &str) -> Result<(String, Vec<Value>)> {
    let (key, values) = text.split_once('=').with_context(|| format!("--grid {text:?} is not key=v1,v2,..."))?;
    let parsed = values.split(',').map(|v| parse_override(&format!("{key}={v}")).map(|(_, value)| value)).collect::<Result<Vec<_>>>()?;
    let key = key.trim().replace('-', "_");
    check_key(&key, &format!("--grid {text}"))?;
    ensure!(!parsed.is_empty() && values.split(',').all(|v| !v.trim().is_empty()), "--grid {text:?}: every value must be non-empty");
    Ok((key, parsed))
}

/// Parses `--fixed key=value`.
pub fn parse_fixed(text: &str) -> Result<(String, Value)> {
    let (key, value) = parse_override(text)?;
    check_key(&key, &format!("--fixed {text}"))?;
    Ok((key, value))
}

/// A typo in a key fails here, before any run starts, naming the flag and the valid keys.
fn check_key(key: &str, flag: &str) -> Result<()> {
    if SWEEP_OWNED_KEYS.contains(&key) {
        bail!("{flag}: `{key}` is set by the sweep for every run; use --output-dir or --jobs instead");
    }
    hyperparams::check_key::<TrainConfig>(key, flag)
}

/// The Cartesian product of the grid, the last key varying fastest; one empty point for an
/// empty grid.
pub fn expand(grid: &[(String, Vec<Value>)]) -> Vec<Map<String, Value>> {
    let mut points = vec![Map::new()];
    for (key, values) in grid {
        points = points
            .iter()
            .flat_map(|point| {
                values.iter().map(move |value| {
                    let mut next = point.clone();
                    next.insert(key.clone(), value.clone());
                    next
                })
            })
            .collect();
    }
    points
}

/// Resolves every grid point of every config file (defaults < YAML < fixed < grid point),
/// adds the baselines and reads the cache state of each run directory.
pub fn plan(spec: &SweepSpec) -> Result<Plan> {
    let mut runs: Vec<PlannedRun> = Vec::new();
    let files: Vec<Option<&Path>> = match spec.config_files.is_empty() {
        true => vec![None],
        false => spec.config_files.iter().map(|f| Some(f.as_path())).collect(),
    };
    for file in files {
        for point in expand(&spec.grid) {
            let configs = match spec.intervention_arms.is_empty() {
                false => arms_of_point(spec, file, &point)?,
                true => vec![resolve_point(spec, file, &point)?],
            };
            for config in configs {
                let baseline = baseline_of(&config)?.map(|b| b.run_name()).transpose()?;
                add_run(&mut runs, config, RunRole::Grid, baseline)?;
            }
        }
    }
    let baselines: Vec<TrainConfig> = runs.iter().map(|r| baseline_of(&r.config)).collect::<Result<Vec<_>>>()?.into_iter().flatten().collect();
    for config in baselines {
        add_run(&mut runs, config, RunRole::Baseline, None)?;
    }
    let referenced: Vec<Option<String>> = runs.iter().map(|r| r.baseline.clone()).collect();
    for run in &mut runs {
        run.role = role_of(&run.name, &referenced);
    }
    for run in &mut runs {
        run.state = cache_state(&run.dir(&spec.output_dir), &run.config)?;
    }
    Ok(Plan { output_dir: spec.output_dir.clone(), runs })
}

fn resolve_point(spec: &SweepSpec, file: Option<&Path>, point: &Map<String, Value>) -> Result<TrainConfig> {
    let mut overrides = spec.fixed.clone();
    overrides.extend(point.clone());
    overrides.insert("output_dir".into(), serde_json::to_value(&spec.output_dir)?);
    let described = Value::Object(point.clone());
    let of_file = file.map_or(String::new(), |f| format!(" of --config {}", f.display()));
    // A detector or reward the grid gives by a path is named by what it declares, as `smallrl
    // train` names it (issue 47): the per-run YAML pins the name.
    let overrides = crate::train::task::named_by_declared_specs(file, overrides).with_context(|| format!("sweep point {described}{of_file}"))?;
    let mut config = TrainConfig::resolve(file, overrides).with_context(|| format!("sweep point {described}{of_file}"))?;
    // Pinned so the per-run YAML the child reads resolves to the same name (a YAML file without
    // `name` would otherwise be named after its file stem).
    config.name.get_or_insert_with(|| UNNAMED_RUN.into());
    Ok(config)
}

/// The keys some intervention's arm alone may hold ([`crate::intervention::ArmShape::keys`]),
/// set aside from a grid point (or `--fixed`) while the routed point resolves.
fn arm_keys() -> impl Iterator<Item = &'static str> {
    Intervention::ALL.iter().flat_map(|intervention| intervention.arm().keys.iter().copied())
}

/// The arms of one grid point: the [`arm_keys`] are set aside while the routed point
/// resolves, then given to their arms.
fn arms_of_point(spec: &SweepSpec, file: Option<&Path>, point: &Map<String, Value>) -> Result<Vec<TrainConfig>> {
    let mut without = spec.clone();
    let mut point = point.clone();
    let mut set_aside = Map::new();
    for key in arm_keys() {
        if let Some(value) = point.remove(key).or_else(|| without.fixed.remove(key)) {
            serde_json::from_value::<TrainConfig>(serde_json::json!({ key: value })).with_context(|| format!("--intervention-arms: {key} {value} is not a valid value"))?;
            set_aside.insert(key.to_string(), value);
        }
    }
    let routed = resolve_point(&without, file, &point)?;
    intervention_arms(&routed, &set_aside, &spec.intervention_arms)
}

/// One routed configuration as the chosen intervention arms, the same otherwise: none (the
/// non-routed baseline), each intervention as its [`Intervention::arm`] says (from the routed
/// point or the point without routing, with or without the routed point's coherence rows, its
/// own keys from `set_aside` or the routed point), and inoculation (the baseline with
/// `inoculation` on). The none arm is also every other arm's baseline, so [`plan`] adds it
/// whether chosen or not.
pub fn intervention_arms(routed: &TrainConfig, set_aside: &Map<String, Value>, chosen: &[Arm]) -> Result<Vec<TrainConfig>> {
    ensure!(
        routed.routing_mode != RoutingMode::None && routed.intervention == Intervention::Routing,
        "--intervention-arms expands a routed configuration (routing_mode classic or exclusive, intervention routing); got routing_mode {}, intervention {}",
        routed.routing_mode,
        routed.intervention
    );
    let none = routed.without_routing();
    let mut arms = Vec::new();
    for arm in Arm::NAMED.into_iter().filter(|arm| chosen.contains(arm)) {
        let config = match arm {
            Arm::None => unrouted(routed),
            Arm::Intervention(intervention) => intervention_arm(routed, &none, intervention, set_aside)?,
            Arm::Inoculation => TrainConfig { inoculation: true, ..unrouted(routed) },
        };
        config.validate().with_context(|| format!("the {} arm of an --intervention-arms sweep is invalid", config.intervention))?;
        arms.push(config);
    }
    Ok(arms)
}

/// `intervention`'s arm of `routed` (`none`: `routed` without routing), as its
/// [`Intervention::arm`] says.
fn intervention_arm(routed: &TrainConfig, none: &TrainConfig, intervention: Intervention, set_aside: &Map<String, Value>) -> Result<TrainConfig> {
    let shape = intervention.arm();
    let base = if shape.routed { routed } else { none };
    let config = TrainConfig { intervention, ..base.clone() };
    let config = if shape.coherence { with_coherence_of(routed, config) } else { config };
    if shape.keys.is_empty() {
        return Ok(config);
    }
    let (mut values, of_routed) = (hyperparams::object(&config)?, hyperparams::object(routed)?);
    for &key in shape.keys {
        match set_aside.get(key).or_else(|| of_routed.get(key)) {
            Some(value) => values.insert(key.to_string(), value.clone()),
            None => values.remove(key),
        };
    }
    serde_json::from_value(Value::Object(values)).with_context(|| format!("--intervention-arms: the {intervention} arm's {}", shape.keys.join(", ")))
}

/// The non-routed baseline of `config`: no routing, no intervention, and the detector's
/// `recall` and `false_positive_rate` at their defaults, since nothing acts on its flags (so
/// the routed runs of a recall grid share one baseline instead of training copies of it).
fn unrouted(config: &TrainConfig) -> TrainConfig {
    let defaults = TrainConfig::default();
    TrainConfig { recall: defaults.recall, false_positive_rate: defaults.false_positive_rate, ..config.without_routing() }
}

/// `config` with `routed`'s coherence keys.
fn with_coherence_of(routed: &TrainConfig, config: TrainConfig) -> TrainConfig {
    TrainConfig {
        coh_samples_per_rollout: routed.coh_samples_per_rollout,
        coherence_rh_mode: routed.coherence_rh_mode,
        coherence_rh_penalty: routed.coherence_rh_penalty,
        coherence_start_frac: routed.coherence_start_frac,
        rh_detector_verifies_retain_samples: routed.rh_detector_verifies_retain_samples,
        rh_detector_retain_recall: routed.rh_detector_retain_recall,
        rp_extra_retain_advantage_multiplier: routed.rp_extra_retain_advantage_multiplier,
        ..config
    }
}

/// Adds a run unless an identical one is planned; two different configurations with the same
/// directory name (they differ only in keys that run names leave out) are an error.
fn add_run(runs: &mut Vec<PlannedRun>, config: TrainConfig, role: RunRole, baseline: Option<String>) -> Result<()> {
    let name = config.run_name()?;
    if let Some(existing) = runs.iter().find(|r| r.name == name) {
        ensure!(
            existing.config == config,
            "two planned runs share the directory name {name} but differ in {:?}; run them in separate sweeps (--output-dir)",
            differing_keys(&existing.config, &config)?
        );
        return Ok(());
    }
    runs.push(PlannedRun { name, config, role, baseline, state: CacheState::New });
    Ok(())
}

/// The same run with routing and any other intervention removed (their keys back to their
/// defaults, which route nothing; the seed and everything else unchanged), for routed runs
/// and the other interventions only.
pub fn baseline_of(config: &TrainConfig) -> Result<Option<TrainConfig>> {
    if config.routing_mode == RoutingMode::None && config.intervention == Intervention::Routing {
        return Ok(None);
    }
    let baseline = unrouted(config);
    baseline.validate().context("the non-routed baseline of a routed run is invalid")?;
    Ok(Some(baseline))
}

/// A run is a baseline when some run of the sweep names it as its baseline (also a non-routed
/// grid point), so a finished sweep and `--collect` of its directory label runs alike.
pub fn role_of(name: &str, baselines: &[Option<String>]) -> RunRole {
    if baselines.iter().any(|b| b.as_deref() == Some(name)) { RunRole::Baseline } else { RunRole::Grid }
}

/// All seeds of one parameter setting: the run name without its `_s<seed>` suffix.
pub fn group_of(run_name: &str) -> &str {
    run_name.rsplit_once("_s").map_or(run_name, |(group, _)| group)
}

fn cache_state(dir: &Path, planned: &TrainConfig) -> Result<CacheState> {
    if !dir.exists() {
        return Ok(CacheState::New);
    }
    let saved = saved_config(dir)?;
    let differing = differing_keys(&comparable(&saved), &comparable(planned))?;
    ensure!(
        differing.is_empty(),
        "{} exists but was trained with another configuration (differs in {differing:?}); remove it or sweep into another --output-dir",
        dir.display()
    );
    if is_finished(dir, planned.max_steps)? {
        Ok(CacheState::Finished)
    } else if crate::rundir::has_checkpoint(dir)? {
        Ok(CacheState::Resumable)
    } else {
        Ok(CacheState::Stale)
    }
}

/// A run directory's resolved configuration (`config.yaml`, written when the run started).
pub fn saved_config(dir: &Path) -> Result<TrainConfig> {
    TrainConfig::read_saved(dir).context("a sweep's output directory holds only smallrl run directories (remove it or choose another --output-dir)")
}

/// Without the keys that say where or how fast a run executed, how it may fail or what it
/// logged, not what it computed (the output directory may be spelled differently by another
/// sweep over the same directory).
fn comparable(config: &TrainConfig) -> TrainConfig {
    let defaults = TrainConfig::default();
    TrainConfig {
        // Without truncation sampling replay changes nothing (runs started before the key read back as trl_1_16).
        sampling_replay: if config.sampling_truncates() { config.sampling_replay } else { defaults.sampling_replay },
        threads: None,
        device: defaults.device,
        tensorboard: defaults.tensorboard,
        log_completions: defaults.log_completions,
        absorption_by_class: defaults.absorption_by_class,
        output_dir: defaults.output_dir,
        // Plugin limits bound how a run may fail, not what it computes; the hashes are
        // recorded by the run itself and checked when it resumes.
        plugin_fuel_per_sample: defaults.plugin_fuel_per_sample,
        plugin_max_call_seconds: defaults.plugin_max_call_seconds,
        plugin_max_memory_mb: defaults.plugin_max_memory_mb,
        plugin_judge_items_per_sample: defaults.plugin_judge_items_per_sample,
        plugin_judge_tokens_per_sample: defaults.plugin_judge_tokens_per_sample,
        plugin_sha256: defaults.plugin_sha256,
        name: config.name.clone().or_else(|| Some(UNNAMED_RUN.into())),
        // Components' names say how a run logged them; a run records the names its plugins
        // declare (issue 47), which a planned configuration does not have yet.
        reward: config.reward.as_ref().map(comparable_reward),
        ..config.clone()
    }
}

fn differing_keys(a: &TrainConfig, b: &TrainConfig) -> Result<Vec<String>> {
    let (Value::Object(a), Value::Object(b)) = (serde_json::to_value(a)?, serde_json::to_value(b)?) else { unreachable!("structs serialize to objects") };
    Ok(a.iter().filter(|(k, v)| b.get(*k) != Some(v)).map(|(k, _)| k.clone()).collect())
}

/// Finished = the final checkpoint exists (the trainer writes it atomically, after the final
/// evaluation and metrics line), and metrics.jsonl and routing_eval.jsonl reach `max_steps`.
pub fn is_finished(dir: &Path, max_steps: usize) -> Result<bool> {
    let final_checkpoint = dir.join(crate::train::checkpoint::dir_name(max_steps));
    Ok(final_checkpoint.is_dir() && last_step(&dir.join("metrics.jsonl"))? == Some(max_steps) && last_step(&dir.join("routing_eval.jsonl"))? == Some(max_steps))
}

/// The `step` of a JSON-lines file's last line (None for a missing or empty file).
pub fn last_step(path: &Path) -> Result<Option<usize>> {
    let lines = Jsonl::new(path.to_path_buf()).read()?;
    lines.last().map(|l| l[crate::train::metrics::key::STEP].as_u64().map(|s| s as usize).with_context(|| format!("{}: the last line has no step", path.display()))).transpose()
}

/// Runs grouped by experiment group (groups in name order, runs in their given order).
pub fn groups<T>(runs: &[T], name: impl Fn(&T) -> &str) -> BTreeMap<String, Vec<&T>> {
    let mut groups: BTreeMap<String, Vec<&T>> = BTreeMap::new();
    for run in runs {
        groups.entry(group_of(name(run)).to_string()).or_default().push(run);
    }
    groups
}

/// The keys in which two runs' configurations differ other than the seed and the keys that
/// only say where or how a run executed or logged (as for the cache), so runs that are the
/// seeds of one setting give an empty list.
pub fn differing_besides_seed(a: &TrainConfig, b: &TrainConfig) -> Result<Vec<String>> {
    let mut keys = differing_keys(&comparable(a), &comparable(b))?;
    keys.retain(|k| k != "seed");
    Ok(keys)
}

/// `reward` as one list of components without names (a single plugin is one such component).
fn comparable_reward(reward: &crate::reward::RewardSpec) -> crate::reward::RewardSpec {
    let components = reward.component_specs().into_iter().map(|spec| crate::reward::ComponentSpec { name: None, ..spec }).collect();
    crate::reward::RewardSpec::Combined { components, max_reward: reward.max_reward() }
}
