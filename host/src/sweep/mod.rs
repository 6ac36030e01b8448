//! Sweeps: a grid of training runs with automatic non-routed baselines, run as
//! `smallrl train` child processes (or emitted as a SLURM array), then a summary table and
//! charts built from the run directories alone, so `--collect` gives the same results.
//!
//! Depends on the training configuration and run naming (`train::config`) and the run-log
//! readers (`train::runlog`), never on the model: a sweep only reads what runs wrote.

pub mod arms;
pub mod charts;
pub mod compare;
pub mod compare_chart;
pub mod deploy;
pub mod draw;
pub mod environments;
pub mod estimate;
pub mod evals;
pub mod pareto;
pub mod pareto_environments;
pub mod plan;
pub mod plot;
pub mod runner;
pub mod slurm;
pub mod summary;
mod viewer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

use crate::train::TrainConfig;
use plan::{Plan, RunRole};

/// How a run of the sweep ended (or was found).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Ok,
    /// Finished in an earlier sweep and reused.
    Cached,
    Failed,
    /// Found by `--collect` without the final checkpoint and evaluation.
    Incomplete,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Cached => "CACHED",
            Self::Failed => "FAIL",
            Self::Incomplete => "INCOMPLETE",
        }
    }
}

/// One run directory as the summary and the charts see it.
#[derive(Debug, Clone)]
pub struct RunEntry {
    pub name: String,
    pub dir: PathBuf,
    pub config: TrainConfig,
    pub role: RunRole,
    /// Directory name of the run's non-routed baseline, for routed runs.
    pub baseline: Option<String>,
    pub status: RunStatus,
}

/// The entries of an executed plan, with the statuses the runner reported.
pub fn entries_of_plan(plan: &Plan, statuses: &BTreeMap<String, RunStatus>) -> Vec<RunEntry> {
    plan.runs
        .iter()
        .map(|run| RunEntry {
            name: run.name.clone(),
            dir: run.dir(&plan.output_dir),
            config: run.config.clone(),
            role: run.role,
            baseline: run.baseline.clone(),
            status: statuses.get(&run.name).copied().unwrap_or(RunStatus::Failed),
        })
        .collect()
}

/// The run directories already in `dir` (those with a `config.yaml`, except runs moved aside),
/// for `--collect`.
pub fn collect_entries(dir: &Path) -> Result<Vec<RunEntry>> {
    let listing = std::fs::read_dir(dir).with_context(|| format!("cannot list {} (--collect needs a sweep output directory)", dir.display()))?;
    let moved_aside = |p: &PathBuf| p.file_name().is_some_and(|n| n.to_string_lossy().contains(runner::MOVED_ASIDE));
    let is_run = |p: &PathBuf| p.join("config.yaml").is_file() && !moved_aside(p);
    let mut run_dirs: Vec<PathBuf> = listing.filter_map(|e| e.ok()).map(|e| e.path()).filter(is_run).collect();
    run_dirs.sort();
    ensure!(!run_dirs.is_empty(), "{} has no run directories (subdirectories with a config.yaml)", dir.display());
    let mut entries = Vec::new();
    for run_dir in run_dirs {
        let config = plan::saved_config(&run_dir)?;
        let status = if plan::is_finished(&run_dir, config.max_steps)? { RunStatus::Ok } else { RunStatus::Incomplete };
        let baseline = plan::baseline_of(&config)?.map(|b| b.run_name()).transpose()?;
        let name = run_dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
        entries.push(RunEntry { name, dir: run_dir, config, role: RunRole::Grid, baseline, status });
    }
    let referenced: Vec<Option<String>> = entries.iter().map(|e| e.baseline.clone()).collect();
    for entry in &mut entries {
        entry.role = plan::role_of(&entry.name, &referenced);
    }
    Ok(entries)
}

/// Summary table (printed, and `summary.csv`), the arms' and environments' tables
/// (`arms.csv`, `environments.csv`) and charts for finished runs.
pub fn report(output_dir: &Path, entries: &[RunEntry]) -> Result<()> {
    let rows = summary::rows(entries)?;
    println!("{}", summary::format_table(&rows));
    let csv = output_dir.join("summary.csv");
    summary::write_csv(&csv, &rows)?;
    println!("summary: {}", csv.display());
    if let Some(path) = deploy::write_csv(output_dir, entries)? {
        println!("deployment: {}", path.display());
    }
    let (arm_rows, env_rows) = tables(output_dir, entries, arms::Reading::Final)?;
    let index = charts::write_all(&output_dir.join("charts"), entries, &arm_rows, env_rows.as_deref())?;
    println!("charts: {}", index.display());
    Ok(())
}

/// The arms' and environments' tables in the paper's reading ([`arms::Reading::LastTenth`]),
/// beside the final-evaluation ones: `arms_last_tenth.csv`, `environments_last_tenth.csv`.
pub fn report_last_tenth(output_dir: &Path, entries: &[RunEntry]) -> Result<()> {
    println!("the paper's reading: each run's last max(1, n // 10) routing evaluations averaged");
    tables(output_dir, entries, arms::Reading::LastTenth).map(|_| ())
}

/// The file a table of `reading` is written to: `<stem>.csv`, or `<stem>_<reading>.csv` for a
/// reading other than the final evaluation's.
pub fn table_file(output_dir: &Path, stem: &str, reading: arms::Reading) -> PathBuf {
    match reading {
        arms::Reading::Final => output_dir.join(format!("{stem}.csv")),
        other => output_dir.join(format!("{stem}_{}.csv", other.name())),
    }
}

/// Prints and writes the arms' and environments' tables of `reading`; the environments' is
/// None when its cells pool more than seeds.
fn tables(output_dir: &Path, entries: &[RunEntry], reading: arms::Reading) -> Result<(Vec<arms::ArmRow>, Option<Vec<environments::EnvRow>>)> {
    let run_values = arms::finished_run_values_read(entries, reading)?;
    let arm_rows = arms::rows(entries, &run_values)?;
    println!("{}", arms::format_table(&arm_rows));
    let arms_csv = table_file(output_dir, "arms", reading);
    arms::write_csv(&arms_csv, &arm_rows)?;
    println!("arms: {}", arms_csv.display());
    let cells = environments::cells(entries);
    let env_rows = match environments::pooling_problem(&cells)? {
        Some(why) => {
            println!("environments: {} is not written: {why}", table_file(Path::new(""), "environments", reading).display());
            None
        }
        None => {
            let rows = environments::rows(&cells, &run_values);
            println!("{}", environments::format_table(&rows));
            let csv = table_file(output_dir, "environments", reading);
            environments::write_csv(&csv, &rows)?;
            println!("environments: {}", csv.display());
            Some(rows)
        }
    };
    Ok((arm_rows, env_rows))
}
