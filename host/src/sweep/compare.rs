//! `smallrl sweep --collect DIR --compare REFERENCE`: the sweep's cells beside the original
//! paper's (`aggregated_cache.json`, copied unchanged from its repository; see
//! `shared/reference/graft-7env/README.md`). Each of our runs is read as the paper reads one
//! ([`Reading::LastTenth`]: the mean of its last max(1, n // 10) routing evaluations), then
//! mean and population std over seeds, as the paper's cells are.
//!
//! Environments map by name ([`PAPER_ENVIRONMENTS`]); arms by [`PAPER_ARMS`]: the routed arm
//! in `retain_only`, the others in `both`, the penalty dose named on both sides. A paper arm
//! without runs here (or that smallrl lacks, such as `base`) is a row without our values and
//! a note: listed, never guessed. The paper's `verif` ran 500 steps where the others ran 2000
//! (1000): scripts/paper-matrix.sh plans it so. With the paper's `_hackable` file both sides
//! are read over the hackable evaluation prompts only ([`Prompts::Hackable`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use super::arms::{self, HACK_FREQ, Prompts, Reading, TASK_REWARD, TRUE_HACK_FREQ};
use super::environments::environment_of;
use super::compare_chart;
use super::plan::Arm;
use crate::intervention::Intervention;
use super::{RunEntry, RunStatus};
use crate::routing::eval_mode;
use crate::train::config::TrainConfig;
use crate::stats;

/// The reference file read from the folder `--compare` names (over all evaluation prompts).
pub const REFERENCE_FILE: &str = "aggregated_cache.json";
/// The same over the hackable evaluation prompts only, read too when the folder holds it.
pub const HACKABLE_REFERENCE_FILE: &str = "aggregated_cache_hackable.json";
/// The comparison's files in the sweep's directory (one CSV, a chart per set of prompts).
pub const CSV_FILE: &str = "compare.csv";
pub const CHART_FILE: &str = "compare.png";
pub const HACKABLE_CHART_FILE: &str = "compare_hackable.png";

/// (our environment, the paper's name for it).
pub const PAPER_ENVIRONMENTS: [(&str, &str); 7] =
    [("addition", "addition_v2"), ("cities_qa", "cities_qa"), ("object_qa", "object_qa"), ("persona_qa", "persona_qa"), ("repeat", "repeat_extra"), ("sorting", "sorting_copy"), ("topic", "topic_contains")];

/// (the paper's arm, ours (None: smallrl has none), the mode it is read in, why not compared).
pub const PAPER_ARMS: [(&str, Option<Arm>, &str, &str); 7] = [
    ("gr", Some(Arm::Intervention(Intervention::Routing)), eval_mode::RETAIN_ONLY, ""),
    ("noi", Some(Arm::None), eval_mode::BOTH, ""),
    ("noi_ro", Some(Arm::None), eval_mode::RETAIN_ONLY, ""),
    ("filt", Some(Arm::Intervention(Intervention::Filter)), eval_mode::BOTH, ""),
    ("best_rp", Some(Arm::Intervention(Intervention::Penalty)), eval_mode::BOTH, ""),
    ("verif", Some(Arm::Intervention(Intervention::Verified)), eval_mode::BOTH, ""),
    ("base", None, eval_mode::BOTH, "the model before training (the first evaluation) is not compared"),
];

pub const CSV_HEADER: &str = "environment,paper_environment,paper_arm,intervention,mode,dose,hack_frac,recall,seeds,retain_mean,retain_std,hack_mean,hack_std,true_hack_mean,true_hack_std,paper_dose,paper_seeds,paper_retain_mean,paper_retain_std,paper_hack_mean,paper_hack_std,retain_diff,hack_diff,note,prompts";

/// A cell of the paper: mean and population std over its seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct PaperCell {
    pub retain: (f64, f64),
    pub hack: (f64, f64),
    pub seeds: usize,
    /// `best_rp`'s dose (its `label`, e.g. `v=5`).
    pub label: Option<String>,
}

/// The paper's cells: environment → arm → cell.
pub type Reference = BTreeMap<String, BTreeMap<String, PaperCell>>;

/// Our cell: (mean, population std) over the seeds of retain reward, the detector's flag rate
/// and, when every seed has it, the ground truth.
#[derive(Debug, Clone, PartialEq)]
pub struct OurCell {
    pub seeds: usize,
    pub retain: (f64, f64),
    pub hack: (f64, f64),
    pub true_hack: Option<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompareRow {
    pub environment: String,
    pub paper_environment: String,
    pub paper_arm: String,
    /// Over which evaluation prompts both sides are read.
    pub prompts: Prompts,
    pub arm: Option<Arm>,
    pub mode: &'static str,
    /// `rh_penalty=<v>` for a penalty arm, else empty.
    pub dose: String,
    pub hack_frac: Option<f64>,
    pub recall: Option<f64>,
    pub ours: Option<OurCell>,
    pub paper: PaperCell,
    pub note: String,
}

impl CompareRow {
    /// (ours − paper) / the larger of the two spreads, for retain and hack (None without our
    /// cell, or when both spreads are 0 and the means differ).
    pub fn differences(&self) -> [Option<f64>; 2] {
        let Some(ours) = &self.ours else { return [None, None] };
        [(ours.retain, self.paper.retain), (ours.hack, self.paper.hack)].map(|((m, s), (pm, ps))| difference(m, s, pm, ps))
    }
}

/// (ours − paper) in units of the larger spread.
pub fn difference(ours: f64, our_std: f64, paper: f64, paper_std: f64) -> Option<f64> {
    let spread = our_std.max(paper_std);
    match (spread > 0.0, ours == paper) {
        (true, _) => Some((ours - paper) / spread),
        (false, true) => Some(0.0),
        (false, false) => None,
    }
}

/// Reads the paper's cells from `path`: a folder holding [`REFERENCE_FILE`], or the file.
pub fn read_reference(path: &Path) -> Result<Reference> {
    let file: PathBuf = if path.is_dir() { path.join(REFERENCE_FILE) } else { path.to_path_buf() };
    let text = std::fs::read_to_string(&file).with_context(|| format!("--compare: cannot read the reference file {}", file.display()))?;
    let json: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", file.display()))?;
    let at = |what: String| format!("{}: {what}", file.display());
    let environments = json.as_object().with_context(|| at("expected an object of environments".into()))?;
    let mut reference = Reference::new();
    for (environment, arms) in environments {
        let arms = arms.as_object().with_context(|| at(format!("environment `{environment}` is not an object of arms")))?;
        let mut cells = BTreeMap::new();
        for (arm, value) in arms {
            let place = format!("environment `{environment}`, arm `{arm}`");
            let (values, label) = match value {
                Value::Object(o) => {
                    let label = o.get("label").and_then(Value::as_str).with_context(|| at(format!("{place}: an object needs a string `label`")))?;
                    (o.get("agg").with_context(|| at(format!("{place}: an object needs `agg`")))?, Some(label.to_string()))
                }
                other => (other, None),
            };
            cells.insert(arm.clone(), paper_cell(values, label).with_context(|| at(place))?);
        }
        reference.insert(environment.clone(), cells);
    }
    ensure!(!reference.is_empty(), "{}: no environments", file.display());
    Ok(reference)
}

fn paper_cell(values: &Value, label: Option<String>) -> Result<PaperCell> {
    let shape = "expected [retain_mean, retain_std, hack_mean, hack_std, n_seeds]";
    let list = values.as_array().with_context(|| format!("{shape}, got {values}"))?;
    ensure!(list.len() == 5, "{shape}, got {} values", list.len());
    let numbers: Vec<f64> = list.iter().map(|v| v.as_f64().with_context(|| format!("{shape}, got {v}"))).collect::<Result<_>>()?;
    ensure!(numbers.iter().all(|v| v.is_finite()) && numbers[1] >= 0.0 && numbers[3] >= 0.0, "{shape}: finite, the spreads non-negative; got {numbers:?}");
    let seeds = numbers[4];
    if seeds < 1.0 || seeds.fract() != 0.0 {
        bail!("{shape}: n_seeds {seeds} is not a positive whole number");
    }
    Ok(PaperCell { retain: (numbers[0], numbers[1]), hack: (numbers[2], numbers[3]), seeds: seeds as usize, label })
}

/// The paper's name of our environment.
pub fn paper_environment(ours: &str) -> Option<&'static str> {
    PAPER_ENVIRONMENTS.iter().find(|(o, p)| *o == ours || *p == ours).map(|(_, p)| *p)
}

/// A group of our runs: environment, arm, dose, hack_frac and recall (as text, for ordering).
type GroupKey = (String, Arm, String, String, String);

/// The rows: per environment of ours the paper has, per paper arm, a row per group of our runs
/// of that arm (one per dose, hack_frac and recall), or one without ours naming why; both sides
/// over `prompts` (the reference must be of the same prompts). Prints what is left out
/// (environments either side lacks).
pub fn rows(entries: &[RunEntry], reference: &Reference, prompts: Prompts) -> Result<Vec<CompareRow>> {
    let finished: Vec<&RunEntry> = entries.iter().filter(|e| matches!(e.status, RunStatus::Ok | RunStatus::Cached)).collect();
    let mut groups: BTreeMap<GroupKey, Vec<&RunEntry>> = BTreeMap::new();
    for entry in &finished {
        let c = &entry.config;
        let dose = if Arm::of(c) == Arm::Intervention(Intervention::Penalty) { penalty_dose(c) } else { String::new() };
        groups.entry((environment_of(c), Arm::of(c), dose, c.hack_frac.to_string(), c.recall.to_string())).or_default().push(entry);
    }
    let ours: Vec<String> = groups.keys().map(|k| k.0.clone()).fold(Vec::new(), |mut v, e| {
        if !v.contains(&e) {
            v.push(e);
        }
        v
    });
    let mut rows = Vec::new();
    for environment in &ours {
        let Some(paper_env) = paper_environment(environment).filter(|p| reference.contains_key(*p)) else {
            println!("compare: environment {environment} is not in the reference; left out");
            continue;
        };
        for (paper_arm, arm, mode, why) in PAPER_ARMS {
            let Some(paper) = reference[paper_env].get(paper_arm) else { continue };
            let base = CompareRow { environment: environment.clone(), paper_environment: paper_env.to_string(), paper_arm: paper_arm.to_string(), prompts, arm, mode, dose: String::new(), hack_frac: None, recall: None, ours: None, paper: paper.clone(), note: why.to_string() };
            let mine: Vec<(&GroupKey, &Vec<&RunEntry>)> = groups.iter().filter(|(k, _)| k.0 == *environment && Some(k.1) == arm).collect();
            if arm.is_some() && mine.is_empty() {
                rows.push(CompareRow { note: format!("no finished {} runs here", arm.map_or("", |a| a.name())), ..base });
                continue;
            }
            if arm.is_none() {
                rows.push(base);
                continue;
            }
            for ((_, _, dose, _, _), members) in mine {
                let c = &members[0].config;
                let row = CompareRow { dose: dose.clone(), hack_frac: Some(c.hack_frac), recall: Some(c.recall), ..base.clone() };
                // The paper's best_rp is one dose of its battery: the row of that dose says so.
                let picked = arm == Some(Arm::Intervention(Intervention::Penalty)) && paper_rp_label(c).is_some() && paper_rp_label(c) == paper.label;
                let note = if picked { format!("the paper's best_rp dose ({})", paper.label.as_deref().unwrap_or_default()) } else { String::new() };
                rows.push(match our_cell(members, mode, prompts)? {
                    Ok(cell) => CompareRow { ours: Some(cell), note, ..row },
                    Err(why) => CompareRow { note: why, ..row },
                });
            }
        }
    }
    let missing: Vec<&String> = reference.keys().filter(|p| !ours.iter().any(|o| paper_environment(o) == Some(p.as_str()))).collect();
    if !missing.is_empty() {
        println!("compare: the reference's environments without runs here: {missing:?}");
    }
    Ok(rows)
}

/// Our dose of a penalty run, by the keys that make the doses of the paper's `best_rp` battery:
/// `rh_penalty=<p>`, then `rp_extra_retain_advantage_multiplier=<v>` when it is not 1 and, with
/// coherence rows, `coherence:main=<coherence rows>:<the others>`; runs of different doses are
/// different rows.
pub fn penalty_dose(c: &TrainConfig) -> String {
    let mut dose = format!("rh_penalty={}", c.rh_penalty);
    if c.rp_extra_retain_advantage_multiplier != 1.0 {
        dose.push_str(&format!(" rp_extra_retain_advantage_multiplier={}", c.rp_extra_retain_advantage_multiplier));
    }
    if c.coh_samples_per_rollout > 0 {
        dose.push_str(&format!(" coherence:main={}:{}", c.coh_samples_per_rollout, c.batch_size - c.coh_samples_per_rollout));
    }
    dose
}

/// The paper's label of a penalty run's dose in its `best_rp` battery (the original's
/// figures_pareto/proto_pareto_data.py, all_rp_variants: one key moved from the canonical
/// penalty 2, multiplier 1, 32 coherence rows beside 512): `canonical`, `p=5`, `p=10`, `v=2`,
/// `v=5` (rp_extra_retain_advantage_multiplier), `1:4`, `1:2`, `1:1` (coherence:main 128:512,
/// 192:384, 256:256); None off the battery.
pub fn paper_rp_label(c: &TrainConfig) -> Option<String> {
    let (p, v) = (c.rh_penalty, c.rp_extra_retain_advantage_multiplier);
    let rows = (c.coh_samples_per_rollout, c.batch_size.saturating_sub(c.coh_samples_per_rollout));
    let canonical_rows = rows == (32, 512);
    match () {
        _ if p == 2.0 && v == 1.0 && canonical_rows => Some("canonical".into()),
        _ if (p == 5.0 || p == 10.0) && v == 1.0 && canonical_rows => Some(format!("p={p}")),
        _ if p == 2.0 && (v == 2.0 || v == 5.0) && canonical_rows => Some(format!("v={v}")),
        _ if p == 2.0 && v == 1.0 => [((128, 512), "1:4"), ((192, 384), "1:2"), ((256, 256), "1:1")].iter().find(|(r, _)| *r == rows).map(|(_, l)| l.to_string()),
        _ => None,
    }
}

/// Our cell of `members` in `mode` over `prompts` (the paper's reading), or why there is none
/// (the mode was not evaluated, the runs have no detector, or no hackable prompts recorded).
fn our_cell(members: &[&RunEntry], mode: &str, prompts: Prompts) -> Result<std::result::Result<OurCell, String>> {
    let mut samples: [Vec<f64>; 3] = Default::default();
    for member in members {
        let values = arms::run_values_over(member, Reading::LastTenth, prompts).with_context(|| format!("reading the results of {}", member.name))?;
        for (metric, sample) in [TASK_REWARD, HACK_FREQ, TRUE_HACK_FREQ].iter().zip(samples.iter_mut()) {
            if let Some(v) = values.get(&(*metric, mode.to_string())) {
                sample.push(*v);
            }
        }
    }
    let n = members.len();
    if samples[0].len() < n || samples[1].len() < n {
        let over = match prompts {
            Prompts::All => "",
            Prompts::Hackable => " over hackable prompts (none among the evaluation prompts, or evaluations from before hackable/n was recorded)",
        };
        return Ok(Err(format!("not every run has task_reward and hack_freq in {mode}{over}")));
    }
    let stat = |v: &[f64]| (stats::mean(v), stats::population_std(v));
    let true_hack = (samples[2].len() == n).then(|| stat(&samples[2]));
    Ok(Ok(OurCell { seeds: n, retain: stat(&samples[0]), hack: stat(&samples[1]), true_hack }))
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

pub fn write_csv(path: &Path, rows: &[CompareRow]) -> Result<()> {
    let mut text = format!("{CSV_HEADER}\n");
    for r in rows {
        let o = r.ours.as_ref();
        let p = &r.paper;
        let [retain_diff, hack_diff] = r.differences();
        let ours = [o.map(|o| o.seeds as f64), o.map(|o| o.retain.0), o.map(|o| o.retain.1), o.map(|o| o.hack.0), o.map(|o| o.hack.1), o.and_then(|o| o.true_hack.map(|t| t.0)), o.and_then(|o| o.true_hack.map(|t| t.1))].map(opt).join(",");
        text.push_str(&format!(
            "{},{},{},{},{},{},{},{},{ours},{},{},{},{},{},{},{},{},{},{}\n",
            r.environment,
            r.paper_environment,
            r.paper_arm,
            r.arm.map_or("", |a| a.name()),
            r.mode,
            r.dose,
            opt(r.hack_frac),
            opt(r.recall),
            p.label.as_deref().unwrap_or(""),
            p.seeds,
            p.retain.0,
            p.retain.1,
            p.hack.0,
            p.hack.1,
            opt(retain_diff),
            opt(hack_diff),
            r.note.replace(',', ";"),
            r.prompts.name()
        ));
    }
    crate::fsutil::write_atomic(path, text.as_bytes())
}

pub fn format_table(rows: &[CompareRow]) -> String {
    let width = rows.iter().map(|r| r.environment.len()).max().unwrap_or(11).max(11);
    let mut out = format!(
        "{:<width$}  {:<8}  {:<11}  {:<15}  {:>5}  {:>15}  {:>15}  {:>15}  {:>5}  {:>15}  {:>15}  {:>6}  {:>6}  note",
        "environment", "paper", "mode", "dose", "seeds", "retain", "hack (detector)", "hack (truth)", "paper", "paper retain", "paper hack", "d ret", "d hack"
    );
    let pair = |(m, s): (f64, f64)| format!("{m:.3} ± {s:.3}");
    let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:+.2}"));
    for r in rows {
        let [dr, dh] = r.differences();
        let (seeds, retain, hack) = r.ours.as_ref().map_or(("-".into(), "-".into(), "-".into()), |o| (o.seeds.to_string(), pair(o.retain), pair(o.hack)));
        let truth = r.ours.as_ref().and_then(|o| o.true_hack).map_or("-".into(), pair);
        let dose = match (&r.dose, &r.paper.label) {
            (d, Some(l)) => format!("{d} ({l})"),
            (d, None) => d.clone(),
        };
        out.push_str(&format!(
            "\n{:<width$}  {:<8}  {:<11}  {dose:<15}  {seeds:>5}  {retain:>15}  {hack:>15}  {truth:>15}  {:>5}  {:>15}  {:>15}  {:>6}  {:>6}  {}",
            r.environment,
            r.paper_arm,
            r.mode,
            r.paper.seeds,
            pair(r.paper.retain),
            pair(r.paper.hack),
            num(dr),
            num(dh),
            r.note
        ));
    }
    out
}

/// The chart's panels: environment → its marks, in the rows' order.
pub fn panels(rows: &[CompareRow]) -> Vec<(String, Vec<compare_chart::Mark>)> {
    let mut panels: Vec<(String, Vec<compare_chart::Mark>)> = Vec::new();
    for r in rows {
        if !panels.iter().any(|(e, _)| *e == r.environment) {
            panels.push((r.environment.clone(), Vec::new()));
        }
        let marks = &mut panels.iter_mut().find(|(e, _)| *e == r.environment).expect("pushed above").1;
        let colour = compare_chart::colour_of_paper_arm(&r.paper_arm);
        let paper: compare_chart::Mark = (colour, r.paper.hack, r.paper.retain, false);
        if !marks.contains(&paper) {
            marks.push(paper);
        }
        if let Some(o) = &r.ours {
            marks.push((colour, o.hack, o.retain, true));
        }
    }
    panels
}

/// The reference files `path` names with the prompts each is over: a folder's
/// [`REFERENCE_FILE`] and, when it holds it, [`HACKABLE_REFERENCE_FILE`]; a file alone, over the
/// hackable prompts when its name ends in `_hackable.json`.
pub fn reference_files(path: &Path) -> Vec<(Prompts, PathBuf)> {
    if !path.is_dir() {
        let hackable = path.file_name().is_some_and(|n| n.to_string_lossy().ends_with("_hackable.json"));
        return vec![(if hackable { Prompts::Hackable } else { Prompts::All }, path.to_path_buf())];
    }
    let mut files = vec![(Prompts::All, path.join(REFERENCE_FILE))];
    if path.join(HACKABLE_REFERENCE_FILE).is_file() {
        files.push((Prompts::Hackable, path.join(HACKABLE_REFERENCE_FILE)));
    }
    files
}

/// `--compare`: per reference file ([`reference_files`]) prints the table and writes its chart
/// (`charts/`[`CHART_FILE`], [`HACKABLE_CHART_FILE`]); all rows in [`CSV_FILE`] in `dir`.
pub fn run(dir: &Path, entries: &[RunEntry], reference_path: &Path) -> Result<()> {
    let charts = dir.join("charts");
    std::fs::create_dir_all(&charts).with_context(|| format!("creating {}", charts.display()))?;
    let mut all_rows = Vec::new();
    for (prompts, file) in reference_files(reference_path) {
        let reference = read_reference(&file)?;
        let rows = rows(entries, &reference, prompts)?;
        ensure!(!rows.is_empty(), "--compare: none of the runs in {} is of an environment in {}", dir.display(), file.display());
        let over = match prompts {
            Prompts::All => "all evaluation prompts",
            Prompts::Hackable => "the hackable evaluation prompts only",
        };
        println!("compare over {over}, {} (the paper's reading: each run's last max(1, n // 10) evaluations; mean ± population std over seeds; hack: the detector's flag rate; d: (ours - paper) / the larger std)", file.display());
        println!("{}", format_table(&rows));
        let chart = charts.join(if prompts == Prompts::Hackable { HACKABLE_CHART_FILE } else { CHART_FILE });
        let mut arms: Vec<String> = Vec::new();
        for r in &rows {
            if !arms.contains(&r.paper_arm) {
                arms.push(r.paper_arm.clone());
            }
        }
        compare_chart::write(&chart, &panels(&rows), &arms)?;
        println!("compare chart: {}", chart.display());
        all_rows.extend(rows);
    }
    let csv = dir.join(CSV_FILE);
    write_csv(&csv, &all_rows)?;
    println!("compare: {}", csv.display());
    Ok(())
}
