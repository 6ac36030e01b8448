//! Sweeps that train: summary, charts, viewer and cache, failures, interruption, intervention arms, packs.

use super::*;

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
    assert_eq!((data.steps.clone(), data.source), (vec![3], EvalSource::Checkpoints));
    assert!(close(data.get(3, 1, 0).unwrap().mean, 0.15) && close(data.get(3, 0, 0).unwrap().mean, 0.35), "task reward of both / baseline from the CSVs");
    assert!(data.get(3, 1, 2).is_none(), "an empty cell is a missing value");
    std::fs::remove_file(with_csv[3].join(smallrl::eval::CHECKPOINTS_CSV)).unwrap();
    let data = charts::group_data(&group, &members, &base_entries).unwrap();
    assert_eq!((data.steps, data.source), (vec![2, 4], EvalSource::Training), "never a mix of sources");
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
    // The five arms this test checks one by one (verified-only has its own tests).
    args.splice(grid..grid + 3, ["--intervention-arms", "none,routing,penalty,filter,placebo", "--grid", "seed=1,2"].map(String::from));
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

/// A hostile environment in a sweep (issue 36): its run fails naming its environment's file and
/// the cause in its log and the summary, and the other environment's run finishes unaffected.
#[test]
fn a_hostile_environment_fails_alone_in_a_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sweep");
    let good = tmp.path().join("good.yaml");
    let hostile = tmp.path().join("hostile.yaml");
    std::fs::write(&good, "environment: sorting\nadapter: dual-lora\nhack_frac: 0.5\nnum_prompts: 64\n").unwrap();
    let hostile_env = common::test_plugin("hostile_env");
    std::fs::write(&hostile, format!("environment: {}\nenvironment_params: {{mode: nan}}\nadapter: dual-lora\nhack_frac: 0.5\nnum_prompts: 64\n", hostile_env.display())).unwrap();
    let mut args: Vec<String> = ["sweep", "--config", good.to_str().unwrap(), hostile.to_str().unwrap(), "--jobs", "2", "--output-dir", out.to_str().unwrap()]
        .map(String::from)
        .to_vec();
    args.extend(["--grid", "seed=1", "--fixed"].map(String::from));
    let fixed = common::tiny_sweep_fixed().into_iter().filter(|f| !f.starts_with("prompts=") && !f.starts_with("rh_detector="));
    args.extend(fixed.chain(["max_steps=2", "save_steps=2", "routing_mode=none"].map(String::from)));
    let output = smallrl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "a sweep with a failed run exits with an error");
    assert!(String::from_utf8_lossy(&output.stderr).contains("1 of 2 runs failed"), "{}", String::from_utf8_lossy(&output.stderr));
    let rows = read_summary(&out);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in rows {
        let hostile_run = row[0].starts_with("hostile_");
        assert_eq!(row[5], if hostile_run { "FAIL" } else { "OK" }, "{row:?}\n{stdout}");
        if hostile_run {
            let log = std::fs::read_to_string(out.join("logs").join(format!("{}.log", row[0]))).unwrap();
            assert!(log.contains("hostile_env.wasm") && log.contains("NaN"), "the run's log names the file and the cause: {log}");
        } else {
            assert_eq!(read_jsonl(out.join(&row[0]).join("metrics.jsonl")).len(), 2, "the other run trained to its end");
        }
    }
}
