//! The suite's Pareto chart (`charts/pareto_environments.png`): small multiples, one panel per
//! environment, task (retain) reward up against hack frequency, one point per (intervention
//! arm, routing mode, hack_frac, recall) cell of `environments.csv` at its mean over seeds with
//! its 95% bootstrap intervals, coloured by arm. The original's reading (seven-envs.md section
//! 10): a routed arm (routing, placebo, matched_placebo) in the mode it deploys, `deployed` when the table has
//! it, else `retain_only`; every other arm in `both`, the policy it trained. x is the
//! ground-truth `true_hack_freq` when every drawn cell has it, else the monitor's `hack_freq`
//! (the axis says which). Each point carries its cell's number; the list of cells (hack_frac,
//! recall) is under the panels. Panels share their axes.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::arms::{DEPLOYED_MODE as DEPLOYED, HACK_FREQ, TASK_REWARD, TRUE_HACK_FREQ};
use super::draw::{self, FONT};
use super::environments::{Cell, EnvRow};
use super::pareto::{self, Point};
use super::plan::Arm;
use crate::intervention::Intervention;
use crate::routing::eval_mode;
use crate::stats::MeanCi;

/// The chart's file name in `charts/`.
pub const FILE: &str = "pareto_environments.png";
/// One panel's width and height; the panels go [`COLUMNS`] to a row at most.
pub const PANEL_PX: (u32, u32) = (480, 420);
pub const COLUMNS: usize = 4;
/// Height of a line of the list of cells under the panels.
pub const CELL_LINE_PX: u32 = 20;

/// The colour of each arm (the legend's order).
pub const ARM_COLOURS: [(Arm, RGBColor); 9] = [
    (Arm::None, RGBColor(127, 127, 127)),
    (Arm::Intervention(Intervention::Routing), RGBColor(44, 160, 44)),
    (Arm::Intervention(Intervention::Penalty), RGBColor(255, 127, 14)),
    (Arm::Intervention(Intervention::Filter), RGBColor(148, 103, 189)),
    (Arm::Intervention(Intervention::Placebo), RGBColor(140, 86, 75)),
    (Arm::Intervention(Intervention::Verified), RGBColor(23, 190, 207)),
    (Arm::Intervention(Intervention::AdvMod), RGBColor(214, 39, 40)),
    (Arm::Intervention(Intervention::MatchedPlacebo), RGBColor(227, 119, 194)),
    (Arm::Inoculation, RGBColor(188, 189, 34)),
];

pub fn colour_of(arm: Arm) -> RGBColor {
    ARM_COLOURS.iter().find(|(a, _)| *a == arm).expect("every arm has a colour").1
}

/// What the chart draws: the x metric, the panels (environment, its points, cells numbered
/// by [`Chart::cells`]) and the cells' (hack_frac, recall), and the arms drawn.
#[derive(Debug, Clone)]
pub struct Chart {
    pub x_metric: &'static str,
    pub panels: Vec<(String, Vec<Point>)>,
    pub cells: Vec<(f64, f64)>,
    pub arms: Vec<Arm>,
}

/// A cell's statistics: (metric, mode) -> mean and interval.
type CellValues<'a> = BTreeMap<(&'a str, &'a str), MeanCi>;

/// The mode a cell is read in (module doc).
fn mode_of(cell: &Cell, modes: &[&str]) -> &'static str {
    match cell.routing_mode != crate::routing::RoutingMode::None.to_string() {
        true if modes.contains(&DEPLOYED) => DEPLOYED,
        true => eval_mode::RETAIN_ONLY,
        false => eval_mode::BOTH,
    }
}

/// The chart of `rows` (None when no cell has both values in its mode): panels, cells and
/// points in the order the rows first name them.
pub fn chart(rows: &[EnvRow]) -> Option<Chart> {
    // Each cell's values: (metric, mode) -> stat, cells in the table's order.
    let mut cells: Vec<(&Cell, CellValues)> = Vec::new();
    for row in rows {
        let i = match cells.iter().position(|(c, _)| *c == &row.cell) {
            Some(i) => i,
            None => {
                cells.push((&row.cell, BTreeMap::new()));
                cells.len() - 1
            }
        };
        cells[i].1.insert((row.metric, row.mode.as_str()), row.stat);
    }
    let read: Vec<(&Cell, &str, &CellValues)> = cells
        .iter()
        .map(|(cell, values)| {
            let modes: Vec<&str> = values.keys().map(|(_, mode)| *mode).collect();
            (*cell, mode_of(cell, &modes), values)
        })
        .filter(|(_, mode, values)| values.contains_key(&(TASK_REWARD, *mode)))
        .collect();
    let has = |metric: &str| read.iter().all(|(_, mode, values)| values.contains_key(&(metric, *mode)));
    let x_metric = if !read.is_empty() && has(TRUE_HACK_FREQ) { TRUE_HACK_FREQ } else { HACK_FREQ };
    let mut numbers: Vec<(f64, f64)> = Vec::new();
    let mut panels: Vec<(String, Vec<Point>)> = Vec::new();
    let mut arms = Vec::new();
    for (cell, mode, values) in read {
        let Some(hack) = values.get(&(x_metric, mode)) else { continue };
        let task = values[&(TASK_REWARD, mode)];
        let key = (cell.hack_frac, cell.recall);
        let number = match numbers.iter().position(|k| *k == key) {
            Some(i) => i + 1,
            None => {
                numbers.push(key);
                numbers.len()
            }
        };
        let panel = match panels.iter().position(|(env, _)| *env == cell.environment) {
            Some(i) => i,
            None => {
                panels.push((cell.environment.clone(), Vec::new()));
                panels.len() - 1
            }
        };
        panels[panel].1.push(Point { number, color: colour_of(cell.arm), hack: *hack, task });
        if !arms.contains(&cell.arm) {
            arms.push(cell.arm);
        }
    }
    arms.sort();
    (!panels.is_empty()).then_some(Chart { x_metric, panels, cells: numbers, arms })
}

/// The image's size for `panels` panels and `cells` cells.
pub fn size(panels: usize, cells: usize) -> (u32, u32) {
    let columns = panels.clamp(1, COLUMNS);
    let rows = panels.div_ceil(COLUMNS).max(1);
    (PANEL_PX.0 * columns as u32, pareto::LEGEND_HEIGHT + PANEL_PX.1 * rows as u32 + CELL_LINE_PX * cells as u32 + 10)
}

/// Writes `chart` to `path` (atomically).
pub fn write(path: &Path, chart: &Chart) -> Result<()> {
    draw::register_font()?;
    let (width, height) = size(chart.panels.len(), chart.cells.len());
    let all: Vec<Point> = chart.panels.iter().flat_map(|(_, points)| points.iter().copied()).collect();
    let y_max = pareto::y_max(&all);
    let x_desc = format!("{} (left is better)", chart.x_metric);
    crate::fsutil::create_file_atomic(path, |tmp| {
        let root = BitMapBackend::new(tmp, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (legend, rest) = root.split_vertically(pareto::LEGEND_HEIGHT);
        let items: Vec<(String, RGBColor)> = chart.arms.iter().map(|a| (a.name().to_string(), colour_of(*a))).collect();
        draw::draw_legend(&legend, &items, 160)?;
        let rows = chart.panels.len().div_ceil(COLUMNS) as u32;
        let (grid, list) = rest.split_vertically(PANEL_PX.1 * rows);
        // Row-major, PANEL_PX each (the image is as wide as the columns).
        let panels = grid.split_evenly((rows as usize, chart.panels.len().clamp(1, COLUMNS)));
        for ((environment, points), panel) in chart.panels.iter().zip(&panels) {
            pareto::draw_panel(panel, environment, &x_desc, y_max, points)?;
        }
        for (i, (hack_frac, recall)) in chart.cells.iter().enumerate() {
            list.draw(&Text::new(format!("{}: hack_frac {hack_frac}, recall {recall}", i + 1), (20, 5 + i as i32 * CELL_LINE_PX as i32), (FONT, 14)))?;
        }
        Ok(root.present()?)
    })
}
