//! The sweep's summary table: run, final reward, kl, step, status, read from the last line of
//! each run's `metrics.jsonl`; printed and written as CSV.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use super::RunEntry;
use crate::train::metrics::key;
use crate::runlog::Jsonl;

#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    pub run: String,
    pub role: &'static str,
    /// The training reward of the last logged step (None before the first step).
    pub final_reward: Option<f64>,
    pub kl: Option<f64>,
    pub step: Option<u64>,
    pub status: &'static str,
}

pub const CSV_HEADER: &str = "run,role,final_reward,kl,step,status";

pub fn rows(entries: &[RunEntry]) -> Result<Vec<SummaryRow>> {
    entries.iter().map(row).collect()
}

fn row(entry: &RunEntry) -> Result<SummaryRow> {
    let path = entry.dir.join("metrics.jsonl");
    let last = Jsonl::new(path.clone()).read()?.pop();
    let field = |key: &str| -> Result<Option<f64>> {
        match last.as_ref().map(|l| &l[key]) {
            // null: the trainer logged a non-finite value (JSON has no NaN); shown empty.
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => Err(anyhow::anyhow!("{}: `{key}` of the last line is {other}, not a number", path.display())),
        }
    };
    Ok(SummaryRow {
        run: entry.name.clone(),
        role: entry.role.as_str(),
        final_reward: field(key::REWARD).context("reading the final reward")?,
        kl: field(key::KL)?,
        step: field(key::STEP)?.map(|s| s as u64),
        status: entry.status.as_str(),
    })
}

/// Floats in full precision (shortest round-trip form), so the CSV reads back exactly.
fn cell(value: Option<f64>) -> String {
    value.map_or(String::new(), |v| v.to_string())
}

pub fn write_csv(path: &Path, rows: &[SummaryRow]) -> Result<()> {
    let mut text = format!("{CSV_HEADER}\n");
    for r in rows {
        let step = r.step.map_or(String::new(), |s| s.to_string());
        text.push_str(&format!("{},{},{},{},{step},{}\n", r.run, r.role, cell(r.final_reward), cell(r.kl), r.status));
    }
    crate::fsutil::write_atomic(path, text.as_bytes())
}

pub fn format_table(rows: &[SummaryRow]) -> String {
    let width = rows.iter().map(|r| r.run.len()).max().unwrap_or(3).max(3);
    let mut out = format!("{:<width$}  {:<8}  {:>8}  {:>8}  {:>6}  status", "run", "role", "reward", "kl", "step");
    for r in rows {
        let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
        let step = r.step.map_or("-".to_string(), |s| s.to_string());
        out.push_str(&format!("\n{:<width$}  {:<8}  {:>8}  {:>8}  {step:>6}  {}", r.run, r.role, num(r.final_reward), num(r.kl), r.status));
    }
    out
}
