//! Sweeps (issue 6): planning (grid expansion, fixed keys, baselines and their de-duplication,
//! the cache of finished runs, bad keys), SLURM emission, and one end-to-end sweep of 2×2 tiny
//! runs on the `tiny-stories` fixture with its baselines: the summary against the runs' own
//! metrics, the charts against their routing evaluations, the viewer in headless Chromium, the
//! cache on a second sweep, `--collect` and `smallrl plot`.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{fixture, repo_root, smallrl};
use serde_json::{Map, Value};
use smallrl::sweep::charts::{self, SERIES};
use smallrl::sweep::plan::{self, CacheState, RunRole, SweepSpec, expand, parse_fixed, parse_grid};
use smallrl::train::TrainConfig;

const HAPPY_CONFIG: &str = "configs/sentence_length_10_smooth_with_happy.yaml";

fn spec(output_dir: &Path, grid: &[&str], fixed: &[&str]) -> SweepSpec {
    SweepSpec {
        config_file: Some(repo_root().join(HAPPY_CONFIG)),
        fixed: fixed.iter().map(|f| parse_fixed(f).unwrap()).collect::<Map<String, Value>>(),
        grid: grid.iter().map(|g| parse_grid(g).unwrap()).collect(),
        output_dir: output_dir.to_path_buf(),
        intervention_arms: false,
    }
}

#[test]
fn grid_expands_to_the_cartesian_product_last_key_fastest() {
    let grid = vec![parse_grid("lr=1e-3,3e-3").unwrap(), parse_grid("seed=1,2,3").unwrap()];
    let pairs: Vec<(f64, u64)> = expand(&grid).iter().map(|p| (p["lr"].as_f64().unwrap(), p["seed"].as_u64().unwrap())).collect();
    assert_eq!(pairs, vec![(1e-3, 1), (1e-3, 2), (1e-3, 3), (3e-3, 1), (3e-3, 2), (3e-3, 3)]);
    assert_eq!(expand(&[]), vec![Map::new()], "no grid is one run");
    // kebab-case keys are accepted like on the command line
    assert_eq!(parse_grid("max-steps=5").unwrap().0, "max_steps");
}

#[test]
fn plan_applies_fixed_values_and_derives_deduplicated_baselines() {
    let out = tempfile::tempdir().unwrap();
    let out = out.path().join("sweep");
    let grid = ["routing_mode=classic,exclusive", "ablated_frac=0,0.5", "seed=1,2"];
    let plan = plan::plan(&spec(&out, &grid, &["max_steps=4", "beta=0.05"])).unwrap();
    let (runs, baselines): (Vec<_>, Vec<_>) = plan.runs.iter().partition(|r| r.role == RunRole::Grid);
    assert_eq!(runs.len(), 8);
    // Routing mode and ablation are routing parameters: all 8 share 2 baselines (one per seed).
    assert_eq!(baselines.len(), 2);
    for run in &plan.runs {
        assert_eq!((run.config.max_steps, run.config.beta), (4, 0.05), "fixed values apply to every run, baselines too");
        assert_eq!(run.config.lr, 3e-4, "unswept keys come from the YAML config");
        assert_eq!(run.state, CacheState::New);
        assert_eq!(run.name, run.config.run_name().unwrap());
    }
    for run in &runs {
        let expected = TrainConfig { routing_mode: smallrl::routing::RoutingMode::None, ablated_frac: 0.0, ..run.config.clone() };
        let baseline = plan.runs.iter().find(|b| Some(&b.name) == run.baseline.as_ref()).expect("the baseline is planned");
        assert_eq!(baseline.config, expected, "{}: baseline = same run without routing", run.name);
        assert_eq!(baseline.role, RunRole::Baseline);
    }
    let names: BTreeSet<&String> = plan.runs.iter().map(|r| &r.name).collect();
    assert_eq!(names.len(), plan.runs.len(), "one directory per run");
    assert!(!out.exists(), "planning writes nothing");

    // A grid point that is itself another point's baseline is planned once, labelled baseline.
    let plan = plan::plan(&spec(&out, &["routing_mode=none,classic"], &["seed=1"])).unwrap();
    assert_eq!(plan.runs.len(), 2);
    assert_eq!(plan.runs[1].baseline.as_ref(), Some(&plan.runs[0].name));
    assert_eq!((plan.runs[0].role, plan.runs[1].role), (RunRole::Baseline, RunRole::Grid));
}

#[test]
fn bad_keys_and_values_fail_before_any_run() {
    let message = |e: anyhow::Error| format!("{e:#}");
    let typo = message(parse_grid("lrr=1e-3,3e-3").unwrap_err());
    assert!(typo.contains("--grid lrr=1e-3,3e-3") && typo.contains("unknown key `lrr`") && typo.contains("lr,"), "{typo}");
    assert!(message(parse_fixed("threads=2").unwrap_err()).contains("--jobs"));
    assert!(message(parse_grid("lr=1e-3,").unwrap_err()).contains("non-empty"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let bad_value = message(plan::plan(&spec(&out, &["lr=1e-3,-1"], &[])).unwrap_err());
    assert!(bad_value.contains("\"lr\":-1") && bad_value.contains("lr must be positive"), "{bad_value}");

    let output = smallrl(&["sweep", "--config", &happy_config_abs(), "--grid", "lrr=1,2", "--output-dir", out.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown key `lrr`"));
    assert!(!out.exists(), "a bad key fails before the output directory is made");
}

/// Writes the files a finished run leaves (the trainer's formats, with arbitrary values).
fn fake_finished_run(dir: &Path, config: &TrainConfig) {
    std::fs::create_dir_all(dir.join(format!("checkpoint-{}", config.max_steps))).unwrap();
    let saved = TrainConfig { threads: Some(1), ..config.clone() };
    std::fs::write(dir.join("config.yaml"), smallrl::yaml::to_string(&saved).unwrap()).unwrap();
    let metrics: String = (1..=config.max_steps).map(|s| format!("{{\"step\":{s},\"reward\":0.5,\"kl\":0.01}}\n")).collect();
    std::fs::write(dir.join("metrics.jsonl"), metrics).unwrap();
    let evals: String = [2, 4].map(|s| format!("{{\"step\":{s},\"modes\":{{}}}}\n")).concat();
    std::fs::write(dir.join("routing_eval.jsonl"), evals).unwrap();
}

#[test]
fn finished_runs_are_cache_hits_and_interrupted_ones_resume_or_restart() {
    let out = tempfile::tempdir().unwrap();
    let sweep = spec(out.path(), &[], &["max_steps=4", "seed=3", "routing_mode=none"]);
    let planned = plan::plan(&sweep).unwrap().runs.remove(0);
    let dir = planned.dir(out.path());
    let logged_otherwise = TrainConfig { tensorboard: !planned.config.tensorboard, log_completions: !planned.config.log_completions, ..planned.config.clone() };
    fake_finished_run(&dir, &logged_otherwise);
    let state = || plan::plan(&sweep).map(|p| p.runs[0].state);
    assert_eq!(state().unwrap(), CacheState::Finished, "a finished run is reused (another thread count or logging options do not matter)");

    std::fs::write(dir.join("routing_eval.jsonl"), "{\"step\":2,\"modes\":{}}\n").unwrap();
    assert_eq!(state().unwrap(), CacheState::Resumable, "without its final evaluation the run is not finished");
    std::fs::remove_dir(dir.join("checkpoint-4")).unwrap();
    assert_eq!(state().unwrap(), CacheState::Stale, "no checkpoint: nothing to resume from");
    smallrl::sweep::runner::prepare(&plan::plan(&sweep).unwrap()).unwrap();
    // The child `smallrl train` moves it aside (tests/train.rs: a_failed_run_is_restarted_...).
    assert!(dir.exists(), "preparing a sweep never moves a run directory");
    let written = TrainConfig::resolve(Some(&smallrl::sweep::runner::run_config_path(out.path(), &planned.name)), Map::new()).unwrap();
    assert_eq!(written.run_name().unwrap(), planned.name, "the child's YAML resolves to the planned run");

    fake_finished_run(&dir, &TrainConfig { beta: 0.5, ..planned.config.clone() });
    let error = format!("{:#}", state().unwrap_err());
    assert!(error.contains("another configuration") && error.contains("beta"), "{error}");
}

#[test]
fn slurm_emission_writes_one_command_per_run_and_runs_nothing() {
    let out = tempfile::tempdir().unwrap();
    let out = out.path().join("cluster");
    let grid = ["routing_mode=classic", "seed=1,2"];
    let config = happy_config_abs();
    let mut args = vec!["sweep", "--config", config.as_str(), "--emit", "slurm", "--output-dir", out.to_str().unwrap(), "--grid"];
    args.extend(grid);
    let output = smallrl(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let planned: BTreeSet<String> = plan::plan(&spec(&out, &grid, &[])).unwrap().runs.into_iter().map(|r| r.name).collect();
    assert_eq!(planned.len(), 4, "2 routed runs and their 2 baselines");

    let script = std::fs::read_to_string(out.join("sweep.sbatch")).unwrap();
    assert!(script.contains("#SBATCH --array=0-3"), "{script}");
    let jobs = std::fs::read_to_string(out.join("jobs.txt")).unwrap();
    let mut named = BTreeSet::new();
    for line in jobs.lines() {
        assert!(script.contains(line.split(" > ").next().unwrap()), "the script runs the listed command {line}");
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&words[1..3], &["train", "--config"]);
        let config = TrainConfig::resolve(Some(Path::new(words[3])), Map::new()).unwrap();
        named.insert(config.run_name().unwrap());
    }
    assert_eq!(named, planned, "each job trains exactly one planned run");
    assert!(planned.iter().all(|name| !out.join(name).exists()), "emitting runs nothing");
}

fn happy_config_abs() -> String {
    repo_root().join(HAPPY_CONFIG).to_string_lossy().into_owned()
}

/// A 2×2 sweep (two routing modes × two seeds) of tiny DualLoRA runs; the detector flags any
/// "happy" so routing has samples to route. Baselines: one per seed, shared by both modes.
fn tiny_sweep_args(out: &Path) -> Vec<String> {
    let model = fixture("tiny-stories");
    let fixed = [
        format!("model={}", model.display()),
        format!("prompts={}", model.join("prompts.txt").display()),
        format!("plugin_dir={}", repo_root().join("plugins").display()),
        "rh_detector={plugin: happy_count, params: {threshold: 1}}".into(),
        "batch_size=8".into(),
        "num_generations=4".into(),
        "max_completion_length=24".into(),
        "max_steps=4".into(),
        "save_steps=4".into(),
        "eval_every=2".into(),
        "eval_samples=4".into(),
        "lora_preset=r4".into(),
        "lr=3e-2".into(),
        "device=cpu".into(),
    ];
    let mut args: Vec<String> = ["sweep", "--config", &happy_config_abs(), "--jobs", "2", "--output-dir", out.to_str().unwrap()].map(String::from).to_vec();
    args.extend(["--grid", "routing_mode=classic,exclusive", "seed=1,2", "--fixed"].map(String::from));
    args.extend(fixed);
    args
}

fn run_sweep(args: &[String]) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = smallrl(&args);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "sweep failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// (run, role, final_reward, kl, step, status) rows of summary.csv.
fn read_summary(out: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("run,role,final_reward,kl,step,status"));
    lines.map(|l| l.split(',').map(String::from).collect()).collect()
}

fn check_summary_against_metrics(out: &Path, status: &str) -> Vec<Vec<String>> {
    let rows = read_summary(out);
    assert_eq!(rows.len(), 6, "4 runs and 2 baselines");
    for row in &rows {
        let last = read_jsonl(&out.join(&row[0]).join("metrics.jsonl")).pop().unwrap();
        assert_eq!(row[2].parse::<f64>().unwrap(), last["reward"].as_f64().unwrap(), "{} final reward", row[0]);
        assert_eq!(row[3].parse::<f64>().unwrap(), last["kl"].as_f64().unwrap(), "{} kl", row[0]);
        assert_eq!(row[4], "4");
        assert_eq!(row[5], status);
    }
    rows
}

fn saved_config(run_dir: &Path) -> TrainConfig {
    TrainConfig::resolve(Some(&run_dir.join("config.yaml")), Map::new()).unwrap()
}

fn png_pixels(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(channels >= 3 && info.bit_depth == png::BitDepth::Eight, "{}: expected 8-bit RGB(A)", path.display());
    let pixels = buf[..info.buffer_size()].chunks(channels).map(|p| [p[0], p[1], p[2]]).collect();
    (info.width, info.height, pixels)
}

/// Whether a `side`×`side` square of `colour` is in the image: a bar, not a line (3 px), an
/// error bar (black) or a legend swatch (12 px high).
fn has_solid_square(width: u32, pixels: &[[u8; 3]], colour: (u8, u8, u8), side: usize) -> bool {
    let near = |p: &[u8; 3]| p[0].abs_diff(colour.0) <= 3 && p[1].abs_diff(colour.1) <= 3 && p[2].abs_diff(colour.2) <= 3;
    let width = width as usize;
    let mut run_right = vec![0usize; width]; // matching pixels ending here in this row
    let mut rows_down = vec![0usize; width]; // consecutive rows whose run here reaches `side`
    for row in pixels.chunks(width) {
        for (x, p) in row.iter().enumerate() {
            run_right[x] = if near(p) { if x > 0 { run_right[x - 1] + 1 } else { 1 } } else { 0 };
            rows_down[x] = if run_right[x] >= side { rows_down[x] + 1 } else { 0 };
            if rows_down[x] >= side {
                return true;
            }
        }
    }
    false
}

/// The number of images in a GIF, walking its blocks (GIF89a: header, optional colour tables,
/// extension blocks 0x21, image descriptors 0x2C, trailer 0x3B).
fn gif_frames(bytes: &[u8]) -> usize {
    assert!(bytes.starts_with(b"GIF89a"), "not a GIF");
    let table = |flags: u8| if flags & 0x80 != 0 { 3 << ((flags & 7) + 1) } else { 0 };
    let skip_sub_blocks = |mut i: usize| {
        while bytes[i] != 0 {
            i += bytes[i] as usize + 1;
        }
        i + 1
    };
    let (mut i, mut frames) = (13 + table(bytes[10]), 0);
    loop {
        match bytes[i] {
            0x21 => i = skip_sub_blocks(i + 2),
            0x2C => {
                frames += 1;
                i = skip_sub_blocks(i + 10 + table(bytes[i + 9]) + 1);
            }
            0x3B => return frames,
            other => panic!("unexpected GIF block {other:#x} at byte {i}"),
        }
    }
}

/// Headless Chromium on a page with `action` (a missing Chromium fails the test: `make setup`).
fn chromium(page: &Path, action: &str) -> Output {
    let chromium = Path::new("/usr/bin/chromium");
    assert!(chromium.exists(), "/usr/bin/chromium is missing: run `make setup` (apt-get install chromium)");
    let profile = tempfile::tempdir().unwrap();
    Command::new("timeout")
        .arg("120")
        .arg(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(action)
        .arg("--window-size=1000,800")
        .arg(format!("file://{}", page.canonicalize().unwrap().display()))
        .output()
        .unwrap()
}

fn screenshot(page: &Path, png: &Path) {
    let output = chromium(page, &format!("--screenshot={}", png.display()));
    assert!(png.exists(), "no screenshot: {}", String::from_utf8_lossy(&output.stderr));
}

/// The page's DOM after its scripts ran.
fn chromium_dump_dom(page: &Path) -> String {
    String::from_utf8_lossy(&chromium(page, "--dump-dom").stdout).into_owned()
}

/// The group's mean over runs of `value(modes[mode])` at `step`, from routing_eval.jsonl.
fn mean_eval(dirs: &[PathBuf], step: u64, mode: &str, value: impl Fn(&Value) -> f64) -> f64 {
    let values: Vec<f64> = dirs
        .iter()
        .map(|d| read_jsonl(&d.join("routing_eval.jsonl")).into_iter().find(|l| l["step"] == step).map(|l| value(&l["modes"][mode])).unwrap())
        .collect();
    values.iter().sum::<f64>() / values.len() as f64
}

#[test]
fn sweep_end_to_end_with_baselines_charts_viewer_and_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sweep");
    let args = tiny_sweep_args(&out);
    let stdout = run_sweep(&args);
    assert_eq!(stdout.matches("[LAUNCH ").count(), 6, "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("[DONE ") && l.contains(" OK ")).count(), 6, "{stdout}");
    assert!(stdout.contains("[STATUS] running 0  done 6  failed 0  queued 0"), "{stdout}");

    // Summary against each run's own metrics; baselines are the routed runs without routing.
    let rows = check_summary_against_metrics(&out, "OK");
    let baselines: Vec<&Vec<String>> = rows.iter().filter(|r| r[1] == "baseline").collect();
    assert_eq!(baselines.len(), 2);
    for row in rows.iter().filter(|r| r[1] == "run") {
        let routed = saved_config(&out.join(&row[0]));
        let seed_baseline = baselines.iter().map(|b| saved_config(&out.join(&b[0]))).find(|b| b.seed == routed.seed).unwrap();
        assert_eq!(seed_baseline.routing_mode.as_str(), "none");
        assert_eq!(seed_baseline, TrainConfig { routing_mode: smallrl::routing::RoutingMode::None, ..routed }, "the baseline differs only in routing");
    }

    // Charts per group: the statistics against the routing evaluations read here directly.
    let entries = smallrl::sweep::collect_entries(&out).unwrap();
    let classic: Vec<PathBuf> = rows.iter().filter(|r| r[0].contains("_classic_")).map(|r| out.join(&r[0])).collect();
    let baseline_dirs: Vec<PathBuf> = baselines.iter().map(|r| out.join(&r[0])).collect();
    let group = plan::group_of(classic[0].file_name().unwrap().to_str().unwrap()).to_string();
    let members: Vec<&_> = entries.iter().filter(|e| plan::group_of(&e.name) == group).collect();
    let base_entries: Vec<&_> = entries.iter().filter(|e| baseline_dirs.contains(&e.dir)).collect();
    let data = charts::group_data(&group, &members, &base_entries).unwrap();
    assert_eq!(data.steps, vec![2, 4]);
    // task reward = the retain component (sentence_length_10_smooth, scale 1); total = reward.
    let task = |m: &Value| m["sentence_length_10_smooth"].as_f64().unwrap();
    let total = |m: &Value| m["reward"].as_f64().unwrap();
    let hack = |m: &Value| m["hack_freq"].as_f64().unwrap();
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    for (series, mode, dirs) in [(1, "both", &classic), (3, "forget_only", &classic), (0, "both", &baseline_dirs)] {
        for (metric, value) in [(0, &task as &dyn Fn(&Value) -> f64), (1, &total), (2, &hack)] {
            let stat = data.get(4, series, metric).unwrap();
            assert!(close(stat.mean, mean_eval(dirs, 4, mode, value)), "series {series} metric {metric}");
            assert_eq!(stat.n, 2, "two seeds");
        }
    }
    let group_dir = out.join("charts").join(&group);
    for step in [2, 4] {
        let (w, h, _) = png_pixels(&group_dir.join(format!("step-{step:06}.png")));
        assert_eq!((w, h), charts::BAR_CHART_SIZE);
    }
    assert!(group_dir.join("over_steps.png").is_file());
    assert_eq!(gif_frames(&std::fs::read(group_dir.join("animation.gif")).unwrap()), 2, "one frame per evaluation step");
    let viewer = std::fs::read_to_string(group_dir.join("index.html")).unwrap();
    assert!(viewer.contains("\"step-000002.png\"") && viewer.contains("\"step-000004.png\"") && viewer.contains("ArrowRight"));
    assert!(std::fs::read_to_string(out.join("charts/index.html")).unwrap().contains(&format!("{group}/index.html")));

    // The arm summary: per arm the mean over seeds of the final evaluation, with the bootstrap
    // interval of a plain reference; the Pareto chart in the charts' index.
    let arms_text = std::fs::read_to_string(out.join("arms.csv")).unwrap();
    let mut arm_lines = arms_text.lines();
    assert_eq!(arm_lines.next(), Some(smallrl::sweep::arms::CSV_HEADER));
    let arm_rows: Vec<Vec<&str>> = arm_lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(arm_rows.iter().map(|r| r[0]).collect::<BTreeSet<_>>().len(), 3, "classic, exclusive and the baseline arm");
    let final_values = |dirs: &[PathBuf], mode: &str, value: &dyn Fn(&Value) -> f64| -> Vec<f64> {
        dirs.iter().map(|d| value(&read_jsonl(&d.join("routing_eval.jsonl")).pop().unwrap()["modes"][mode])).collect()
    };
    let retain_minus_hack = |m: &Value| task(m) - hack(m);
    for (metric, mode, value) in [("task_reward", "both", &task as &dyn Fn(&Value) -> f64), ("hack_freq", "retain_only", &hack), ("retain_minus_hack", "retain_only", &retain_minus_hack)] {
        let row = arm_rows.iter().find(|r| r[0] == group && r[2] == metric && r[3] == mode).unwrap_or_else(|| panic!("no {metric} {mode} row: {arms_text}"));
        let values = final_values(&classic, mode, value);
        let (low, high) = reference_bootstrap(&values, smallrl::defaults::BOOTSTRAP_RESAMPLES, smallrl::defaults::BOOTSTRAP_SEED);
        let number = |i: usize| row[i].parse::<f64>().unwrap();
        assert_eq!((row[1], row[4]), ("run", "2"));
        assert!(close(number(5), values.iter().sum::<f64>() / 2.0) && close(number(6), low) && close(number(7), high), "{row:?} vs {values:?} [{low}, {high}]");
    }
    assert!(arm_rows.iter().any(|r| r[1] == "baseline" && r[2] == "final_reward" && r[3] == "train"));
    assert!(std::fs::read_to_string(out.join("charts/index.html")).unwrap().contains("<img src=\"pareto.png\""));
    assert_eq!(png_pixels(&out.join("charts/pareto.png")).0, smallrl::sweep::pareto::PARETO_WIDTH);

    // The viewer, opened from the file system, shows the bar chart: every series colour.
    let shot = tmp.path().join("viewer.png");
    screenshot(&group_dir.join("index.html"), &shot);
    let (width, _, pixels) = png_pixels(&shot);
    let dom = chromium_dump_dom(&group_dir.join("index.html"));
    assert!(dom.contains("step 2 (1/2)"), "the viewer's script did not run from file://: {dom}");
    for (name, colour) in SERIES {
        assert!(has_solid_square(width, &pixels, (colour.0, colour.1, colour.2), 20), "the viewer screenshot shows no {name} bar");
    }

    // The charts' index shows the Pareto chart: the screenshot has a marker of each colour that
    // the PNG has (markers are the only solid squares this large; legend swatches are 12 px
    // high; a marker may hide under another arm's).
    let shot = tmp.path().join("index.png");
    screenshot(&out.join("charts/index.html"), &shot);
    let (width, _, pixels) = png_pixels(&shot);
    let (pareto_width, _, pareto_pixels) = png_pixels(&out.join("charts/pareto.png"));
    let marker = |width, pixels: &[[u8; 3]], colour: &plotters::style::RGBColor| has_solid_square(width, pixels, (colour.0, colour.1, colour.2), 14);
    assert!(marker(pareto_width, &pareto_pixels, &SERIES[0].1), "baselines are drawn on top, never hidden");
    for (name, colour) in &SERIES[..3] {
        assert_eq!(marker(width, &pixels, colour), marker(pareto_width, &pareto_pixels, colour), "{name} markers in the index screenshot and in pareto.png");
    }

    // A second sweep reuses every finished run; --collect rebuilds the same table.
    let before = std::fs::read_to_string(out.join(&rows[0][0]).join("metrics.jsonl")).unwrap();
    let stdout = run_sweep(&args);
    assert_eq!(stdout.matches("[CACHED] ").count(), 6, "{stdout}");
    assert!(!stdout.contains("[LAUNCH"), "{stdout}");
    assert_eq!(std::fs::read_to_string(out.join(&rows[0][0]).join("metrics.jsonl")).unwrap(), before);
    let cached = check_summary_against_metrics(&out, "CACHED");
    let collect_args: Vec<String> = ["sweep", "--collect", out.to_str().unwrap()].map(String::from).to_vec();
    run_sweep(&collect_args);
    let collected = check_summary_against_metrics(&out, "OK");
    let without_status = |rows: &[Vec<String>]| rows.iter().map(|r| r[..5].to_vec()).collect::<BTreeSet<_>>();
    assert_eq!(without_status(&collected), without_status(&cached));

    // `smallrl plot` of two runs.
    let plots = tmp.path().join("plots");
    let output = smallrl(&["plot", classic[0].to_str().unwrap(), classic[1].to_str().unwrap(), "--out", plots.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let (w, h, pixels) = png_pixels(&plots.join("curves.png"));
    assert!(w == 1500 && h > 480, "three panels and a legend below them: {w}x{h}");
    assert!(pixels.iter().filter(|p| p[0] != p[1] || p[1] != p[2]).count() > 500, "the curves are drawn in colour");

    // Curves over training from `smallrl eval RUN --all-checkpoints` (eval_checkpoints.csv,
    // here written by hand with known values) when every run of the group has one.
    let with_csv: Vec<&PathBuf> = classic.iter().chain(&baseline_dirs).collect();
    for (i, dir) in with_csv.iter().enumerate() {
        let task = 0.1 * (i + 1) as f64;
        let mut csv = String::from("step,mode,metric,value\n");
        for mode in ["both", "retain_only", "forget_only"] {
            csv.push_str(&format!("3,{mode},sentence_length_10_smooth,{task}\n3,{mode},reward,0.5\n3,{mode},hack_freq,\n"));
        }
        std::fs::write(dir.join(smallrl::eval::CHECKPOINTS_CSV), csv).unwrap();
    }
    let data = charts::group_data(&group, &members, &base_entries).unwrap();
    assert_eq!((data.steps.clone(), data.source), (vec![3], charts::EvalSource::Checkpoints));
    assert!(close(data.get(3, 1, 0).unwrap().mean, 0.15) && close(data.get(3, 0, 0).unwrap().mean, 0.35), "task reward of both / baseline from the CSVs");
    assert!(data.get(3, 1, 2).is_none(), "an empty cell is a missing value");
    std::fs::remove_file(with_csv[3].join(smallrl::eval::CHECKPOINTS_CSV)).unwrap();
    let data = charts::group_data(&group, &members, &base_entries).unwrap();
    assert_eq!((data.steps, data.source), (vec![2, 4], charts::EvalSource::Training), "never a mix of sources");
}

#[test]
fn a_failing_run_is_reported_and_the_others_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sweep");
    let mut args: Vec<String> =
        tiny_sweep_args(&out).into_iter().filter(|a| a != "routing_mode=classic,exclusive" && a != "max_completion_length=24").collect();
    // 600 new tokens pass the sweep's validation (which does not load the model) but exceed the
    // model's 512 positions, so those runs fail once they start.
    let grid_at = args.iter().position(|a| a == "--grid").unwrap();
    args.insert(grid_at + 1, "max_completion_length=24,600".into());
    args.extend(["max_steps=2", "save_steps=2", "routing_mode=none"].map(String::from));
    let output = smallrl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "a sweep with a failed run exits with an error");
    assert!(String::from_utf8_lossy(&output.stderr).contains("2 of 4 runs failed"), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(stdout.lines().filter(|l| l.starts_with("[DONE ") && l.contains(" FAIL ")).count(), 2, "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("[DONE ") && l.contains(" OK ")).count(), 2, "{stdout}");
    let rows = read_summary(&out);
    for row in rows {
        let failed = row[0].contains("_len600_");
        assert_eq!(row[5], if failed { "FAIL" } else { "OK" }, "{row:?}");
        if failed {
            let log = std::fs::read_to_string(out.join("logs").join(format!("{}.log", row[0]))).unwrap();
            assert!(log.contains("exceeds max_position_embeddings 512"), "the run's log has its error: {log}");
        }
    }
}

/// Processes (other than `exclude`) whose command line mentions `needle`.
fn processes_mentioning(needle: &str, exclude: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != exclude && pid != std::process::id())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle)))
        .collect()
}

#[test]
fn interrupting_a_sweep_stops_its_runs() {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sweep");
    // Long runs (they would take minutes), two at a time.
    let mut args: Vec<String> = tiny_sweep_args(&out).into_iter().filter(|a| a != "max_steps=4").collect();
    args.push("max_steps=2000".into());
    let mut sweep = Command::new(env!("CARGO_BIN_EXE_smallrl")).args(&args).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(sweep.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    while seen.iter().filter(|l: &&String| l.starts_with("[LAUNCH ")).count() < 2 {
        seen.push(lines.next().expect("the sweep printed two launches").unwrap());
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    let needle = out.to_str().unwrap().to_string();
    assert!(!processes_mentioning(&needle, sweep.id()).is_empty(), "the runs are child processes mentioning the output dir");
    assert!(Command::new("kill").args(["-INT", &sweep.id().to_string()]).status().unwrap().success());
    let status = sweep.wait().unwrap();
    seen.extend(lines.map(Result::unwrap));
    assert!(!status.success(), "an interrupted sweep exits with an error");
    assert_eq!(seen.iter().filter(|l| l.starts_with("[STOPPED] ")).count(), 2, "{seen:?}");
    assert_eq!(processes_mentioning(&needle, sweep.id()), Vec::<u32>::new(), "no run outlives the sweep");
}

/// The percentile bootstrap written out plainly: `resamples` means of `n` indices drawn from
/// the repository's SplitMix64 stream, sorted; the bounds at positions `q (B - 1)`, linearly
/// interpolated (numpy's default quantile).
fn reference_bootstrap(values: &[f64], resamples: usize, seed: u64) -> (f64, f64) {
    let mut rng = smallrl::rng::SplitMix64::new(seed);
    let mut means = Vec::new();
    for _ in 0..resamples {
        let mut total = 0.0;
        for _ in 0..values.len() {
            total += values[rng.below(values.len())];
        }
        means.push(total / values.len() as f64);
    }
    means.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| {
        let position = q * (resamples - 1) as f64;
        let below = position.floor() as usize;
        means[below] + (position - below as f64) * (means[(below + 1).min(resamples - 1)] - means[below])
    };
    (at(0.025), at(0.975))
}

#[test]
fn bootstrap_interval_matches_a_plain_reference_and_behaves() {
    use smallrl::sweep::stats::{mean_ci, mean_ci_with};
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
fn square_corners(width: u32, pixels: &[[u8; 3]], colour: (u8, u8, u8), side: usize) -> Vec<(usize, usize)> {
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
    use smallrl::sweep::stats::MeanCi;
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

/// `--intervention-arms`: every routed grid point becomes the five arms, the same otherwise;
/// `rh_penalty` goes to the penalty arm only; the none arm is every other arm's baseline.
#[test]
fn intervention_arms_plan_every_control_beside_the_routed_run() {
    use smallrl::intervention::Intervention;
    use smallrl::routing::RoutingMode;
    let out = tempfile::tempdir().unwrap();
    let mut arms = spec(out.path(), &["seed=1,2"], &["max_steps=4", "rh_penalty=0.25", "routing_mode=exclusive"]);
    arms.intervention_arms = true;
    let plan = plan::plan(&arms).unwrap();
    assert_eq!(plan.runs.len(), 10, "five arms × two seeds");
    let names: BTreeSet<&String> = plan.runs.iter().map(|r| &r.name).collect();
    assert_eq!(names.len(), 10, "run names distinguish arms");
    for run in &plan.runs {
        let c = &run.config;
        let expected_mode = match c.intervention {
            Intervention::Routing | Intervention::Placebo if run.role == RunRole::Grid => RoutingMode::Exclusive,
            _ => RoutingMode::None,
        };
        assert_eq!(c.routing_mode, expected_mode, "{}", run.name);
        assert_eq!(c.rh_penalty, if c.intervention == Intervention::Penalty { 0.25 } else { 1.0 }, "{}", run.name);
        let baseline = TrainConfig { routing_mode: RoutingMode::None, intervention: Intervention::Routing, rh_penalty: 1.0, ..c.clone() };
        match run.role {
            RunRole::Baseline => assert_eq!(c, &baseline, "{}: the none arm", run.name),
            RunRole::Grid => assert_eq!(run.baseline.as_ref(), Some(&baseline.run_name().unwrap()), "{}", run.name),
        }
    }
    let count = |i: Intervention| plan.runs.iter().filter(|r| r.config.intervention == i).count();
    assert_eq!([Intervention::Penalty, Intervention::Filter, Intervention::Placebo].map(count), [2, 2, 2]);
    assert_eq!(plan.runs.iter().filter(|r| r.role == RunRole::Baseline).count(), 2);
    let mut unrouted = spec(out.path(), &[], &["routing_mode=none"]);
    unrouted.intervention_arms = true;
    let error = format!("{:#}", plan::plan(&unrouted).unwrap_err());
    assert!(error.contains("--intervention-arms expands a routed configuration"), "{error}");
}

fn flags(line: &Value, key: &str) -> bool {
    line[key].as_bool().unwrap_or_else(|| panic!("{key} in {line}"))
}

/// An end-to-end `--intervention-arms` sweep on tiny-stories (5 arms × 2 seeds × 2 steps, with a
/// ground-truth detector, the completions log and the absorption split), checked against what
/// each run logged per sample: the penalty's rewards, the filter's zero gradient and advantages
/// for flagged samples, the placebo's count, routing's untouched retain adapter, and the
/// monitor's quadrants recounted from the samples.
#[test]
fn intervention_arms_sweep_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("arms");
    let mut args: Vec<String> = tiny_sweep_args(&out).into_iter().filter(|a| !a.starts_with("max_steps") && !a.starts_with("save_steps") && !a.starts_with("eval_every")).collect();
    let grid = args.iter().position(|a| a == "--grid").unwrap();
    args.splice(grid..grid + 3, ["--intervention-arms", "--grid", "seed=1,2"].map(String::from));
    args.extend(
        ["max_steps=2", "save_steps=2", "eval_every=2", "rh_penalty=0.5", "log_completions=true", "absorption_by_class=true", "rh_ground_truth={plugin: happy_count, params: {threshold: 2}}"]
            .map(String::from),
    );
    let started = std::time::Instant::now();
    let stdout = run_sweep(&args);
    eprintln!("the 10-run sweep took {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(stdout.lines().filter(|l| l.starts_with("[DONE ") && l.contains(" OK ")).count(), 10, "{stdout}");
    let mut flagged_seen = [0usize; 4];
    for entry in smallrl::sweep::collect_entries(&out).unwrap() {
        let intervention = entry.config.intervention;
        let metrics = read_jsonl(&entry.dir.join("metrics.jsonl"));
        let completions = read_jsonl(&entry.dir.join("completions.jsonl"));
        assert_eq!((metrics.len(), completions.len()), (2, 16), "{}", entry.name);
        for line in &metrics {
            let step = line["step"].as_u64().unwrap();
            let samples: Vec<&Value> = completions.iter().filter(|c| c["step"].as_u64() == Some(step)).collect();
            let count = |f: &dyn Fn(&Value) -> bool| samples.iter().filter(|s| f(s)).count() as u64;
            let flagged = count(&|s| flags(s, "is_rh"));
            // The monitor's quadrants, recounted from the samples.
            for (key, hacked, is_flagged) in [("monitor/hacked_flagged", true, true), ("monitor/clean_flagged", false, true), ("monitor/hacked_unflagged", true, false), ("monitor/clean_unflagged", false, false)] {
                assert_eq!(line[key].as_u64(), Some(count(&|s| flags(s, "hacked") == hacked && flags(s, "is_rh") == is_flagged)), "{} step {step} {key}", entry.name);
            }
            let hacked_flagged = line["monitor/hacked_flagged"].as_f64().unwrap();
            match line["monitor/precision"].as_f64() {
                Some(p) => assert!((p - hacked_flagged / flagged as f64).abs() < 1e-12),
                None => assert_eq!(flagged, 0),
            }
            let reward_mean = samples.iter().map(|s| s["trained_reward"].as_f64().unwrap()).sum::<f64>() / 8.0;
            assert!((line["reward"].as_f64().unwrap() - reward_mean).abs() < 1e-12, "metrics' reward is what trained");
            let absorption = |adapter: &str, quantity: &str| line[format!("absorption/{adapter}/{quantity}")].as_f64().unwrap_or_else(|| panic!("{adapter} {quantity} in {line}"));
            for adapter in ["retain", "forget"] {
                assert!(absorption(adapter, "param_norm") > 0.0 && absorption(adapter, "grad_norm") >= 0.0);
                assert!(absorption(adapter, "update_norm") > 0.0, "{}: {adapter} moved", entry.name);
            }
            for sample in &samples {
                let (reward, trained) = (sample["reward"].as_f64().unwrap(), sample["trained_reward"].as_f64().unwrap());
                let penalty = if intervention == smallrl::intervention::Intervention::Penalty && flags(sample, "is_rh") { 0.5 } else { 0.0 };
                assert!((trained - (reward - penalty)).abs() < 1e-12, "{}: {sample}", entry.name);
            }
            let routed = count(&|s| flags(s, "routed"));
            use smallrl::intervention::Intervention::*;
            match intervention {
                Placebo => assert_eq!(routed, flagged, "{} step {step}: the placebo routes as many as were flagged", entry.name),
                _ => assert_eq!(routed, flagged),
            }
            if flagged == 0 {
                continue;
            }
            let arm = [Routing, Penalty, Filter, Placebo].iter().position(|&i| i == intervention).unwrap();
            flagged_seen[arm] += 1;
            if intervention == Filter {
                for adapter in ["retain", "forget"] {
                    assert_eq!(absorption(adapter, "grad_norm_flagged"), 0.0, "{}: filtered samples give no gradient", entry.name);
                }
                assert!(samples.iter().filter(|s| flags(s, "is_rh")).all(|s| s["advantage"].as_f64() == Some(0.0)));
            }
            if intervention == Routing && entry.config.routing_mode == smallrl::routing::RoutingMode::Classic {
                assert_eq!(absorption("retain", "grad_norm_flagged"), 0.0, "{}: routed samples leave retain alone", entry.name);
                assert!(absorption("forget", "grad_norm_flagged") > 0.0);
            }
        }
        let evals = read_jsonl(&entry.dir.join("routing_eval.jsonl"));
        for mode in evals[0]["modes"].as_object().unwrap().values() {
            let total: u64 = ["monitor/hacked_flagged", "monitor/clean_flagged", "monitor/hacked_unflagged", "monitor/clean_unflagged"].iter().map(|k| mode[*k].as_u64().unwrap()).sum();
            assert_eq!(total, 4, "every evaluation sample is in one quadrant");
        }
    }
    assert!(flagged_seen.iter().all(|&n| n > 0), "every arm saw flagged samples (steps per arm: {flagged_seen:?})");
}

/// `--pack 4 --pack-workers 2`: the six runs of the tiny sweep (routed runs and their baselines
/// differ in routing, seed and nothing of their shapes) train in two child processes, each
/// stepping its runs in two threads, each run finishing
/// in its own directory as a solo run would; a second sweep finds them all cached. A grid over a
/// shape key is refused before any run starts, naming the key.
#[test]
fn a_packed_sweep_trains_in_packs_and_refuses_different_shapes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sweep");
    let mut mixed: Vec<String> = tiny_sweep_args(&out).into_iter().filter(|a| a != "max_completion_length=24").collect();
    let grid_at = mixed.iter().position(|a| a == "--grid").unwrap();
    mixed.insert(grid_at + 1, "max_completion_length=16,24".into());
    mixed.extend(["--pack", "2"].map(String::from));
    let output = smallrl(&mixed.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("`max_completion_length` is 16") && stderr.contains("drop --pack"), "{stderr}");
    assert!(!out.exists(), "a refused sweep writes nothing");

    let mut args = tiny_sweep_args(&out);
    args.extend(["--pack", "4", "--pack-workers", "2"].map(String::from));
    let stdout = run_sweep(&args);
    assert_eq!(stdout.lines().filter(|l| l.starts_with("[DONE ") && l.contains(" OK ")).count(), 6, "{stdout}");
    check_summary_against_metrics(&out, "OK");
    let mut pack_logs: Vec<String> = std::fs::read_dir(out.join("logs")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    pack_logs.sort();
    assert_eq!(pack_logs.len(), 2, "one log per pack: {pack_logs:?}");
    assert!(pack_logs.iter().all(|name| name.starts_with("pack-of-")), "{pack_logs:?}");
    let pack_log = std::fs::read_to_string(out.join("logs").join(&pack_logs[0])).unwrap();
    assert!(pack_log.matches("run directory: ").count() >= 2, "{pack_log}");
    let again = run_sweep(&args);
    assert_eq!(again.matches("[CACHED] ").count(), 6, "{again}");
}
