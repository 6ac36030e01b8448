//! The paper's table end to end (issue 38): scripts/paper-matrix.sh planned (`--dry-run`: its
//! runs and GPU hours against counts made by hand), and a CPU rehearsal of the pipeline on the
//! tiny-stories fixture: a sorting matrix of three arms and two seeds trained for two steps,
//! collected and compared with the paper's reference files (table, CSV, both charts).

use super::*;
use smallrl::sweep::compare;

/// Each sweep of the script: (runs to train, steps) from its estimate line.
fn estimates(stdout: &str) -> Vec<(usize, usize)> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("estimate: "))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            (words[0].parse().unwrap(), words[4].parse().unwrap())
        })
        .collect()
}

#[test]
fn the_paper_matrix_plans_its_runs_and_estimates_their_gpu_hours() {
    let tmp = tempfile::tempdir().unwrap();
    let output = Command::new("bash")
        .arg(repo_root().join("scripts/paper-matrix.sh"))
        .arg(tmp.path().join("paper"))
        .arg("--dry-run")
        .env("SMALLRL", env!("CARGO_BIN_EXE_smallrl"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    // Per environment, the main sweep: routed x 5 seeds, penalty 2/5/10 x 5, filter x 5 and the
    // none baseline x 5 = 30 runs; each ratio dose (three) and each multiplier dose (two):
    // penalty and its baseline x 3 seeds = 6 (the multiplier doses' baselines are the main
    // sweep's, counted again in an empty directory); verified-only: verified and its 500-step
    // baseline x 3 = 6.
    let long = [(5 * 30, 5 * 30 * 2000)].into_iter().chain([(5 * 6, 5 * 6 * 2000); 5]);
    let short = [(2 * 30, 2 * 30 * 1000)].into_iter().chain([(2 * 6, 2 * 6 * 1000); 5]);
    let expected: Vec<(usize, usize)> = long.chain(short).chain([(7 * 6, 7 * 6 * 500)]).collect();
    assert_eq!(estimates(&stdout), expected, "{stdout}");
    // In all 462 runs, 741,000 steps (308.75 GPU hours alone at 1.50 s a step). The first
    // sweep's 300,000 steps: 300,000 x 1.50 / 3600 = 125.0 hours alone; x 4.4 / 5 / 3600 = 73.3
    // five to a GPU.
    let steps: usize = expected.iter().map(|e| e.1).sum();
    assert_eq!((expected.iter().map(|e| e.0).sum::<usize>(), steps), (462, 741_000));
    // The multiplier doses: penalty 2 with the key set on the penalty runs only.
    for v in [2, 5] {
        let dose = format!("rh_penalty2_extramult{v}");
        assert!(stdout.lines().any(|l| l.contains("_penalty_") && l.contains(&dose)), "a v={v} run named {dose}: {stdout}");
    }
    assert!(!stdout.lines().any(|l| l.contains("extramult") && !l.contains("_penalty_")), "only penalty runs carry the multiplier: {stdout}");
    let first = stdout.lines().find(|l| l.starts_with("estimate: ")).unwrap();
    assert!(first.contains("125.0 GPU hours one run to a GPU (1.50 s a step)") && first.contains("73.3 GPU hours 5 time-sliced runs to a GPU (4.4 s a step each)"), "{first}");
    assert!(first.contains("the original tool's canonical SmolLM2-135M step"), "the source of the step time is named: {first}");
    assert!(!tmp.path().join("paper").exists() || std::fs::read_dir(tmp.path().join("paper")).unwrap().next().is_none(), "a dry run writes no run");
}

#[test]
fn a_cpu_rehearsal_trains_collects_and_compares_with_the_paper() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("rehearsal");
    let config = tmp.path().join("sorting.yaml");
    std::fs::write(&config, "environment: sorting\nadapter: dual-lora\nrouting_mode: classic\nhack_frac: 0.5\nnum_prompts: 64\n").unwrap();
    let mut args: Vec<String> = ["sweep", "--config", config.to_str().unwrap(), "--jobs", "2", "--output-dir", out.to_str().unwrap()].map(String::from).to_vec();
    args.extend(["--grid", "seed=1,2", "--intervention-arms", "routing,penalty,verified", "--fixed"].map(String::from));
    let fixed = common::tiny_sweep_fixed().into_iter().filter(|f| !f.starts_with("prompts=") && !f.starts_with("rh_detector=") && !f.starts_with("eval_samples="));
    args.extend(fixed.chain(["max_steps=2", "save_steps=2", "eval_every=1", "eval_samples=16"].map(String::from)));
    run_sweep(&args);
    let reference = repo_root().join("../shared/reference/graft-7env");
    let stdout = common::smallrl_ok(&["sweep", "--collect", out.to_str().unwrap(), "--compare", reference.to_str().unwrap()]);
    assert!(stdout.contains("compare over all evaluation prompts") && stdout.contains("compare over the hackable evaluation prompts only"), "{stdout}");

    let text = std::fs::read_to_string(out.join(compare::CSV_FILE)).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(compare::CSV_HEADER));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    // Per set of prompts, the paper's seven arms of sorting_copy; ours where we trained the arm.
    for prompts in ["all", "hackable"] {
        let of: Vec<&Vec<&str>> = rows.iter().filter(|r| r[24] == prompts).collect();
        let arms: BTreeSet<&str> = of.iter().map(|r| r[2]).collect();
        assert_eq!(arms, ["base", "best_rp", "filt", "gr", "noi", "noi_ro", "verif"].into_iter().collect(), "{prompts}: {text}");
        for r in &of {
            assert_eq!((r[0], r[1]), ("sorting", "sorting_copy"));
            let ours = ["gr", "noi", "noi_ro", "best_rp", "verif"].contains(&r[2]);
            assert_eq!(r[8], if ours { "2" } else { "" }, "{prompts} {}: two seeds of ours, or none: {r:?}", r[2]);
            if ours {
                for column in [9, 11, 13] {
                    let v: f64 = r[column].parse().unwrap_or_else(|_| panic!("{prompts} {}: column {column} in {r:?}", r[2]));
                    assert!((0.0..=1.0).contains(&v), "{r:?}");
                }
            }
        }
    }
    let (width, _, _) = png_pixels(&out.join("charts").join(compare::CHART_FILE));
    assert_eq!(png_pixels(&out.join("charts").join(compare::HACKABLE_CHART_FILE)).0, width);
}

/// scripts/gpu-check.sh's CPU-side parts: the script parses, and the canonical runs' YAML files
/// it writes (one alone, five packed; float32 and bfloat16 weights, and float32 weights with
/// `train_dtype: bfloat16`) are valid configurations of the canonical step: 544 rows, 3 steps,
/// seeds 1-5, on CUDA, in the dtypes asked for.
#[test]
fn the_gpu_checks_canonical_runs_are_valid_configurations() {
    let script = repo_root().join("scripts/gpu-check.sh");
    assert!(Command::new("bash").arg("-n").arg(&script).status().unwrap().success(), "bash -n {}", script.display());
    let tmp = tempfile::tempdir().unwrap();
    let model = repo_root().join(".fixtures/smollm2-135m-instruct");
    for (dtype, train_dtype) in [("float32", "float32"), ("bfloat16", "float32"), ("float32", "bfloat16")] {
        let dir = tmp.path().join(format!("{dtype}-{train_dtype}"));
        let status = Command::new("bash").arg(&script).args(["canonical-configs", dir.to_str().unwrap(), model.to_str().unwrap(), dtype, "5", train_dtype]).status().unwrap();
        assert!(status.success());
        let files: Vec<PathBuf> = (1..=5).map(|s| dir.join(format!("canonical_{s}.yaml"))).collect();
        for (seed, file) in (1..=5).zip(&files) {
            let config = TrainConfig::resolve(Some(file), Map::new()).unwrap_or_else(|e| panic!("{}: {e:#}", file.display()));
            assert_eq!((config.seed, config.batch_size, config.coh_samples_per_rollout, config.max_steps), (seed, 544, 32, 3));
            assert_eq!((config.dtype.to_string().as_str(), config.train_dtype.to_string().as_str(), config.model.as_str()), (dtype, train_dtype, model.to_str().unwrap()));
        }
        let mut args = vec!["sweep".to_string(), "--dry-run".into(), "--output-dir".into(), tmp.path().join("plan").to_string_lossy().into_owned(), "--config".into()];
        args.extend(files.iter().map(|f| f.to_string_lossy().into_owned()));
        let stdout = common::smallrl_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(stdout.contains("10 runs planned"), "five routed runs and their baselines validate: {stdout}");
    }
}
