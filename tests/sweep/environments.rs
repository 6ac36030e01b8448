//! The per-environment table (`environments.csv`) and the environments' Pareto chart, from
//! finished run directories written by hand: two environments × (routing, its baseline) × three
//! seeds, every value chosen here.

use super::*;
use smallrl::sweep::environments;
use smallrl::sweep::pareto_environments as chart;
use smallrl::sweep::plan::Arm;
use smallrl::intervention::Intervention;
use smallrl::sweep::{RunStatus, entries_of_plan};

/// Per environment: (its task component, routed run's seeds' [task, hack] in retain_only,
/// in both, and the baseline's in both).
type Values = [[f64; 3]; 2];
const SORTING: (&str, &str, Values, Values, Values) = (
    "sorting",
    "sorting_positional",
    [[0.6, 0.7, 0.9], [0.1, 0.2, 0.15]],
    [[0.5, 0.55, 0.6], [0.5, 0.6, 0.7]],
    [[0.3, 0.4, 0.35], [0.8, 0.9, 0.85]],
);
const ADDITION: (&str, &str, Values, Values, Values) = (
    "addition",
    "addition_digit",
    [[0.8, 0.85, 0.9], [0.05, 0.1, 0.3]],
    [[0.7, 0.6, 0.65], [0.4, 0.35, 0.3]],
    [[0.45, 0.5, 0.4], [0.6, 0.7, 0.65]],
);

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// The run's final evaluation (step 4; step 2 with other values) with the chosen values.
fn write_evaluations(dir: &Path, component: &str, modes: &[(&str, f64, f64)]) {
    let line = |step: usize, shift: f64| {
        let modes: Map<String, Value> = modes.iter().map(|(mode, task, hack)| (mode.to_string(), serde_json::json!({"reward": task + 0.5 * hack, "hack_freq": hack * shift, component: task * shift}))).collect();
        serde_json::json!({"step": step, "modes": modes}).to_string()
    };
    std::fs::write(dir.join("routing_eval.jsonl"), format!("{}\n{}\n", line(2, 0.5), line(4, 1.0))).unwrap();
}

/// Arms come from the interventions' declaration, colours from `ARM_COLOURS`: a new
/// intervention's arm fails here, naming the table to give it a colour, rather than in a chart.
#[test]
fn every_arm_has_its_own_colour() {
    for arm in Arm::NAMED {
        assert!(chart::ARM_COLOURS.iter().any(|(a, _)| *a == arm), "the {} arm has no colour in sweep/pareto_environments.rs's ARM_COLOURS", arm.name());
    }
    let colours: BTreeSet<(u8, u8, u8)> = chart::ARM_COLOURS.iter().map(|(_, c)| (c.0, c.1, c.2)).collect();
    assert_eq!(colours.len(), chart::ARM_COLOURS.len(), "two arms share a colour");
}

#[test]
fn environment_table_and_chart_read_each_cell_from_its_seeds() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("suite");
    let plugin_dir = format!("plugin_dir={}", common::plugin_dir().display());
    let sweep = SweepSpec {
        config_files: ["sorting", "addition"].map(|e| repo_root().join(format!("configs/envs/{e}.yaml"))).to_vec(),
        fixed: [parse_fixed("max_steps=4").unwrap(), parse_fixed(&plugin_dir).unwrap()].into_iter().collect(),
        grid: vec![parse_grid("seed=1,2,3").unwrap()],
        output_dir: out.clone(),
        intervention_arms: vec![Arm::Intervention(Intervention::Routing)],
    };
    let plan = plan::plan(&sweep).unwrap();
    assert_eq!(plan.runs.len(), 12);
    for run in &plan.runs {
        let dir = run.dir(&out);
        super::planning::fake_finished_run(&dir, &run.config);
        let (_, component, retain_only, both, baseline) = if run.config.environment.as_deref() == Some("sorting") { SORTING } else { ADDITION };
        let seed = run.config.seed as usize - 1;
        let at = |v: &Values| (v[0][seed], v[1][seed]);
        match Arm::of(&run.config) {
            Arm::Intervention(Intervention::Routing) => {
                let ((rt, rh), (bt, bh)) = (at(&retain_only), at(&both));
                write_evaluations(&dir, component, &[("both", bt, bh), ("retain_only", rt, rh), ("forget_only", 0.1, 0.95)]);
            }
            _ => write_evaluations(&dir, component, &[("both", at(&baseline).0, at(&baseline).1)]),
        }
    }
    let statuses = plan.runs.iter().map(|r| (r.name.clone(), RunStatus::Ok)).collect();
    let entries = entries_of_plan(&plan, &statuses);
    smallrl::sweep::report(&out, &entries).unwrap();

    // environments.csv: each (environment, arm, mode, metric) against the chosen seeds' values.
    let text = std::fs::read_to_string(out.join("environments.csv")).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(environments::CSV_HEADER));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let find = |env: &str, arm: &str, metric: &str, mode: &str| {
        let found: Vec<&Vec<&str>> = rows.iter().filter(|r| r[0] == env && r[1] == arm && r[5] == metric && r[6] == mode).collect();
        assert_eq!(found.len(), 1, "{env} {arm} {metric} {mode} in\n{text}");
        found[0].clone()
    };
    for (env, _, retain_only, both, baseline) in [SORTING, ADDITION] {
        for (arm, routing_mode, mode, values) in [("routing", "classic", "retain_only", retain_only), ("routing", "classic", "both", both), ("none", "none", "both", baseline)] {
            for (metric, seeds) in [("task_reward", values[0]), ("hack_freq", values[1])] {
                let row = find(env, arm, metric, mode);
                assert_eq!(&row[2..5], &[routing_mode, "0.5", "1"], "{env} {arm}: the cell's keys from config.yaml");
                assert_eq!(row[7], "3");
                let (m, low, high) = (row[8].parse::<f64>().unwrap(), row[9].parse::<f64>().unwrap(), row[10].parse::<f64>().unwrap());
                assert!((m - mean(&seeds)).abs() < 1e-12, "{env} {arm} {metric} {mode}: {m} vs {}", mean(&seeds));
                let (ref_low, ref_high) = reference_bootstrap(&seeds, smallrl::defaults::BOOTSTRAP_RESAMPLES, smallrl::defaults::BOOTSTRAP_SEED);
                assert!((low - ref_low).abs() < 1e-12 && (high - ref_high).abs() < 1e-12, "{env} {arm} {metric} {mode}: [{low}, {high}] vs [{ref_low}, {ref_high}]");
            }
        }
        let routed_task: Vec<f64> = (0..3).map(|s| retain_only[0][s] - retain_only[1][s]).collect();
        assert!((find(env, "routing", "retain_minus_hack", "retain_only")[8].parse::<f64>().unwrap() - mean(&routed_task)).abs() < 1e-12);
    }
    // Every metric and mode a run yields is in its cell (whatever run_values adds later).
    for entry in &entries {
        let cell = environments::Cell::of(&entry.config);
        for (metric, mode) in smallrl::sweep::arms::run_values(entry).unwrap().keys() {
            find(&cell.environment, cell.arm.name(), metric, mode);
        }
    }
    let mut per_cell: BTreeSet<(String, &str, &str, String)> = BTreeSet::new();
    for entry in &entries {
        let cell = environments::Cell::of(&entry.config);
        for (metric, mode) in smallrl::sweep::arms::run_values(entry).unwrap().into_keys() {
            per_cell.insert((cell.environment.clone(), cell.arm.name(), metric, mode));
        }
    }
    assert_eq!(rows.len(), per_cell.len(), "one row per cell and (metric, mode), nothing else");
    assert!(per_cell.len() >= 2 * (9 + 2), "per environment at least routing's 9 (metric, mode) pairs and the baseline's 2");

    // The chart: two panels side by side (addition, sorting), one point per arm in each, where
    // the values say.
    let path = out.join("charts").join(chart::FILE);
    if let Some(keep) = std::env::var_os("SMALLRL_KEEP_CHART") {
        std::fs::copy(&path, keep).unwrap();
    }
    let (width, height, pixels) = png_pixels(&path);
    assert_eq!((width, height), chart::size(2, 1));
    assert_eq!(width, 2 * chart::PANEL_PX.0);
    let index = std::fs::read_to_string(out.join("charts/index.html")).unwrap();
    assert!(index.contains(&format!("src=\"{}\"", chart::FILE)), "{index}");
    let side = smallrl::sweep::pareto::MARKER_PX as usize - 2;
    let colour = |arm: Arm| {
        let c = chart::colour_of(arm);
        (c.0, c.1, c.2)
    };
    // Marker centres of a colour, left panel first.
    let centres = |c: (u8, u8, u8)| {
        let corners = super::statistics::square_corners(width, &pixels, c, side);
        let mut centres: Vec<(f64, f64)> = Vec::new();
        for panel in 0..2 {
            let mine: Vec<&(usize, usize)> = corners.iter().filter(|p| p.0 / chart::PANEL_PX.0 as usize == panel).collect();
            assert!(!mine.is_empty(), "no marker of {c:?} in panel {panel}");
            let (x0, x1) = (mine.iter().map(|p| p.0).min().unwrap(), mine.iter().map(|p| p.0).max().unwrap());
            let (y0, y1) = (mine.iter().map(|p| p.1).min().unwrap(), mine.iter().map(|p| p.1).max().unwrap());
            assert!(x1 - x0 <= 4 && y1 - y0 <= 4, "one marker of {c:?} in panel {panel}: {x0}..{x1} x {y0}..{y1}");
            centres.push((((x0 + 1 - side) + x1) as f64 / 2.0, ((y0 + 1 - side) + y1) as f64 / 2.0));
        }
        centres
    };
    let (routed, plain) = (centres(colour(Arm::Intervention(Intervention::Routing))), centres(colour(Arm::None)));
    // Panels in name order: addition's (left) gives the scales (routing read in retain_only,
    // the baseline in both).
    let point = |v: &(&str, &str, Values, Values, Values), routed: bool| if routed { (mean(&v.2[1]), mean(&v.2[0])) } else { (mean(&v.4[1]), mean(&v.4[0])) };
    let (l_routed, l_plain, r_routed, r_plain) = (point(&ADDITION, true), point(&ADDITION, false), point(&SORTING, true), point(&SORTING, false));
    let kx = (plain[0].0 - routed[0].0) / (l_plain.0 - l_routed.0);
    let ky = (plain[0].1 - routed[0].1) / (l_routed.1 - l_plain.1);
    assert!(kx > 250.0 && ky > 200.0, "scales {kx} {ky}");
    // Sorting's panel: the same axes, one panel width to the right.
    let predicted = |p: (f64, f64)| (routed[0].0 + chart::PANEL_PX.0 as f64 + kx * (p.0 - l_routed.0), routed[0].1 - ky * (p.1 - l_routed.1));
    for (found, values) in [(routed[1], r_routed), (plain[1], r_plain)] {
        let expected = predicted(values);
        assert!((found.0 - expected.0).abs() <= 1.5 && (found.1 - expected.1).abs() <= 1.5, "sorting's point {values:?} at {found:?}, expected {expected:?}");
    }
    assert!(super::statistics::square_corners(width, &pixels, colour(Arm::Intervention(Intervention::Penalty)), side).is_empty(), "no penalty arm, no penalty point");
}

/// A cell pools seeds only: runs of one cell that differ in another key leave the table out.
#[test]
fn a_cell_mixing_settings_is_named_not_pooled() {
    let config = |lr: f64, seed: u64| TrainConfig { lr, seed, ..TrainConfig::default() };
    let entry = |config: TrainConfig| smallrl::sweep::RunEntry {
        name: config.run_name().unwrap(),
        dir: PathBuf::from("/nonexistent"),
        config,
        role: RunRole::Grid,
        baseline: None,
        status: RunStatus::Ok,
    };
    let seeds = [entry(config(1e-3, 1)), entry(config(1e-3, 2))];
    assert_eq!(environments::pooling_problem(&environments::cells(&seeds)).unwrap(), None);
    let mixed = [entry(config(1e-3, 1)), entry(config(3e-3, 2))];
    let why = environments::pooling_problem(&environments::cells(&mixed)).unwrap().expect("two settings in one cell");
    assert!(why.contains("[\"lr\"]") && why.contains("environment -"), "{why}");
}

/// The chart's reading: a routed arm in `deployed` when its cell has it (else `retain_only`),
/// other arms in `both`; x the ground truth `true_hack_freq` when every drawn cell has it.
#[test]
fn the_environment_chart_reads_routed_arms_deployed_and_the_ground_truth_when_logged() {
    use smallrl::stats::MeanCi;
    use smallrl::sweep::arms::{HACK_FREQ, TASK_REWARD};
    let cell = |environment: &str, arm: Arm, routing_mode: &str, recall: f64| environments::Cell { environment: environment.into(), arm, routing_mode: routing_mode.into(), hack_frac: 0.5, recall };
    let stat = |mean: f64| MeanCi { mean, ci: None, n: 1 };
    let row = |cell: &environments::Cell, metric: &'static str, mode: &str, mean: f64| environments::EnvRow { cell: cell.clone(), metric, mode: mode.into(), stat: stat(mean) };
    let routed = cell("sorting", Arm::Intervention(Intervention::Routing), "classic", 0.1);
    let plain = cell("sorting", Arm::None, "none", 0.1);
    let penalised = cell("sorting", Arm::Intervention(Intervention::Penalty), "none", 0.25);
    let mut rows = Vec::new();
    for (c, offset) in [(&routed, 0.0), (&plain, 0.01), (&penalised, 0.02)] {
        for (mode, base) in [("both", 0.1), ("retain_only", 0.2), ("forget_only", 0.3)] {
            rows.push(row(c, TASK_REWARD, mode, base + offset));
            rows.push(row(c, HACK_FREQ, mode, base + 0.5 + offset));
            rows.push(row(c, smallrl::sweep::arms::TRUE_HACK_FREQ, mode, base + 0.6 + offset));
        }
    }
    let read = |rows: &[environments::EnvRow]| {
        let drawn = chart::chart(rows).expect("points to draw");
        assert_eq!(drawn.panels.len(), 1);
        let points: Vec<(usize, (u8, u8, u8), f64, f64)> = drawn.panels[0].1.iter().map(|p| (p.number, (p.color.0, p.color.1, p.color.2), p.hack.mean, p.task.mean)).collect();
        (drawn.x_metric, drawn.cells.clone(), points)
    };
    let colour = |arm: Arm| {
        let c = chart::colour_of(arm);
        (c.0, c.1, c.2)
    };
    let (x_metric, cells, points) = read(&rows);
    assert_eq!(x_metric, smallrl::sweep::arms::TRUE_HACK_FREQ);
    assert_eq!(cells, vec![(0.5, 0.1), (0.5, 0.25)], "points numbered by (hack_frac, recall)");
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    let expected = [(1, colour(Arm::None), 0.71, 0.11), (1, colour(Arm::Intervention(Intervention::Routing)), 0.8, 0.2), (2, colour(Arm::Intervention(Intervention::Penalty)), 0.72, 0.12)];
    assert_eq!(points.len(), 3, "{points:?}");
    for wanted in expected {
        assert!(points.iter().any(|found| found.0 == wanted.0 && found.1 == wanted.1 && close(found.2, wanted.2) && close(found.3, wanted.3)), "{wanted:?} not in {points:?}");
    }
    // The routed run's deployed mode, when logged, is what it is read in.
    rows.push(row(&routed, TASK_REWARD, smallrl::sweep::arms::DEPLOYED_MODE, 0.4));
    rows.push(row(&routed, HACK_FREQ, smallrl::sweep::arms::DEPLOYED_MODE, 0.05));
    rows.push(row(&routed, smallrl::sweep::arms::TRUE_HACK_FREQ, smallrl::sweep::arms::DEPLOYED_MODE, 0.07));
    let (_, _, points) = read(&rows);
    assert_eq!(points.len(), 3, "{points:?}");
    assert!(points.iter().any(|p| p.1 == colour(Arm::Intervention(Intervention::Routing)) && close(p.2, 0.07) && close(p.3, 0.4)), "{points:?}");
    // One drawn cell without the ground truth: the monitor's rate for all.
    rows.retain(|r| !(r.cell == penalised && r.metric == smallrl::sweep::arms::TRUE_HACK_FREQ));
    let (x_metric, _, points) = read(&rows);
    assert_eq!(x_metric, HACK_FREQ);
    assert!(points.iter().any(|p| p.1 == colour(Arm::Intervention(Intervention::Routing)) && close(p.2, 0.05)) && points.iter().any(|p| p.1 == colour(Arm::None) && close(p.2, 0.61)), "{points:?}");
}
