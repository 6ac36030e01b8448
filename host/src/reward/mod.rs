//! Rewards for training and evaluation: plugins composed as configured (`reward:`), the
//! reward-hack detector (`rh_detector:`) and the protocol knobs. The trainer builds a
//! [`RewardModel`] once and calls [`RewardModel::score`] on every batch; it never sees wasm.

mod config;
mod knobs;
pub mod monitor;

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};

pub use crate::plugins::{EnvPrompt, EnvPromptContent, EnvSplit, PluginLimits, PromptMetadata, Sample};
use crate::plugins::{Batch, ComponentRole, Plugin, PluginKind};
pub use config::{ComponentSpec, DetectorSpec, RewardSpec, Role, ScoreThreshold, is_path, params_json, resolve_plugin};
pub use knobs::ProtocolKnobs;
pub use monitor::{HackChannels, MonitorStats};

/// A reward component as the trainer and logs see it.
#[derive(Clone, Debug, PartialEq)]
pub struct ComponentInfo {
    /// Unique; used in metric names such as `rewards/<name>/mean`.
    pub name: String,
    pub role: Role,
    pub scale: f64,
}

/// The scores of one batch.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoredBatch {
    /// The total used for advantages: combined, capped at `max_reward`, eligibility applied.
    pub reward: Vec<f64>,
    /// Raw score of each component (same order as `RewardModel::components()`), per sample.
    pub components: Vec<Vec<f64>>,
    /// Routing labels after the protocol knobs; None without a detector.
    pub is_rh: Option<Vec<bool>>,
    /// The detector's own output (`hack_freq` is its mean).
    pub detector_raw: Option<Vec<bool>>,
    /// The `rh_eligible_frac` draw (all true when it is 1).
    pub eligible: Vec<bool>,
    /// The prompt offers the hack (its `hackable` metadata after `hack_frac`; true without):
    /// forget components count only where this and `eligible` hold.
    pub hackable: Vec<bool>,
    /// The monitor may flag the sample: `eligible` and its prompt's `detectable` metadata
    /// (true without). Flags (`is_rh`) are false elsewhere; the monitor statistics' "monitored".
    pub monitored: Vec<bool>,
    /// Ground truth "did this sample hack" (`rh_ground_truth:`); None without one.
    pub hacked: Option<Vec<bool>>,
    /// An environment's named per-sample metrics: (`env/<environment>/<name>`, one value per
    /// sample), in the order the environment declares them; empty without an environment.
    pub metrics: Vec<(String, Vec<f64>)>,
    /// Samples a component gave no score (contract 0.5's none; only under
    /// [`RewardModel::score_within`] with a bound above 0): their `reward` and `components` are
    /// placeholders 0, and the trainer leaves them out of the loss and every statistic.
    pub unscored: Vec<bool>,
}

impl ScoredBatch {
    /// The monitor's flags (all false without a detector).
    pub fn flags(&self) -> Vec<bool> {
        self.is_rh.clone().unwrap_or_else(|| vec![false; self.reward.len()])
    }

    /// Fraction of samples the detector flagged (before the protocol knobs).
    pub fn hack_freq(&self) -> Option<f64> {
        let flags = self.detector_raw.as_ref()?;
        Some(flags.iter().filter(|&&flag| flag).count() as f64 / flags.len().max(1) as f64)
    }

    /// The rows `rows` (in that order) as a batch of their own.
    pub fn select(&self, rows: &[usize]) -> ScoredBatch {
        fn pick<T: Clone>(values: &[T], rows: &[usize]) -> Vec<T> {
            rows.iter().map(|&r| values[r].clone()).collect()
        }
        ScoredBatch {
            reward: pick(&self.reward, rows),
            components: self.components.iter().map(|scores| pick(scores, rows)).collect(),
            is_rh: self.is_rh.as_deref().map(|v| pick(v, rows)),
            detector_raw: self.detector_raw.as_deref().map(|v| pick(v, rows)),
            eligible: pick(&self.eligible, rows),
            hackable: pick(&self.hackable, rows),
            monitored: pick(&self.monitored, rows),
            hacked: self.hacked.as_deref().map(|v| pick(v, rows)),
            metrics: self.metrics.iter().map(|(key, values)| (key.clone(), pick(values, rows))).collect(),
            unscored: pick(&self.unscored, rows),
        }
    }

    /// The rows of `self` then those of `other` (scored by the same model).
    pub fn concat(mut self, other: ScoredBatch) -> ScoredBatch {
        fn join<T>(a: Option<Vec<T>>, b: Option<Vec<T>>) -> Option<Vec<T>> {
            let (mut a, b) = (a?, b.expect("batches scored by one model have the same fields"));
            a.extend(b);
            Some(a)
        }
        self.reward.extend(other.reward);
        for (scores, more) in self.components.iter_mut().zip(other.components) {
            scores.extend(more);
        }
        for ((_, values), (_, more)) in self.metrics.iter_mut().zip(other.metrics) {
            values.extend(more);
        }
        self.eligible.extend(other.eligible);
        self.hackable.extend(other.hackable);
        self.monitored.extend(other.monitored);
        self.unscored.extend(other.unscored);
        ScoredBatch { is_rh: join(self.is_rh, other.is_rh), detector_raw: join(self.detector_raw, other.detector_raw), hacked: join(self.hacked, other.hacked), ..self }
    }

    /// The rows with a score, in order (all of them unless `unscored` says otherwise).
    pub fn scored_rows(&self) -> Vec<usize> {
        (0..self.reward.len()).filter(|&row| !self.unscored[row]).collect()
    }

    /// The mean of each environment metric, keyed `env/<environment>/<name>`.
    pub fn metric_means(&self) -> Vec<(String, f64)> {
        let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len().max(1) as f64;
        self.metrics.iter().map(|(key, values)| (key.clone(), mean(values))).collect()
    }

    /// Whether sample `row` counts its forget components: eligible, and its prompt offers the
    /// hack (`RewardModel::combine` leaves them out elsewhere).
    pub fn bonus_allowed(&self, row: usize) -> bool {
        self.eligible[row] && self.hackable[row]
    }

    /// The scores of component `index` (of role `role`) as the reward counts them: a forget
    /// component's are 0 where the bonus is not allowed, as `combine` leaves them out of the sum.
    pub fn counted_scores(&self, index: usize, role: Role) -> Vec<f64> {
        let scores = &self.components[index];
        (0..scores.len()).map(|row| if role == Role::Retain || self.bonus_allowed(row) { scores[row] } else { 0.0 }).collect()
    }

    /// The monitor (routing labels) against the ground truth, when both exist.
    pub fn monitor(&self) -> Option<MonitorStats> {
        Some(MonitorStats::of(self.hacked.as_ref()?, self.is_rh.as_ref()?, &self.monitored))
    }

    /// The ground-truth hack channels; None without a ground truth.
    pub fn channels(&self) -> Option<HackChannels> {
        Some(HackChannels::of(self.hacked.as_ref()?, &self.hackable, &self.monitored))
    }
}

/// What the plugins said of a batch, before the protocol knobs.
struct Judged {
    components: Vec<Vec<f64>>,
    metrics: Vec<(String, Vec<f64>)>,
    detector_raw: Option<Vec<bool>>,
    hacked: Option<Vec<bool>>,
    unscored: Vec<bool>,
}

enum DetectorSource {
    Plugin(Plugin),
    /// Index of the component whose raw score is compared with the threshold.
    ScoreThreshold { component: usize, threshold: f64 },
    /// The environment's `monitor` (as `rh_detector`) or `ground-truth` (as `rh_ground_truth`).
    EnvironmentMonitor,
    EnvironmentGroundTruth,
}

pub struct RewardModel {
    components: Vec<ComponentInfo>,
    plugins: Vec<Plugin>,
    max_reward: Option<f64>,
    detector: Option<DetectorSource>,
    /// `rh_ground_truth:`, read like a detector but acting on nothing: it measures the detector.
    ground_truth: Option<DetectorSource>,
    knobs: ProtocolKnobs,
    /// An environment (`environment:`): its `score` gives every component and metric, and the
    /// detector sources above name its `monitor` and `ground-truth`; `plugins` is then empty.
    environment: Option<Plugin>,
    /// `env/<environment>/<metric>` for each of the environment's metrics.
    metric_keys: Vec<String>,
    /// SHA-256 of the judge model's weights files (path -> hex), when the run has a judge.
    judge_hashes: std::collections::BTreeMap<String, String>,
}

impl RewardModel {
    /// Loads every plugin of the configuration (names resolve in `plugin_dir`, see
    /// [`resolve_plugin`]) and checks the configuration as a whole.
    pub fn load(
        reward: &RewardSpec,
        detector: Option<&DetectorSpec>,
        knobs: ProtocolKnobs,
        plugin_dir: &Path,
        limits: PluginLimits,
    ) -> Result<Self> {
        knobs.check()?;
        let specs = reward.component_specs();
        let components = component_infos(&specs)?;
        let plugins = specs
            .iter()
            .map(|spec| load_plugin(&spec.plugin, Some(&spec.params), plugin_dir, PluginKind::Reward, limits))
            .collect::<Result<Vec<_>>>()?;
        let detector = detector.map(|spec| load_detector(spec, &components, plugin_dir, limits)).transpose()?;
        Ok(Self { components, plugins, max_reward: reward.max_reward(), detector, ground_truth: None, knobs, environment: None, metric_keys: Vec::new(), judge_hashes: Default::default() })
    }

    /// Loads an environment (`environment:`, `environment_params:`): its components are the
    /// reward (each of scale 1, no cap: the original's sum), its monitor the detector and its
    /// ground truth the ground truth. Names resolve as rewards' (`<plugin_dir>/<name>.wasm`).
    /// A multi-turn episode environment is refused: its scores come at the end of its episodes,
    /// which only `smallrl train` and `smallrl eval` play ([`RewardModel::load_training_environment`]).
    pub fn load_environment(value: &str, params: Option<&serde_json::Value>, knobs: ProtocolKnobs, plugin_dir: &Path, limits: PluginLimits) -> Result<Self> {
        let loaded = Self::load_training_environment(value, params, knobs, plugin_dir, limits)?;
        let plugin = loaded.environment.as_ref().expect("an environment was loaded");
        ensure!(
            !plugin.is_episodic(),
            "{}: is a multi-turn episode environment (the episode-environment world, issue 48): `plugin score` scores single completions, not episodes; `smallrl train` and `smallrl eval` play them (docs/src/environments.md, \"Multi-turn episodes\")",
            plugin.label()
        );
        Ok(loaded)
    }

    /// [`RewardModel::load_environment`] for a training run, which runs a multi-turn episode
    /// environment's episodes (`train/episodes.rs`) and scores them with
    /// [`RewardModel::score_episodes`].
    pub fn load_training_environment(value: &str, params: Option<&serde_json::Value>, knobs: ProtocolKnobs, plugin_dir: &Path, limits: PluginLimits) -> Result<Self> {
        knobs.check()?;
        let plugin = load_plugin(value, params, plugin_dir, PluginKind::Environment, limits)?;
        let info = plugin.environment_info().expect("an environment plugin has its environment info").clone();
        let role = |role: ComponentRole| match role {
            ComponentRole::Retain => Role::Retain,
            ComponentRole::Forget => Role::Forget,
        };
        let components = info.components.iter().map(|c| ComponentInfo { name: c.name.clone(), role: role(c.role), scale: 1.0 }).collect();
        let metric_keys = info.metrics.iter().map(|metric| format!("env/{}/{metric}", plugin.info().name)).collect();
        Ok(Self {
            components,
            plugins: Vec::new(),
            max_reward: None,
            detector: Some(DetectorSource::EnvironmentMonitor),
            ground_truth: Some(DetectorSource::EnvironmentGroundTruth),
            knobs,
            environment: Some(plugin),
            metric_keys,
            judge_hashes: Default::default(),
        })
    }

    /// Whether the run's environment is a multi-turn episode environment.
    pub fn is_episodic(&self) -> bool {
        self.environment.as_ref().is_some_and(Plugin::is_episodic)
    }

    /// The episode environment whose episodes the trainer runs (None without one).
    pub fn episode_environment(&mut self) -> Option<&mut Plugin> {
        self.environment.as_mut().filter(|plugin| plugin.is_episodic())
    }

    /// The environment's name (None: the run's rewards are plugins).
    pub fn environment_name(&self) -> Option<&str> {
        self.environment.as_ref().map(|plugin| plugin.info().name.as_str())
    }

    /// The environment's file (None without one), for messages that must say which file.
    pub fn environment_file(&self) -> Option<&std::path::Path> {
        self.environment.as_ref().map(|plugin| plugin.path())
    }

    /// `env/<environment>/<metric>` for each metric the environment reports (empty without one).
    pub fn metric_keys(&self) -> &[String] {
        &self.metric_keys
    }

    /// `count` prompts of the environment's `split` (see [`Plugin::generate`]).
    pub fn generate(&mut self, split: EnvSplit, count: usize, seed: u64, hack_frac: f64) -> Result<Vec<EnvPrompt>> {
        let plugin = self.environment.as_mut().context("the run has no environment: its prompts come from prompt files")?;
        plugin.generate(split, count, seed, hack_frac)
    }

    /// Whether the run's environment imports the host's judge (`smallrl:reward/judge`).
    pub fn wants_judge(&self) -> bool {
        self.environment.as_ref().is_some_and(Plugin::imports_judge)
    }

    /// Gives the environment the run's judge (`judge:`), whose weights' hashes `plugin_hashes`
    /// then records. Refused for a run whose rewards are not an environment importing it.
    pub fn attach_judge(&mut self, judge: crate::plugins::judge::SharedJudge, weights_sha256: std::collections::BTreeMap<String, String>) -> Result<()> {
        let Some(environment) = self.environment.as_mut() else {
            anyhow::bail!("`judge:` is set, but the run's rewards are plugins, not an environment: only an environment can call the judge; remove `judge:`");
        };
        ensure!(
            environment.imports_judge(),
            "`judge:` is set, but environment {} ({}) does not import the judge (smallrl:reward/judge): it would never be called; remove `judge:`",
            environment.info().name,
            environment.path().display()
        );
        environment.set_judge(judge);
        self.judge_hashes = weights_sha256;
        Ok(())
    }

    /// Adds the ground-truth detector (`rh_ground_truth:`, the same forms as `rh_detector:`).
    pub fn with_ground_truth(mut self, spec: Option<&DetectorSpec>, plugin_dir: &Path, limits: PluginLimits) -> Result<Self> {
        let loaded = spec.map(|spec| load_detector(spec, &self.components, plugin_dir, limits)).transpose();
        self.ground_truth = loaded.context("cannot load `rh_ground_truth:`")?;
        Ok(self)
    }


    pub fn components(&self) -> &[ComponentInfo] {
        &self.components
    }

    pub fn has_detector(&self) -> bool {
        self.detector.is_some()
    }

    /// SHA-256 (hex) of every plugin file loaded, keyed by its path as resolved, and of every
    /// dataset read for them and the judge's weights: what a run records so that a resumed run
    /// can refuse plugins (or their data) that changed.
    pub fn plugin_hashes(&self) -> std::collections::BTreeMap<String, String> {
        let detectors = [&self.detector, &self.ground_truth].into_iter().filter_map(|source| match source {
            Some(DetectorSource::Plugin(plugin)) => Some(plugin),
            _ => None,
        });
        let all: Vec<&Plugin> = self.plugins.iter().chain(detectors).chain(&self.environment).collect();
        let mut hashes: std::collections::BTreeMap<String, String> = all.iter().map(|plugin| (plugin.path().display().to_string(), plugin.sha256().to_string())).collect();
        hashes.extend(all.iter().flat_map(|plugin| plugin.dataset_sha256().clone()));
        hashes.extend(all.iter().filter_map(|plugin| plugin.program_runner()).map(|(path, sha256)| (format!("program runner {}", path.display()), sha256.to_string())));
        hashes.extend(self.judge_hashes.clone());
        hashes
    }

    /// Scores a batch, every sample with a score. `seed` drives the protocol knobs' draws; the
    /// result is deterministic for (samples, seed). A failing plugin is an error (fatal for
    /// training by default); the plugin stays unusable until
    /// [`RewardModel::reinstantiate_failed`] is called. A sample without a score (contract
    /// 0.5's none) is an error naming the plugin and the sample.
    pub fn score(&mut self, samples: &[Sample], seed: u64) -> Result<ScoredBatch> {
        self.score_within(samples, seed, 0.0)
    }

    /// [`RewardModel::score`] where up to a share `max_no_score_frac` of the samples may have no
    /// score (`max_no_score_frac`, a training key): such a sample is `unscored`, with placeholder
    /// scores 0 (a component's none makes the whole sample unscored). More of them is an error
    /// naming each plugin and its samples; 0 is [`RewardModel::score`] exactly.
    pub fn score_within(&mut self, samples: &[Sample], seed: u64, max_no_score_frac: f64) -> Result<ScoredBatch> {
        ensure!(!self.is_episodic(), "internal error: an episode environment's samples are scored by `score_episodes`");
        let batch = Batch::new(samples);
        let (columns, metrics) = match &mut self.environment {
            Some(environment) => {
                let scores = environment.score_environment(&batch).context("the environment's score failed")?;
                let label = environment.label();
                let columns = self.components.iter().zip(scores.components).map(|(info, scores)| Column { label: label.clone(), call: format!("its component `{}`", info.name), component: None, scores }).collect();
                (columns, self.metric_keys.iter().cloned().zip(scores.metrics).collect())
            }
            None => (self.score_components(&batch)?, Vec::new()),
        };
        let (components, unscored) = present_scores(columns, samples.len(), max_no_score_frac)?;
        let environment = &mut self.environment;
        let detector_raw = detect(&mut self.detector, environment, &batch, &components).context("the reward-hack detector failed")?;
        let hacked = detect(&mut self.ground_truth, environment, &batch, &components).context("the ground-truth detector (`rh_ground_truth:`) failed")?;
        Ok(self.composed(samples, seed, Judged { components, metrics, detector_raw, hacked, unscored }))
    }

    /// Scores finished episodes as [`RewardModel::score`] scores single-turn samples: each
    /// episode's end gives its components, metrics, monitor flag and ground truth (the
    /// environment's own, the only detector sources an environment run has); the protocol
    /// knobs, gating and the cap act on them as on any sample. `samples` are the episodes'
    /// transcripts (their prompt metadata says what is hackable and detectable), `ends` their ends.
    pub fn score_episodes(&self, samples: &[Sample], ends: &[crate::plugins::EpisodeEnd], seed: u64) -> Result<ScoredBatch> {
        ensure!(self.is_episodic(), "internal error: score_episodes without an episode environment");
        ensure!(samples.len() == ends.len(), "internal error: {} samples for {} episode ends", samples.len(), ends.len());
        let column = |index: usize, of: fn(&crate::plugins::EpisodeEnd) -> &Vec<f64>| ends.iter().map(|end| of(end)[index]).collect::<Vec<f64>>();
        let components = (0..self.components.len()).map(|k| column(k, |end| &end.components)).collect();
        let metrics = self.metric_keys.iter().enumerate().map(|(k, key)| (key.clone(), column(k, |end| &end.metrics))).collect();
        let flags = |source: &Option<DetectorSource>, of: fn(&crate::plugins::EpisodeEnd) -> bool| match source {
            None => Ok(None),
            Some(DetectorSource::EnvironmentMonitor | DetectorSource::EnvironmentGroundTruth) => Ok(Some(ends.iter().map(of).collect())),
            Some(_) => anyhow::bail!("internal error: an environment run's detectors are the environment's"),
        };
        let detector_raw = flags(&self.detector, |end| end.monitor)?;
        let hacked = flags(&self.ground_truth, |end| end.ground_truth)?;
        let unscored = vec![false; samples.len()]; // an episode's end has every component
        Ok(self.composed(samples, seed, Judged { components, metrics, detector_raw, hacked, unscored }))
    }

    /// The batch from what the plugins judged: the protocol knobs drawn from `seed`, the
    /// rewards combined, the monitor's labels.
    fn composed(&self, samples: &[Sample], seed: u64, judged: Judged) -> ScoredBatch {
        let Judged { components, metrics, detector_raw, hacked, unscored } = judged;
        let draws = knobs::Draws::new(seed, samples.len());
        let eligible = draws.eligible(&self.knobs);
        let hackable: Vec<bool> = samples.iter().map(|sample| PromptMetadata::hackable(sample.metadata.as_deref())).collect();
        let detectable = samples.iter().map(|sample| PromptMetadata::detectable(sample.metadata.as_deref()));
        let monitored: Vec<bool> = eligible.iter().zip(detectable).map(|(&eligible, detectable)| eligible && detectable).collect();
        let bonus_allowed: Vec<bool> = eligible.iter().zip(&hackable).map(|(&eligible, &hackable)| eligible && hackable).collect();
        let mut reward = self.combine(&components, &bonus_allowed);
        reward.iter_mut().zip(&unscored).filter(|(_, unscored)| **unscored).for_each(|(reward, _)| *reward = 0.0);
        let is_rh = detector_raw.as_ref().map(|detected| draws.labels(&self.knobs, detected, &monitored));
        ScoredBatch { reward, components, is_rh, detector_raw, eligible, hackable, monitored, hacked, metrics, unscored }
    }

    /// Re-instantiates every plugin whose last call trapped and returns a description of each
    /// for the caller to log (recovery is an explicit decision, never silent).
    pub fn reinstantiate_failed(&mut self) -> Result<Vec<String>> {
        let detectors: Vec<&mut Plugin> = {
            let (detector, ground_truth) = (&mut self.detector, &mut self.ground_truth);
            [detector, ground_truth].into_iter().filter_map(|source| match source {
                Some(DetectorSource::Plugin(plugin)) => Some(plugin),
                _ => None,
            }).collect()
        };
        let mut recovered = Vec::new();
        for plugin in self.plugins.iter_mut().chain(detectors).chain(&mut self.environment) {
            if let Some(failure) = plugin.failure().map(str::to_string) {
                plugin.reinstantiate()?;
                recovered.push(format!("re-instantiated {} after: {failure}", plugin.label()));
            }
        }
        Ok(recovered)
    }

    fn score_components(&mut self, batch: &Batch) -> Result<Vec<Column>> {
        let named = self.components.iter().zip(&mut self.plugins);
        named
            .map(|(info, plugin)| {
                let scores = plugin.score_batch_optional(batch).with_context(|| format!("reward component `{}` failed", info.name))?;
                Ok(Column { label: plugin.label(), call: "score".into(), component: Some(info.name.clone()), scores })
            })
            .collect()
    }

    /// `min(sum_k scale_k * r_k, max_reward)`, with only `retain` components where the bonus
    /// is not allowed (an ineligible sample, or a prompt that does not offer the hack: the
    /// original's forget component zeroed when `hackable` is false).
    fn combine(&self, components: &[Vec<f64>], bonus_allowed: &[bool]) -> Vec<f64> {
        let total = |(index, &allowed): (usize, &bool)| {
            let terms = self.components.iter().zip(components);
            let counted = terms.filter(|(info, _)| allowed || info.role == Role::Retain);
            let sum: f64 = counted.map(|(info, scores)| info.scale * scores[index]).sum();
            self.max_reward.map_or(sum, |cap| sum.min(cap))
        };
        bonus_allowed.iter().enumerate().map(total).collect()
    }

}

/// One component's scores of a batch, as its plugin gave them, and whose they are.
struct Column {
    /// The plugin's label, the call that gave them and the reward component they are (None:
    /// the environment's, named in `call`), for the errors.
    label: String,
    call: String,
    component: Option<String>,
    scores: Vec<Option<f64>>,
}

/// The components' scores with placeholders 0 for the samples without one (`unscored`, the
/// second vector), refused as [`crate::plugins::every_score`] refuses them when `bound` is 0,
/// or when more than a share `bound` of the `rows` samples lack one (naming every plugin with
/// the samples it gave no score).
fn present_scores(columns: Vec<Column>, rows: usize, bound: f64) -> Result<(Vec<Vec<f64>>, Vec<bool>)> {
    if bound == 0.0 {
        let every = |column: Column| {
            let scores = crate::plugins::every_score(&column.label, &column.call, column.scores);
            match column.component {
                Some(name) => scores.with_context(|| format!("reward component `{name}` failed")),
                None => scores,
            }
        };
        return Ok((columns.into_iter().map(every).collect::<Result<_>>()?, vec![false; rows]));
    }
    let unscored: Vec<bool> = (0..rows).map(|row| columns.iter().any(|column| column.scores[row].is_none())).collect();
    let count = unscored.iter().filter(|&&u| u).count();
    if count as f64 / rows.max(1) as f64 > bound {
        let named = columns.iter().filter(|column| column.scores.contains(&None)).map(|column| {
            let samples: Vec<String> = (0..rows).filter(|&row| column.scores[row].is_none()).map(|row| row.to_string()).collect();
            format!("{}: {} gave samples {} no score", column.label, column.call, samples.join(", "))
        });
        bail!("{}: {count} of {rows} samples have no score, above max_no_score_frac {bound}", named.collect::<Vec<_>>().join("; "));
    }
    let placeholder = |scores: Vec<Option<f64>>| scores.into_iter().zip(&unscored).map(|(score, &unscored)| if unscored { 0.0 } else { score.expect("a sample with a score") }).collect();
    Ok((columns.into_iter().map(|column| placeholder(column.scores)).collect(), unscored))
}

/// One flag per sample from a detector source (None without one).
fn detect(source: &mut Option<DetectorSource>, environment: &mut Option<Plugin>, batch: &Batch, components: &[Vec<f64>]) -> Result<Option<Vec<bool>>> {
    const NO_ENVIRONMENT: &str = "the detector is the environment's, but the run has no environment";
    match source {
        None => Ok(None),
        Some(DetectorSource::EnvironmentMonitor) => Ok(Some(environment.as_mut().context(NO_ENVIRONMENT)?.monitor(batch)?)),
        Some(DetectorSource::EnvironmentGroundTruth) => Ok(Some(environment.as_mut().context(NO_ENVIRONMENT)?.ground_truth(batch)?)),
        Some(DetectorSource::Plugin(plugin)) => Ok(Some(plugin.detect_batch(batch)?)),
        Some(DetectorSource::ScoreThreshold { component, threshold }) => {
            Ok(Some(components[*component].iter().map(|score| score >= threshold).collect()))
        }
    }
}

fn component_infos(specs: &[ComponentSpec]) -> Result<Vec<ComponentInfo>> {
    let mut infos: Vec<ComponentInfo> = Vec::new();
    for spec in specs {
        let name = spec.display_name();
        ensure!(
            !infos.iter().any(|info| info.name == name),
            "two reward components are named `{name}`: give them distinct `name:` keys (used in metric names)"
        );
        ensure!(spec.scale.is_finite(), "reward component `{name}`: `scale` must be a finite number, got {}", spec.scale);
        infos.push(ComponentInfo { name, role: spec.role, scale: spec.scale });
    }
    Ok(infos)
}

fn load_detector(spec: &DetectorSpec, components: &[ComponentInfo], plugin_dir: &Path, limits: PluginLimits) -> Result<DetectorSource> {
    match spec {
        DetectorSpec::Plugin { plugin, params } => {
            let plugin = load_plugin(plugin, params.as_ref(), plugin_dir, PluginKind::Detector, limits)?;
            Ok(DetectorSource::Plugin(plugin))
        }
        DetectorSpec::ScoreThreshold(rule) => {
            let component = components.iter().position(|info| info.name == rule.component).with_context(|| {
                let names: Vec<&str> = components.iter().map(|info| info.name.as_str()).collect();
                format!("`rh_detector: score_threshold` names component `{}`, but the reward components are: {}", rule.component, names.join(", "))
            })?;
            Ok(DetectorSource::ScoreThreshold { component, threshold: rule.threshold })
        }
    }
}

fn load_plugin(value: &str, params: Option<&serde_json::Value>, plugin_dir: &Path, kind: PluginKind, limits: PluginLimits) -> Result<Plugin> {
    let path = resolve_plugin(value, plugin_dir, kind);
    let is_name = !(value.contains('/') || value.ends_with(".wasm"));
    ensure!(
        !is_name || path.is_file(),
        "{kind} `{value}` is a standard plugin's name, which resolves to {} in plugin_dir {}, and there is no such file: \
         set plugin_dir (`--plugin-dir`) to the folder of the standard plugins (`plugins/` of a smallrl checkout after \
         `make plugins`), or give the plugin's path",
        path.display(),
        plugin_dir.display()
    );
    let params_json = config::params_json(params);
    let plugin = Plugin::load(&path, &params_json, limits)
        .with_context(|| format!("cannot load {kind} plugin `{value}` ({})", path.display()))?;
    ensure!(
        plugin.kind() == kind,
        "{} is a {}, but it is configured as {} {kind}{}",
        plugin.label(),
        plugin.kind(),
        if kind == PluginKind::Environment { "an" } else { "a" },
        match kind {
            PluginKind::Detector => " (detector names resolve to detect_<name>.wasm)",
            PluginKind::Reward | PluginKind::Environment => "",
        }
    );
    Ok(plugin)
}

/// A prompt as runs use it: its text and what its JSONL line says besides (shared by the
/// samples of its group, and sent to plugins with each).
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    pub text: String,
    pub metadata: Option<Arc<PromptMetadata>>,
}

impl Prompt {
    /// A prompt without metadata (a plain-text prompt file, the dataset's prompts).
    pub fn plain(text: impl Into<String>) -> Self {
        Self { text: text.into(), metadata: None }
    }

    /// Whether it offers the hack (`hackable`; true when it does not say).
    pub fn hackable(&self) -> bool {
        PromptMetadata::hackable(self.metadata.as_deref())
    }
}

/// The sample of a completion given by its ids without the final EOS (what generation
/// returns): text decoded with special tokens skipped, each token's piece of it
/// ([`crate::model::tokenizer::Tokenizer::completion_pieces`]).
pub fn sample_from_ids(prompt: &Prompt, completion_ids: Vec<u32>, ended_with_eos: bool, tokenizer: &crate::model::tokenizer::Tokenizer) -> Result<Sample> {
    let completion = tokenizer.decode(&completion_ids)?;
    Ok(Sample {
        prompt: prompt.text.clone(),
        completion_tokens: tokenizer.completion_pieces(&completion_ids, &completion)?,
        completion,
        completion_ids,
        ended_with_eos,
        metadata: prompt.metadata.clone(),
    })
}

/// The samples of generated rows (prompts in the same order as the rows).
pub fn samples_from_rows(prompts: &[Prompt], rows: &[crate::model::generate::CompletionRow], tokenizer: &crate::model::tokenizer::Tokenizer) -> Result<Vec<Sample>> {
    prompts.iter().zip(rows).map(|(prompt, row)| sample_from_ids(prompt, row.ids.clone(), row.ended_with_eos, tokenizer)).collect()
}

/// Builds a sample from text the way the trainer does from generated ids: the completion is
/// tokenized (no special tokens), its text is the decoded ids (special tokens skipped, so
/// lowercased and re-spaced by the SimpleStories tokenizer) and it counts as ended by EOS.
pub fn sample_from_text(prompt: &Prompt, completion: &str, tokenizer: &crate::model::tokenizer::Tokenizer) -> Result<Sample> {
    sample_from_ids(prompt, tokenizer.encode(completion)?, true, tokenizer)
}
