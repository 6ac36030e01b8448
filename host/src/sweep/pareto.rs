//! The Pareto chart of a sweep (`charts/pareto.png`): task reward (up) against hack frequency
//! (left is better), one point per arm and adapter mode at the arm's mean over seeds, with its
//! 95% bootstrap interval as error bars in both directions. Colours are the bar charts':
//! `both` blue, `retain_only` green; a baseline arm (no routing) is one grey point, its `both`
//! mode (the policy it trained). Each point carries its arm's number; the list of arms is
//! printed under the plot.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::arms::{ArmRow, HACK_FREQ, TASK_REWARD};
use super::draw::{self, FONT, SERIES};
use crate::stats::MeanCi;
use crate::routing::eval_mode;

/// The chart's file name in `charts/`.
pub const FILE: &str = "pareto.png";
pub const PARETO_WIDTH: u32 = 900;
/// Height of the plot; the list of arms adds [`ARM_LINE_PX`] per arm below it.
pub const PARETO_PLOT_HEIGHT: u32 = 640;
pub const ARM_LINE_PX: u32 = 20;
/// Side of a point's square marker (the error bars are 2 px wide, so a marker is the only
/// solid square of its colour larger than the legend's 12 px swatches).
pub const MARKER_PX: i32 = 16;

/// A point: its number (1-based, the arm's here, the cell's in the environments' chart),
/// colour, x = hack frequency, y = task reward.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub number: usize,
    pub color: RGBColor,
    pub hack: MeanCi,
    pub task: MeanCi,
}

/// The points of the arm summary: `both` and `retain_only` of routed arms, `both` of
/// baselines; an arm/mode without a hack frequency (no detector) has no point.
pub fn points(rows: &[ArmRow]) -> (Vec<String>, Vec<Point>) {
    let mut arms: Vec<String> = Vec::new();
    let mut found: BTreeMap<(usize, &str), (Option<MeanCi>, Option<MeanCi>, &'static str)> = BTreeMap::new();
    for row in rows {
        let arm = match arms.iter().position(|a| *a == row.arm) {
            Some(i) => i,
            None => {
                arms.push(row.arm.clone());
                arms.len() - 1
            }
        };
        let entry = found.entry((arm, row.mode.as_str())).or_insert((None, None, row.role));
        match row.metric {
            HACK_FREQ => entry.0 = Some(row.stat),
            TASK_REWARD => entry.1 = Some(row.stat),
            _ => {}
        }
    }
    let mut points = Vec::new();
    for ((arm, mode), (hack, task, role)) in found {
        let (Some(hack), Some(task)) = (hack, task) else { continue };
        let color = match (role, mode) {
            ("baseline", m) if m == eval_mode::BOTH => SERIES[0].1,
            ("run", m) if m == eval_mode::BOTH => SERIES[1].1,
            ("run", m) if m == eval_mode::RETAIN_ONLY => SERIES[2].1,
            _ => continue,
        };
        points.push(Point { number: arm + 1, color, hack, task });
    }
    // Baselines last, on top: the reference every routed arm is read against.
    points.sort_by_key(|p| p.color == SERIES[0].1);
    (arms, points)
}

/// Writes the chart of `rows` to `path` (atomically).
pub fn write(path: &Path, rows: &[ArmRow]) -> Result<()> {
    draw::register_font()?;
    let (arms, points) = points(rows);
    let height = PARETO_PLOT_HEIGHT + ARM_LINE_PX * arms.len() as u32 + 10;
    crate::fsutil::create_file_atomic(path, |tmp| {
        let root = BitMapBackend::new(tmp, (PARETO_WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (plot, list) = root.split_vertically(PARETO_PLOT_HEIGHT);
        draw_plot(&plot, &points)?;
        for (i, arm) in arms.iter().enumerate() {
            list.draw(&Text::new(format!("{}: {arm}", i + 1), (20, 5 + i as i32 * ARM_LINE_PX as i32), (FONT, 14)))?;
        }
        Ok(root.present()?)
    })
}

fn draw_plot(area: &draw::Area, points: &[Point]) -> Result<()> {
    let (legend, plot) = area.split_vertically(LEGEND_HEIGHT);
    let items: Vec<(String, RGBColor)> = [("baseline (both)", SERIES[0].1), ("both", SERIES[1].1), ("retain_only", SERIES[2].1)].map(|(n, c)| (n.to_string(), c)).to_vec();
    draw::draw_legend(&legend, &items, 200)?;
    draw_panel(&plot, "task reward vs hack frequency (mean over seeds, 95% bootstrap CI)", "hack frequency", y_max(points), points)
}

/// Height of the legend strip above a Pareto chart's plot.
pub const LEGEND_HEIGHT: u32 = 36;

/// The top of the task-reward axis: 1, or above the highest interval.
pub fn y_max(points: &[Point]) -> f64 {
    let top = points.iter().map(|p| p.task.ci.map_or(p.task.mean, |c| c.1)).fold(1.0, f64::max);
    (top * 1.05 * 10.0).ceil() / 10.0
}

/// One plot of task reward (0 to `y_max`) against a hack frequency (0 to 1): each point a
/// square marker at its means, with its number beside it and its intervals as error bars in
/// both directions (none for one seed).
pub fn draw_panel(area: &draw::Area, caption: &str, x_desc: &str, y_max: f64, points: &[Point]) -> Result<()> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 18))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.02f64..1.02, 0f64..y_max)?;
    chart.configure_mesh().x_desc(x_desc).y_desc("task reward").label_style((FONT, 15)).draw()?;
    for p in points {
        let style = p.color.stroke_width(2);
        if let Some((low, high)) = p.task.ci {
            chart.draw_series(std::iter::once(ErrorBar::new_vertical(p.hack.mean, low, p.task.mean, high, style, 10)))?;
        }
        if let Some((low, high)) = p.hack.ci {
            chart.draw_series(std::iter::once(ErrorBar::new_horizontal(p.task.mean, low, p.hack.mean, high, style, 10)))?;
        }
        // The chart maps to the whole image's pixels; the area draws from its own corner.
        let (x, y) = chart.backend_coord(&(p.hack.mean, p.task.mean));
        let (x, y) = (x - area.get_base_pixel().0, y - area.get_base_pixel().1);
        let half = MARKER_PX / 2;
        area.draw(&Rectangle::new([(x - half, y - half), (x + half, y + half)], p.color.filled()))?;
        area.draw(&Text::new(p.number.to_string(), (x + half + 3, y - half - 14), (FONT, 14)))?;
    }
    Ok(())
}
