//! `smallrl sweep`: a grid of `smallrl train` runs with automatic baselines (see
//! `crate::sweep`). Every key is validated before any run starts.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use serde_json::Map;

use crate::defaults;
use crate::sweep::plan::{self, CacheState, Plan, SweepSpec};
use crate::sweep::{self as sweeps, RunStatus, runner};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Emit {
    /// A SLURM array script (sweep.sbatch) and a job list (jobs.txt) in the output directory.
    Slurm,
}

#[derive(Args, Debug)]
pub struct SweepArgs {
    /// Base YAML experiment configs (see configs/), e.g. `--config configs/envs/{sorting,addition}.yaml`:
    /// each file is the outermost factor of the grid (repeatable).
    #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with = "collect")]
    pub config: Vec<PathBuf>,
    /// One reward plugin (.wasm path or a name in the plugin dir) instead of `reward:` in YAML.
    #[arg(long, conflicts_with = "collect")]
    pub reward_plugin: Option<String>,
    /// JSON parameters for --reward-plugin.
    #[arg(long, requires = "reward_plugin")]
    pub reward_params: Option<String>,
    /// A config key and its values, e.g. `lr=1e-4,3e-4` (repeatable; Cartesian product).
    #[arg(long, value_name = "KEY=V1,V2,...", num_args = 1.., conflicts_with = "collect")]
    pub grid: Vec<String>,
    /// A config key every run shares, e.g. `max_steps=200` (repeatable).
    #[arg(long, value_name = "KEY=VALUE", num_args = 1.., conflicts_with = "collect")]
    pub fixed: Vec<String>,
    /// Plan intervention arms of each (routed) grid point: alone, all of none, routing, penalty,
    /// filter, placebo, verified, adv_mod, matched_placebo (docs/src/training.md, "Controls"); or
    /// a comma list of them, e.g. `routing,penalty` (the non-routed baseline, none, is planned
    /// for every routed or penalised run anyway), which may also name inoculation (the baseline
    /// with inoculation prompting, environment runs).
    #[arg(long, value_name = "ARMS", num_args = 0..=1, conflicts_with = "collect")]
    pub intervention_arms: Option<Option<String>>,
    /// After the runs (or with --collect), apply the deployment protocol to each finished routed
    /// run with retain and forget adapters: `smallrl eval RUN --deploy` (the base model's hack
    /// rates, the forget-scale curve 0, 0.1, ..., 1 and the deployed scale) unless its
    /// deployment.json is current; writes deployment.csv, and the arm tables gain the modes
    /// `base` and `deployed`.
    #[arg(long, conflicts_with = "emit")]
    pub deploy: bool,
    /// Also read each finished run as the paper does, the mean of its last max(1, n // 10)
    /// routing evaluations: writes arms_last_tenth.csv and environments_last_tenth.csv beside
    /// the final-evaluation tables (which stay as they are).
    #[arg(long)]
    pub last_tenth: bool,
    /// With --collect: our cells beside the original paper's, read from the folder PATH (holding
    /// its aggregated_cache.json, e.g. shared/reference/graft-7env) or that file; writes
    /// compare.csv and charts/compare.png (docs/src/sweeps.md, "Comparing with the paper").
    #[arg(long, value_name = "PATH", requires = "collect")]
    pub compare: Option<PathBuf>,
    /// Print the planned runs (cached ones marked) and an estimate of the GPU hours they take
    /// (from the original's measured step time, named in the output), and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// Concurrent runs on this machine; each gets max(1, cores / jobs) libtorch threads.
    #[arg(long, default_value_t = defaults::SWEEP_JOBS)]
    pub jobs: usize,
    /// Runs per process: each `smallrl train` child trains N runs of the grid in lockstep,
    /// sampling them stacked on CUDA (docs/src/sweeps.md, "Packed runs"); the runs must share their
    /// architecture and shapes, checked before any run starts. 1: one process per run.
    /// Default: 1 on the CPU; on CUDA 16 when the grid's runs share an architecture, else 1.
    /// With --emit slurm: runs per array task (default likewise, by the runs' `device`).
    #[arg(long, value_name = "N", conflicts_with = "collect")]
    pub pack: Option<usize>,
    /// Threads that step a pack's runs at once (`train --pack-workers`); each run then gets
    /// max(1, cores / (jobs x W)) libtorch threads.
    #[arg(long, value_name = "W", default_value_t = 1, conflicts_with = "collect")]
    pub pack_workers: usize,
    /// Where run directories, logs, summary.csv and charts go (also the cache of finished runs).
    #[arg(long, default_value = defaults::SWEEP_OUTPUT_DIR)]
    pub output_dir: PathBuf,
    /// Write the commands for a cluster scheduler instead of running them.
    #[arg(long, value_enum, conflicts_with = "dry_run")]
    pub emit: Option<Emit>,
    /// Build the summary table and charts from the run directories already in DIR.
    #[arg(long, value_name = "DIR")]
    pub collect: Option<PathBuf>,
    /// With --emit slurm: a YAML file of slurm_partition, slurm_time, slurm_account,
    /// slurm_gpus_per_task, slurm_cpus_per_task, slurm_sbatch (a list of extra #SBATCH lines);
    /// the --slurm-* flags override it.
    #[arg(long, value_name = "YAML", requires = "emit")]
    pub slurm_config: Option<PathBuf>,
    /// With --emit slurm: #SBATCH --partition.
    #[arg(long, value_name = "NAME", requires = "emit")]
    pub slurm_partition: Option<String>,
    /// With --emit slurm: #SBATCH --time (e.g. 4:00:00 or 1-00:00:00).
    #[arg(long, value_name = "LIMIT", requires = "emit")]
    pub slurm_time: Option<String>,
    /// With --emit slurm: #SBATCH --account.
    #[arg(long, value_name = "NAME", requires = "emit")]
    pub slurm_account: Option<String>,
    /// With --emit slurm: GPUs per array task (#SBATCH --gres=gpu:N) [default: 1 when the runs
    /// ask for CUDA, else 0].
    #[arg(long, value_name = "N", requires = "emit")]
    pub slurm_gpus_per_task: Option<usize>,
    /// With --emit slurm: CPUs per array task [default: 1 per pack worker]; each run gets
    /// CPUs / pack workers libtorch threads.
    #[arg(long, value_name = "N", requires = "emit")]
    pub slurm_cpus_per_task: Option<usize>,
    /// With --emit slurm: an extra #SBATCH line, e.g. --slurm-sbatch=--mem=16G (repeatable).
    #[arg(long, value_name = "LINE", requires = "emit", allow_hyphen_values = true)]
    pub slurm_sbatch: Vec<String>,
}

/// Runs per child process: `--pack` as given (its runs checked before any starts), or without it
/// on CUDA [`defaults::SWEEP_PACK_ON_CUDA`] when every run is on CUDA and all share an
/// architecture; says which, and why not when it could not pack.
fn pack_size(asked: Option<usize>, plan: &plan::Plan, emitting: bool) -> Result<usize> {
    // An emitted job runs elsewhere: its runs are on CUDA when they ask for it, whatever this
    // machine has; and only the runs still to train are grouped.
    let runs: Vec<_> = plan.runs.iter().filter(|run| !emitting || run.state != CacheState::Finished).collect();
    let configs: Vec<_> = runs.iter().map(|run| &run.config).collect();
    if let Some(pack) = asked {
        if pack > 1 {
            crate::train::packed::check_packable(&configs)?;
        }
        return Ok(pack);
    }
    let on_cuda = !configs.is_empty()
        && match emitting {
            true => runs.iter().all(|run| sweeps::slurm::requests_cuda(run)),
            false => configs.iter().all(|config| config.device.resolve().is_ok_and(|d| d.is_cuda())),
        };
    if !on_cuda || configs.len() < 2 {
        return Ok(1);
    }
    match crate::train::packed::check_packable(&configs) {
        Ok(()) => {
            let pack = defaults::SWEEP_PACK_ON_CUDA.min(configs.len());
            println!("on CUDA: {pack} runs per process, sampled stacked (--pack {pack}); --pack 1 runs one process per run");
            Ok(pack)
        }
        Err(why) => {
            println!("on CUDA, but one process per run: the runs cannot be packed ({why:#})");
            Ok(1)
        }
    }
}

pub fn run(args: SweepArgs) -> Result<()> {
    if let Some(dir) = &args.collect {
        let entries = sweeps::collect_entries(dir)?;
        if args.deploy {
            sweeps::deploy::run(dir, &entries, args.jobs, &runner::Launch::for_jobs(args.jobs, 1)?)?;
        }
        report(dir, &entries, &args)?;
        if let Some(reference) = &args.compare {
            sweeps::compare::run(dir, &entries, reference)?;
        }
        return Ok(());
    }
    anyhow::ensure!(args.jobs >= 1, "--jobs must be at least 1");
    anyhow::ensure!(args.pack != Some(0), "--pack must be at least 1 (1: one process per run)");
    anyhow::ensure!(args.pack_workers >= 1, "--pack-workers must be at least 1");
    let slurm = slurm_options(&args)?;
    anyhow::ensure!(
        args.emit.is_some() || slurm == sweeps::slurm::SlurmOptions::default(),
        "--slurm-config and the --slurm-* flags describe the array job of --emit slurm: add --emit slurm (with --dry-run nothing is emitted)"
    );
    let plan = plan::plan(&spec(&args)?)?;
    let pack = pack_size(args.pack, &plan, args.emit.is_some())?;
    // Workers step a pack's runs; without packs they would only divide each run's threads.
    anyhow::ensure!(pack > 1 || args.pack_workers == 1, "--pack-workers steps packed runs: give --pack N with N > 1 as well");
    print_plan(&plan);
    if args.dry_run {
        println!("{}", sweeps::estimate::of(&plan));
        return Ok(());
    }
    if let Some(Emit::Slurm) = args.emit {
        let exe = std::env::current_exe()?;
        let grouping = sweeps::slurm::Grouping { pack, pack_workers: args.pack_workers };
        match sweeps::slurm::emit(&plan, &exe, &slurm, grouping)? {
            Some(job) => {
                let (script, output_dir) = (job.script.display(), plan.output_dir.display());
                println!(
                    "wrote {script}: {} array tasks of {} run(s), {} GPU(s) and {} CPU(s) each (submit with `sbatch {script}`); afterwards: smallrl sweep --collect {output_dir}",
                    job.tasks, job.runs_per_task, job.gpus_per_task, job.cpus_per_task
                )
            }
            None => println!("every run is finished; nothing to submit"),
        }
        return Ok(());
    }
    if args.jobs > 1 && plan.runs.iter().any(|run| run.config.device.resolve().is_ok_and(|d| d.is_cuda())) {
        println!("{}", crate::device::mps_advice(args.jobs, crate::device::mps_daemon_running(std::path::Path::new("/proc"))));
    }
    let launch = runner::Launch { pack, ..runner::Launch::for_jobs(args.jobs, args.pack_workers)? };
    let statuses = runner::execute(&plan, args.jobs, &launch)?;
    let entries = sweeps::entries_of_plan(&plan, &statuses);
    if args.deploy {
        sweeps::deploy::run(&plan.output_dir, &entries, args.jobs, &runner::Launch::for_jobs(args.jobs, 1)?)?;
    }
    report(&plan.output_dir, &entries, &args)?;
    let failed: Vec<&String> = statuses.iter().filter(|(_, s)| **s == RunStatus::Failed).map(|(n, _)| n).collect();
    if !failed.is_empty() {
        bail!("{} of {} runs failed: {failed:?}; their logs are in {}", failed.len(), plan.runs.len(), plan.output_dir.join("logs").display());
    }
    Ok(())
}

/// The sweep's report, and with `--last-tenth` the paper's reading beside it.
fn report(dir: &std::path::Path, entries: &[sweeps::RunEntry], args: &SweepArgs) -> Result<()> {
    sweeps::report(dir, entries)?;
    if args.last_tenth {
        sweeps::report_last_tenth(dir, entries)?;
    }
    Ok(())
}

/// `--slurm-config`, with the `--slurm-*` flags over it.
fn slurm_options(args: &SweepArgs) -> Result<sweeps::slurm::SlurmOptions> {
    let file = args.slurm_config.as_deref().map(sweeps::slurm::SlurmOptions::read).transpose()?.unwrap_or_default();
    Ok(file.overridden_by(sweeps::slurm::SlurmOptions {
        slurm_partition: args.slurm_partition.clone(),
        slurm_time: args.slurm_time.clone(),
        slurm_account: args.slurm_account.clone(),
        slurm_gpus_per_task: args.slurm_gpus_per_task,
        slurm_cpus_per_task: args.slurm_cpus_per_task,
        slurm_sbatch: args.slurm_sbatch.clone(),
    }))
}

fn spec(args: &SweepArgs) -> Result<SweepSpec> {
    let mut fixed = Map::new();
    if let Some(plugin) = &args.reward_plugin {
        fixed.extend(crate::train::config::reward_plugin_overrides(plugin, args.reward_params.as_deref(), !args.config.is_empty())?);
    }
    for text in &args.fixed {
        let (key, value) = plan::parse_fixed(text)?;
        fixed.insert(key, value);
    }
    let grid = args.grid.iter().map(|g| plan::parse_grid(g)).collect::<Result<Vec<_>>>()?;
    let intervention_arms = match &args.intervention_arms {
        Some(list) => plan::Arm::parse_list(list.as_deref())?,
        None => Vec::new(),
    };
    Ok(SweepSpec { config_files: args.config.clone(), fixed, grid, output_dir: args.output_dir.clone(), intervention_arms })
}

fn print_plan(plan: &Plan) {
    let cached = plan.runs.iter().filter(|r| r.state == CacheState::Finished).count();
    println!("{} runs planned in {} ({cached} cached):", plan.runs.len(), plan.output_dir.display());
    for (i, run) in plan.runs.iter().enumerate() {
        let state = match run.state {
            CacheState::New => "new",
            CacheState::Finished => "CACHED",
            CacheState::Resumable => "resume",
            CacheState::Stale => "restart (no checkpoint)",
        };
        println!("  {:>3}. {:<8} {:<24} {}", i + 1, run.role.as_str(), state, run.name);
    }
}
