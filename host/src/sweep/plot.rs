//! `smallrl plot`: training curves (reward, KL, completion length) from any runs'
//! `metrics.jsonl`, one line per run.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use plotters::prelude::*;

use super::charts::{FONT, register_font};
use crate::train::runlog::Jsonl;

/// The metrics drawn, one panel each: (key in metrics.jsonl, panel title).
const CURVES: [(&str, &str); 3] = [("reward", "reward"), ("kl", "KL"), ("completions/mean_length", "completion length (tokens)")];
const SIZE: (u32, u32) = (1500, 480);

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
        let step = line["step"].as_f64().with_context(|| format!("{}: a line has no step", path.display()))?;
        for (curve, (key, _)) in CURVES.iter().enumerate() {
            let value = line[*key].as_f64().with_context(|| format!("{}: step {step} has no numeric `{key}`", path.display()))?;
            points[curve].push((step, value));
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
        let root = BitMapBackend::new(tmp, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        for (curve, panel) in root.split_evenly((1, CURVES.len())).iter().enumerate() {
            draw_panel(panel, &runs, curve)?;
        }
        Ok(root.present()?)
    })?;
    Ok(path)
}

fn draw_panel(panel: &DrawingArea<BitMapBackend, plotters::coord::Shift>, runs: &[RunCurves], curve: usize) -> Result<()> {
    let all = runs.iter().flat_map(|r| r.points[curve].iter());
    let (x_max, y_min, y_max) = all.fold((1.0f64, f64::INFINITY, f64::NEG_INFINITY), |(x, lo, hi), (s, v)| (x.max(*s), lo.min(*v), hi.max(*v)));
    let pad = ((y_max - y_min) * 0.05).max(1e-3);
    let mut chart = ChartBuilder::on(panel)
        .caption(CURVES[curve].1, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, (y_min - pad)..(y_max + pad))?;
    chart.configure_mesh().x_desc("step").label_style((FONT, 14)).draw()?;
    for (i, run) in runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(run.points[curve].iter().copied(), color.stroke_width(2)))?
            .label(run.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    if curve == 0 {
        chart.configure_series_labels().position(SeriesLabelPosition::LowerRight).background_style(WHITE.mix(0.9)).border_style(BLACK).label_font((FONT, 13)).draw()?;
    }
    Ok(())
}
