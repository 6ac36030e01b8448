//! The sweep's table per environment (`environments.csv`): the suite's matrix read as the
//! original reads it, one cell per (environment, intervention arm, routing mode, hack_frac,
//! recall), and per cell and metric/mode the mean over its seeds with a 95% bootstrap interval
//! ([`crate::stats::mean_ci`], as `arms.rs`). Every value comes from [`arms::run_values`], so
//! each metric and mode it yields appears here too; the cell's keys come from each run's saved
//! `config.yaml`, never from its name.
//!
//! Environment: the run's `environment` (a path's file stem), else its reward components'
//! names joined by `+`, else `-`. A cell pools seeds only: when two runs of one cell differ in
//! any other key (a grid over `lr`, say) the table is not written, and the sweep says which key.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;

use super::plan::{self, Arm};
use super::{RunEntry, RunStatus, arms};
use crate::stats::{self, MeanCi};

pub const CSV_HEADER: &str = "environment,intervention,routing_mode,hack_frac,recall,metric,mode,seeds,mean,ci_low,ci_high";

/// A cell's place in the table: environment, arm, routing mode, hack_frac's and recall's bits.
type CellKey = (String, Arm, String, u64, u64);

/// What the table's cells are keyed by (the order of its rows).
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub environment: String,
    pub arm: Arm,
    pub routing_mode: String,
    pub hack_frac: f64,
    pub recall: f64,
}

impl Cell {
    pub fn of(config: &crate::train::TrainConfig) -> Cell {
        Cell { environment: environment_of(config), arm: Arm::of(config), routing_mode: config.routing_mode.to_string(), hack_frac: config.hack_frac, recall: config.recall }
    }

    /// Sorts by environment, arm, routing mode, then hack_frac and recall as numbers.
    fn order_key(&self) -> CellKey {
        // Both are validated fractions in [0, 1]; non-negative floats' bits order as the numbers do.
        (self.environment.clone(), self.arm, self.routing_mode.clone(), self.hack_frac.abs().to_bits(), self.recall.abs().to_bits())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct EnvRow {
    pub cell: Cell,
    pub metric: &'static str,
    pub mode: String,
    pub stat: MeanCi,
}

/// The name a run's environment goes by in the table and the chart.
pub fn environment_of(config: &crate::train::TrainConfig) -> String {
    if let Some(environment) = &config.environment {
        return Path::new(environment).file_stem().map_or(environment.clone(), |s| s.to_string_lossy().into_owned());
    }
    match &config.reward {
        Some(reward) => reward.component_specs().iter().map(|c| c.display_name()).collect::<Vec<_>>().join("+"),
        None => "-".to_string(),
    }
}

/// The finished runs (OK or cached) grouped by cell, cells in table order.
pub fn cells(entries: &[RunEntry]) -> Vec<(Cell, Vec<&RunEntry>)> {
    let mut cells: BTreeMap<CellKey, (Cell, Vec<&RunEntry>)> = BTreeMap::new();
    for entry in entries.iter().filter(|e| matches!(e.status, RunStatus::Ok | RunStatus::Cached)) {
        let cell = Cell::of(&entry.config);
        cells.entry(cell.order_key()).or_insert_with(|| (cell, Vec::new())).1.push(entry);
    }
    cells.into_values().collect()
}

/// Why the cells are not seeds of one setting each (two runs of a cell that differ in another
/// key than the seed), or None when they are.
pub fn pooling_problem(cells: &[(Cell, Vec<&RunEntry>)]) -> Result<Option<String>> {
    for (cell, members) in cells {
        for other in &members[1..] {
            let differing = plan::differing_besides_seed(&members[0].config, &other.config)?;
            if !differing.is_empty() {
                return Ok(Some(format!(
                    "{} and {} share the cell (environment {}, intervention {}, routing_mode {}, hack_frac {}, recall {}) but differ in {differing:?}; the table pools seeds only (see arms.csv)",
                    members[0].name,
                    other.name,
                    cell.environment,
                    cell.arm.name(),
                    cell.routing_mode,
                    cell.hack_frac,
                    cell.recall
                )));
            }
        }
    }
    Ok(None)
}

/// Rows of every cell from its runs' `values` ([`arms::finished_run_values`]), metrics and
/// modes in `run_values`' order (by name).
pub fn rows(cells: &[(Cell, Vec<&RunEntry>)], values: &BTreeMap<String, arms::RunValues>) -> Vec<EnvRow> {
    let mut rows = Vec::new();
    for (cell, members) in cells {
        let mut samples: BTreeMap<(&'static str, String), Vec<f64>> = BTreeMap::new();
        for member in members {
            for (key, value) in &values[&member.name] {
                samples.entry(key.clone()).or_default().push(*value);
            }
        }
        for ((metric, mode), values) in samples {
            rows.push(EnvRow { cell: cell.clone(), metric, mode, stat: stats::mean_ci(&values) });
        }
    }
    rows
}

pub fn write_csv(path: &Path, rows: &[EnvRow]) -> Result<()> {
    let mut text = format!("{CSV_HEADER}\n");
    for r in rows {
        let c = &r.cell;
        let (low, high) = r.stat.ci.map_or((String::new(), String::new()), |(l, h)| (l.to_string(), h.to_string()));
        text.push_str(&format!("{},{},{},{},{},{},{},{},{},{low},{high}\n", c.environment, c.arm.name(), c.routing_mode, c.hack_frac, c.recall, r.metric, r.mode, r.stat.n, r.stat.mean));
    }
    crate::fsutil::write_atomic(path, text.as_bytes())
}

pub fn format_table(rows: &[EnvRow]) -> String {
    let width = rows.iter().map(|r| r.cell.environment.len()).max().unwrap_or(11).max(11);
    let mut out = format!("{:<width$}  {:<12}  {:<9}  {:>9}  {:>6}  {:<17}  {:<11}  {:>5}  {:>7}  95% CI (bootstrap)", "environment", "intervention", "routing", "hack_frac", "recall", "metric", "mode", "seeds", "mean");
    for r in rows {
        let c = &r.cell;
        let ci = r.stat.ci.map_or("-".to_string(), |(l, h)| format!("[{l:.3}, {h:.3}]"));
        out.push_str(&format!(
            "\n{:<width$}  {:<12}  {:<9}  {:>9}  {:>6}  {:<17}  {:<11}  {:>5}  {:>7.3}  {ci}",
            c.environment,
            c.arm.name(),
            c.routing_mode,
            c.hack_frac,
            c.recall,
            r.metric,
            r.mode,
            r.stat.n,
            r.stat.mean
        ));
    }
    out
}
