//! Runs a plan: each run is a `smallrl train` child process with its own run directory and log
//! file (`<output>/logs/<run>.log`), at most `jobs` at a time. A failing run is reported and
//! the others go on; Ctrl-C kills every child and waits for it (the trainer's checkpoints are
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
}

impl Launch {
    /// `jobs` children share the machine's cores: each gets `max(1, cores / jobs)` threads.
    pub fn for_jobs(jobs: usize) -> Result<Self> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let exe = std::env::current_exe().context("cannot find the smallrl executable to start runs with")?;
        Ok(Self { exe, threads_per_run: (cores / jobs.max(1)).max(1), status_every: Duration::from_secs(defaults::SWEEP_STATUS_SECONDS) })
    }
}

/// The arguments of `smallrl` that (re)start a run: a new run reads its resolved YAML, an
/// interrupted one resumes from its newest checkpoint.
pub fn train_args(plan: &Plan, run: &PlannedRun, threads: usize) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["train".into()];
    match run.state {
        CacheState::Resumable => args.extend(["--resume".into(), run.dir(&plan.output_dir).into_os_string()]),
        _ => args.extend(["--config".into(), run_config_path(&plan.output_dir, &run.name).into_os_string()]),
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

/// Writes the per-run YAML files, for the runs to start. A stale directory (no checkpoint) is
/// left to its `smallrl train` child, which moves it aside itself (`train::rundir::claim_new`,
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

pub use crate::train::rundir::MOVED_ASIDE;

struct Running {
    index: usize,
    name: String,
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
    queue.reverse(); // popped from the back: launch order = plan order
    let mut running: Vec<Running> = Vec::new();
    let mut last_status = Instant::now();
    while !queue.is_empty() || !running.is_empty() {
        if INTERRUPTED.load(Ordering::SeqCst) {
            stop_all(&mut running);
            bail!("sweep interrupted (Ctrl-C): stopped the running runs; run the sweep again to resume them");
        }
        while running.len() < jobs.max(1) {
            let Some((index, run)) = queue.pop() else { break };
            println!("[LAUNCH {index}/{total}] {}", run.name);
            match spawn(plan, run, launch) {
                Ok(child) => running.push(Running { index, name: run.name.clone(), child, started: Instant::now() }),
                Err(e) => {
                    println!("[DONE {index}/{total}] {} FAIL 0.0s ({e:#})", run.name);
                    statuses.insert(run.name.clone(), RunStatus::Failed);
                }
            }
        }
        reap(&mut running, &mut statuses, total, &plan.output_dir)?;
        if last_status.elapsed() >= launch.status_every {
            print_status(running.len(), &statuses, queue.len());
            last_status = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(defaults::SWEEP_POLL_MILLIS));
    }
    print_status(0, &statuses, 0);
    Ok(statuses)
}

fn spawn(plan: &Plan, run: &PlannedRun, launch: &Launch) -> Result<Child> {
    let log_path = log_path(&plan.output_dir, &run.name);
    let log = std::fs::File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
    let stderr = log.try_clone().with_context(|| format!("cannot share {}", log_path.display()))?;
    Command::new(&launch.exe)
        .args(train_args(plan, run, launch.threads_per_run))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("cannot start {}", launch.exe.display()))
}

/// Collects the children that exited, printing `[DONE i/N] name OK|FAIL 12.3s`.
fn reap(running: &mut Vec<Running>, statuses: &mut BTreeMap<String, RunStatus>, total: usize, output_dir: &Path) -> Result<()> {
    let mut still = Vec::new();
    for mut r in running.drain(..) {
        match r.child.try_wait().with_context(|| format!("cannot wait for run {}", r.name))? {
            None => still.push(r),
            Some(exit) => {
                let seconds = r.started.elapsed().as_secs_f64();
                let (status, word) = if exit.success() { (RunStatus::Ok, "OK") } else { (RunStatus::Failed, "FAIL") };
                let hint = if exit.success() { String::new() } else { format!(" ({exit}; see {})", log_path(output_dir, &r.name).display()) };
                println!("[DONE {}/{total}] {} {word} {seconds:.1}s{hint}", r.index, r.name);
                statuses.insert(r.name, status);
            }
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
        println!("[STOPPED] {}", r.name);
    }
}

fn install_interrupt_handler() -> Result<()> {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    let mut result = Ok(());
    INSTALLED.call_once(|| result = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst)).context("cannot install the Ctrl-C handler"));
    result
}
