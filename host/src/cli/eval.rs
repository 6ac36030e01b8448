//! `smallrl eval CHECKPOINT`: the routing evaluation of a saved checkpoint, with the adapter
//! configuration and the reward configuration the run recorded (never guessed); at the
//! standard adapter modes or at chosen adapter scales (`--scales`, `--forget-scales`: one model
//! load, one sampling pass per scale); `--all-checkpoints` evaluates every checkpoint of a run
//! into one CSV; `--deploy` applies the deployment protocol to a finished run
//! (`eval::deployment`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use clap::Args;

use crate::eval::{self, EvalSetup, deployment};
use crate::routing;
use crate::train::{self, TrainConfig, checkpoint};

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// A `checkpoint-N` directory of a run (a run directory with --all-checkpoints).
    pub checkpoint: PathBuf,
    /// Evaluate at these adapter scales instead of the standard modes: one value per adapter
    /// (DualLoRA: retain,forget), e.g. `--scales 1,0.5`; repeat for several. A global scale s
    /// is `--scales s,s`. Modes are named `retain<r>_forget<f>` (or `lora<s>`).
    #[arg(long, value_name = "S1,S2", value_parser = parse_scales)]
    pub scales: Vec<Vec<f64>>,
    /// DualLoRA: evaluate with retain at 1 and forget at each of these scales (with --scales,
    /// after its modes), e.g. `--forget-scales 0,0.25,0.5,0.75,1`.
    #[arg(long, value_delimiter = ',')]
    pub forget_scales: Vec<f64>,
    /// CHECKPOINT is a finished run directory: evaluate its final checkpoint as the base model
    /// (every adapter at scale 0) and along the forget-scale curve (--forget-scales, default
    /// 0, 0.1, ..., 1), deploy the highest forget scale whose monitored ground-truth hack rate is
    /// below the base model's (the original's rule), and write `<run>/deployment.json`.
    /// --n-samples defaults to the run's `eval_samples` here.
    #[arg(long, conflicts_with_all = ["scales", "all_checkpoints", "reward_history", "json", "config"])]
    pub deploy: bool,
    /// CHECKPOINT is a run directory: evaluate each of its checkpoints (in step order) and write
    /// `<run>/eval_checkpoints.csv` (step,mode,metric,value).
    #[arg(long, conflicts_with_all = ["reward_history", "json"])]
    pub all_checkpoints: bool,
    /// Completions per adapter mode (one per evaluation prompt) [default: the default of the
    /// `eval_samples` key; with --deploy the run's own eval_samples].
    #[arg(long)]
    pub n_samples: Option<usize>,
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

fn parse_scales(text: &str) -> Result<Vec<f64>, String> {
    text.split(',').map(|v| v.trim().parse::<f64>().map_err(|e| format!("`{v}` in `{text}`: {e}"))).collect()
}

pub fn run(args: EvalArgs) -> Result<()> {
    crate::device::set_threads(args.threads)?;
    if args.deploy {
        return deploy(&args);
    }
    let checkpoints = match args.all_checkpoints {
        true => {
            let all = checkpoint::all(&args.checkpoint)?;
            ensure!(!all.is_empty(), "{} has no checkpoint-N directories (--all-checkpoints takes a run directory)", args.checkpoint.display());
            all.into_iter().map(|(_, dir)| dir).collect()
        }
        false => vec![args.checkpoint.clone()],
    };
    // The scales are checked against the adapters before any model is loaded; a run's
    // checkpoints all have the run's adapters.
    let adapters = checkpoint::read_state(&checkpoints[0])?.adapters;
    for dir in &checkpoints[1..] {
        checkpoint::check_adapters(&checkpoint::read_state(dir)?, &adapters, dir)?;
    }
    let modes: Vec<(String, Vec<f64>)> = match args.scales.is_empty() && args.forget_scales.is_empty() {
        true => routing::eval_modes(&adapters).into_iter().map(|(name, scales)| (name.to_string(), scales)).collect(),
        false => routing::scaled_modes(&adapters, &args.scales, &args.forget_scales)?,
    };
    let mut reports = Vec::new();
    for dir in &checkpoints {
        let report = evaluate(dir, &modes, args.n_samples.unwrap_or(crate::defaults::EVAL_PROMPTS), args.config.as_deref())?;
        match args.all_checkpoints {
            true => println!("{}", eval::format_block(&report)),
            false => print_report(&report, &args)?,
        }
        reports.push(report);
    }
    if args.all_checkpoints {
        let csv = args.checkpoint.join(eval::CHECKPOINTS_CSV);
        crate::fsutil::write_atomic(&csv, eval::checkpoints_csv(&reports)?.as_bytes())?;
        println!("wrote {} ({} checkpoints x {} modes)", csv.display(), reports.len(), modes.len());
    }
    Ok(())
}

/// One checkpoint's evaluation in `modes`, with the run's recorded configuration.
fn evaluate(dir: &Path, modes: &[(String, Vec<f64>)], n_samples: usize, scoring_config: Option<&Path>) -> Result<eval::EvalReport> {
    let run_config_path = dir.join("config.yaml");
    let mut config = TrainConfig::resolve(Some(&run_config_path), Default::default())?;
    if let Some(path) = scoring_config {
        let scoring = TrainConfig::resolve(Some(path), Default::default())?;
        (config.reward, config.rh_detector) = (scoring.reward, scoring.rh_detector);
    }
    let restored = checkpoint::restore_model(dir, config.device.resolve()?)?;
    let tokenizer = crate::model::Tokenizer::from_file(&restored.tokenizer_path)?;
    let mut rewards = train::task::rewards(&config)?;
    // Chat prompts are rendered by the base model's template, as the run rendered them.
    let render = match config.prompt_format {
        crate::model::chat::PromptFormat::Raw => train::prompts::PromptRender::Raw,
        crate::model::chat::PromptFormat::Chat => train::prompts::PromptRender::for_run(&config, &crate::model::hub::resolve(&config.model, &config.revision)?)?,
    };
    let (mut prompts, starts) = match config.environment.is_some() {
        true => train::task::evaluation_episodes(&mut rewards, n_samples, &config, &render)?,
        false => (train::evaluation_prompts(&config, &tokenizer, &render)?, Vec::new()),
    };
    ensure!(prompts.len() >= n_samples, "--n-samples {n_samples} but only {} evaluation prompts exist", prompts.len());
    prompts.truncate(n_samples);
    let (seed, step) = (train::eval_seed(&config), restored.state.step);
    if rewards.is_episodic() {
        // One episode per evaluation prompt at each mode's scales, as the run's own evaluations
        // play them (`Trainer::evaluate`): its sampling settings, the evaluation seed, ids from 0.
        let episodes = train::episodes::Episodes::new(&config, starts, &render)?;
        let sampling = train::sampling_params(&config);
        let mut rollout = |scales: &[f64], rewards: &mut crate::reward::RewardModel| {
            let decoder = crate::model::decode::DecodeModel::sampling_in(&restored.model, scales, config.sampler_dtype);
            episodes.play_on(&decoder, &tokenizer, &sampling, rewards, &prompts, (seed, seed), 0).map(|played| (played.samples, played.scored))
        };
        return eval::routing_eval_of(&mut rollout, modes, &mut rewards, config.max_no_score_frac, step);
    }
    let sampling = train::eval_sampling_params(&config);
    let setup = EvalSetup { tokenizer: &tokenizer, prompts: &prompts, sampling: &sampling, seed, max_no_score_frac: config.max_no_score_frac };
    eval::routing_eval(&mut eval::fresh_decoders(&restored.model, config.sampler_dtype), modes, &mut rewards, &setup, step)
}

/// `--deploy`: the run's final checkpoint as the base model and along the forget-scale curve,
/// the deployment rule, `<run>/deployment.json`.
fn deploy(args: &EvalArgs) -> Result<()> {
    let run_dir = &args.checkpoint;
    let config = TrainConfig::read_saved(run_dir).with_context(|| format!("--deploy takes a run directory; {} is not one", run_dir.display()))?;
    let (step, final_checkpoint) = checkpoint::all(run_dir)?.pop().with_context(|| format!("{} has no checkpoint", run_dir.display()))?;
    ensure!(step == config.max_steps, "{}: the last checkpoint is step {step} but the run trains to max_steps {}; deploy a finished run", run_dir.display(), config.max_steps);
    let forget_scales = match args.forget_scales.is_empty() {
        true => crate::defaults::DEPLOY_FORGET_SCALES.to_vec(),
        false => args.forget_scales.clone(),
    };
    let modes = deployment::modes(&checkpoint::read_state(&final_checkpoint)?.adapters, &forget_scales)?;
    let n_samples = args.n_samples.unwrap_or(config.eval_samples);
    let report = evaluate(&final_checkpoint, &modes, n_samples, None)?;
    let deployment = deployment::from_report(&report, &forget_scales, n_samples).with_context(|| format!("deploying {}", run_dir.display()))?;
    deployment::write(run_dir, &deployment)?;
    println!("{}", deployment::format_table(&deployment));
    println!("wrote {}", run_dir.join(deployment::FILE).display());
    Ok(())
}

fn print_report(report: &eval::EvalReport, args: &EvalArgs) -> Result<()> {
    let history = match args.reward_history {
        true => Some(crate::train::metrics::reward_history(args.checkpoint.parent().context("a checkpoint lives in a run directory")?)?),
        false => None,
    };
    if args.json {
        println!("{}", serde_json::json!({"report": report, "reward_history": history}));
        return Ok(());
    }
    println!("{}", eval::format_block(report));
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
