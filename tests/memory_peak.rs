//! The memory estimate (`train/memory.rs`) against the peak resident memory measured over a
//! training step of the tiny-stories fixture, in a test binary of its own: no other test's
//! tensors share the process whose peak is read.

#[path = "common/mod.rs"]
mod common;

use smallrl::train::memory;
use smallrl::train::{TrainConfig, Trainer};

/// The training precision a child process of the test measures.
const TRAIN_DTYPE_VAR: &str = "SMALLRL_MEMORY_PEAK_TRAIN_DTYPE";

/// One step of 64 completions of up to 64 tokens (DualLoRA r4, one thread), in each training
/// precision (`train_dtype`) in a process of its own: what the estimate says the step adds to the
/// process (the sampler's folded copies, the optimizer's state and the largest of sampling,
/// scoring and training, with what bfloat16's autocast keeps and its bfloat16 copy of the
/// weights) covers the peak resident memory measured over the step less the resident memory
/// before it, within the planner's margin, and is at most twice it. At this size the training's activations are most of the
/// estimate (docs/src/training.md has the figures).
#[test]
fn the_estimate_covers_the_measured_peak_within_a_factor_of_two() {
    // Each precision in a process of its own: a second run in one process reuses the pages the
    // allocator kept from the first, and its peak measures nothing (1 MB measured so).
    let Ok(train_dtype) = std::env::var(TRAIN_DTYPE_VAR) else {
        for train_dtype in ["float32", "bfloat16"] {
            let name = "the_estimate_covers_the_measured_peak_within_a_factor_of_two";
            let status = std::process::Command::new(std::env::current_exe().unwrap()).args(["--exact", name, "--nocapture"]).env(TRAIN_DTYPE_VAR, train_dtype).status().unwrap();
            assert!(status.success(), "{train_dtype}: the measurement in its own process failed (its output above)");
        }
        return;
    };
    let train_dtype = train_dtype.as_str();
    common::one_thread();
    let out = tempfile::tempdir().unwrap();
    let mut config = common::tiny_stories_run(out.path(), &common::standard_plugin("happy"), "memory");
    for (key, value) in [("batch_size", 64), ("num_generations", 8), ("max_completion_length", 64)] {
        config.insert(key.into(), value.into());
    }
    config.insert("train_dtype".into(), train_dtype.into());
    let mut trainer = Trainer::new(TrainConfig::resolve(None, config).unwrap(), None).unwrap();
    let before = memory::resident().unwrap();
    memory::reset_peak_resident().unwrap();
    trainer.train_one().unwrap();
    let measured = memory::peak_resident().unwrap() - before;
    let plan = trainer.memory_plan();
    assert_eq!(plan.step.matmul_bytes, if train_dtype == "bfloat16" { 2 } else { 4 }, "{train_dtype}: the plan's products");
    let estimated = plan.estimate.peak(plan.step.rows, plan.step.samples_ahead) - plan.estimate.weights;
    let training = plan.estimate.training(plan.step.rows);
    let ratio = estimated as f64 / measured as f64;
    eprintln!("tiny-stories, {train_dtype}, 64 rows of {} tokens: estimated {estimated} bytes beyond the weights (training {training}), measured {measured} ({ratio:.2})", plan.step.tokens);
    assert!(training * 2 > estimated, "{train_dtype}: the activations dominate the estimate: {:?}", plan.estimate);
    // Never so far under the measured peak that the plan fails: the planner gives the estimate
    // only USABLE_FRACTION of the memory, so a step fits while its peak is at most the estimate
    // over that fraction (bfloat16's estimate missed the backward's float32 temporaries and the
    // adapters' casts before #50: 0.92 of the peak here, now 1.14-1.29, float32 1.28-1.35). Not
    // held to 1.0: the estimate counts tensors, the measurement an allocator's resident pages,
    // which another libc, libtorch or processor (oneDNN's scratch buffers) moves by tens of
    // percent. At most twice the peak: a missing or doubled term (activations, a decoder copy)
    // is off by more.
    assert!((memory::USABLE_FRACTION..=2.0).contains(&ratio), "{train_dtype}: estimated {estimated} bytes, measured {measured}: {:?}", plan.estimate);
}
