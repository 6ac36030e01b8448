//! The sweep's summary per arm: an arm is every run with the same configuration except the
//! seed (the run name without `_s<seed>`, which lists every non-default hyperparameter), so
//! routed runs, their baselines and any other intervention each form their own arm. Per arm
//! and metric: the mean over seeds and a 95% percentile-bootstrap interval ([`super::stats`]).
//!
//! Metrics, per finished run: `final_reward` (the training reward of the last step,
//! `metrics.jsonl`; mode `train`), and from the run's own final routing evaluation (the last
//! line of `routing_eval.jsonl`, at `max_steps`; not `eval_checkpoints.csv`) `task_reward` and
//! `hack_freq` in each adapter mode, and `retain_minus_hack` = task reward − hack frequency in
//! `retain_only` (what routing is for: a retain adapter that keeps the task and drops the hack
//! scores high).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

use crate::stats::{self, MeanCi};
use super::{RunEntry, RunStatus, evals, plan};
use crate::reward::monitor::key as channel_key;
use crate::routing::eval_mode;
use crate::train::metrics::key;
use crate::runlog::Jsonl;

pub const FINAL_REWARD: &str = "final_reward";
pub const TASK_REWARD: &str = "task_reward";
pub const HACK_FREQ: &str = "hack_freq";
pub const RETAIN_MINUS_HACK: &str = "retain_minus_hack";
/// The ground-truth hack rate over all prompts (runs with a ground truth: an environment or
/// `rh_ground_truth:`); `hack_freq` is the monitor's flag rate.
pub const TRUE_HACK_FREQ: &str = "true_hack_freq";
/// The ground-truth hack rate among hackable prompts the monitor sees / does not see.
pub const MONITORED_HACK_FREQ: &str = "monitored_hack_freq";
pub const UNMONITORED_HACK_FREQ: &str = "unmonitored_hack_freq";
/// Modes read from the run's `deployment.json` (`sweep --deploy`): the base model, and the
/// routed run at its deployed forget scale.
pub const BASE_MODE: &str = "base";
pub const DEPLOYED_MODE: &str = "deployed";
/// The mode of `final_reward` (the policy that trained: both adapters, ablation as trained).
pub const TRAIN_MODE: &str = "train";

pub const CSV_HEADER: &str = "arm,role,metric,mode,seeds,mean,ci_low,ci_high";

#[derive(Debug, Clone, PartialEq)]
pub struct ArmRow {
    pub arm: String,
    /// `baseline` when every run of the arm is some routed run's baseline, else `run`.
    pub role: &'static str,
    pub metric: &'static str,
    pub mode: String,
    pub stat: MeanCi,
}

/// One finished run's values: (metric, mode) → value.
pub type RunValues = BTreeMap<(&'static str, String), f64>;

/// [`run_values`] of every finished (OK or cached) run, by run name: read once for all the
/// tables.
pub fn finished_run_values(entries: &[RunEntry]) -> Result<BTreeMap<String, RunValues>> {
    finished_run_values_read(entries, Reading::Final)
}

/// How a run's routing evaluations become its values: the final evaluation (the default), or
/// the paper's reading, the mean of the last max(1, n // 10) of its n evaluations
/// (`--last-tenth`; each metric averaged over the evaluations of the window that have it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reading {
    #[default]
    Final,
    LastTenth,
}

impl Reading {
    pub fn name(self) -> &'static str {
        match self {
            Self::Final => "final",
            Self::LastTenth => "last_tenth",
        }
    }

    /// How many of `n` evaluations (the last ones) the reading averages.
    pub fn window(self, n: usize) -> usize {
        match self {
            Self::Final => 1.min(n),
            Self::LastTenth => (n / 10).max(1).min(n),
        }
    }
}

/// One finished run's values from its final evaluation.
pub fn run_values(entry: &RunEntry) -> Result<RunValues> {
    run_values_read(entry, Reading::Final)
}

/// [`run_values`] of every finished (OK or cached) run in `reading`, by run name.
pub fn finished_run_values_read(entries: &[RunEntry], reading: Reading) -> Result<BTreeMap<String, RunValues>> {
    entries
        .iter()
        .filter(|e| matches!(e.status, RunStatus::Ok | RunStatus::Cached))
        .map(|e| Ok((e.name.clone(), run_values_read(e, reading).with_context(|| format!("reading the results of {}", e.name))?)))
        .collect()
}

/// Which evaluation prompts a run's values are over: all of them, or the hackable ones only
/// (the paper's `_hackable` figures; `eval::HackableSubset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prompts {
    #[default]
    All,
    Hackable,
}

impl Prompts {
    pub fn name(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Hackable => "hackable",
        }
    }
}

/// One finished run's values in `reading`: the routing evaluations' metrics averaged over the
/// reading's window (the last one must be at `max_steps`); `final_reward` and the deployment's
/// modes are of the last step whatever the reading.
pub fn run_values_read(entry: &RunEntry, reading: Reading) -> Result<RunValues> {
    run_values_over(entry, reading, Prompts::All)
}

/// [`run_values_read`] over `prompts`. Over the hackable prompts a mode's metrics are read from
/// its `hackable/` keys (its own values when every prompt is hackable) and are absent when no
/// prompt is hackable or the run predates the count (`hackable/n`); no deployment modes.
pub fn run_values_over(entry: &RunEntry, reading: Reading, prompts: Prompts) -> Result<RunValues> {
    let mut values = BTreeMap::new();
    let metrics_path = entry.dir.join("metrics.jsonl");
    let last = Jsonl::new(metrics_path.clone()).read()?.pop().with_context(|| format!("{} is empty", metrics_path.display()))?;
    let reward = last[key::REWARD].as_f64().with_context(|| format!("{}: the last line has no finite `{}`", metrics_path.display(), key::REWARD))?;
    values.insert((FINAL_REWARD, TRAIN_MODE.to_string()), reward);
    // The task reward weighs the retain components: learnt once (an environment's load).
    let weights = evals::task_weights(entry)?;
    let eval_path = evals::EvalSource::Training.path(entry);
    let mut lines = Jsonl::new(eval_path.clone()).read()?;
    anyhow::ensure!(!lines.is_empty(), "{}: no routing evaluation", eval_path.display());
    let window = lines.split_off(lines.len() - reading.window(lines.len()));
    let step_of = |line: &serde_json::Value| line[crate::eval::key::STEP].as_u64().map(|s| s as usize);
    let final_step = step_of(&window[window.len() - 1]).with_context(|| format!("{}: the last line has no step", eval_path.display()))?;
    anyhow::ensure!(final_step == entry.config.max_steps, "{}: the last routing evaluation is at step {final_step}, not max_steps {}", entry.dir.display(), entry.config.max_steps);
    let mut samples: BTreeMap<(&'static str, String), Vec<f64>> = BTreeMap::new();
    for line in &window {
        let step = step_of(line).with_context(|| format!("{}: a line has no step", eval_path.display()))?;
        let modes = line[crate::eval::key::MODES].as_object().with_context(|| format!("{}: step {step} has no `modes`", eval_path.display()))?;
        let mut one = BTreeMap::new();
        for (mode, mode_json) in modes {
            match prompts {
                Prompts::All => insert_mode(&mut one, mode, mode_json, &weights, &eval_path, step)?,
                Prompts::Hackable => insert_hackable(&mut one, mode, mode_json, &weights, &eval_path, step)?,
            }
        }
        for (k, v) in one {
            samples.entry(k).or_default().push(v);
        }
    }
    // One evaluation's value is kept as it is (the final reading, exactly as it was written).
    values.extend(samples.into_iter().map(|(k, v)| (k, if v.len() == 1 { v[0] } else { v.iter().sum::<f64>() / v.len() as f64 })));
    if prompts == Prompts::Hackable {
        return Ok(values);
    }
    if let Some(deployment) = crate::eval::deployment::read(&entry.dir)? {
        anyhow::ensure!(deployment.step == final_step, "{}: deployment.json is of step {}, the run ended at {final_step}; run `smallrl sweep --collect DIR --deploy` again", entry.dir.display(), deployment.step);
        let path = entry.dir.join(crate::eval::deployment::FILE);
        for (mode, mode_json) in [(BASE_MODE, deployment.base()), (DEPLOYED_MODE, deployment.deployed())] {
            insert_mode(&mut values, mode, mode_json, &weights, &path, final_step)?;
        }
    }
    Ok(values)
}

/// One mode's metrics from its values (`mode_json`, as a `routing_eval.jsonl` line holds them;
/// `path` and `step` say where, for errors): task reward, the monitor's flag rate, the
/// ground-truth channels when the run has a ground truth, and `retain_minus_hack` in
/// `retain_only`.
fn insert_mode(values: &mut BTreeMap<(&'static str, String), f64>, mode: &str, mode_json: &serde_json::Value, weights: &[(String, f64)], path: &Path, step: usize) -> Result<()> {
    let [task, _, hack] = evals::mode_values(mode_json, weights, path, step)?;
    let task = task.expect("task reward is always computed");
    values.insert((TASK_REWARD, mode.to_string()), task);
    if let Some(hack) = hack {
        values.insert((HACK_FREQ, mode.to_string()), hack);
        if mode == eval_mode::RETAIN_ONLY {
            values.insert((RETAIN_MINUS_HACK, mode.to_string()), task - hack);
        }
    }
    for (metric, key) in [(TRUE_HACK_FREQ, channel_key::TRUE_HACK_FREQ), (MONITORED_HACK_FREQ, channel_key::TRUE_HACK_FREQ_MONITORED), (UNMONITORED_HACK_FREQ, channel_key::TRUE_HACK_FREQ_UNMONITORED)] {
        if let Some(rate) = mode_json[key].as_f64() {
            values.insert((metric, mode.to_string()), rate);
        }
    }
    Ok(())
}

/// One mode's metrics over its hackable prompts (see [`run_values_over`]).
fn insert_hackable(values: &mut BTreeMap<(&'static str, String), f64>, mode: &str, mode_json: &serde_json::Value, weights: &[(String, f64)], path: &Path, step: usize) -> Result<()> {
    let Some(hackable) = mode_json[crate::eval::key::HACKABLE_N].as_u64() else { return Ok(()) };
    let n = mode_json[crate::eval::key::N].as_u64().with_context(|| format!("{}: step {step}, mode {mode} has `{}` but no `n`", path.display(), crate::eval::key::HACKABLE_N))?;
    match hackable {
        0 => Ok(()),
        h if h == n => insert_mode(values, mode, mode_json, weights, path, step),
        _ => insert_mode(values, mode, &crate::eval::hackable_view(mode_json), weights, path, step),
    }
}

/// Rows for every arm of the finished runs (`values`, [`finished_run_values`]; unfinished and
/// failed runs are left out and named on stdout), arms in name order, metrics and modes in a
/// fixed order.
pub fn rows(entries: &[RunEntry], values: &BTreeMap<String, RunValues>) -> Result<Vec<ArmRow>> {
    let finished: Vec<&RunEntry> = entries.iter().filter(|e| matches!(e.status, RunStatus::Ok | RunStatus::Cached)).collect();
    for left_out in entries.iter().filter(|e| !matches!(e.status, RunStatus::Ok | RunStatus::Cached)) {
        println!("arms: {} ({}) is left out of the arm summary", left_out.name, left_out.status.as_str());
    }
    let mut rows = Vec::new();
    for (arm, members) in plan::groups(&finished, |e| e.name.as_str()) {
        let role = if members.iter().all(|m| m.role == plan::RunRole::Baseline) { "baseline" } else { "run" };
        let mut samples: BTreeMap<(usize, &'static str, String), Vec<f64>> = BTreeMap::new();
        for member in &members {
            for ((metric, mode), value) in &values[&member.name] {
                samples.entry((metric_order(metric), *metric, mode.clone())).or_default().push(*value);
            }
        }
        for ((_, metric, mode), values) in samples {
            rows.push(ArmRow { arm: arm.clone(), role, metric, mode, stat: stats::mean_ci(&values) });
        }
    }
    Ok(rows)
}

fn metric_order(metric: &str) -> usize {
    [FINAL_REWARD, TASK_REWARD, HACK_FREQ, RETAIN_MINUS_HACK, TRUE_HACK_FREQ, MONITORED_HACK_FREQ, UNMONITORED_HACK_FREQ].iter().position(|m| *m == metric).expect("a known metric")
}

pub fn write_csv(path: &Path, rows: &[ArmRow]) -> Result<()> {
    let mut text = format!("{CSV_HEADER}\n");
    for r in rows {
        let (low, high) = r.stat.ci.map_or((String::new(), String::new()), |(l, h)| (l.to_string(), h.to_string()));
        text.push_str(&format!("{},{},{},{},{},{},{low},{high}\n", r.arm, r.role, r.metric, r.mode, r.stat.n, r.stat.mean));
    }
    crate::fsutil::write_atomic(path, text.as_bytes())
}

pub fn format_table(rows: &[ArmRow]) -> String {
    let width = rows.iter().map(|r| r.arm.len()).max().unwrap_or(3).max(3);
    let mut out = format!("{:<width$}  {:<17}  {:<11}  {:>5}  {:>7}  95% CI (bootstrap)", "arm", "metric", "mode", "seeds", "mean");
    for r in rows {
        let ci = r.stat.ci.map_or("-".to_string(), |(l, h)| format!("[{l:.3}, {h:.3}]"));
        out.push_str(&format!("\n{:<width$}  {:<17}  {:<11}  {:>5}  {:>7.3}  {ci}", r.arm, r.metric, r.mode, r.stat.n, r.stat.mean));
    }
    out
}
