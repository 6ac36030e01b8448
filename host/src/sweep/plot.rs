//! `smallrl plot`: training curves (reward, KL, completion length) from any runs'
//! `metrics.jsonl`, one line per run.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use plotters::prelude::*;
use serde_json::Value;

use super::draw::{Area, FONT, LEGEND_ROW_PX, draw_legend, integer_label, register_font};
use crate::train::metrics::key;
use crate::runlog::Jsonl;

/// The metrics drawn, one panel each: (key in metrics.jsonl, panel title).
const CURVES: [(&str, &str); 3] = [(key::REWARD, "reward"), (key::KL, "KL"), (key::MEAN_LENGTH, "completion length (tokens)")];
/// Width and height of the panels; the legend below them adds a row per run.
const PANELS_SIZE: (u32, u32) = (1500, 480);

/// One run's (step, value) points for each curve.
struct RunCurves {
    label: String,
    points: Vec<Vec<(f64, f64)>>,
}

fn read_curves(run_dir: &Path) -> Result<RunCurves> {
    let path = run_dir.join("metrics.jsonl");
    ensure!(path.is_file(), "{} has no metrics.jsonl: pass run directories written by `smallrl train`", run_dir.display());
    let lines = Jsonl::new(path.clone()).read()?;
    let mut points = vec![Vec::new(); CURVES.len()];
    for line in &lines {
        let step = line[key::STEP].as_f64().with_context(|| format!("{}: a line has no step", path.display()))?;
        for (curve, (key, _)) in CURVES.iter().enumerate() {
            match &line[*key] {
                // A non-finite value is logged as null (JSON has no NaN): left out of the curve.
                Value::Null if line.get(*key).is_some() => {}
                value => points[curve].push((step, value.as_f64().with_context(|| format!("{}: step {step} has no numeric `{key}`", path.display()))?)),
            }
        }
    }
    let label = run_dir.canonicalize().unwrap_or_else(|_| run_dir.to_path_buf());
    Ok(RunCurves { label: label.file_name().unwrap_or_default().to_string_lossy().into_owned(), points })
}

/// Writes `<out_dir>/curves.png` and returns its path.
pub fn plot_runs(run_dirs: &[PathBuf], out_dir: &Path) -> Result<PathBuf> {
    ensure!(!run_dirs.is_empty(), "no run directories given");
    let runs = run_dirs.iter().map(|d| read_curves(d)).collect::<Result<Vec<_>>>()?;
    register_font()?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    let path = out_dir.join("curves.png");
    crate::fsutil::create_file_atomic(&path, |tmp| {
        let legend_height = (runs.len() as i32 * LEGEND_ROW_PX + 16) as u32;
        let root = BitMapBackend::new(tmp, (PANELS_SIZE.0, PANELS_SIZE.1 + legend_height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (panels, legend) = root.split_vertically(PANELS_SIZE.1);
        let colors: Vec<RGBColor> = (0..runs.len()).map(run_color).collect();
        for (curve, panel) in panels.split_evenly((1, CURVES.len())).iter().enumerate() {
            draw_panel(panel, &runs, &colors, curve)?;
        }
        let items: Vec<(String, RGBColor)> = runs.iter().map(|r| r.label.clone()).zip(colors.iter().copied()).collect();
        draw_legend(&legend, &items, PANELS_SIZE.0 as i32)?;
        Ok(root.present()?)
    })?;
    Ok(path)
}

fn run_color(index: usize) -> RGBColor {
    let (r, g, b) = Palette99::pick(index).rgb();
    RGBColor(r, g, b)
}

fn draw_panel(panel: &Area, runs: &[RunCurves], colors: &[RGBColor], curve: usize) -> Result<()> {
    let all = runs.iter().flat_map(|r| r.points[curve].iter());
    let (x_max, y_min, y_max) = all.fold((1.0f64, f64::INFINITY, f64::NEG_INFINITY), |(x, lo, hi), (s, v)| (x.max(*s), lo.min(*v), hi.max(*v)));
    // No finite value at all: an empty panel with a unit axis.
    let (y_min, y_max) = if y_min <= y_max { (y_min, y_max) } else { (0.0, 1.0) };
    let pad = ((y_max - y_min) * 0.05).max(1e-3);
    let mut chart = ChartBuilder::on(panel)
        .caption(CURVES[curve].1, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, (y_min - pad)..(y_max + pad))?;
    chart.configure_mesh().x_desc("step").x_label_formatter(&|x| integer_label(*x)).label_style((FONT, 14)).draw()?;
    for (run, color) in runs.iter().zip(colors) {
        chart.draw_series(LineSeries::new(run.points[curve].iter().copied(), color.stroke_width(2)))?;
    }
    Ok(())
}
