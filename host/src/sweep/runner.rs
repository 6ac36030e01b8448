//! Runs a plan: each run is a `smallrl train` child process with its own run directory and log
//! file (`<output>/logs/<run>.log`), at most `jobs` at a time; with `--pack N`, each child
//! trains N runs of the plan in lockstep (`smallrl train --pack-config ...`, `train::packed`),
//! logging to `<output>/logs/pack-of-<first run>.log`, and a run's status is read from its
//! directory (finished or not). A failing run is reported and the others go on; Ctrl-C kills every child and waits for it (the trainer's checkpoints are
//! atomic and its metrics lines flushed, so a killed run leaves a resumable directory).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::plan::{CacheState, Plan, PlannedRun};
use super::RunStatus;
use crate::defaults;

/// Set by the Ctrl-C handler; the loop below sees it within one poll.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How the children are started: the `smallrl` binary, libtorch threads per child, and the
/// interval of the status line.
pub struct Launch {
    pub exe: PathBuf,
    pub threads_per_run: usize,
    pub status_every: Duration,
    /// Runs per child process (1: one `smallrl train` per run).
    pub pack: usize,
    /// Threads that step a pack's runs at once (`train --pack-workers`).
    pub pack_workers: usize,
}

impl Launch {
    /// `jobs` children of `pack_workers` threads stepping runs each share the machine's cores:
    /// each run gets `max(1, cores / (jobs * pack_workers))` libtorch threads.
    pub fn for_jobs(jobs: usize, pack_workers: usize) -> Result<Self> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let exe = std::env::current_exe().context("cannot find the smallrl executable to start runs with")?;
        let threads_per_run = (cores / (jobs.max(1) * pack_workers.max(1))).max(1);
        Ok(Self { exe, threads_per_run, status_every: Duration::from_secs(defaults::SWEEP_STATUS_SECONDS), pack: 1, pack_workers })
    }
}

/// The arguments of `smallrl` that (re)start a run: a new run reads its resolved YAML, an
/// interrupted one resumes from its newest checkpoint.
pub fn train_args(plan: &Plan, run: &PlannedRun, threads: usize) -> Vec<OsString> {
    command_args(plan, &[run], ["--resume", "--config"], threads)
}

/// The arguments of `smallrl` that train `runs` as one pack, each started or resumed as
/// [`train_args`] would, stepped by `workers` threads.
pub fn packed_train_args(plan: &Plan, runs: &[&PlannedRun], threads: usize, workers: usize) -> Vec<OsString> {
    let mut args = command_args(plan, runs, ["--pack-resume", "--pack-config"], threads);
    args.extend(["--pack-workers".into(), workers.to_string().into()]);
    args
}

/// `train`, then per run `resume DIR` (a resumable run) or `config YAML`, then the threads.
fn command_args(plan: &Plan, runs: &[&PlannedRun], [resume, config]: [&str; 2], threads: usize) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["train".into()];
    for run in runs {
        match run.state {
            CacheState::Resumable => args.extend([resume.into(), run.dir(&plan.output_dir).into_os_string()]),
            _ => args.extend([config.into(), run_config_path(&plan.output_dir, &run.name).into_os_string()]),
        }
    }
    args.extend(["--threads".into(), threads.to_string().into()]);
    args
}

/// `<output>/configs/<run>.yaml`: the run's resolved configuration, which its child reads.
pub fn run_config_path(output_dir: &Path, name: &str) -> PathBuf {
    output_dir.join("configs").join(format!("{name}.yaml"))
}

pub fn log_path(output_dir: &Path, name: &str) -> PathBuf {
    output_dir.join("logs").join(format!("{name}.log"))
}

/// The output of the child that trains a pack, named after its first run.
pub fn pack_log_path(output_dir: &Path, first_run: &str) -> PathBuf {
    log_path(output_dir, &format!("pack-of-{first_run}"))
}

/// Writes the per-run YAML files, for the runs to start. A stale directory (no checkpoint) is
/// left to its `smallrl train` child, which moves it aside itself (`rundir::claim_new`,
/// after checking that no process still writes it) and says so in the run's train.log.
pub fn prepare(plan: &Plan) -> Result<()> {
    for dir in ["configs", "logs"] {
        let path = plan.output_dir.join(dir);
        std::fs::create_dir_all(&path).with_context(|| format!("cannot create {}", path.display()))?;
    }
    for run in plan.runs.iter().filter(|r| r.state != CacheState::Finished) {
        let yaml = crate::yaml::to_string(&run.config)?;
        crate::fsutil::write_atomic(&run_config_path(&plan.output_dir, &run.name), yaml.as_bytes())?;
    }
    Ok(())
}

pub use crate::rundir::MOVED_ASIDE;

/// A child process and the runs it trains (one, or a pack).
struct Running {
    /// Each run's position in the launch order (1-based), name and directory.
    runs: Vec<(usize, String, PathBuf)>,
    packed: bool,
    log: PathBuf,
    child: Child,
    started: Instant,
}

/// Runs every unfinished run of the plan, `jobs` at a time; returns each run's status.
pub fn execute(plan: &Plan, jobs: usize, launch: &Launch) -> Result<BTreeMap<String, RunStatus>> {
    install_interrupt_handler()?;
    prepare(plan)?;
    let mut statuses: BTreeMap<String, RunStatus> = BTreeMap::new();
    let mut queue: Vec<(usize, &PlannedRun)> = Vec::new();
    for run in &plan.runs {
        match run.state {
            CacheState::Finished => {
                println!("[CACHED] {}", run.name);
                statuses.insert(run.name.clone(), RunStatus::Cached);
            }
            _ => queue.push((queue.len() + 1, run)),
        }
    }
    let total = queue.len();
    let mut units: Vec<Vec<(usize, &PlannedRun)>> = queue.chunks(launch.pack.max(1)).map(<[_]>::to_vec).collect();
    units.reverse(); // popped from the back: launch order = plan order
    let mut running: Vec<Running> = Vec::new();
    let mut last_status = Instant::now();
    while !units.is_empty() || !running.is_empty() {
        if INTERRUPTED.load(Ordering::SeqCst) {
            stop_all(&mut running);
            bail!("sweep interrupted (Ctrl-C): stopped the running runs; run the sweep again to resume them");
        }
        while running.len() < jobs.max(1) {
            let Some(unit) = units.pop() else { break };
            for (index, run) in &unit {
                println!("[LAUNCH {index}/{total}] {}", run.name);
            }
            let runs: Vec<(usize, String, PathBuf)> = unit.iter().map(|(i, r)| (*i, r.name.clone(), r.dir(&plan.output_dir))).collect();
            let runs_of_unit: Vec<&PlannedRun> = unit.iter().map(|(_, r)| *r).collect();
            match spawn(plan, &runs_of_unit, launch) {
                Ok((child, log, packed)) => running.push(Running { runs, packed, log, child, started: Instant::now() }),
                Err(e) => {
                    for (index, name, _) in runs {
                        println!("[DONE {index}/{total}] {name} FAIL 0.0s ({e:#})");
                        statuses.insert(name, RunStatus::Failed);
                    }
                }
            }
        }
        reap(&mut running, &mut statuses, total, plan)?;
        if last_status.elapsed() >= launch.status_every {
            print_status(running.len(), &statuses, units.iter().map(Vec::len).sum());
            last_status = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(defaults::SWEEP_POLL_MILLIS));
    }
    print_status(0, &statuses, 0);
    Ok(statuses)
}

/// Starts the child for one run, or for a pack of runs when `launch.pack` > 1; returns it, its
/// log file and whether it is a pack.
fn spawn(plan: &Plan, runs: &[&PlannedRun], launch: &Launch) -> Result<(Child, PathBuf, bool)> {
    let packed = launch.pack > 1;
    let (log_path, args) = match runs {
        [run] if !packed => (log_path(&plan.output_dir, &run.name), train_args(plan, run, launch.threads_per_run)),
        _ => (pack_log_path(&plan.output_dir, &runs[0].name), packed_train_args(plan, runs, launch.threads_per_run, launch.pack_workers)),
    };
    Ok((spawn_logged(&launch.exe, &args, &log_path)?, log_path, packed))
}

/// Starts `exe args` with stdout and stderr into a new `log_path`.
pub fn spawn_logged(exe: &Path, args: &[OsString], log_path: &Path) -> Result<Child> {
    let log = std::fs::File::create(log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
    let stderr = log.try_clone().with_context(|| format!("cannot share {}", log_path.display()))?;
    Command::new(exe).args(args).stdin(Stdio::null()).stdout(log).stderr(stderr).spawn().with_context(|| format!("cannot start {}", exe.display()))
}

/// Collects the children that exited, printing `[DONE i/N] name OK|FAIL 12.3s` for each of
/// their runs: a solo run by its exit status, a packed one by its directory (the pack's exit
/// status says only whether all its runs finished).
fn reap(running: &mut Vec<Running>, statuses: &mut BTreeMap<String, RunStatus>, total: usize, plan: &Plan) -> Result<()> {
    let mut still = Vec::new();
    for mut r in running.drain(..) {
        let Some(exit) = r.child.try_wait().with_context(|| format!("cannot wait for the child training {}", r.runs[0].1))? else {
            still.push(r);
            continue;
        };
        let seconds = r.started.elapsed().as_secs_f64();
        for (index, name, dir) in r.runs {
            let finished = match r.packed {
                true => plan.runs.iter().find(|p| p.name == name).map_or(Ok(false), |p| super::plan::is_finished(&dir, p.config.max_steps))?,
                false => exit.success(),
            };
            let (status, word) = if finished { (RunStatus::Ok, "OK") } else { (RunStatus::Failed, "FAIL") };
            let hint = match (finished, r.packed) {
                (true, _) => String::new(),
                (false, false) => format!(" ({exit}; see {})", r.log.display()),
                (false, true) => format!(" (see {} and {})", dir.join("train.log").display(), r.log.display()),
            };
            println!("[DONE {index}/{total}] {name} {word} {seconds:.1}s{hint}");
            statuses.insert(name, status);
        }
    }
    *running = still;
    Ok(())
}

fn print_status(running: usize, statuses: &BTreeMap<String, RunStatus>, queued: usize) {
    let failed = statuses.values().filter(|s| **s == RunStatus::Failed).count();
    let done = statuses.len() - failed;
    println!("[STATUS] running {running}  done {done}  failed {failed}  queued {queued}");
}

fn stop_all(running: &mut Vec<Running>) {
    for r in running.iter_mut() {
        let _ = r.child.kill();
    }
    for mut r in running.drain(..) {
        let _ = r.child.wait();
        for (_, name, _) in &r.runs {
            println!("[STOPPED] {name}");
        }
    }
}

fn install_interrupt_handler() -> Result<()> {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    let mut result = Ok(());
    INSTALLED.call_once(|| result = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst)).context("cannot install the Ctrl-C handler"));
    result
}
