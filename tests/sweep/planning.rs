//! Planning a sweep without training: the grid, fixed values, baselines, cache hits, SLURM emission, intervention arms.

use super::*;

fn spec(output_dir: &Path, grid: &[&str], fixed: &[&str]) -> SweepSpec {
    SweepSpec {
        config_files: vec![repo_root().join(HAPPY_CONFIG)],
        fixed: fixed.iter().map(|f| parse_fixed(f).unwrap()).collect::<Map<String, Value>>(),
        grid: grid.iter().map(|g| parse_grid(g).unwrap()).collect(),
        output_dir: output_dir.to_path_buf(),
        intervention_arms: Vec::new(),
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
pub(super) fn fake_finished_run(dir: &Path, config: &TrainConfig) {
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
    // The child `smallrl train` moves it aside (tests/train/: a_failed_run_is_restarted_...).
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

/// `--intervention-arms`: every routed grid point becomes the eight arms, the same otherwise;
/// `rh_penalty` goes to the penalty arm only, `advantage_penalty` and `advantage_score` to the
/// adv_mod arm only; the none arm is every other arm's baseline.
#[test]
fn intervention_arms_plan_every_control_beside_the_routed_run() {
    use smallrl::intervention::{AdvantageScore, Intervention};
    use smallrl::routing::RoutingMode;
    let out = tempfile::tempdir().unwrap();
    let mut arms = spec(out.path(), &["seed=1,2"], &["max_steps=4", "rh_penalty=0.25", "advantage_penalty=0.75", "routing_mode=exclusive"]);
    arms.intervention_arms = plan::Arm::ALL.to_vec();
    let plan = plan::plan(&arms).unwrap();
    assert_eq!(plan.runs.len(), 16, "eight arms × two seeds");
    let names: BTreeSet<&String> = plan.runs.iter().map(|r| &r.name).collect();
    assert_eq!(names.len(), 16, "run names distinguish arms");
    for run in &plan.runs {
        let c = &run.config;
        let expected_mode = match c.intervention {
            Intervention::Routing | Intervention::Placebo | Intervention::MatchedPlacebo if run.role == RunRole::Grid => RoutingMode::Exclusive,
            _ => RoutingMode::None,
        };
        assert_eq!(c.routing_mode, expected_mode, "{}", run.name);
        assert_eq!(c.rh_penalty, if c.intervention == Intervention::Penalty { 0.25 } else { 1.0 }, "{}", run.name);
        assert_eq!(c.advantage_penalty, if c.intervention == Intervention::AdvMod { 0.75 } else { 1.0 }, "{}", run.name);
        let baseline = TrainConfig { routing_mode: RoutingMode::None, intervention: Intervention::Routing, rh_penalty: 1.0, advantage_penalty: 1.0, ..c.clone() };
        match run.role {
            RunRole::Baseline => assert_eq!(c, &baseline, "{}: the none arm", run.name),
            RunRole::Grid => assert_eq!(run.baseline.as_ref(), Some(&baseline.run_name().unwrap()), "{}", run.name),
        }
    }
    let count = |i: Intervention| plan.runs.iter().filter(|r| r.config.intervention == i).count();
    let others = [Intervention::Penalty, Intervention::Filter, Intervention::Placebo, Intervention::Verified, Intervention::AdvMod, Intervention::MatchedPlacebo];
    assert_eq!(others.map(count), [2; 6]);
    assert_eq!(plan.runs.iter().filter(|r| r.role == RunRole::Baseline).count(), 2);
    // The detector's continuous score: a key of the adv_mod arm alone (the routed run refuses it).
    let threshold = ["max_steps=4", "routing_mode=classic", "advantage_score=detector_score", "rh_detector={score_threshold: {component: happy_count, threshold: 1}}"];
    let mut continuous = spec(out.path(), &[], &threshold);
    continuous.intervention_arms = plan::Arm::parse_list(Some("routing,adv_mod")).unwrap();
    let runs = plan::plan(&continuous).unwrap().runs;
    assert_eq!(runs.len(), 3, "routing, adv_mod and their baseline");
    for run in &runs {
        let expected = if run.config.intervention == Intervention::AdvMod { AdvantageScore::DetectorScore } else { AdvantageScore::Flag };
        assert_eq!(run.config.advantage_score, expected, "{}", run.name);
    }
    let mut unrouted = spec(out.path(), &[], &["routing_mode=none"]);
    unrouted.intervention_arms = plan::Arm::ALL.to_vec();
    let error = format!("{:#}", plan::plan(&unrouted).unwrap_err());
    assert!(error.contains("--intervention-arms expands a routed configuration"), "{error}");
}

/// The reward-penalty arm (and adv_mod, beside it) keeps the routed run's coherence rows (the original's
/// matrix_rp_7envs: the same verified coherence extras); the non-routed baseline has none, and a recall grid shares one baseline.
#[test]
fn the_penalty_arm_keeps_the_coherence_rows_of_the_routed_run() {
    use smallrl::intervention::Intervention;
    let out = tempfile::tempdir().unwrap();
    let fixed = ["max_steps=4", "routing_mode=classic", "coh_samples_per_rollout=16", "rh_detector_verifies_retain_samples=true", "rh_detector_retain_recall=0.5"];
    let mut arms = spec(out.path(), &["recall=0.5,0.25"], &fixed);
    arms.intervention_arms = plan::Arm::ALL.to_vec();
    let plan = plan::plan(&arms).unwrap();
    // Recall acts on flags, which the baseline ignores: both recalls share one baseline (at
    // the default recall), while the penalty arm keeps each recall.
    let baselines: Vec<_> = plan.runs.iter().filter(|r| r.role == RunRole::Baseline).collect();
    assert_eq!(baselines.len(), 1, "{:?}", baselines.iter().map(|r| &r.name).collect::<Vec<_>>());
    assert_eq!(baselines[0].config.recall, 1.0);
    let penalty_recalls: BTreeSet<String> = plan.runs.iter().filter(|r| r.config.intervention == Intervention::Penalty).map(|r| r.config.recall.to_string()).collect();
    assert_eq!(penalty_recalls, BTreeSet::from(["0.5".to_string(), "0.25".to_string()]));
    let arm = |intervention: Intervention, routed: bool| plan.runs.iter().find(|r| r.config.intervention == intervention && (r.config.routing_mode.as_str() != "none") == routed).unwrap();
    for config in [&arm(Intervention::Routing, true).config, &arm(Intervention::Penalty, false).config, &arm(Intervention::AdvMod, false).config] {
        assert_eq!((config.coh_samples_per_rollout, config.rh_detector_verifies_retain_samples, config.rh_detector_retain_recall), (16, true, 0.5), "{config:?}");
    }
    let baseline = &arm(Intervention::Routing, false).config;
    assert_eq!((baseline.coh_samples_per_rollout, baseline.rh_detector_verifies_retain_samples), (0, false));
}

/// The arms come from the interventions' declaration: none, then every intervention in the
/// order `choice!` declares them, each planned as its `Intervention::arm` says (the routing kept
/// or not, the routed point's coherence rows kept or not, its own keys given to it alone), and
/// read back from its config.yaml as the same arm.
#[test]
fn every_intervention_is_an_arm_planned_as_its_declaration_says() {
    use smallrl::intervention::Intervention;
    assert_eq!(plan::Arm::ALL[0], plan::Arm::None);
    let declared: Vec<plan::Arm> = Intervention::ALL.iter().map(|&i| plan::Arm::Intervention(i)).collect();
    assert_eq!(plan::Arm::ALL[1..], declared[..]);
    assert_eq!(plan::Arm::NAMED.last(), Some(&plan::Arm::Inoculation));
    let own_keys = [("rh_penalty", serde_json::json!(0.25)), ("advantage_penalty", serde_json::json!(0.75))];
    let out = tempfile::tempdir().unwrap();
    for &intervention in Intervention::ALL {
        let fixed = ["max_steps=4", "routing_mode=classic", "coh_samples_per_rollout=16", "rh_penalty=0.25", "advantage_penalty=0.75"];
        let mut sweep = spec(out.path(), &[], &fixed);
        sweep.intervention_arms = plan::Arm::parse_list(Some(intervention.as_str())).unwrap();
        let runs = plan::plan(&sweep).unwrap().runs;
        let run = runs.iter().find(|r| r.role == RunRole::Grid).unwrap();
        let (config, shape) = (&run.config, intervention.arm());
        assert_eq!(plan::Arm::of(config), plan::Arm::Intervention(intervention), "{}", run.name);
        assert_eq!(config.routing_mode.as_str() != "none", shape.routed, "{}: routing", run.name);
        let coherence_rows = if shape.routed || shape.coherence { 16 } else { 0 };
        assert_eq!(config.coh_samples_per_rollout, coherence_rows, "{}: coherence rows", run.name);
        let values = serde_json::to_value(config).unwrap();
        for (key, value) in &own_keys {
            let expected = if shape.keys.contains(key) { value.clone() } else { serde_json::json!(1.0) };
            assert_eq!(values[*key], expected, "{}: {key} goes to its own arm only", run.name);
        }
    }
}

fn env_config(name: &str) -> PathBuf {
    repo_root().join(format!("configs/envs/{name}.yaml"))
}

/// Several `--config` files are the outermost factor: each file × grid × chosen arms, with the
/// non-routed baseline of every routed or penalised run, each read back from the YAML a child
/// would train from.
#[test]
fn config_files_times_grid_times_chosen_arms() {
    use smallrl::sweep::plan::Arm;
    use smallrl::intervention::Intervention;
    let out = tempfile::tempdir().unwrap();
    let files = [env_config("sorting"), env_config("addition")];
    let plugin_dir = format!("plugin_dir={}", common::plugin_dir().display());
    let mut sweep = spec(out.path(), &["hack_frac=0.5,0.9", "seed=1,2"], &["max_steps=4", &plugin_dir]);
    sweep.config_files = files.to_vec();
    sweep.intervention_arms = Arm::parse_list(Some("routing,penalty")).unwrap();
    let plan = plan::plan(&sweep).unwrap();
    smallrl::sweep::runner::prepare(&plan).unwrap();
    let mut found = BTreeSet::new();
    for run in &plan.runs {
        let read_back = TrainConfig::resolve(Some(&smallrl::sweep::runner::run_config_path(out.path(), &run.name)), Map::new()).unwrap();
        assert_eq!(read_back.run_name().unwrap(), run.name);
        let c = &read_back;
        let key = (c.environment.clone().unwrap(), c.hack_frac.to_string(), c.seed, Arm::of(c).name());
        assert!(found.insert(key.clone()), "{key:?} planned twice");
        // The routed run is the file with the grid point; the others derive from it.
        let file = files.iter().find(|f| f.file_stem().unwrap() == c.environment.as_deref().unwrap()).unwrap();
        let overrides: Map<String, Value> = [("max_steps", Value::from(4)), ("hack_frac", c.hack_frac.into()), ("seed", c.seed.into()), ("output_dir", serde_json::to_value(out.path()).unwrap())]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .chain([parse_fixed(&plugin_dir).unwrap()])
            .collect();
        let routed = TrainConfig { threads: c.threads, ..TrainConfig::resolve(Some(file), overrides).unwrap() };
        let expected = match Arm::of(c) {
            Arm::Intervention(Intervention::Routing) => routed.clone(),
            Arm::None => TrainConfig { recall: 1.0, ..routed.without_routing() },
            // The penalty arm differs from the routed run in routing and the intervention alone:
            // it keeps the coherence rows (and their verifier) the configs have.
            Arm::Intervention(Intervention::Penalty) => {
                let (Value::Object(penalised), Value::Object(routed_keys)) = (serde_json::to_value(c).unwrap(), serde_json::to_value(&routed).unwrap()) else { unreachable!() };
                let differing: BTreeSet<&str> = penalised.iter().filter(|(k, v)| routed_keys.get(*k) != Some(v)).map(|(k, _)| k.as_str()).collect();
                assert_eq!(differing, BTreeSet::from(["intervention", "renormalization_mode", "routing_mode", "split_moment"]), "{}", run.name);
                assert!(c.coh_samples_per_rollout > 0 && c.rh_detector_verifies_retain_samples, "{}", run.name);
                c.clone()
            }
            other => panic!("{}: arm {} was not chosen", run.name, other.name()),
        };
        assert_eq!(c, &expected, "{}", run.name);
        assert_eq!(run.role == RunRole::Baseline, Arm::of(c) == Arm::None, "{}", run.name);
    }
    let mut expected = BTreeSet::new();
    for env in ["sorting", "addition"] {
        for hack_frac in ["0.5", "0.9"] {
            for seed in [1, 2] {
                for arm in ["none", "routing", "penalty"] {
                    expected.insert((env.to_string(), hack_frac.to_string(), seed, arm));
                }
            }
        }
    }
    assert_eq!(found, expected, "2 files × 2 hack_frac × 2 seeds × (routing, penalty and their baseline)");
    let names: BTreeSet<&String> = plan.runs.iter().map(|r| &r.name).collect();
    assert_eq!(names.len(), 24, "every run has its own directory");

    // Two files that name their runs alike but differ in a key run names leave out collide.
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read_to_string(&files[0]).unwrap();
    for (sub, eval_every) in [("a", 10), ("b", 20)] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        std::fs::write(dir.path().join(sub).join("sorting.yaml"), original.replace("eval_every: 10", &format!("eval_every: {eval_every}"))).unwrap();
    }
    sweep.config_files = vec![dir.path().join("a/sorting.yaml"), dir.path().join("b/sorting.yaml")];
    let error = format!("{:#}", plan::plan(&sweep).unwrap_err());
    assert!(error.contains("two planned runs share the directory name") && error.contains("eval_every"), "{error}");
}

#[test]
fn intervention_arm_lists_name_the_valid_arms() {
    use smallrl::sweep::plan::Arm;
    use smallrl::intervention::Intervention;
    assert_eq!(Arm::parse_list(None).unwrap(), Arm::ALL.to_vec(), "the bare flag is every arm");
    assert_eq!(Arm::parse_list(Some("penalty,routing")).unwrap(), vec![Arm::Intervention(Intervention::Routing), Arm::Intervention(Intervention::Penalty)]);
    let error = format!("{:#}", Arm::parse_list(Some("routing,penalti")).unwrap_err());
    assert!(error.contains("\"penalti\"") && error.contains("none, routing, penalty, filter, placebo, verified, adv_mod, matched_placebo"), "{error}");
    assert!(format!("{:#}", Arm::parse_list(Some("routing,routing")).unwrap_err()).contains("twice"));

    // On the command line: the bare flag, a list, a typo; and --config taking several files.
    let out = tempfile::tempdir().unwrap();
    let out = out.path().join("dry");
    let config = happy_config_abs();
    let dry = |arms: &[&str]| {
        let mut args = vec!["sweep", "--config", config.as_str(), "--dry-run", "--output-dir", out.to_str().unwrap(), "--fixed", "routing_mode=classic", "--grid", "seed=1"];
        args.extend(arms);
        smallrl(&args)
    };
    let planned = |output: &std::process::Output| {
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).lines().next().unwrap().to_string()
    };
    assert!(planned(&dry(&["--intervention-arms"])).starts_with("8 runs planned"));
    assert!(planned(&dry(&["--intervention-arms", "routing,penalty"])).starts_with("3 runs planned"));
    let typo = dry(&["--intervention-arms", "routing,penalti"]);
    assert!(!typo.status.success() && String::from_utf8_lossy(&typo.stderr).contains("the arms are none, routing, penalty, filter, placebo, verified, adv_mod, matched_placebo"));
    let sorting = env_config("sorting").to_string_lossy().into_owned();
    let addition = env_config("addition").to_string_lossy().into_owned();
    let plugin_dir = format!("plugin_dir={}", common::plugin_dir().display());
    let output = smallrl(&["sweep", "--config", &sorting, &addition, "--dry-run", "--output-dir", out.to_str().unwrap(), "--fixed", &plugin_dir, "--grid", "seed=1,2", "--intervention-arms", "routing"]);
    let stdout = planned(&output);
    assert!(stdout.starts_with("8 runs planned"), "{stdout}");
    assert!(!out.exists(), "a dry run writes nothing");
}

/// Issue 47.5: a grid that gives `rh_detector` by a path names its runs by the detector's
/// declared name (`det-happy_any`), as `smallrl train` does, not by the path; the runs still
/// load the file the grid names.
#[test]
fn a_grid_detector_given_by_a_path_names_its_runs_by_the_declared_name() {
    let out = tempfile::tempdir().unwrap();
    let detector = common::plugin_dir().join("detect_happy_any.wasm");
    let grid = format!("rh_detector={{plugin: {}}}", detector.display());
    let plan = plan::plan(&spec(out.path(), &[&grid, "seed=1"], &["max_steps=4", "routing_mode=classic"])).unwrap();
    let routed: Vec<_> = plan.runs.iter().filter(|r| r.role == RunRole::Grid).collect();
    assert_eq!(routed.len(), 1);
    let name = &routed[0].name;
    assert!(name.starts_with("sentence_length_10_smooth_with_happy_det-happy_any_") && !name.contains("detect_happy_any"), "the declared name, not the path: {name}");
    let expected: smallrl::reward::DetectorSpec = smallrl::yaml::from_str(&format!("{{plugin: {}}}", detector.display())).unwrap();
    assert_eq!(routed[0].config.rh_detector, Some(expected), "the run loads the grid's file");
}
