//! `smallrl eval CHECKPOINT`: the routing evaluation of a saved checkpoint, with the adapter
//! configuration and the reward configuration the run recorded (never guessed); at the
//! standard adapter modes or at chosen adapter scales (`--scales`, `--forget-scales`: one model
//! load, one sampling pass per scale); `--all-checkpoints` evaluates every checkpoint of a run
//! into one CSV.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use clap::Args;

use crate::eval::{self, EvalSetup};
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
    /// With --forget-scales: report the deployed forget scale by the original's rule, the
    /// highest scale whose hack frequency is strictly below this base rate (the base model's;
    /// the original's scripts use 0.02), else 0 (full ablation).
    #[arg(long, value_name = "RATE", requires = "forget_scales", conflicts_with = "json")]
    pub deploy_below: Option<f64>,
    /// CHECKPOINT is a run directory: evaluate each of its checkpoints (in step order) and write
    /// `<run>/eval_checkpoints.csv` (step,mode,metric,value).
    #[arg(long, conflicts_with_all = ["reward_history", "json"])]
    pub all_checkpoints: bool,
    /// Completions per adapter mode (one per evaluation prompt).
    #[arg(long, default_value_t = crate::defaults::EVAL_PROMPTS)]
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

fn parse_scales(text: &str) -> Result<Vec<f64>, String> {
    text.split(',').map(|v| v.trim().parse::<f64>().map_err(|e| format!("`{v}` in `{text}`: {e}"))).collect()
}

pub fn run(args: EvalArgs) -> Result<()> {
    crate::device::set_threads(args.threads)?;
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
        let report = evaluate(dir, &modes, &args)?;
        match args.all_checkpoints {
            true => println!("{}", eval::format_block(&report)),
            false => print_report(&report, &args)?,
        }
        if let Some(base_rate) = args.deploy_below {
            print_deployed_scale(&report, &args.forget_scales, base_rate)?;
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
fn evaluate(dir: &Path, modes: &[(String, Vec<f64>)], args: &EvalArgs) -> Result<eval::EvalReport> {
    let run_config_path = dir.join("config.yaml");
    let mut config = TrainConfig::resolve(Some(&run_config_path), Default::default())?;
    if let Some(path) = &args.config {
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
    let mut prompts = match config.environment.is_some() {
        true => train::task::evaluation_prompts(&mut rewards, args.n_samples, &config, &render)?,
        false => train::evaluation_prompts(&config, &tokenizer, &render)?,
    };
    ensure!(prompts.len() >= args.n_samples, "--n-samples {} but only {} evaluation prompts exist", args.n_samples, prompts.len());
    prompts.truncate(args.n_samples);
    let sampling = train::sampling_params(&config);
    let setup = EvalSetup { tokenizer: &tokenizer, prompts: &prompts, sampling: &sampling, seed: train::eval_seed(&config) };
    eval::routing_eval(&restored.model, modes, &mut rewards, &setup, restored.state.step)
}

/// The forget-scale curve of `report` (its last `forget_scales.len()` modes, in that order)
/// and the scale the deployment rule picks ([`routing::deployed_forget_scale`]).
fn print_deployed_scale(report: &eval::EvalReport, forget_scales: &[f64], base_rate: f64) -> Result<()> {
    let curve_modes = &report.modes[report.modes.len() - forget_scales.len()..];
    let curve = forget_scales
        .iter()
        .zip(curve_modes)
        .map(|(&scale, mode)| Ok((scale, mode.hack_freq.with_context(|| format!("{}: no hack frequency (the run has no rh_detector); the deployment rule needs one", mode.mode))?)))
        .collect::<Result<Vec<(f64, f64)>>>()?;
    let scale = routing::deployed_forget_scale(&curve, base_rate)?;
    println!("deployed forget scale at step {}: {scale} (highest with hack_freq < {base_rate}; curve {curve:?})", report.step);
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
