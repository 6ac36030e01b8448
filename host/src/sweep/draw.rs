//! The drawing vocabulary shared by the sweep's charts, its Pareto plot and its metric plots:
//! the series' colours, the embedded font, legends and axis labels.

use anyhow::{Result, ensure};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::routing::eval_mode;

/// The bar series in chart order, with their colours (the viewer test looks for these).
pub const SERIES: [(&str, RGBColor); 4] = [
    ("baseline", RGBColor(127, 127, 127)),
    (eval_mode::BOTH, RGBColor(31, 119, 180)),
    (eval_mode::RETAIN_ONLY, RGBColor(44, 160, 44)),
    (eval_mode::FORGET_ONLY, RGBColor(214, 39, 40)),
];
pub const FONT: &str = "sans-serif";

/// Text needs a font; an embedded one (DejaVu Sans) makes charts independent of system fonts.
pub fn register_font() -> Result<()> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok());
    ensure!(ok, "the embedded DejaVu Sans font could not be loaded for chart text");
    Ok(())
}

pub type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Steps are integers: ticks between them get no label (rounded ones would repeat).
pub fn integer_label(x: f64) -> String {
    if (x - x.round()).abs() < 1e-6 { format!("{x:.0}") } else { String::new() }
}

/// Height of one row of a legend drawn by [`draw_legend`].
pub const LEGEND_ROW_PX: i32 = 22;

/// Colour swatches and names in columns `column_px` wide, wrapping into rows; drawn in an area
/// of their own beside the plots so they never cover data.
pub fn draw_legend(area: &Area, items: &[(String, RGBColor)], column_px: i32) -> Result<()> {
    const LEFT: i32 = 70;
    let per_row = ((area.dim_in_pixel().0 as i32 - LEFT) / column_px).max(1);
    for (i, (name, color)) in items.iter().enumerate() {
        let (x, y) = (LEFT + (i as i32 % per_row) * column_px, 8 + (i as i32 / per_row) * LEGEND_ROW_PX);
        area.draw(&Rectangle::new([(x, y + 3), (x + 24, y + 15)], color.filled()))?;
        area.draw(&Text::new(name.clone(), (x + 32, y), (FONT, 16)))?;
    }
    Ok(())
}
