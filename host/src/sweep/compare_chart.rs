//! The comparison's chart (`charts/compare.png`, drawn for `super::compare`): one Pareto panel per
//! environment, retain reward up against the detector's flag rate (left is better); the
//! paper's cells as open circles, ours as filled squares, one colour per paper arm, each
//! with ± its population std over seeds as error bars.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::draw::{self, FONT};
use super::pareto::{LEGEND_HEIGHT, MARKER_PX};
use super::pareto_environments::{COLUMNS, PANEL_PX, colour_of};
use super::plan::Arm;
use crate::intervention::Intervention;

/// The colour of a paper arm: its smallrl arm's in the environments' chart, else its own.
pub fn colour_of_paper_arm(arm: &str) -> RGBColor {
    match arm {
        "gr" => colour_of(Arm::Intervention(Intervention::Routing)),
        "noi" => colour_of(Arm::None),
        "noi_ro" => RGBColor(188, 189, 34),
        "filt" => colour_of(Arm::Intervention(Intervention::Filter)),
        "best_rp" => colour_of(Arm::Intervention(Intervention::Penalty)),
        "verif" => colour_of(Arm::Intervention(Intervention::Verified)),
        _ => RGBColor(0, 0, 0),
    }
}

/// A point: colour, (hack mean, std), (retain mean, std), ours (square) or the paper's (circle).
pub type Mark = (RGBColor, (f64, f64), (f64, f64), bool);

/// The image's size for `panels` panels.
pub fn size(panels: usize) -> (u32, u32) {
    let columns = panels.clamp(1, COLUMNS);
    (PANEL_PX.0 * columns as u32, 3 * LEGEND_HEIGHT + PANEL_PX.1 * panels.div_ceil(COLUMNS).max(1) as u32)
}

/// Writes the chart of `panels` (environment, its marks) and the legend's paper `arms` to
/// `path` (atomically).
pub fn write(path: &Path, panels: &[(String, Vec<Mark>)], arms: &[String]) -> Result<()> {
    draw::register_font()?;
    let (width, height) = size(panels.len());
    let y_max = panels.iter().flat_map(|(_, m)| m.iter().map(|m| m.2.0 + m.2.1)).fold(1.0, f64::max);
    let y_max = (y_max * 1.05 * 10.0).ceil() / 10.0;
    crate::fsutil::create_file_atomic(path, |tmp| {
        let root = BitMapBackend::new(tmp, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (legend, rest) = root.split_vertically(3 * LEGEND_HEIGHT);
        let items: Vec<(String, RGBColor)> = arms.iter().map(|a| (a.clone(), colour_of_paper_arm(a))).collect();
        draw::draw_legend(&legend, &items, 120)?;
        legend.draw(&Text::new("squares: smallrl; circles: the paper (± std over seeds)", (70, 3 * LEGEND_HEIGHT as i32 - 20), (FONT, 14)))?;
        let areas = rest.split_evenly((panels.len().div_ceil(COLUMNS).max(1), panels.len().clamp(1, COLUMNS)));
        for ((environment, marks), area) in panels.iter().zip(&areas) {
            draw_panel(area, environment, y_max, marks)?;
        }
        Ok(root.present()?)
    })
}

fn draw_panel(area: &draw::Area, environment: &str, y_max: f64, marks: &[Mark]) -> Result<()> {
    let mut chart = ChartBuilder::on(area).caption(environment, (FONT, 18)).margin(15).x_label_area_size(45).y_label_area_size(60).build_cartesian_2d(-0.02f64..1.02, 0f64..y_max)?;
    chart.configure_mesh().x_desc("hack_freq (detector; left is better)").y_desc("retain reward").label_style((FONT, 15)).draw()?;
    for &(colour, (hack, hack_std), (retain, retain_std), ours) in marks {
        let style = colour.stroke_width(2);
        if retain_std > 0.0 {
            chart.draw_series(std::iter::once(ErrorBar::new_vertical(hack, retain - retain_std, retain, retain + retain_std, style, 10)))?;
        }
        if hack_std > 0.0 {
            chart.draw_series(std::iter::once(ErrorBar::new_horizontal(retain, hack - hack_std, hack, hack + hack_std, style, 10)))?;
        }
        let (x, y) = chart.backend_coord(&(hack, retain));
        let (x, y) = (x - area.get_base_pixel().0, y - area.get_base_pixel().1);
        let half = MARKER_PX / 2;
        match ours {
            true => area.draw(&Rectangle::new([(x - half, y - half), (x + half, y + half)], colour.filled()))?,
            false => area.draw(&Circle::new((x, y), half, colour.stroke_width(3)))?,
        }
    }
    Ok(())
}
