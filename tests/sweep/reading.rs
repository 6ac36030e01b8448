//! The paper's reading (`--last-tenth`): each run's last max(1, n // 10) routing evaluations
//! averaged, against means computed by hand on run directories written by hand; the final
//! evaluation's tables stay as they were.

use super::*;
use std::collections::BTreeMap;
use smallrl::sweep::arms::{self, Reading};
use smallrl::sweep::plan::Arm;
use smallrl::intervention::Intervention;
use smallrl::sweep::{RunStatus, entries_of_plan};

/// A routing_eval.jsonl line at `step`: in every mode task = step / 100, the detector's flag
/// rate 1 - step / 100, the ground truth step / 200.
fn line(step: usize) -> String {
    let s = step as f64;
    let mode = serde_json::json!({"reward": s / 100.0, "hack_freq": 1.0 - s / 100.0, "sorting_positional": s / 100.0, "true_hack_freq": s / 200.0});
    serde_json::json!({"step": step, "modes": {"both": mode, "retain_only": mode}}).to_string() + "\n"
}

/// A sweep of the sorting environment (plugins from the repository): `max_steps`, the seeds
/// (`1,2,...`) and the intervention arms.
pub(super) fn sorting_sweep(out: &Path, max_steps: usize, seeds: &str, arms: &[Arm]) -> SweepSpec {
    let plugin_dir = format!("plugin_dir={}", common::plugin_dir().display());
    SweepSpec {
        config_files: vec![repo_root().join("configs/envs/sorting.yaml")],
        fixed: [parse_fixed(&format!("max_steps={max_steps}")).unwrap(), parse_fixed(&plugin_dir).unwrap()].into_iter().collect(),
        grid: vec![parse_grid(&format!("seed={seeds}")).unwrap()],
        output_dir: out.to_path_buf(),
        intervention_arms: arms.to_vec(),
    }
}

/// The rows of a table file: (first column(s) key, metric, mode) -> mean.
fn means(path: &Path, key_columns: usize) -> BTreeMap<(String, String, String), f64> {
    let text = std::fs::read_to_string(path).unwrap();
    let metric = key_columns;
    text.lines().skip(1).map(|l| l.split(',').collect::<Vec<_>>()).map(|r| ((r[..key_columns].join(","), r[metric].to_string(), r[metric + 1].to_string()), r[metric + 3].parse().unwrap())).collect()
}

#[test]
fn the_last_tenth_reading_averages_the_last_tenth_of_each_runs_evaluations() {
    assert_eq!([0, 1, 9, 10, 19, 20, 25, 100].map(|n| Reading::LastTenth.window(n)), [0, 1, 1, 1, 1, 2, 2, 10]);
    assert_eq!([1, 25].map(|n| Reading::Final.window(n)), [1, 1]);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("suite");
    let plan = plan::plan(&sorting_sweep(&out, 50, "1,2", &[Arm::Intervention(Intervention::Routing)])).unwrap();
    assert_eq!(plan.runs.len(), 4, "routing and its baseline, two seeds");
    for run in &plan.runs {
        let dir = run.dir(&out);
        super::planning::fake_finished_run(&dir, &run.config);
        // Seed 1: 25 evaluations (steps 2, 4, ..., 50): the last 2 (48, 50) are read.
        // Seed 2: 9 evaluations (steps 34, ..., 50): the last one (50) alone.
        let first = if run.config.seed == 1 { 2 } else { 34 };
        let lines: String = (first..=50).step_by(2).map(line).collect();
        std::fs::write(dir.join("routing_eval.jsonl"), lines).unwrap();
    }
    let statuses = plan.runs.iter().map(|r| (r.name.clone(), RunStatus::Ok)).collect();
    let entries = entries_of_plan(&plan, &statuses);

    // One run: seed 1 averages steps 48 and 50.
    let seed1 = entries.iter().find(|e| e.config.seed == 1).unwrap();
    let values = arms::run_values_read(seed1, Reading::LastTenth).unwrap();
    let at = |metric: &'static str, mode: &str| values[&(metric, mode.to_string())];
    for mode in ["both", "retain_only"] {
        assert!((at(arms::TASK_REWARD, mode) - 0.49).abs() < 1e-12);
        assert!((at(arms::HACK_FREQ, mode) - 0.51).abs() < 1e-12, "the detector's flag rate");
        assert!((at(arms::TRUE_HACK_FREQ, mode) - 0.245).abs() < 1e-12, "the ground truth");
    }
    assert!((at(arms::RETAIN_MINUS_HACK, "retain_only") + 0.02).abs() < 1e-12);
    assert_eq!(at(arms::FINAL_REWARD, "train"), 0.5, "the training reward of the last step, whatever the reading");
    assert_eq!(arms::run_values_read(seed1, Reading::Final).unwrap(), arms::run_values(seed1).unwrap());
    assert_eq!(arms::run_values(seed1).unwrap()[&(arms::TASK_REWARD, "both".to_string())], 0.5, "the final reading: step 50 alone");

    // The tables: the final reading's files as before, the paper's beside them.
    smallrl::sweep::report(&out, &entries).unwrap();
    let final_files = ["arms.csv", "environments.csv"].map(|f| std::fs::read(out.join(f)).unwrap());
    assert!(!out.join("arms_last_tenth.csv").exists(), "without --last-tenth nothing more is written");
    smallrl::sweep::report_last_tenth(&out, &entries).unwrap();
    assert_eq!(["arms.csv", "environments.csv"].map(|f| std::fs::read(out.join(f)).unwrap()), final_files, "the final reading's tables are untouched");
    let env = means(&out.join("environments_last_tenth.csv"), 5);
    let env_final = means(&out.join("environments.csv"), 5);
    let cell = |arm: &str, routing: &str| format!("sorting,{arm},{routing},0.5,1");
    for (arm, routing) in [("routing", "classic"), ("none", "none")] {
        for mode in ["both", "retain_only"] {
            let get = |table: &BTreeMap<(String, String, String), f64>, metric: &str| table[&(cell(arm, routing), metric.to_string(), mode.to_string())];
            // Seeds' readings: (0.49, 0.5) task, (0.51, 0.5) flags, (0.245, 0.25) ground truth.
            for (metric, last_tenth, last) in [("task_reward", 0.495, 0.5), ("hack_freq", 0.505, 0.5), ("true_hack_freq", 0.2475, 0.25)] {
                assert!((get(&env, metric) - last_tenth).abs() < 1e-12, "{arm} {mode} {metric}: {} vs {last_tenth}", get(&env, metric));
                assert!((get(&env_final, metric) - last).abs() < 1e-12, "{arm} {mode} {metric} (final)");
            }
        }
    }
    let arms_table = means(&out.join("arms_last_tenth.csv"), 2);
    let routed = arms_table.iter().find(|((arm, _, _), _)| arm.ends_with(",run")).map(|((arm, _, _), _)| arm.clone()).unwrap();
    assert!((arms_table[&(routed, "task_reward".to_string(), "retain_only".to_string())] - 0.495).abs() < 1e-12);
}
