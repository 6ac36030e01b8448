//! Charts of a sweep's routing evaluations, per experiment group (all seeds of one parameter
//! setting, plus their baselines): grouped bars per evaluation step (baseline, both,
//! retain_only, forget_only × task reward, total reward, hack frequency; mean ± sample std over
//! seeds), line charts over steps, an animated GIF across steps and an HTML viewer.
//!
//! Task reward = Σ scale × mean score over the reward components whose role is `retain` (the
//! true task); total reward = the combined reward the run optimised (`reward`, capped at
//! `max_reward`); the `forget` components (the hackable bonus) are in the total only. Roles and
//! scales come from each run's own `config.yaml`, the scores from its `routing_eval.jsonl`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::RunEntry;
use super::draw::{Area, FONT, SERIES, draw_legend, integer_label, register_font};
use super::evals::{EvalSource, run_evaluations};
use super::plan::{self, RunRole};
use crate::defaults;
use crate::routing::eval_mode;
use crate::eval;

const BASELINE: usize = 0;
pub const METRICS: [&str; 3] = ["task reward", "total reward", "hack frequency"];
/// The evaluation mode of a baseline run that stands for it in the charts.
const BASELINE_MODE: &str = eval_mode::BOTH;
pub const BAR_CHART_SIZE: (u32, u32) = (900, 560);
const LINE_CHART_SIZE: (u32, u32) = (1500, 480);

/// Mean and sample standard deviation (0 for one value) over seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub mean: f64,
    pub std: f64,
    pub n: usize,
}

impl Stat {
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        let mean = values.iter().sum::<f64>() / n.max(1) as f64;
        let var = if n > 1 { values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64 } else { 0.0 };
        Self { mean, std: var.sqrt(), n }
    }
}

/// One group's statistics: (step, series index, metric index) → stat over seeds.
#[derive(Debug, Clone)]
pub struct GroupData {
    pub group: String,
    pub steps: Vec<usize>,
    pub stats: BTreeMap<(usize, usize, usize), Stat>,
    pub source: EvalSource,
}

impl GroupData {
    pub fn get(&self, step: usize, series: usize, metric: usize) -> Option<Stat> {
        self.stats.get(&(step, series, metric)).copied()
    }

    fn has_series(&self, series: usize) -> bool {
        self.stats.keys().any(|(_, s, _)| *s == series)
    }

    /// The top of the value axis, shared by every step so the animation does not jump.
    fn y_max(&self) -> f64 {
        let top = self.stats.values().map(|s| s.mean + s.std).fold(1.0, f64::max);
        (top * 1.1 * 10.0).ceil() / 10.0
    }
}

/// Statistics over the seeds of a group's runs (modes → their series) and of their
/// baselines (the baseline's `both` mode → the baseline series).
pub fn group_data(group: &str, members: &[&RunEntry], baselines: &[&RunEntry]) -> Result<GroupData> {
    let source = EvalSource::of_runs(&members.iter().chain(baselines).copied().collect::<Vec<_>>());
    let mut samples: BTreeMap<(usize, usize, usize), Vec<f64>> = BTreeMap::new();
    let mut add = |entry: &RunEntry, series_of: &dyn Fn(&str) -> Option<usize>| -> Result<()> {
        for (step, mode, values) in run_evaluations(entry, source)? {
            let Some(series) = series_of(&mode) else { continue };
            for (metric, value) in values.iter().enumerate() {
                if let Some(v) = value {
                    samples.entry((step, series, metric)).or_default().push(*v);
                }
            }
        }
        Ok(())
    };
    for member in members {
        add(member, &|mode| SERIES.iter().skip(1).position(|(name, _)| *name == mode).map(|i| i + 1))?;
    }
    for baseline in baselines {
        add(baseline, &|mode| (mode == BASELINE_MODE).then_some(BASELINE))?;
    }
    let mut steps: Vec<usize> = samples.keys().map(|(step, _, _)| *step).collect();
    steps.dedup();
    let stats = samples.into_iter().map(|(key, values)| (key, Stat::of(&values))).collect();
    Ok(GroupData { group: group.to_string(), steps, stats, source })
}

/// Charts for every group of grid runs, the Pareto chart of the arms (`pareto.png`, when any
/// arm has a hack frequency), the environments' Pareto chart (`pareto_environments.png`, when
/// the sweep has an environment run and `env_rows` a point), and `<charts_dir>/index.html`
/// showing them and linking the viewers.
pub fn write_all(charts_dir: &Path, entries: &[RunEntry], arm_rows: &[super::arms::ArmRow], env_rows: Option<&[super::environments::EnvRow]>) -> Result<PathBuf> {
    std::fs::create_dir_all(charts_dir).with_context(|| format!("cannot create {}", charts_dir.display()))?;
    let grid: Vec<&RunEntry> = entries.iter().filter(|e| e.role == RunRole::Grid).collect();
    let mut written = Vec::new();
    for (group, members) in plan::groups(&grid, |e| e.name.as_str()) {
        let members: Vec<&RunEntry> = members.into_iter().copied().collect();
        let baselines: Vec<&RunEntry> = entries.iter().filter(|e| members.iter().any(|m| m.baseline.as_deref() == Some(e.name.as_str()))).collect();
        let data = group_data(&group, &members, &baselines)?;
        if data.steps.is_empty() {
            println!("charts: {group} has no routing evaluations yet; skipped");
            continue;
        }
        if data.source == EvalSource::Checkpoints {
            println!("charts: {group} from every run's {} (smallrl eval --all-checkpoints)", eval::CHECKPOINTS_CSV);
        }
        write_group(&charts_dir.join(&group), &data)?;
        written.push(group);
    }
    let pareto = !super::pareto::points(arm_rows).1.is_empty();
    if pareto {
        super::pareto::write(&charts_dir.join(super::pareto::FILE), arm_rows)?;
    }
    let environment_chart = match env_rows {
        Some(rows) if entries.iter().any(|e| e.config.environment.is_some()) => super::pareto_environments::chart(rows),
        _ => None,
    };
    if let Some(chart) = &environment_chart {
        super::pareto_environments::write(&charts_dir.join(super::pareto_environments::FILE), chart)?;
    }
    let index = charts_dir.join("index.html");
    crate::fsutil::write_atomic(&index, super::viewer::index_page(&written, pareto, environment_chart.is_some()).as_bytes())?;
    Ok(index)
}

/// `step-NNNNNN.png` per evaluation step, `over_steps.png`, `animation.gif`, `index.html`.
pub fn write_group(dir: &Path, data: &GroupData) -> Result<()> {
    register_font()?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let y_max = data.y_max();
    let mut frames = Vec::new();
    for &step in &data.steps {
        let file = format!("step-{step:06}.png");
        crate::fsutil::create_file_atomic(&dir.join(&file), |tmp| {
            let root = BitMapBackend::new(tmp, BAR_CHART_SIZE).into_drawing_area();
            draw_bars(&root, data, step, y_max)?;
            Ok(root.present()?)
        })?;
        frames.push((step, file));
    }
    crate::fsutil::create_file_atomic(&dir.join("over_steps.png"), |tmp| {
        let root = BitMapBackend::new(tmp, LINE_CHART_SIZE).into_drawing_area();
        draw_lines(&root, data, y_max)?;
        Ok(root.present()?)
    })?;
    crate::fsutil::create_file_atomic(&dir.join("animation.gif"), |tmp| {
        let root = BitMapBackend::gif(tmp, BAR_CHART_SIZE, defaults::GIF_FRAME_MILLIS)?.into_drawing_area();
        for &step in &data.steps {
            draw_bars(&root, data, step, y_max)?;
            root.present()?;
        }
        Ok(())
    })?;
    crate::fsutil::write_atomic(&dir.join("index.html"), super::viewer::group_page(&data.group, &frames).as_bytes())
}

fn draw_bars(root: &Area, data: &GroupData, step: usize, y_max: f64) -> Result<()> {
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(format!("{}  @ step {step}", data.group), (FONT, 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..METRICS.len() as f64, 0f64..y_max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|_| String::new())
        .y_desc("mean ± std over seeds")
        .label_style((FONT, 15))
        .draw()?;
    let slot = 0.8 / SERIES.len() as f64;
    for (series, (name, color)) in SERIES.iter().enumerate().filter(|(s, _)| data.has_series(*s)) {
        let color = *color;
        let bars = (0..METRICS.len()).filter_map(|m| data.get(step, series, m).map(|st| (m, st)));
        let left = move |m: usize| m as f64 + 0.1 + series as f64 * slot;
        chart
            .draw_series(bars.clone().map(|(m, st)| Rectangle::new([(left(m), 0.0), (left(m) + slot * 0.9, st.mean)], color.filled())))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        chart.draw_series(bars.map(|(m, st)| {
            let centre = left(m) + slot * 0.45;
            ErrorBar::new_vertical(centre, st.mean - st.std, st.mean, st.mean + st.std, BLACK.stroke_width(2), 10)
        }))?;
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperRight).background_style(WHITE.mix(0.9)).border_style(BLACK).label_font((FONT, 15)).draw()?;
    for (m, metric) in METRICS.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(m as f64 + 0.5, 0.0));
        root.draw(&Text::new(*metric, (x, y + 10), (FONT, 17).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top))))?;
    }
    Ok(())
}

fn draw_lines(root: &Area, data: &GroupData, y_max: f64) -> Result<()> {
    root.fill(&WHITE)?;
    let (legend, panels) = root.split_vertically(LEGEND_STRIP_HEIGHT);
    draw_legend_strip(&legend, data)?;
    let (first, last) = (data.steps[0] as f64, *data.steps.last().expect("a group with charts has steps") as f64);
    // Padded so the error bars of the first and last step are not cut by the frame.
    let pad = ((last - first) * 0.05).max(0.5);
    for (m, panel) in panels.split_evenly((1, METRICS.len())).iter().enumerate() {
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{} over steps", METRICS[m]), (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(first - pad..last + pad, 0f64..y_max)?;
        chart.configure_mesh().x_desc("step").x_label_formatter(&|x| integer_label(*x)).label_style((FONT, 14)).draw()?;
        for (series, (_, color)) in SERIES.iter().enumerate().filter(|(s, _)| data.has_series(*s)) {
            let points: Vec<(f64, Stat)> = data.steps.iter().filter_map(|&step| data.get(step, series, m).map(|st| (step as f64, st))).collect();
            chart.draw_series(LineSeries::new(points.iter().map(|(x, st)| (*x, st.mean)), color.stroke_width(3)))?;
            chart.draw_series(points.iter().map(|(x, st)| ErrorBar::new_vertical(*x, st.mean - st.std, st.mean, st.mean + st.std, color.stroke_width(2), 8)))?;
        }
    }
    Ok(())
}

const LEGEND_STRIP_HEIGHT: u32 = 36;
/// The series' colours in a strip above the panels, where no data can be hidden under it.
fn draw_legend_strip(strip: &Area, data: &GroupData) -> Result<()> {
    let items: Vec<(String, RGBColor)> = SERIES.iter().enumerate().filter(|(s, _)| data.has_series(*s)).map(|(_, (n, c))| (n.to_string(), *c)).collect();
    draw_legend(strip, &items, 180)
}

