//! Statistics and charts: bootstrap intervals and the Pareto chart.

use super::*;

#[test]
fn bootstrap_interval_matches_a_plain_reference_and_behaves() {
    use smallrl::stats::{mean_ci, mean_ci_with};
    let values = [0.2, 0.9, 0.4, 0.7, 0.1];
    let ours = mean_ci_with(&values, 2000, 7, 0.95);
    let (low, high) = reference_bootstrap(&values, 2000, 7);
    let (our_low, our_high) = ours.ci.unwrap();
    assert!((our_low - low).abs() < 1e-12 && (our_high - high).abs() < 1e-12, "{:?} vs {low} {high}", ours.ci);
    assert!((ours.mean - 0.46).abs() < 1e-12 && low < ours.mean && ours.mean < high && low >= 0.1 && high <= 0.9);
    // The defaults are the documented ones.
    let default = mean_ci(&values);
    let (low, high) = reference_bootstrap(&values, smallrl::defaults::BOOTSTRAP_RESAMPLES, smallrl::defaults::BOOTSTRAP_SEED);
    assert!((default.ci.unwrap().0 - low).abs() < 1e-12 && (default.ci.unwrap().1 - high).abs() < 1e-12);
    // Two values {0, 1}: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the
    // 2.5th and 97.5th percentiles are 0 and 1.
    assert_eq!(mean_ci(&[0.0, 1.0]).ci, Some((0.0, 1.0)));
    assert_eq!(mean_ci(&[0.3; 4]).ci, Some((0.3, 0.3)), "no spread, no width");
    assert_eq!(mean_ci(&[0.3]).ci, None, "one seed has no interval");
    // Many values: the interval is about the normal one, mean ± 1.96 s / sqrt(n).
    let many: Vec<f64> = (0..400).map(|i| (i as f64 * 0.618_033_988_75).fract()).collect();
    let n = many.len() as f64;
    let mean = many.iter().sum::<f64>() / n;
    let sd = (many.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    let (low, high) = mean_ci(&many).ci.unwrap();
    let normal_half_width = 1.96 * sd / n.sqrt();
    for half in [mean - low, high - mean] {
        assert!((half / normal_half_width - 1.0).abs() < 0.08, "half width {half} vs normal {normal_half_width}");
    }
}

/// Pixels of `colour` that are the bottom-right corner of a `side`×`side` square of it.
pub(super) fn square_corners(width: u32, pixels: &[[u8; 3]], colour: (u8, u8, u8), side: usize) -> Vec<(usize, usize)> {
    let width = width as usize;
    let mut run_right = vec![0usize; width];
    let mut rows_down = vec![0usize; width];
    let mut corners = Vec::new();
    for (y, row) in pixels.chunks(width).enumerate() {
        for (x, p) in row.iter().enumerate() {
            let near = p[0] == colour.0 && p[1] == colour.1 && p[2] == colour.2;
            run_right[x] = if near { if x > 0 { run_right[x - 1] + 1 } else { 1 } } else { 0 };
            rows_down[x] = if run_right[x] >= side { rows_down[x] + 1 } else { 0 };
            if rows_down[x] >= side {
                corners.push((x, y));
            }
        }
    }
    corners
}

#[test]
fn pareto_chart_places_points_and_intervals_where_their_values_are() {
    use smallrl::sweep::arms::{ArmRow, HACK_FREQ, TASK_REWARD};
    use smallrl::sweep::pareto;
    use smallrl::stats::MeanCi;
    let stat = |mean: f64, ci: Option<(f64, f64)>| MeanCi { mean, ci, n: 3 };
    let row = |arm: &str, role, metric, mode: &str, s| ArmRow { arm: arm.into(), role, metric, mode: mode.into(), stat: s };
    let rows = vec![
        row("routed", "run", TASK_REWARD, "both", stat(0.5, Some((0.4, 0.6)))),
        row("routed", "run", HACK_FREQ, "both", stat(0.5, Some((0.25, 0.75)))),
        row("routed", "run", TASK_REWARD, "retain_only", stat(0.75, Some((0.7, 0.8)))),
        row("routed", "run", HACK_FREQ, "retain_only", stat(0.25, Some((0.2, 0.3)))),
        row("routed", "run", TASK_REWARD, "forget_only", stat(0.1, None)),
        row("routed", "run", HACK_FREQ, "forget_only", stat(0.9, None)),
        row("plain", "baseline", TASK_REWARD, "both", stat(0.25, None)),
        row("plain", "baseline", HACK_FREQ, "both", stat(1.0, None)),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("pareto.png");
    pareto::write(&path, &rows).unwrap();
    let (width, height, pixels) = png_pixels(&path);
    assert_eq!((width, height), (pareto::PARETO_WIDTH, pareto::PARETO_PLOT_HEIGHT + 2 * pareto::ARM_LINE_PX + 10), "two arms listed");
    let colour = |i: usize| (SERIES[i].1.0, SERIES[i].1.1, SERIES[i].1.2);
    let side = pareto::MARKER_PX as usize - 2;
    // The centre of the one marker of a colour (exactly one square of it that large).
    let centre = |c: (u8, u8, u8)| {
        let corners = square_corners(width, &pixels, c, side);
        assert!(!corners.is_empty(), "no marker of colour {c:?}");
        let (x0, x1) = (corners.iter().map(|p| p.0).min().unwrap(), corners.iter().map(|p| p.0).max().unwrap());
        let (y0, y1) = (corners.iter().map(|p| p.1).min().unwrap(), corners.iter().map(|p| p.1).max().unwrap());
        assert!(x1 - x0 <= 4 && y1 - y0 <= 4, "one marker of colour {c:?}: corners span {x0}..{x1} x {y0}..{y1}");
        (((x0 + 1 - side) + x1) as f64 / 2.0, ((y0 + 1 - side) + y1) as f64 / 2.0)
    };
    let (grey, blue, green) = (centre(colour(0)), centre(colour(1)), centre(colour(2)));
    assert!(square_corners(width, &pixels, colour(3), side).is_empty(), "forget_only is not drawn");
    // Linear axes: pixels per unit of hack frequency (x) and of task reward (y, up) agree
    // between the pairs of points.
    let kx = (grey.0 - blue.0) / (1.0 - 0.5);
    let ky = (grey.1 - blue.1) / (0.5 - 0.25);
    assert!(kx > 300.0 && ky > 300.0, "scales {kx} {ky}");
    assert!((blue.0 - kx * (0.5 - 0.25) - green.0).abs() <= 1.5, "retain_only's x: {green:?}, from blue {blue:?} and {kx} px per unit");
    assert!((blue.1 - ky * (0.75 - 0.5) - green.1).abs() <= 1.5, "retain_only's y: {green:?}, from blue {blue:?} and {ky} px per unit");
    // Error bars: from the marker's centre, the mode's colour reaches the interval's ends.
    let at = |x: f64, y: f64| pixels[y as usize * width as usize + x as usize];
    let is = |p: [u8; 3], c: (u8, u8, u8)| (p[0], p[1], p[2]) == c;
    let reach = |from: (f64, f64), step: (f64, f64), c| (0..).take_while(|i| is(at(from.0 + step.0 * *i as f64, from.1 + step.1 * *i as f64), c)).count() as f64;
    for (point, c, [left, right, up, down]) in [(blue, colour(1), [0.25, 0.25, 0.1, 0.1]), (green, colour(2), [0.05, 0.05, 0.05, 0.05])] {
        for (step, scale, expected) in [((-1.0, 0.0), kx, left), ((1.0, 0.0), kx, right), ((0.0, -1.0), ky, up), ((0.0, 1.0), ky, down)] {
            let reached = reach(point, step, c);
            assert!((reached - scale * expected).abs() <= 3.0, "bar of {c:?} in direction {step:?}: {reached} px, expected {}", scale * expected);
        }
    }
    let half_marker = (pareto::MARKER_PX / 2) as f64;
    assert!((reach(grey, (1.0, 0.0), colour(0)) - half_marker).abs() <= 2.0, "one seed: no error bar");
}
