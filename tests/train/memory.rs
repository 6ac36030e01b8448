//! The memory planner in a run (`train/memory.rs`): `gradient_accumulation_steps: auto` with a
//! `max_memory` that holds half the step's rows trains the step in two micro-batches and
//! computes what the one-pass step computes, and keeps its plan when resumed; a `max_memory`
//! that holds no row is refused before anything is sampled or written, naming the figures and
//! the keys to change.

use super::*;
use smallrl::train::memory::{USABLE_FRACTION, plan};

/// Two steps of routed DualLoRA runs (the `happy` reward, so advantages and gradients are not
/// zero): the planned run records 2 micro-batches in config.yaml and says so in train.log, and
/// its metrics (loss, gradient norm, KL, entropies, rewards) are the one-pass run's within the
/// bounds of a stacked pack (float32 rounding of sums taken in another order).
#[test]
fn a_planned_step_is_the_unplanned_step() {
    one_thread();
    let out = tempfile::tempdir().unwrap();
    let config = |name: &str| with(routed_config(&out.path().join(name)), "max_steps", json!(2));
    let mut unplanned = Trainer::new(TrainConfig::resolve(None, config("unplanned")).unwrap(), None).unwrap();
    let (step, estimate) = (unplanned.memory_plan().step, unplanned.memory_plan().estimate);
    // A budget that holds half the step's rows and not all of them.
    let beyond_weights = estimate.peak(step.rows / 2, step.samples_ahead) - estimate.weights;
    let budget = (beyond_weights as f64 / USABLE_FRACTION).ceil() as u64 + 1;
    assert_eq!(plan(&estimate, &step, budget, step.rows).unwrap().micro_batches, 2, "the budget holds half the rows: {estimate:?}");
    let max_memory = format!("{}B", estimate.weights + budget);
    let planned = with(with(config("planned"), "gradient_accumulation_steps", json!("auto")), "max_memory", json!(max_memory));
    let planned_run = Trainer::new(TrainConfig::resolve(None, planned).unwrap(), None).unwrap().train(None).unwrap().run_dir;
    let unplanned_run = unplanned.train(None).unwrap().run_dir;

    let saved = TrainConfig::read_saved(&planned_run).unwrap();
    assert_eq!((saved.planned_micro_batches, saved.micro_batches()), (Some(2), 2));
    let log = std::fs::read_to_string(planned_run.join("train.log")).unwrap();
    assert!(log.contains("memory: gradient_accumulation_steps auto planned 2 micro-batch(es) of 4 rows"), "{log}");
    assert!(log.contains("[Step 1] peak resident memory: ") && log.contains("[Step 2] peak resident memory: "), "{log}");
    let unplanned_log = std::fs::read_to_string(unplanned_run.join("train.log")).unwrap();
    assert!(unplanned_log.contains("memory: gradient_accumulation_steps 1, micro-batches of 8 rows; estimated peak"), "{unplanned_log}");
    // A resumed run keeps the recorded plan: with a max_memory that holds no row it is not
    // planned again (which would refuse it).
    let resumed = TrainConfig { max_memory: Some("1MB".parse().unwrap()), ..saved };
    drop(Trainer::new(resumed, Some(&planned_run)).unwrap());
    let log = std::fs::read_to_string(planned_run.join("train.log")).unwrap();
    assert!(log.contains("memory: gradient_accumulation_steps auto, 2 micro-batch(es) of 4 rows as planned when the run started"), "{log}");
    let metrics = |run: &Path| deterministic(read_jsonl(&run.join("metrics.jsonl")));
    let (a, b) = (metrics(&planned_run), metrics(&unplanned_run));
    assert!(a.iter().any(|line| line[key::GRAD_NORM].as_f64().unwrap() > 1e-4), "the steps have gradients to compare: {a:?}");
    super::packs::assert_close_metrics(&a, &b, "metrics.jsonl");
}

/// A max_memory below what one row needs: refused before sampling, with the estimate, the
/// budget and the keys to change; no run directory is written.
#[test]
fn a_step_that_cannot_fit_one_row_is_refused_before_sampling() {
    one_thread();
    let out = tempfile::tempdir().unwrap();
    let config = with(with(small_config(out.path(), &standard_plugin("happy")), "gradient_accumulation_steps", json!("auto")), "max_memory", json!("1MB"));
    let error = format!("{:#}", Trainer::new(TrainConfig::resolve(None, config).unwrap(), None).err().expect("refused"));
    assert!(error.starts_with("gradient_accumulation_steps auto: even 1 row(s) per micro-batch need an estimated "), "{error}");
    assert!(error.contains("usable (0.8 of max_memory 1MB less the weights)"), "{error}");
    assert!(error.contains("lower batch_size, num_generations or max_completion_length, free memory, or set max_memory"), "{error}");
    assert!(std::fs::read_dir(out.path()).unwrap().next().is_none(), "nothing written");
}
