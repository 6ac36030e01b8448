//! Every default value of smallrl, in one place. Commands, configs and run-directory naming all
//! read them from here (run names list exactly the hyperparameters that differ from these).

/// The model researchers study: SimpleStories-1.25M on the HuggingFace Hub.
pub const MODEL: &str = "SimpleStories/SimpleStories-1.25M";
pub const REVISION: &str = "main";
pub const DEVICE: &str = "auto";
pub const DTYPE: &str = "float32";

// Sampling (TRL's GRPO generation settings of the original runs).
pub const TEMPERATURE: f64 = 1.0;
pub const TOP_K: usize = 0;
pub const TOP_P: f64 = 1.0;
pub const REPETITION_PENALTY: f64 = 1.0;
pub const MAX_COMPLETION_LENGTH: usize = 128;
pub const SAMPLE_SEED: u64 = 42;

// GRPO (the original's recommended values; §2 of the behaviour reference).
pub const BETA: f64 = 0.02;
pub const EPSILON: f64 = 0.2;
pub const LOSS_TYPE: &str = "grpo";
pub const NUM_ITERATIONS: usize = 1;
pub const BATCH_SIZE: usize = 32;
pub const NUM_GENERATIONS: usize = 16;
pub const LEARNING_RATE: f64 = 1e-5;
pub const MAX_STEPS: usize = 2000;
pub const SEED: u64 = 42;
pub const MAX_GRAD_NORM: f64 = 1.0;
pub const WEIGHT_DECAY: f64 = 0.0;
pub const ADAM_BETA1: f64 = 0.9;
pub const ADAM_BETA2: f64 = 0.999;
pub const ADAM_EPSILON: f64 = 1e-8;
/// Added to the group standard deviation when normalising advantages (TRL's constant).
pub const ADVANTAGE_STD_EPSILON: f64 = 1e-4;

// Prompts.
pub const PROMPT_LENGTH: usize = 8;
pub const NUM_PROMPTS: usize = 10_000;
/// Evaluation prompts are drawn with this seed, independent of the run seed.
pub const EVAL_PROMPT_SEED: u64 = 99;
/// How many evaluation prompts are drawn from the dataset's test split (commands take the
/// first `eval_samples` / `--n-samples` of them).
pub const EVAL_PROMPT_POOL: usize = 100;

// Adapters (§5). The default is full fine-tuning, for which the values above were validated.
pub const ADAPTER: &str = "full";
pub const RETAIN_RANK: usize = 32;
pub const FORGET_RANK: usize = 32;
pub const LORA_RANK: usize = 64;
pub const LORA_ALPHA: f64 = 32.0;
pub const LAYER_STRIDE: usize = 1;

// Routing and the detector's experimental-protocol knobs (§4, §5).
pub const ROUTING_MODE: &str = "none";
pub const ABLATED_FRAC: f64 = 0.0;
pub const FALSE_POSITIVE_RATE: f64 = 0.0;
pub const RECALL: f64 = 1.0;
pub const RH_ELIGIBLE_FRAC: f64 = 1.0;

// Logging, checkpoints, evaluation (§6, §7).
pub const LOGGING_STEPS: usize = 10;
pub const SAVE_STEPS: usize = 500;
pub const EVAL_EVERY: usize = 100;
pub const EVAL_SAMPLES: usize = 10;
pub const OUTPUT_DIR: &str = "runs";
pub const PLUGIN_DIR: &str = "plugins";

// Plugin sandbox limits per call: generous for text rewards (512 completions take about 1 ms
// and under 2 MiB), small enough that a runaway plugin fails fast.
pub const PLUGIN_MAX_MEMORY_BYTES: usize = 64 << 20;
pub const PLUGIN_MAX_CALL_SECONDS: u64 = 10;

// Sweeps and charts (issue 6).
/// Where `smallrl sweep` puts its runs, logs, summary and charts.
pub const SWEEP_OUTPUT_DIR: &str = "runs/sweep";
/// Concurrent child runs of a sweep.
pub const SWEEP_JOBS: usize = 1;
/// Seconds between the sweep's status lines (running/done/failed/queued).
pub const SWEEP_STATUS_SECONDS: u64 = 30;
/// How often the sweep looks at its children (milliseconds).
pub const SWEEP_POLL_MILLIS: u64 = 200;
/// CPUs (and libtorch threads) per run in an emitted SLURM array job.
pub const SLURM_CPUS_PER_RUN: usize = 1;
/// Delay between frames of the animated GIF across evaluation steps (milliseconds).
pub const GIF_FRAME_MILLIS: u32 = 800;
/// Delay between frames when the HTML viewer plays (milliseconds).
pub const VIEWER_FRAME_MILLIS: u32 = 800;
/// Where `smallrl plot` writes its curves.
pub const PLOT_OUTPUT_DIR: &str = "plots";
