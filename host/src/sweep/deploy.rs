//! `smallrl sweep --deploy`: the deployment protocol over a sweep's finished routed runs. Each
//! run's final checkpoint is evaluated by a `smallrl eval RUN --deploy` child (the base model's
//! rates, the forget-scale curve and the deployed scale, `eval::deployment`), `--jobs` at a time;
//! a run whose `deployment.json` matches its final step, the curve and its `eval_samples` is not
//! evaluated again. `deployment.csv` lists every deployed run; the arm and environment tables
//! read each run's `base` and `deployed` modes from the same files (`arms::run_values`).

use std::ffi::OsString;
use std::path::Path;
use std::process::Child;

use anyhow::{Context, Result, bail};

use super::runner::{self, Launch};
use super::{RunEntry, RunStatus};
use crate::eval::deployment::{self, Deployment};
use crate::reward::monitor::key as channel_key;
use crate::routing::RoutingMode;

pub const CSV: &str = "deployment.csv";
pub const CSV_HEADER: &str = "run,step,n,base_monitored,base_unmonitored,base_all,deployed_forget_scale,monitored,unmonitored,all,reward";

/// A run the protocol applies to: finished, routed (routing or placebo) with retain and forget
/// adapters.
pub fn applies(entry: &RunEntry) -> bool {
    matches!(entry.status, RunStatus::Ok | RunStatus::Cached) && entry.config.routing_mode != RoutingMode::None && matches!(entry.config.adapter, crate::adapters::AdapterKind::DualLora | crate::adapters::AdapterKind::DualMlp)
}

/// Whether `run_dir`'s deployment is the one `--deploy` would compute now.
fn is_current(entry: &RunEntry) -> Result<bool> {
    Ok(deployment::read(&entry.dir)?.is_some_and(|d| d.step == entry.config.max_steps && d.n_samples == entry.config.eval_samples && d.forget_scales == crate::defaults::DEPLOY_FORGET_SCALES))
}

/// Evaluates every run the protocol applies to that lacks a current deployment, `jobs` children
/// at a time; a failed evaluation leaves the others to finish, then fails the sweep naming each
/// failed run, its log and the cause the log ends with.
pub fn run(output_dir: &Path, entries: &[RunEntry], jobs: usize, launch: &Launch) -> Result<()> {
    let mut pending = Vec::new();
    for entry in entries.iter().filter(|e| applies(e)) {
        if !is_current(entry)? {
            pending.push(entry);
        }
    }
    println!("[DEPLOY] {} routed run(s) to evaluate for deployment", pending.len());
    let logs = output_dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    // Every run is evaluated before a failure stops the sweep: one hostile run spoils no other.
    let mut failed = Vec::new();
    for batch in pending.chunks(jobs.max(1)) {
        let children = batch.iter().map(|entry| spawn(entry, &logs, launch)).collect::<Result<Vec<(Child, &RunEntry, std::path::PathBuf)>>>()?;
        for (mut child, entry, log) in children {
            let status = child.wait().with_context(|| format!("waiting for the deployment evaluation of {}", entry.name))?;
            match status.success() {
                true => println!("[DEPLOY] {} done", entry.name),
                false => {
                    println!("[DEPLOY] {} FAILED (see {})", entry.name, log.display());
                    failed.push(format!("{} ({status}; see {}): {}", entry.name, log.display(), logged_cause(&log)));
                }
            }
        }
    }
    if !failed.is_empty() {
        bail!("the deployment evaluation failed for {}", failed.join("; "));
    }
    Ok(())
}

/// The last line of a failed child's error in its log (before the backtrace): its cause.
fn logged_cause(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let error = text.split("Stack backtrace:").next().unwrap_or_default();
    // The child's own error: plugin text in it is already bounded and cleaned.
    error.lines().map(str::trim).filter(|line| !line.is_empty()).last().unwrap_or("no cause logged").to_string()
}

fn spawn<'a>(entry: &'a RunEntry, logs: &Path, launch: &Launch) -> Result<(Child, &'a RunEntry, std::path::PathBuf)> {
    let log_path = logs.join(format!("{}.deploy.log", entry.name));
    let args: Vec<OsString> = vec!["eval".into(), entry.dir.clone().into(), "--deploy".into(), "--threads".into(), launch.threads_per_run.to_string().into()];
    Ok((runner::spawn_logged(&launch.exe, &args, &log_path)?, entry, log_path))
}

/// `deployment.csv`: one row per run with a deployment, in the entries' order.
pub fn write_csv(output_dir: &Path, entries: &[RunEntry]) -> Result<Option<std::path::PathBuf>> {
    let mut text = format!("{CSV_HEADER}\n");
    let mut rows = 0;
    for entry in entries.iter().filter(|e| applies(e)) {
        let Some(deployment) = deployment::read(&entry.dir)? else { continue };
        text.push_str(&row(&entry.name, &deployment));
        rows += 1;
    }
    if rows == 0 {
        return Ok(None);
    }
    let path = output_dir.join(CSV);
    crate::fsutil::write_atomic(&path, text.as_bytes())?;
    Ok(Some(path))
}

fn row(run: &str, d: &Deployment) -> String {
    let cell = |values: &serde_json::Value, key: &str| values[key].as_f64().map_or(String::new(), |v| v.to_string());
    let channels = |values: &serde_json::Value| [channel_key::TRUE_HACK_FREQ_MONITORED, channel_key::TRUE_HACK_FREQ_UNMONITORED, channel_key::TRUE_HACK_FREQ].map(|k| cell(values, k)).join(",");
    format!("{run},{},{},{},{},{},{}\n", d.step, d.n_samples, channels(d.base()), d.deployed_forget_scale, channels(d.deployed()), cell(d.deployed(), crate::eval::key::REWARD))
}
