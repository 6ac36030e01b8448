//! The WASI 0.2 a component gets when it imports WASI (a language runtime: componentize-py's
//! CPython imports 25 interfaces), through wasmtime-wasi's p2 implementation with every
//! capability removed and every source of variation fixed:
//!
//! - no preopened directories (every filesystem call fails) but, for a component `plugin build`
//!   wrote, its own Python files, read-only, as `.` (`python_sources.rs`); no environment
//!   variables, no arguments, stdin at end of file;
//! - no network: TCP, UDP and name lookup are denied;
//! - a fixed wall clock ([`WALL_CLOCK_SECONDS`]) and a monotonic clock that starts at 0 at every
//!   call and advances [`MONOTONIC_STEP_NS`] per reading and by the duration of every sleep,
//!   which returns at once: time never depends on the machine;
//! - random bytes from a SHA-256 counter stream seeded by the plugin file's hash, the call's
//!   name and its arguments ([`CallSeed`]), so a call gives the same bytes in any run, resumed
//!   or not, on any machine;
//! - stdout and stderr kept in the plugin's log: the last [`MAX_STREAM_BYTES`] of each per
//!   call (a traceback's last lines name the error), the rest discarded;
//! - `exit` ends the call with an error naming the code (`failure.rs`).
//!
//! A program the runner runs (`programs.rs`) gets the same, except that stdin is its own, its
//! files are in a read-only preopened directory `.`, and its stdout and stderr are kept from the
//! start up to its output limit ([`Sandbox::for_program`]).
//!
//! Architecture invariant: a component that imports no WASI interface (every Rust plugin built
//! with the SDK) is linked without any of this (`runtime.rs` keeps two linkers), so it cannot
//! reach a WASI function even by mistake.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};


/// What `time.time()` reads in a plugin: 2024-01-01T00:00:00Z, whatever the date.
pub const WALL_CLOCK_SECONDS: u64 = 1_704_067_200;
/// How far the monotonic clock moves at each reading, so a loop that waits for time to pass
/// ends (after its fuel, if it waits long).
pub const MONOTONIC_STEP_NS: u64 = 1_000;
/// The most of stdout (and of stderr) a call keeps: its last bytes.
pub const MAX_STREAM_BYTES: usize = 4096;
/// The most a call may write to stdout and stderr together: more is a plugin printing in a
/// loop, and the call fails saying so ([`OutputFlood`]).
pub const MAX_OUTPUT_BYTES_PER_CALL: usize = 1 << 20;
/// The largest `get-random-bytes` request (wasmtime-wasi's default is 64 MiB): CPython asks
/// for a few dozen bytes; a plugin that asks for more is refused rather than fed.
const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// The interface names the sleep override replaces (the version wasmtime-wasi 48 links).
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// The WASI 0.2 packages a component may import (each without capabilities, as above).
pub const PROVIDED: [&str; 6] = ["wasi:cli/", "wasi:io/", "wasi:clocks/", "wasi:random/", "wasi:filesystem/", "wasi:sockets/"];

/// Whether a component imports any WASI interface.
pub fn imports_wasi(component: &wasmtime::component::Component, engine: &wasmtime::Engine) -> bool {
    component.component_type().imports(engine).any(|(name, _)| name.starts_with("wasi:"))
}

/// A store's data that holds a [`Sandbox`] (the plugin store's state, `store.rs`).
pub trait HasSandbox: WasiView + 'static {
    fn sandbox(&mut self) -> &mut Sandbox;
}

/// Adds the deterministic WASI to a linker: wasmtime-wasi's synchronous p2 functions, with the
/// monotonic clock's subscriptions replaced so that sleeping takes no real time.
pub fn add_to_linker<T: HasSandbox>(linker: &mut Linker<T>) -> anyhow::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker).map_err(anyhow::Error::from)?;
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK).map_err(anyhow::Error::from)?;
    clock
        .func_wrap("subscribe-duration", |mut store, (duration,): (u64,)| Ok((sleep(store.data_mut(), duration)?,)))
        .map_err(anyhow::Error::from)?;
    clock
        .func_wrap("subscribe-instant", |mut store, (when,): (u64,)| {
            let now = store.data_mut().sandbox().call().monotonic_ns;
            Ok((sleep(store.data_mut(), when.saturating_sub(now))?,))
        })
        .map_err(anyhow::Error::from)?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A sleep: the clock moves on by `duration` and the pollable is ready at once.
fn sleep<T: HasSandbox>(state: &mut T, duration: u64) -> wasmtime::Result<Resource<DynPollable>> {
    {
        let mut call = state.sandbox().call();
        call.monotonic_ns = call.monotonic_ns.saturating_add(duration);
    }
    let table = state.ctx().table;
    let ready = table.push(Ready)?;
    wasmtime_wasi::p2::subscribe(table, ready)
}

/// A pollable that is always ready (a finished sleep).
struct Ready;

#[wasmtime_wasi::async_trait]
impl Pollable for Ready {
    async fn ready(&mut self) {}
}

/// What seeds a call's random stream: the plugin file's SHA-256, the call's name and a digest
/// of its arguments. Two calls with the same three draw the same bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallSeed([u8; 32]);

impl CallSeed {
    pub fn new(plugin_sha256: &str, call: &str, arguments: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        for part in [plugin_sha256.as_bytes(), call.as_bytes(), arguments] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        Self(hasher.finalize().into())
    }
}

/// The per-call state the WASI functions read and write: shared between the store and the
/// clock, random and output objects wasmtime-wasi holds.
pub struct CallEnv {
    monotonic_ns: u64,
    random: RandomStream,
    stdout: TailBuffer,
    stderr: TailBuffer,
    /// Bytes written to stdout and stderr in this call.
    written: usize,
    /// A program's whole output (None: a plugin's, kept as tails).
    program_output: Option<ProgramOutput>,
}

impl CallEnv {
    fn new(seed: CallSeed) -> Self {
        Self { monotonic_ns: 0, random: RandomStream::new(seed), stdout: TailBuffer::default(), stderr: TailBuffer::default(), written: 0, program_output: None }
    }

    /// A program's stdout and stderr (lossy UTF-8); empty for a plugin's call.
    pub fn program_output(&self) -> (String, String) {
        match &self.program_output {
            Some(output) => (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned()),
            None => Default::default(),
        }
    }

    /// What the guest wrote to stderr in this call, else to stdout (None: nothing).
    pub fn output(&self) -> Option<String> {
        [&self.stderr, &self.stdout].into_iter().find_map(TailBuffer::text)
    }
}

/// One plugin store's WASI: the context wasmtime-wasi reads, its resource table, and the call
/// state ([`CallEnv`]) restarted at every call.
pub struct Sandbox {
    ctx: WasiCtx,
    table: ResourceTable,
    call: Arc<Mutex<CallEnv>>,
}

/// The deterministic, capability-free WASI every sandbox starts from: no sockets, the fixed wall
/// clock, the call's clock and random stream (`call`), an insecure-random seed from the
/// component's hash (`sha256`), stdout and stderr into the call's record.
fn deterministic_builder(sha256: &str, call: &Arc<Mutex<CallEnv>>) -> wasmtime_wasi::WasiCtxBuilder {
    let mut builder = WasiCtx::builder();
    builder
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }))
        .wall_clock(FixedWallClock)
        .monotonic_clock(CallClock(call.clone()))
        .secure_random(CallRandom(call.clone()))
        .insecure_random(CallRandom(call.clone()))
        .insecure_random_seed(u128::from_le_bytes(CallSeed::new(sha256, "insecure-seed", &[]).0[..16].try_into().expect("16 bytes")))
        .max_random_size(MAX_RANDOM_BYTES)
        .stdout(CallOutput { call: call.clone(), stream: Stream::Stdout })
        .stderr(CallOutput { call: call.clone(), stream: Stream::Stderr });
    builder
}

impl Sandbox {
    /// A sandbox for the plugin whose file hashes to `plugin_sha256`; a Python component's own
    /// files (`python_sources.rs`), when it carries them, in the read-only preopened directory `.`.
    pub fn new(plugin_sha256: &str, sources: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let call = Arc::new(Mutex::new(CallEnv::new(CallSeed::new(plugin_sha256, "instantiate", &[]))));
        let mut builder = deterministic_builder(plugin_sha256, &call);
        if let Some(dir) = sources {
            builder.preopened_dir(dir, ".", wasmtime_wasi::FsPerms::ReadOnly).map_err(anyhow::Error::from)?;
        }
        Ok(Self { ctx: builder.build(), table: ResourceTable::new(), call })
    }

    /// The sandbox of one program of the runner (`programs.rs`): the plugins' deterministic WASI
    /// seeded by `seed`, with `stdin` as stdin (None: at end of file), `files` (the program's
    /// private directory, which the caller made) as the read-only preopened directory `.`, and stdout and stderr kept whole up
    /// to `max_output_bytes` together (past it the program traps with [`ProgramOutputOverLimit`]).
    pub fn for_program(runner_sha256: &str, seed: CallSeed, stdin: Option<&str>, files: &std::path::Path, max_output_bytes: usize) -> anyhow::Result<Self> {
        let mut call = CallEnv::new(seed);
        call.program_output = Some(ProgramOutput { stdout: Vec::new(), stderr: Vec::new(), limit: max_output_bytes });
        let call = Arc::new(Mutex::new(call));
        let mut builder = deterministic_builder(runner_sha256, &call);
        builder.stdin(wasmtime_wasi::p2::pipe::MemoryInputPipe::new(stdin.unwrap_or_default().as_bytes().to_vec()));
        builder.preopened_dir(files, ".", wasmtime_wasi::FsPerms::ReadOnly).map_err(anyhow::Error::from)?;
        Ok(Self { ctx: builder.build(), table: ResourceTable::new(), call })
    }

    /// Restarts the clock, the random stream and the output for a call seeded by `seed`.
    pub fn start_call(&mut self, seed: CallSeed) {
        *lock(&self.call) = CallEnv::new(seed);
    }

    pub fn call(&self) -> MutexGuard<'_, CallEnv> {
        lock(&self.call)
    }

    pub fn view(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.ctx, table: &mut self.table }
    }
}

/// The call state's lock; a panic while it was held (inside wasmtime-wasi) leaves plain data
/// that is still consistent, so a poisoned lock is taken over.
fn lock(call: &Mutex<CallEnv>) -> MutexGuard<'_, CallEnv> {
    call.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct FixedWallClock;

impl HostWallClock for FixedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn now(&self) -> Duration {
        Duration::from_secs(WALL_CLOCK_SECONDS)
    }
}

struct CallClock(Arc<Mutex<CallEnv>>);

impl HostMonotonicClock for CallClock {
    fn resolution(&self) -> u64 {
        MONOTONIC_STEP_NS
    }

    fn now(&self) -> u64 {
        let mut call = lock(&self.0);
        call.monotonic_ns = call.monotonic_ns.saturating_add(MONOTONIC_STEP_NS);
        call.monotonic_ns
    }
}

/// SHA-256 in counter mode over the call's seed: block i is SHA-256(seed || i).
struct RandomStream {
    seed: CallSeed,
    counter: u64,
    block: [u8; 32],
    used: usize,
}

impl RandomStream {
    fn new(seed: CallSeed) -> Self {
        Self { seed, counter: 0, block: [0; 32], used: 32 }
    }

    fn fill(&mut self, out: &mut [u8]) {
        for byte in out {
            if self.used == self.block.len() {
                let mut hasher = Sha256::new();
                hasher.update(self.seed.0);
                hasher.update(self.counter.to_le_bytes());
                self.block = hasher.finalize().into();
                self.counter += 1;
                self.used = 0;
            }
            *byte = self.block[self.used];
            self.used += 1;
        }
    }
}

/// The call's random stream as the `rand` generator wasmtime-wasi draws from.
struct CallRandom(Arc<Mutex<CallEnv>>);

impl rand_core::TryRng for CallRandom {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut bytes = [0; 4];
        self.try_fill_bytes(&mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut bytes = [0; 8];
        self.try_fill_bytes(&mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn try_fill_bytes(&mut self, out: &mut [u8]) -> Result<(), Self::Error> {
        lock(&self.0).random.fill(out);
        Ok(())
    }
}

/// The last [`MAX_STREAM_BYTES`] written to one stream in a call.
#[derive(Default)]
struct TailBuffer {
    bytes: std::collections::VecDeque<u8>,
    dropped: usize,
}

impl TailBuffer {
    fn write(&mut self, bytes: &[u8]) {
        let keep = &bytes[bytes.len().saturating_sub(MAX_STREAM_BYTES)..];
        self.dropped += bytes.len() - keep.len();
        self.bytes.extend(keep);
        let excess = self.bytes.len().saturating_sub(MAX_STREAM_BYTES);
        self.bytes.drain(..excess);
        self.dropped += excess;
    }

    fn text(&self) -> Option<String> {
        let (head, tail) = self.bytes.as_slices();
        let text = String::from_utf8_lossy(&[head, tail].concat()).trim().to_string();
        match (text.is_empty(), self.dropped) {
            (true, _) => None,
            (false, 0) => Some(text),
            (false, dropped) => Some(format!("[... {dropped} bytes before] {text}")),
        }
    }
}

#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// stdout or stderr of a plugin: every write accepted (so printing cannot fail a plugin), its
/// tail kept in the call state.
#[derive(Clone)]
struct CallOutput {
    call: Arc<Mutex<CallEnv>>,
    stream: Stream,
}

impl IsTerminal for CallOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CallOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    /// Only WASI 0.3 guests write through this; the host links 0.2 alone, so nothing does.
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(tokio::io::sink())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CallOutput {
    async fn ready(&mut self) {}
}

/// Why a program was stopped: it wrote more than its output limit (the runner reports it as the
/// program's status).
#[derive(Debug)]
pub struct ProgramOutputOverLimit;

impl std::fmt::Display for ProgramOutputOverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the program wrote more than its output limit")
    }
}

impl std::error::Error for ProgramOutputOverLimit {}

/// A program's stdout and stderr, kept whole up to `limit` bytes together.
struct ProgramOutput {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    limit: usize,
}

impl ProgramOutput {
    /// Keeps what fits under the limit; false when `bytes` did not all fit.
    fn write(&mut self, stream: Stream, bytes: &[u8]) -> bool {
        let room = self.limit - self.stdout.len() - self.stderr.len();
        let kept = &bytes[..bytes.len().min(room)];
        match stream {
            Stream::Stdout => self.stdout.extend_from_slice(kept),
            Stream::Stderr => self.stderr.extend_from_slice(kept),
        }
        kept.len() == bytes.len()
    }
}

/// Why a call that printed too much failed (`failure.rs` reports it).
#[derive(Debug)]
pub struct OutputFlood;

impl std::fmt::Display for OutputFlood {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "it wrote more than {} KiB to stdout and stderr in one call (printing in a loop?); a plugin's output is for messages", MAX_OUTPUT_BYTES_PER_CALL >> 10)
    }
}

impl std::error::Error for OutputFlood {}

impl OutputStream for CallOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        let mut call = lock(&self.call);
        if let Some(output) = call.program_output.as_mut() {
            return match output.write(self.stream, &bytes) {
                true => Ok(()),
                false => Err(wasmtime_wasi::p2::StreamError::Trap(wasmtime::Error::new(ProgramOutputOverLimit))),
            };
        }
        call.written = call.written.saturating_add(bytes.len());
        if call.written > MAX_OUTPUT_BYTES_PER_CALL {
            return Err(wasmtime_wasi::p2::StreamError::Trap(wasmtime::Error::new(OutputFlood)));
        }
        match self.stream {
            Stream::Stdout => call.stdout.write(&bytes),
            Stream::Stderr => call.stderr.write(&bytes),
        }
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_random_stream_is_sha256_in_counter_mode() {
        let seed = CallSeed::new("abc", "score", b"batch");
        let mut stream = RandomStream::new(seed);
        let mut bytes = [0u8; 40];
        stream.fill(&mut bytes[..5]);
        stream.fill(&mut bytes[5..]);
        let block = |i: u64| -> [u8; 32] {
            let mut hasher = Sha256::new();
            hasher.update(seed.0);
            hasher.update(i.to_le_bytes());
            hasher.finalize().into()
        };
        assert_eq!(&bytes[..32], &block(0));
        assert_eq!(&bytes[32..], &block(1)[..8]);
        assert_ne!(CallSeed::new("abc", "score", b"batch"), CallSeed::new("abc", "score", b"batcH"));
        assert_ne!(CallSeed::new("ab", "cscore", b""), CallSeed::new("abc", "score", b""), "parts are length-prefixed");
    }

    #[test]
    fn output_keeps_the_last_bytes() {
        let mut buffer = TailBuffer::default();
        assert_eq!(buffer.text(), None);
        buffer.write(b"first\n");
        assert_eq!(buffer.text().as_deref(), Some("first"));
        buffer.write(&vec![b'x'; MAX_STREAM_BYTES]);
        buffer.write(b"last");
        let text = buffer.text().unwrap();
        assert!(text.starts_with(&format!("[... {} bytes before] ", 6 + 4)), "{text}");
        assert!(text.ends_with("xlast") && text.len() < MAX_STREAM_BYTES + 40, "{}", text.len());
    }
}
