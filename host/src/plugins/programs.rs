//! The program runner (contract 0.4's `programs` import, `wit/smallrl-reward.wit`): runs Python
//! programs a plugin hands the host, each in a FRESH instance of smallrl's CPython component
//! (`plugins/python/runner/`, built by componentize-py at set-up into
//! `plugins/program_runner.wasm`), and says how each ended.
//!
//! Fresh is cheap: the component is compiled once per process (and cached on disk like every
//! plugin), pre-linked once ([`wasmtime::component::InstancePre`]), and its instances come from
//! a pool (`runtime::program_runtime`) whose slots keep their memory mapped: when a program
//! ends, wasmtime copies its slot's memory back to the initial image (CPython with the standard
//! library already imported, a snapshot componentize-py takes at build time). Nothing
//! one program does reaches another: each has its own store, memory, WASI context and private
//! directory.
//!
//! Each program runs under its own fuel, memory and output limits ([`ProgramLimits`]); going
//! over one is the program's [`Status`], never an error. Only what the host refuses to run (a
//! bad file name, too many files) or what fuel cannot bound (the wall-clock backstop, a missing
//! runner) is an error. Outcomes depend only on the programs and the limits: the WASI is the
//! plugins' deterministic one (`wasi.rs`), seeded by the runner's hash and the program.
//!
//! Architecture invariant: the runner's world (`plugins/python/runner/program-runner.wit`) is
//! private to host and runner; plugins see only the contract's `programs` interface.

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, OnceLock};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, anyhow, bail, ensure};
use wasmtime::component::Component;
use wasmtime::{Store, Trap};

use super::runtime::{EPOCH_TICK, program_runtime};
pub use super::runtime::PROGRAM_SLOTS;
use super::store::StoreState;
use super::wasi::{CallSeed, ProgramOutputOverLimit, Sandbox};


mod bindings {
    wasmtime::component::bindgen!({ world: "program-runner", path: "../plugins/python/runner" });
}

/// The most files one program may have.
pub const MAX_FILES_PER_PROGRAM: usize = 64;
/// The most bytes of files (names and contents) one call may hand the runner.
pub const MAX_FILE_BYTES_PER_CALL: usize = 16 << 20;
/// The longest file name.
const MAX_FILE_NAME_BYTES: usize = 255;

/// A program and how it ended: the guest SDK's types (`plugins/sdk/src/programs.rs`), which the
/// host shares, so the two sides of the `programs` import cannot drift apart.
pub use smallrl_plugin_sdk::programs::{Program, Status};

/// What one program did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    pub stdout: String,
    pub stderr: String,
    /// The fuel it used, instantiation included (deterministic: what `program_fuel` bounds).
    pub fuel: u64,
}

pub use super::store::ProgramLimits;

pub use super::wit::PROGRAMS_INTERFACES;

/// Whether `component` imports the program runner.
pub fn imports_programs(component: &Component, engine: &wasmtime::Engine) -> bool {
    component.component_type().imports(engine).any(|(name, _)| PROGRAMS_INTERFACES.contains(&name))
}

/// The runner component, compiled and pre-linked once per process.
pub struct Runner {
    path: PathBuf,
    sha256: String,
    pre: bindings::ProgramRunnerPre<StoreState>,
}

/// `$SMALLRL_PROGRAM_RUNNER`, else `plugins/program_runner.wasm` of this checkout (`make plugins`
/// builds it).
pub fn runner_path() -> PathBuf {
    match std::env::var_os("SMALLRL_PROGRAM_RUNNER") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/program_runner.wasm"),
    }
}

/// The process's runner, loaded on first use; an error (kept) says how to build it.
pub fn runner() -> Result<&'static Runner> {
    static RUNNER: OnceLock<Result<Runner, String>> = OnceLock::new();
    RUNNER.get_or_init(|| Runner::load(&runner_path()).map_err(|error| format!("{error:#}"))).as_ref().map_err(|error| anyhow!("{error}"))
}

impl Runner {
    fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| {
            format!("cannot read the program runner {}: build it with `make plugins` (or set SMALLRL_PROGRAM_RUNNER)", path.display())
        })?;
        let runtime = program_runtime()?;
        let component = Component::new(&runtime.engine, &bytes)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("the program runner {} is not a valid component: rebuild it with `make plugins`", path.display()))?;
        let pre = runtime
            .wasi_linker
            .instantiate_pre(&component)
            .and_then(bindings::ProgramRunnerPre::new)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("the program runner {} does not fit this smallrl: rebuild it with `make plugins`", path.display()))?;
        Ok(Self { path: path.to_owned(), sha256: super::sha256_hex(&bytes), pre })
    }

    /// SHA-256 (hex) of the runner component: part of a run's provenance.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Runs `programs`, each in a fresh interpreter, in parallel over the machine's cores: one
/// outcome per program, in order.
pub fn run(programs: &[Program], limits: ProgramLimits) -> Result<Vec<Outcome>> {
    check_request(programs)?;
    let runner = runner()?;
    let workers = std::thread::available_parallelism().map_or(1, usize::from).min(programs.len()).max(1);
    let next = AtomicUsize::new(0);
    let mut outcomes: Vec<Option<Result<Outcome>>> = (0..programs.len()).map(|_| None).collect();
    let done: Vec<Vec<(usize, Result<Outcome>)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(program) = programs.get(index) else { break mine };
                        mine.push((index, run_one(runner, program, limits)));
                    }
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().expect("a program-runner thread panicked")).collect()
    });
    for (index, outcome) in done.into_iter().flatten() {
        outcomes[index] = Some(outcome);
    }
    outcomes
        .into_iter()
        .enumerate()
        .map(|(index, outcome)| outcome.expect("every program ran").with_context(|| format!("program {index} of {}", programs.len())))
        .collect()
}

/// Refuses what the host does not run: bad or repeated file names, too many or too large files.
pub(super) fn check_request(programs: &[Program]) -> Result<()> {
    let mut file_bytes = 0usize;
    for (index, program) in programs.iter().enumerate() {
        ensure!(program.files.len() <= MAX_FILES_PER_PROGRAM, "program {index} has {} files, more than {MAX_FILES_PER_PROGRAM}", program.files.len());
        let mut names = std::collections::BTreeSet::new();
        for (name, contents) in &program.files {
            let plain = !name.is_empty() && name.len() <= MAX_FILE_NAME_BYTES && name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
            ensure!(plain, "program {index}: the file name {:?} is not a plain file name (1 to {MAX_FILE_NAME_BYTES} bytes, no `/`, `\\`, NUL, `.` or `..`)", super::text::shown(name));
            ensure!(names.insert(name.as_str()), "program {index}: the file name {:?} is given twice", super::text::shown(name));
            file_bytes = file_bytes.saturating_add(name.len() + contents.len());
        }
    }
    ensure!(file_bytes <= MAX_FILE_BYTES_PER_CALL, "the programs' files hold {file_bytes} bytes, more than {} MiB in one call", MAX_FILE_BYTES_PER_CALL >> 20);
    Ok(())
}

/// The random stream's seed of a program: its source, stdin and files, length-prefixed.
fn program_seed(runner_sha256: &str, program: &Program) -> CallSeed {
    let mut parts: Vec<&[u8]> = vec![program.source.as_bytes(), program.stdin.as_deref().map_or(b"\x00none", str::as_bytes)];
    for (name, contents) in &program.files {
        parts.push(name.as_bytes());
        parts.push(contents.as_bytes());
    }
    let joined: Vec<u8> = parts.iter().flat_map(|part| (part.len() as u64).to_le_bytes().into_iter().chain(part.iter().copied())).collect();
    CallSeed::new(runner_sha256, "program", &joined)
}

/// The private directory of a program, holding its files (deleted when dropped). Every program
/// has one, empty without files, so its current directory exists as under `python3`.
fn files_directory(program: &Program) -> Result<tempfile::TempDir> {
    let directory = tempfile::Builder::new().prefix("smallrl-program-").tempdir().context("cannot create a program's private directory")?;
    // Fixed access and modification times: what `os.stat` shows of them does not depend on
    // when the run ran (the status-change time and the inode number are the host's).
    let fixed = std::time::UNIX_EPOCH + std::time::Duration::from_secs(super::wasi::WALL_CLOCK_SECONDS);
    let times = std::fs::FileTimes::new().set_accessed(fixed).set_modified(fixed);
    for (name, contents) in &program.files {
        let path = directory.path().join(name);
        std::fs::write(&path, contents).with_context(|| format!("cannot write the program file {}", path.display()))?;
        std::fs::File::options().write(true).open(&path).and_then(|file| file.set_times(times)).with_context(|| format!("cannot date {}", path.display()))?;
    }
    std::fs::File::open(directory.path()).and_then(|dir| dir.set_times(times)).with_context(|| format!("cannot date {}", directory.path().display()))?;
    Ok(directory)
}

/// One program in a fresh instance: its outcome, or an error the caller must not score (the
/// wall-clock backstop, a runner that does not start).
fn run_one(runner: &Runner, program: &Program, limits: ProgramLimits) -> Result<Outcome> {
    // Declared before the store, so dropped after it: the slot is free once the instance is gone.
    let _slot = PoolSlot::take();
    let directory = files_directory(program)?;
    let seed = program_seed(&runner.sha256, program);
    let sandbox = Sandbox::for_program(&runner.sha256, seed, program.stdin.as_deref(), directory.path(), limits.max_output_bytes)?;
    let mut store = Store::new(runner.pre.engine(), StoreState::new(limits.max_memory_bytes, Some(sandbox)));
    store.limiter(|state| state);
    store.set_fuel(limits.fuel).map_err(anyhow::Error::from)?;
    store.set_epoch_deadline((limits.max_time.as_nanos() / EPOCH_TICK.as_nanos()) as u64 + 1);
    let instance = runner.pre.instantiate(&mut store).map_err(|error| match store.data().memory_limit_hit() {
        Some(bytes) => anyhow!(
            "the program runner needs {:.1} MiB of memory when it starts, over program_max_memory_mb ({} MiB): raise program_max_memory_mb",
            bytes as f64 / (1u64 << 20) as f64,
            limits.max_memory_bytes >> 20
        ),
        None => anyhow::Error::from(error).context(format!("cannot start the program runner {}", runner.path.display())),
    })?;
    let ended = instance.call_run(&mut store, &program.source);
    let (stdout, stderr) = store.data().sandbox_ref().map(|sandbox| sandbox.call().program_output()).unwrap_or_default();
    let fuel = limits.fuel - store.get_fuel().unwrap_or(0);
    let status = match ended {
        Ok(ending) => status_of(ending),
        Err(error) => status_of_trap(error, store.data(), limits)?,
    };
    Ok(Outcome { status, stdout, stderr, fuel })
}

/// One of the runner pool's [`PROGRAM_SLOTS`] slots, held while a program's instance lives:
/// with more programs at once than slots (several runs' calls in one process), a program waits
/// for a slot instead of failing to instantiate.
struct PoolSlot;

static FREE_SLOTS: Mutex<u32> = Mutex::new(PROGRAM_SLOTS);
static SLOT_FREED: Condvar = Condvar::new();

impl PoolSlot {
    fn take() -> Self {
        let mut free = FREE_SLOTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while *free == 0 {
            free = SLOT_FREED.wait(free).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *free -= 1;
        Self
    }
}

impl Drop for PoolSlot {
    fn drop(&mut self) {
        *FREE_SLOTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
        SLOT_FREED.notify_one();
    }
}

fn status_of(ending: bindings::Ending) -> Status {
    match ending {
        bindings::Ending::Normal => Status::Normal,
        bindings::Ending::Exit(code) => Status::Exit(code),
        bindings::Ending::Exception((type_name, message)) => Status::Exception { type_name, message },
    }
}

/// The status a trap means, or the error it is (the wall clock; the runner's own memory at
/// start over the limit).
fn status_of_trap(error: wasmtime::Error, state: &StoreState, limits: ProgramLimits) -> Result<Status> {
    if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return Ok(Status::Exit(exit.0));
    }
    if error.downcast_ref::<ProgramOutputOverLimit>().is_some() {
        return Ok(Status::OutputOverLimit);
    }
    if state.memory_limit_hit().is_some() {
        return Ok(Status::OutOfMemory);
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Ok(Status::OutOfFuel),
        Some(Trap::StackOverflow) => Ok(Status::StackOverflow),
        Some(Trap::Interrupt) => bail!(
            "it ran longer than the wall-clock backstop of {:?} before its fuel ({} instructions) ran out: \
             lower `program_fuel`, or raise `plugin_max_call_seconds`",
            limits.max_time,
            limits.fuel
        ),
        Some(trap) => Ok(Status::Crashed(trap.to_string())),
        None => Err(anyhow::Error::from(error).context("the program runner failed")),
    }
}

/// An outcome as one JSON object: `status` ("normal", "exit", "exception", "out-of-fuel",
/// "out-of-memory", "output-over-limit", "stack-overflow", "crashed"), `exit_code`,
/// `exception_type` and `message` where they apply, `stdout`, `stderr`, `fuel`.
pub fn outcome_json(outcome: &Outcome) -> serde_json::Value {
    let mut object = serde_json::json!({ "status": status_name(&outcome.status) });
    match &outcome.status {
        Status::Exit(code) => object["exit_code"] = (*code).into(),
        Status::Exception { type_name, message } => {
            object["exception_type"] = type_name.as_str().into();
            object["message"] = message.as_str().into();
        }
        Status::Crashed(what) => object["message"] = what.as_str().into(),
        _ => {}
    }
    object["stdout"] = outcome.stdout.as_str().into();
    object["stderr"] = outcome.stderr.as_str().into();
    object["fuel"] = outcome.fuel.into();
    object
}

/// The status's name in the contract (`wit/smallrl-reward.wit`).
pub fn status_name(status: &Status) -> &'static str {
    match status {
        Status::Normal => "normal",
        Status::Exit(_) => "exit",
        Status::Exception { .. } => "exception",
        Status::OutOfFuel => "out-of-fuel",
        Status::OutOfMemory => "out-of-memory",
        Status::OutputOverLimit => "output-over-limit",
        Status::StackOverflow => "stack-overflow",
        Status::Crashed(_) => "crashed",
    }
}

/// A program as a programs file holds it: a source string, or an object.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum ProgramEntry {
    Source(String),
    Full {
        source: String,
        #[serde(default)]
        stdin: Option<String>,
        #[serde(default)]
        files: std::collections::BTreeMap<String, String>,
    },
}

/// The programs of a JSON file (`smallrl plugin programs`): a list of source strings or
/// `{"source", "stdin", "files": {name: text}}` objects.
pub fn read_file(file: &Path) -> Result<Vec<Program>> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let entries: Vec<ProgramEntry> = serde_json::from_str(&text).with_context(|| {
        format!("{}: expected a JSON list of programs (source strings or {{\"source\", \"stdin\", \"files\"}} objects)", file.display())
    })?;
    Ok(entries
        .into_iter()
        .map(|entry| match entry {
            ProgramEntry::Source(source) => Program::source(source),
            ProgramEntry::Full { source, stdin, files } => Program { source, stdin, files: files.into_iter().collect() },
        })
        .collect())
}

/// Runs the programs of a JSON file ([`read_file`]): each outcome as [`outcome_json`].
pub fn run_file(file: &Path, limits: ProgramLimits) -> Result<Vec<serde_json::Value>> {
    let outcomes = run(&read_file(file)?, limits).with_context(|| format!("cannot run the programs of {}", file.display()))?;
    Ok(outcomes.iter().map(outcome_json).collect())
}

/// The `programs` import: a request the host refuses is the guest's error; a
/// runner that cannot run (missing, a program past the wall-clock backstop) ends the call.
impl super::wit::programs::Host for StoreState {
    fn run(&mut self, programs: Vec<super::wit::programs::Program>) -> wasmtime::Result<Result<Vec<super::wit::programs::Outcome>, String>> {
        let programs: Vec<Program> = programs.into_iter().map(from_wit_program).collect();
        if let Err(refused) = check_request(&programs) {
            return Ok(Err(format!("{refused:#}")));
        }
        match run(&programs, self.program_limits()) {
            Ok(outcomes) => Ok(Ok(outcomes.into_iter().map(to_wit_outcome).collect())),
            Err(error) => Err(wasmtime::Error::msg(format!("its programs could not run: {error:#}"))),
        }
    }
}

/// A program a plugin hands the runner, in the host's form.
fn from_wit_program(program: super::wit::programs::Program) -> Program {
    Program {
        source: program.source,
        stdin: program.stdin,
        files: program.files.into_iter().map(|file| (file.name, file.contents)).collect(),
    }
}

/// An outcome in the contract's form.
fn to_wit_outcome(outcome: Outcome) -> super::wit::programs::Outcome {
    use super::wit::programs::{ExceptionInfo, Status as WitStatus};
    let status = match outcome.status {
        Status::Normal => WitStatus::Normal,
        Status::Exit(code) => WitStatus::Exit(code),
        Status::Exception { type_name, message } => WitStatus::Exception(ExceptionInfo { type_name, message }),
        Status::OutOfFuel => WitStatus::OutOfFuel,
        Status::OutOfMemory => WitStatus::OutOfMemory,
        Status::OutputOverLimit => WitStatus::OutputOverLimit,
        Status::StackOverflow => WitStatus::StackOverflow,
        Status::Crashed(what) => WitStatus::Crashed(what),
    };
    super::wit::programs::Outcome { status, stdout: outcome.stdout, stderr: outcome.stderr }
}
