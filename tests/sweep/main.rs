//! Sweeps (issue 6): planning (grid expansion, fixed keys, baselines and their de-duplication,
//! the cache of finished runs, bad keys), SLURM emission, and one end-to-end sweep of 2×2 tiny
//! runs on the `tiny-stories` fixture with its baselines: the summary against the runs' own
//! metrics, the charts against their routing evaluations, the viewer in headless Chromium, the
//! cache on a second sweep, `--collect` and `smallrl plot`.

#[path = "../common/mod.rs"]
mod common;
mod planning;
mod end_to_end;
mod statistics;
mod environments;
mod reading;
mod compare;
mod rehearsal;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{read_jsonl, repo_root, smallrl};
use serde_json::{Map, Value};
use smallrl::sweep::charts;
use smallrl::sweep::draw::SERIES;
use smallrl::sweep::evals::EvalSource;
use smallrl::sweep::plan::{self, CacheState, RunRole, SweepSpec, expand, parse_fixed, parse_grid};
use smallrl::train::TrainConfig;

const HAPPY_CONFIG: &str = "configs/sentence_length_10_smooth_with_happy.yaml";

fn happy_config_abs() -> String {
    repo_root().join(HAPPY_CONFIG).to_string_lossy().into_owned()
}

/// A 2×2 sweep (two routing modes × two seeds) of tiny DualLoRA runs; the detector flags any
/// "happy" so routing has samples to route. Baselines: one per seed, shared by both modes.
fn tiny_sweep_args(out: &Path) -> Vec<String> {
    let mut fixed = common::tiny_sweep_fixed();
    fixed.push("lr=3e-2".into());
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
