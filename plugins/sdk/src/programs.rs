//! The host's program runner (contract 0.4's `programs` import): Python programs, each run in a
//! fresh sandboxed interpreter of its own, and how each ended. A grader builds one program per
//! completion (the completion's code followed by its tests) and scores the outcomes:
//!
//! ```ignore
//! use smallrl_plugin_sdk::programs::{run_programs, Program, Status};
//!
//! let programs: Vec<Program> = samples.iter().map(|s| Program::source(format!("{}\n{TESTS}", s.completion))).collect();
//! let outcomes = run_programs(&programs)?;
//! let passed = outcomes.iter().map(|o| matches!(o.status, Status::Normal) && o.stdout.ends_with("ok\n"));
//! ```
//!
//! An endless loop, a memory bomb or a flood of output is the program's [`Status`], never an
//! error: the call fails only for a request the host refuses (a bad file name, too many files).
//! In a wasm plugin the call goes to the host; natively (tests, the host's benchmark) to the
//! runner set by [`set_native_runner`].

/// One program: Python source run as `__main__`, its stdin, and the files of its private
/// (read-only) directory `.`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    pub source: String,
    /// None: stdin is at end of file.
    pub stdin: Option<String>,
    /// (name, contents): plain file names (no `/`), unique.
    pub files: Vec<(String, String)>,
}

impl Program {
    /// A program of `source` alone.
    pub fn source(source: impl Into<String>) -> Self {
        Self { source: source.into(), ..Self::default() }
    }

    /// This program with a file in its directory.
    pub fn with_file(mut self, name: impl Into<String>, contents: impl Into<String>) -> Self {
        self.files.push((name.into(), contents.into()));
        self
    }

    /// This program with `stdin` as its standard input.
    pub fn with_stdin(mut self, stdin: impl Into<String>) -> Self {
        self.stdin = Some(stdin.into());
        self
    }
}

/// How a program ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// It ran to its end.
    Normal,
    /// `sys.exit(code)` (None: 0; not an integer: 1) or `os._exit` (0 or 1).
    Exit(i32),
    /// An uncaught exception: its type's name and `str(exception)`.
    Exception { type_name: String, message: String },
    /// Over `program_fuel` (an endless loop).
    OutOfFuel,
    /// Over `program_max_memory_mb`.
    OutOfMemory,
    /// Over `program_max_output_kib` of stdout and stderr (stopped there, output kept).
    OutputOverLimit,
    /// The interpreter's native stack overflowed.
    StackOverflow,
    /// Another trap of the interpreter (a CPython fatal error).
    Crashed(String),
}

/// What one program did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// Whether it ran to its end or exited with status 0.
    pub fn succeeded(&self) -> bool {
        matches!(self.status, Status::Normal | Status::Exit(0))
    }
}

/// Runs `programs`, each in a fresh interpreter: one outcome per program, in order.
pub fn run_programs(programs: &[Program]) -> Result<Vec<Outcome>, String> {
    #[cfg(target_arch = "wasm32")]
    {
        crate::guest::run_programs(programs)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        NATIVE_RUNNER.with(|runner| match runner.borrow().as_ref() {
            Some(runner) => runner(programs),
            None => Err("no program runner: natively, set one with set_native_runner (a wasm plugin calls the host's)".into()),
        })
    }
}

/// A native stand-in for the host's runner (per thread), for native tests and benchmarks.
pub type NativeRunner = Box<dyn Fn(&[Program]) -> Result<Vec<Outcome>, String>>;

#[cfg(not(target_arch = "wasm32"))]
thread_local! {
    static NATIVE_RUNNER: std::cell::RefCell<Option<NativeRunner>> = const { std::cell::RefCell::new(None) };
}

/// Sets (or with None clears) this thread's native runner; [`run_programs`] calls it natively.
#[cfg(not(target_arch = "wasm32"))]
pub fn set_native_runner(runner: Option<NativeRunner>) {
    NATIVE_RUNNER.with(|slot| *slot.borrow_mut() = runner);
}
