//! `smallrl eval CHECKPOINT`: the routing evaluation of a saved checkpoint, with the adapter
//! configuration and the reward configuration the run recorded (never guessed).

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use clap::Args;

use crate::eval::{self, EvalSetup};
use crate::reward::RewardModel;
use crate::routing;
use crate::train::{self, TrainConfig, checkpoint};

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// A `checkpoint-N` directory of a run.
    pub checkpoint: PathBuf,
    /// Completions per adapter mode (one per evaluation prompt).
    #[arg(long, default_value_t = 20)]
    pub n_samples: usize,
    /// Score with this config's `reward:`/`rh_detector:` instead of the run's.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Samples printed per mode.
    #[arg(long, default_value_t = 5)]
    pub show: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also summarise the run's reward curve from metrics.jsonl.
    #[arg(long)]
    pub reward_history: bool,
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(args: EvalArgs) -> Result<()> {
    crate::device::set_threads(args.threads)?;
    let run_config_path = args.checkpoint.join("config.yaml");
    let mut config = TrainConfig::resolve(Some(&run_config_path), Default::default())?;
    if let Some(path) = &args.config {
        let scoring = TrainConfig::resolve(Some(path), Default::default())?;
        (config.reward, config.rh_detector) = (scoring.reward, scoring.rh_detector);
    }
    let restored = checkpoint::restore_model(&args.checkpoint, config.device.resolve()?)?;
    let tokenizer = crate::model::Tokenizer::from_file(&restored.tokenizer_path)?;
    let reward = config.reward.as_ref().context("the run has no reward configuration")?;
    let mut rewards = RewardModel::load(reward, config.rh_detector.as_ref(), config.knobs(), &config.plugin_dir, config.plugin_limits()?)?
        .with_ground_truth(config.rh_ground_truth.as_ref(), &config.plugin_dir, config.plugin_limits()?)?;
    let mut prompts = train::evaluation_prompts(&config, &tokenizer)?;
    ensure!(prompts.len() >= args.n_samples, "--n-samples {} but only {} evaluation prompts exist", args.n_samples, prompts.len());
    prompts.truncate(args.n_samples);
    let sampling = train::sampling_params(&config);
    let setup = EvalSetup { tokenizer: &tokenizer, prompts: &prompts, sampling: &sampling, seed: train::eval_seed(&config) };
    let report = eval::routing_eval(&restored.model, &routing::eval_modes(&restored.adapters), &mut rewards, &setup, restored.state.step)?;
    let history = match args.reward_history {
        true => Some(crate::train::metrics::reward_history(args.checkpoint.parent().context("a checkpoint lives in a run directory")?)?),
        false => None,
    };
    if args.json {
        println!("{}", serde_json::json!({"report": report, "reward_history": history}));
        return Ok(());
    }
    println!("{}", eval::format_block(&report));
    for mode in &report.modes {
        println!("\n{} (unique first sentences {}/{}):", mode.mode, mode.unique_first_sentences, mode.n);
        for (prompt, completion) in mode.samples.iter().take(args.show) {
            println!("  {prompt} ||| {completion}");
        }
    }
    if let Some(history) = history {
        println!("\n{}", history["summary"].as_str().unwrap_or_default());
    }
    Ok(())
}
