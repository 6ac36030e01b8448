//! `smallrl plugin bench --programs N`: the program runner's throughput on N graded
//! completions (a function of about 10 lines followed by 5 asserts, as a code environment's
//! grader runs them), beside the peers' way of running them: one `python3` subprocess per
//! program, as many at a time as the runner has threads.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use super::programs::{self, Program, ProgramLimits, Status};

/// What the two ways took on the same programs.
pub struct ProgramsBench {
    pub programs: usize,
    /// Threads the runner (and the subprocess pool) used.
    pub workers: usize,
    /// Loading the runner: reading, compiling or fetching from the cache, pre-linking.
    pub runner_load: Duration,
    /// All programs through the runner, each in a fresh instance (the fastest of the rounds).
    pub runner: Duration,
    /// All programs as `python3 -c` subprocesses (one round: it is the slow side).
    pub subprocess: Duration,
    /// Programs whose asserts all passed, by the runner and by the subprocesses (they agree).
    pub passed: usize,
}

impl std::fmt::Display for ProgramsBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per = |d: Duration| d.as_secs_f64() * 1e3 / self.programs as f64;
        writeln!(f, "{} programs (a 10-line function and 5 asserts each; {} pass), {} threads:", self.programs, self.passed, self.workers)?;
        writeln!(f, "  runner load (compile or cache hit, pre-link): {:.1} ms", self.runner_load.as_secs_f64() * 1e3)?;
        writeln!(f, "  program runner (a fresh instance each): {:.3} s ({:.2} ms/program)", self.runner.as_secs_f64(), per(self.runner))?;
        writeln!(f, "  python3 subprocess per program:          {:.3} s ({:.2} ms/program)", self.subprocess.as_secs_f64(), per(self.subprocess))?;
        write!(f, "  subprocess / runner time: {:.2}x", self.subprocess.as_secs_f64() / self.runner.as_secs_f64())
    }
}

/// Program `i` of the benchmark: a small list function, different constants per program, and
/// five asserts; every eighth program has a wrong assert (its status is AssertionError).
pub fn graded_program(i: usize) -> Program {
    let k = i % 97 + 1;
    let wrong = usize::from(i % 8 == 7);
    Program::source(format!(
        "def solve(xs):\n    \"\"\"The sum of the even numbers of xs, times {k}.\"\"\"\n    total = 0\n    for x in xs:\n        if x % 2 == 0:\n            total += x\n    return total * {k}\n\n\
         assert solve([1, 2, 3, 4]) == {}\nassert solve([]) == 0\nassert solve([2]) == {}\nassert solve([1, 3, 5]) == {wrong}\nassert solve(list(range(10))) == {}\n",
        6 * k,
        2 * k,
        20 * k
    ))
}

/// Runs `count` graded programs through the runner `rounds` times (keeping the fastest round)
/// and once as subprocesses.
pub fn bench(count: usize, rounds: u32, limits: ProgramLimits, python: &Path) -> Result<ProgramsBench> {
    ensure!(count > 0, "--programs must be positive");
    let programs: Vec<Program> = (0..count).map(graded_program).collect();
    let started = Instant::now();
    programs::runner()?;
    let runner_load = started.elapsed();
    let workers = std::thread::available_parallelism().map_or(1, usize::from).min(count);
    let (mut runner, mut passed_runner) = (Duration::MAX, 0);
    for _ in 0..rounds.max(1) {
        let started = Instant::now();
        let outcomes = programs::run(&programs, limits)?;
        runner = runner.min(started.elapsed());
        passed_runner = outcomes.iter().filter(|outcome| outcome.status == Status::Normal).count();
    }
    let python = interpreter(python)?;
    let started = Instant::now();
    let passed_subprocess = run_subprocesses(&programs, workers, &python)?;
    let subprocess = started.elapsed();
    ensure!(passed_runner == passed_subprocess, "the runner passed {passed_runner} programs, the subprocesses {passed_subprocess}");
    Ok(ProgramsBench { programs: count, workers, runner_load, runner, subprocess, passed: passed_runner })
}

/// The interpreter `python` runs (`sys.executable`), as a peer's grader starts it: a launcher
/// on the PATH (pyenv's shim is a shell script) would add its own start-up, 0.2 s here, to
/// every program.
fn interpreter(python: &Path) -> Result<std::path::PathBuf> {
    let output = Command::new(python)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    ensure!(output.status.success(), "{} -c 'import sys' failed: {}", python.display(), String::from_utf8_lossy(&output.stderr));
    let executable = String::from_utf8(output.stdout).context("sys.executable is not UTF-8")?;
    ensure!(!executable.trim().is_empty(), "{} reports no sys.executable", python.display());
    Ok(executable.trim().into())
}

/// The peers' way: `python -c SOURCE` per program, `workers` at a time; how many exited 0.
fn run_subprocesses(programs: &[Program], workers: usize, python: &Path) -> Result<usize> {
    let next = AtomicUsize::new(0);
    let passed = AtomicUsize::new(0);
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    while let Some(program) = programs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let status = Command::new(python)
                            .arg("-c")
                            .arg(&program.source)
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .status()
                            .with_context(|| format!("cannot run {}", python.display()))?;
                        if status.success() {
                            passed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|handle| handle.join().expect("a subprocess thread panicked"))
    })?;
    Ok(passed.into_inner())
}
