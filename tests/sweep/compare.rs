//! `sweep --collect DIR --compare PATH`: our cells beside the paper's, from run directories
//! written by hand (each run's last tenth of evaluations chosen here) against a reference
//! written here and against the real one in ../shared/reference/graft-7env; bad reference
//! files are named with their problem.

use super::*;
use smallrl::sweep::arms::Prompts;
use smallrl::sweep::compare::{self, CompareRow};
use smallrl::sweep::plan::Arm;
use smallrl::intervention::Intervention;
use smallrl::sweep::{RunStatus, entries_of_plan};

/// Per arm and mode read: the seeds' [task, hack] at the last evaluation (step 100); the one
/// before it (95) has task − 0.02 and hack + 0.02, so the paper's reading (the last 2 of 20)
/// is each minus/plus 0.01; earlier evaluations hold 9.0 (never read). Half of the 10
/// evaluation prompts are hackable: over them task + 0.1, the detector's rate 2 x hack and the
/// ground truth's hack.
const ROUTED: [[f64; 3]; 2] = [[0.6, 0.7, 0.8], [0.1, 0.2, 0.3]];
const PENALTY: [[f64; 3]; 2] = [[0.5, 0.5, 0.8], [0.0, 0.3, 0.3]];
const NONE: [[f64; 3]; 2] = [[0.9, 0.8, 0.7], [0.9, 0.9, 0.6]];

fn reference_root() -> PathBuf {
    repo_root().join("../shared/reference/graft-7env")
}

/// Mean and population std, written out.
fn mean_std(values: &[f64]) -> (f64, f64) {
    let m = values.iter().sum::<f64>() / values.len() as f64;
    (m, (values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / values.len() as f64).sqrt())
}

fn evaluations(component: &str, task: f64, hack: f64) -> String {
    let line = |step: usize, task: f64, hack: f64| {
        let mode = serde_json::json!({"reward": task, "hack_freq": hack, component: task, "n": 10, "hackable/n": 5,
            format!("hackable/{component}"): task + 0.1, "hackable/hack_freq": 2.0 * hack, "hackable/true_hack_freq": hack});
        serde_json::json!({"step": step, "modes": {"both": mode, "retain_only": mode}}).to_string() + "\n"
    };
    (1..=20).map(|i| match i * 5 {
        100 => line(100, task, hack),
        95 => line(95, task - 0.02, hack + 0.02),
        s => line(s, 9.0, 9.0),
    }).collect()
}

/// A finished sorting sweep: routing, penalty and their baseline, three seeds each.
fn fake_sweep(out: &Path) -> Vec<smallrl::sweep::RunEntry> {
    let plan = plan::plan(&super::reading::sorting_sweep(out, 100, "1,2,3", &[Arm::Intervention(Intervention::Routing), Arm::Intervention(Intervention::Penalty)])).unwrap();
    assert_eq!(plan.runs.len(), 9);
    for run in &plan.runs {
        let dir = run.dir(out);
        super::planning::fake_finished_run(&dir, &run.config);
        let values = match Arm::of(&run.config) {
            Arm::Intervention(Intervention::Routing) => ROUTED,
            Arm::Intervention(Intervention::Penalty) => PENALTY,
            _ => NONE,
        };
        let seed = run.config.seed as usize - 1;
        std::fs::write(dir.join("routing_eval.jsonl"), evaluations("sorting_positional", values[0][seed], values[1][seed])).unwrap();
    }
    let statuses = plan.runs.iter().map(|r| (r.name.clone(), RunStatus::Ok)).collect();
    entries_of_plan(&plan, &statuses)
}

#[test]
fn our_cells_stand_beside_the_papers_with_differences_in_units_of_the_larger_spread() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("suite");
    let entries = fake_sweep(&out);
    let penalty = entries.iter().find(|e| Arm::of(&e.config) == Arm::Intervention(Intervention::Penalty)).unwrap().config.rh_penalty;
    let reference = tmp.path().join("reference.json");
    std::fs::write(
        &reference,
        r#"{"sorting_copy": {"gr": [0.7, 0.05, 0.2, 0.02, 5], "noi": [0.8, 0.1, 0.8, 0.2, 3], "filt": [0.6, 0.0, 0.4, 0.0, 3],
            "verif": [0.5, 0.01, 0.2, 0.03, 3], "best_rp": {"label": "v=2", "agg": [0.6, 0.2, 0.2, 0.1, 3]}},
            "addition_v2": {"gr": [0.1, 0.1, 0.1, 0.1, 2]}}"#,
    )
    .unwrap();
    let rows = compare::rows(&entries, &compare::read_reference(&reference).unwrap(), Prompts::All).unwrap();
    let row = |arm: &str| -> &CompareRow { rows.iter().find(|r| r.paper_arm == arm).unwrap_or_else(|| panic!("{arm} in {rows:?}")) };
    assert_eq!(rows.len(), 5, "gr, noi, filt, best_rp, verif of sorting; addition has no runs: {rows:?}");
    assert!(rows.iter().all(|r| r.environment == "sorting" && r.paper_environment == "sorting_copy"));
    for (arm, values, mode, paper) in [("gr", ROUTED, "retain_only", [0.7, 0.05, 0.2, 0.02]), ("noi", NONE, "both", [0.8, 0.1, 0.8, 0.2]), ("best_rp", PENALTY, "both", [0.6, 0.2, 0.2, 0.1])] {
        let r = row(arm);
        assert_eq!(r.mode, mode);
        let ours = r.ours.as_ref().unwrap_or_else(|| panic!("{arm}: {}", r.note));
        assert_eq!(ours.seeds, 3);
        let (retain, hack) = (mean_std(&values[0].map(|v| v - 0.01)), mean_std(&values[1].map(|v| v + 0.01)));
        for (found, expected) in [(ours.retain, retain), (ours.hack, hack)] {
            assert!((found.0 - expected.0).abs() < 1e-12 && (found.1 - expected.1).abs() < 1e-12, "{arm}: {found:?} vs {expected:?}");
        }
        let [dr, dh] = r.differences();
        assert!((dr.unwrap() - (retain.0 - paper[0]) / retain.1.max(paper[1])).abs() < 1e-12, "{arm} retain difference");
        assert!((dh.unwrap() - (hack.0 - paper[2]) / hack.1.max(paper[3])).abs() < 1e-12, "{arm} hack difference");
    }
    assert_eq!(row("best_rp").dose, format!("rh_penalty={penalty} coherence:main=32:512"));
    assert_eq!(row("best_rp").note, "", "penalty {penalty} is no dose of the paper's battery");
    assert_eq!(row("best_rp").paper.label.as_deref(), Some("v=2"));
    assert!(row("filt").ours.is_none() && row("filt").note.contains("no finished filter runs"), "{:?}", row("filt"));
    assert!(row("verif").ours.is_none() && row("verif").note.contains("no finished verified runs"), "{:?}", row("verif"));
    assert!(rows.iter().all(|r| r.prompts == Prompts::All && r.ours.as_ref().is_none_or(|o| o.true_hack.is_none())), "no ground truth over all prompts here");

    // Over the hackable prompts: both sides' `_hackable` figures, the ground truth beside the
    // detector's rate.
    let hackable_reference = tmp.path().join("reference_hackable.json");
    std::fs::write(&hackable_reference, r#"{"sorting_copy": {"gr": [0.75, 0.05, 0.4, 0.02, 5]}}"#).unwrap();
    let files = compare::reference_files(&hackable_reference);
    assert_eq!(files, [(Prompts::Hackable, hackable_reference.clone())], "a file named *_hackable.json is of the hackable prompts");
    let hackable = compare::rows(&entries, &compare::read_reference(&hackable_reference).unwrap(), Prompts::Hackable).unwrap();
    assert_eq!(hackable.len(), 1, "{hackable:?}");
    let ours = hackable[0].ours.as_ref().unwrap_or_else(|| panic!("{}", hackable[0].note));
    let expected = [mean_std(&ROUTED[0].map(|v| v + 0.09)), mean_std(&ROUTED[1].map(|v| 2.0 * v + 0.02)), mean_std(&ROUTED[1].map(|v| v + 0.01))];
    for (found, expected) in [ours.retain, ours.hack, ours.true_hack.unwrap()].into_iter().zip(expected) {
        assert!((found.0 - expected.0).abs() < 1e-12 && (found.1 - expected.1).abs() < 1e-12, "{found:?} vs {expected:?}");
    }
    let [dr, _] = hackable[0].differences();
    assert!((dr.unwrap() - (expected[0].0 - 0.75) / expected[0].1.max(0.05)).abs() < 1e-12);
    assert_eq!(compare::difference(0.5, 0.0, 0.5, 0.0), Some(0.0));
    assert_eq!(compare::difference(0.6, 0.0, 0.5, 0.0), None, "no spread, a difference: no unit");

    // The real reference: every paper arm of sorting_copy is listed, the paper's numbers as filed.
    let real = compare::read_reference(&reference_root()).unwrap();
    assert_eq!(real.len(), 7);
    assert_eq!(real["addition_v2"]["best_rp"].label.as_deref(), Some("v=5"));
    let hackable = compare::read_reference(&reference_root().join("aggregated_cache_hackable.json")).unwrap();
    assert_eq!(hackable.keys().collect::<Vec<_>>(), real.keys().collect::<Vec<_>>());
    smallrl::sweep::compare::run(&out, &entries, &reference_root()).unwrap();
    let text = std::fs::read_to_string(out.join(compare::CSV_FILE)).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(compare::CSV_HEADER));
    let csv: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let arms: BTreeSet<&str> = csv.iter().map(|r| r[2]).collect();
    assert_eq!(arms, ["base", "best_rp", "filt", "gr", "noi", "noi_ro", "verif"].into_iter().collect());
    let json: Value = serde_json::from_str(&std::fs::read_to_string(reference_root().join("aggregated_cache.json")).unwrap()).unwrap();
    let gr = csv.iter().find(|r| r[2] == "gr" && r[24] == "all").unwrap();
    let paper: Vec<f64> = gr[17..21].iter().map(|v| v.parse().unwrap()).collect();
    assert_eq!(paper, json["sorting_copy"]["gr"].as_array().unwrap()[..4].iter().map(|v| v.as_f64().unwrap()).collect::<Vec<_>>());
    assert_eq!((gr[3], gr[4], gr[8]), ("routing", "retain_only", "3"));
    let chart = out.join("charts").join(compare::CHART_FILE);
    if let Some(keep) = std::env::var_os("SMALLRL_KEEP_CHART") {
        std::fs::copy(&chart, keep).unwrap();
    }
    let (width, height, _) = png_pixels(&chart);
    assert_eq!((width, height), smallrl::sweep::compare_chart::size(1));
    // The real hackable file too: its rows and chart beside the others.
    let json: Value = serde_json::from_str(&std::fs::read_to_string(reference_root().join(compare::HACKABLE_REFERENCE_FILE)).unwrap()).unwrap();
    let gr = csv.iter().find(|r| r[2] == "gr" && r[24] == "hackable").unwrap();
    let paper: Vec<f64> = gr[17..21].iter().map(|v| v.parse().unwrap()).collect();
    assert_eq!(paper, json["sorting_copy"]["gr"].as_array().unwrap()[..4].iter().map(|v| v.as_f64().unwrap()).collect::<Vec<_>>());
    assert_eq!(csv.iter().filter(|r| r[24] == "hackable").count(), csv.iter().filter(|r| r[24] == "all").count());
    assert_eq!(png_pixels(&out.join("charts").join(compare::HACKABLE_CHART_FILE)).0, width);
}

/// The doses scripts/paper-matrix.sh plans, on an environment's recipe, carry the labels of the
/// paper's best_rp battery (figures_pareto/proto_pareto_data.py); the row of the dose the paper
/// picked says so.
#[test]
fn the_penalty_doses_map_to_the_papers_best_rp_labels() {
    let config = repo_root().join("configs/envs/addition.yaml");
    let penalty = |keys: &[(&str, f64)]| {
        let base = serde_json::json!({"routing_mode": "none", "intervention": "penalty", "renormalization_mode": "off", "split_moment": false});
        let mut map: Map<String, Value> = base.as_object().unwrap().clone();
        // Whole numbers as integers (batch sizes and rows are counts).
        map.extend(keys.iter().map(|(k, v)| (k.to_string(), if v.fract() == 0.0 { Value::from(*v as u64) } else { Value::from(*v) })));
        TrainConfig::resolve(Some(&config), map).unwrap()
    };
    let m = "rp_extra_retain_advantage_multiplier";
    for (keys, label, dose) in [
        (vec![("rh_penalty", 2.0)], Some("canonical"), "rh_penalty=2 coherence:main=32:512"),
        (vec![("rh_penalty", 5.0)], Some("p=5"), "rh_penalty=5 coherence:main=32:512"),
        (vec![("rh_penalty", 10.0)], Some("p=10"), "rh_penalty=10 coherence:main=32:512"),
        (vec![("rh_penalty", 2.0), (m, 2.0)], Some("v=2"), "rh_penalty=2 rp_extra_retain_advantage_multiplier=2 coherence:main=32:512"),
        (vec![("rh_penalty", 2.0), (m, 5.0)], Some("v=5"), "rh_penalty=2 rp_extra_retain_advantage_multiplier=5 coherence:main=32:512"),
        (vec![("rh_penalty", 2.0), ("batch_size", 640.0), ("coh_samples_per_rollout", 128.0)], Some("1:4"), "rh_penalty=2 coherence:main=128:512"),
        (vec![("rh_penalty", 2.0), ("batch_size", 576.0), ("coh_samples_per_rollout", 192.0)], Some("1:2"), "rh_penalty=2 coherence:main=192:384"),
        (vec![("rh_penalty", 2.0), ("batch_size", 512.0), ("coh_samples_per_rollout", 256.0)], Some("1:1"), "rh_penalty=2 coherence:main=256:256"),
        (vec![("rh_penalty", 5.0), (m, 5.0)], None, "rh_penalty=5 rp_extra_retain_advantage_multiplier=5 coherence:main=32:512"),
        (vec![("rh_penalty", 1.0)], None, "rh_penalty=1 coherence:main=32:512"),
    ] {
        let c = penalty(&keys);
        assert_eq!((compare::paper_rp_label(&c).as_deref(), compare::penalty_dose(&c).as_str()), (label, dose), "{keys:?}");
    }
    // The fake sweep's penalty runs as the v=5 dose: against a reference that picked v=5 their
    // row is marked, against one that picked 1:1 it is not.
    let tmp = tempfile::tempdir().unwrap();
    let mut entries = fake_sweep(&tmp.path().join("suite"));
    for e in entries.iter_mut().filter(|e| Arm::of(&e.config) == Arm::Intervention(Intervention::Penalty)) {
        (e.config.rh_penalty, e.config.rp_extra_retain_advantage_multiplier) = (2.0, 5.0);
    }
    for (picked, note) in [("v=5", "the paper's best_rp dose (v=5)"), ("1:1", "")] {
        let reference = tmp.path().join("reference.json");
        std::fs::write(&reference, format!(r#"{{"sorting_copy": {{"best_rp": {{"label": "{picked}", "agg": [0.6, 0.2, 0.2, 0.1, 3]}}}}}}"#)).unwrap();
        let rows = compare::rows(&entries, &compare::read_reference(&reference).unwrap(), Prompts::All).unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!((rows[0].dose.as_str(), rows[0].note.as_str(), rows[0].ours.as_ref().map(|o| o.seeds)), ("rh_penalty=2 rp_extra_retain_advantage_multiplier=5 coherence:main=32:512", note, Some(3)));
    }
}

#[test]
fn the_command_compares_and_bad_reference_files_are_named_with_their_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("suite");
    fake_sweep(&out);
    let dir = out.to_str().unwrap();
    let stdout = common::smallrl_ok(&["sweep", "--collect", dir, "--compare", reference_root().to_str().unwrap()]);
    assert!(stdout.contains("compare over all evaluation prompts") && stdout.contains("best_rp"), "{stdout}");
    assert!(out.join(compare::CSV_FILE).is_file() && out.join("charts").join(compare::CHART_FILE).is_file());
    for (name, text, problem) in [
        ("broken.json", "{\"sorting_copy\": [", "not JSON"),
        ("short.json", "{\"sorting_copy\": {\"gr\": [0.1, 0.2, 0.3]}}", "got 3 values"),
        ("label.json", "{\"sorting_copy\": {\"best_rp\": {\"agg\": [0.1, 0.1, 0.1, 0.1, 3]}}}", "label"),
        ("seeds.json", "{\"sorting_copy\": {\"gr\": [0.1, 0.1, 0.1, 0.1, 2.5]}}", "n_seeds"),
    ] {
        let path = tmp.path().join(name);
        std::fs::write(&path, text).unwrap();
        let output = common::smallrl(&["sweep", "--collect", dir, "--compare", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(name) && stderr.contains(problem), "{name}: {stderr}");
    }
    let missing = tmp.path().join("nowhere");
    let output = common::smallrl(&["sweep", "--collect", dir, "--compare", missing.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("nowhere"), "the missing file is named");
}
