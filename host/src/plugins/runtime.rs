//! The one wasmtime runtime of the process: the engine (compilation cache on disk, epoch ticker
//! thread) and its two linkers: the pure one, which offers plugins nothing but `log` (and
//! environments the run's judge), and the same plus the deterministic WASI (`wasi.rs`) for
//! components that import WASI.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Result, anyhow};
use wasmtime::component::Linker;
use wasmtime::{Cache, CacheConfig, Config, Engine};

use super::store::StoreState;
use super::wit;

/// Period of the epoch ticker: the granularity of the call-time limit.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The longest log message kept from a guest (a panic message is short; a hostile guest is not).
const MAX_LOG_BYTES: usize = 4096;

pub struct Runtime {
    pub engine: Engine,
    /// `log` and `judge` only: what every component that imports no WASI is linked with.
    pub pure_linker: Linker<StoreState>,
    /// `log`, `judge` and the deterministic WASI 0.2.
    pub wasi_linker: Linker<StoreState>,
}

impl Runtime {
    /// The linker for a component: the WASI one only when it imports WASI.
    pub fn linker_for(&self, imports_wasi: bool) -> &Linker<StoreState> {
        match imports_wasi {
            true => &self.wasi_linker,
            false => &self.pure_linker,
        }
    }
}

/// The shared runtime, built on first use. Building cannot fail in practice (the cache is
/// optional), but if it does every load reports why.
pub fn runtime() -> Result<&'static Runtime> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    built_once(&RUNTIME, engine_config, "the WebAssembly runtime")
}

/// The runtime in `cell`, built from `config` on first use; a failure to build is kept and
/// reported (naming `what`) at every later use.
fn built_once(cell: &'static OnceLock<Result<Runtime, String>>, config: fn() -> Config, what: &str) -> Result<&'static Runtime> {
    cell.get_or_init(|| build_runtime(config()).map_err(|error| format!("{error:#}")))
        .as_ref()
        .map_err(|error| anyhow!("cannot start {what}: {error}"))
}

fn engine_config() -> Config {
    let mut config = Config::new();
    // Fuel bounds a call deterministically; the epoch deadline is the wall-clock backstop.
    config.consume_fuel(true);
    config.epoch_interruption(true);
    config
}

/// The time to compile `bytes` as a component with no cache (what a plugin's first load costs
/// on a machine that never saw it): `plugin bench` reports it.
pub fn time_uncached_compile(bytes: &[u8]) -> Result<Duration> {
    let engine = Engine::new(&engine_config()).map_err(anyhow::Error::from)?;
    let started = std::time::Instant::now();
    wasmtime::component::Component::new(&engine, bytes).map_err(anyhow::Error::from)?;
    Ok(started.elapsed())
}

/// The program runner's runtime (`programs.rs`): the plugins' engine settings, with instances
/// drawn from a pool of [`PROGRAM_SLOTS`] slots that stay mapped between programs. When a
/// program's instance goes, wasmtime resets its slot's memory to the runner's initial image
/// (copying the first [`PROGRAM_KEEP_RESIDENT`] bytes back, unmapping the rest), so the next
/// program still starts from a fresh interpreter, without the `mmap`/`munmap` and the page
/// faults of a new mapping per program, which serialise threads on the process's address-space
/// lock (with a new mapping per program, 544 graded programs took 2.2-2.3 s on 2 threads,
/// 2.1-2.3 s on one; pooled, 1.0-1.1 s on 2).
pub fn program_runtime() -> Result<&'static Runtime> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    built_once(&RUNTIME, pooled_config, "the program runner's WebAssembly runtime")
}

/// Runner instances alive at once, at most: more than one call's threads on the machines we
/// target; `programs.rs` makes a program wait for a free slot rather than fail when several
/// calls run at once (packs).
pub const PROGRAM_SLOTS: u32 = 32;

/// Bytes of a slot's memory restored by copying rather than unmapped when a program ends:
/// what CPython touches in a short program (measured: 16 MiB leaves no page faults in the
/// runner's memory; 8 MiB leaves 70% of them).
const PROGRAM_KEEP_RESIDENT: usize = 16 << 20;

/// Per runner instance: core instances, memories and tables the pool holds room for (a
/// componentize-py component has a few of each; `programs.rs` tests a full pool).
const CORE_INSTANCES_PER_SLOT: u32 = 32;
const MEMORIES_PER_SLOT: u32 = 4;
const TABLES_PER_SLOT: u32 = 4;

fn pooled_config() -> Config {
    use wasmtime::{Enabled, InstanceAllocationStrategy, PoolingAllocationConfig};
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(PROGRAM_SLOTS)
        .total_core_instances(PROGRAM_SLOTS * CORE_INSTANCES_PER_SLOT)
        .total_memories(PROGRAM_SLOTS * MEMORIES_PER_SLOT)
        .total_tables(PROGRAM_SLOTS * TABLES_PER_SLOT)
        .linear_memory_keep_resident(PROGRAM_KEEP_RESIDENT)
        .table_keep_resident(PROGRAM_KEEP_RESIDENT)
        // wasmtime 48's scan for dirty pages stops after 32 regions and unmaps the rest; CPython
        // dirties more, so the scan brought the page faults back (633k against 125k for 1632
        // programs): a plain copy of the kept bytes is faster.
        .pagemap_scan(Enabled::No);
    let mut config = engine_config();
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

fn build_runtime(mut config: Config) -> Result<Runtime> {
    config.cache(compilation_cache());
    // Per-function compiled code: a rebuilt Python component reuses CPython's.
    if let Some(directory) = function_cache_directory() {
        let functions = super::function_cache::FunctionCache::new(directory);
        config.enable_incremental_compilation(std::sync::Arc::new(functions)).map_err(anyhow::Error::from)?;
    }
    let engine = Engine::new(&config).map_err(anyhow::Error::from)?;
    start_epoch_ticker(engine.clone());
    let pure_linker = host_linker(&engine)?;
    let mut wasi_linker = host_linker(&engine)?;
    super::wasi::add_to_linker(&mut wasi_linker)?;
    Ok(Runtime { engine, pure_linker, wasi_linker })
}

/// Compiled code cached on disk: loading a plugin compiled before takes under a millisecond.
/// A cache that cannot be set up only costs speed, so it is reported and skipped.
fn compilation_cache() -> Option<Cache> {
    let directory = cache_directory()?;
    let mut cache_config = CacheConfig::new();
    cache_config.with_directory(&directory);
    match Cache::new(cache_config) {
        Ok(cache) => Some(cache),
        Err(error) => {
            eprintln!("warning: no plugin compilation cache in {}: {error}", directory.display());
            None
        }
    }
}

/// `$SMALLRL_PLUGIN_CACHE`, else the user cache directory (`$XDG_CACHE_HOME` or
/// `~/.cache`)`/smallrl/wasmtime`, else the temporary directory: always absolute, so it does
/// not depend on the current directory and survives `cargo clean` and fresh clones.
pub fn cache_directory() -> Option<PathBuf> {
    let absolute = |path: PathBuf| path.is_absolute().then_some(path);
    let from_env = |name: &str| std::env::var_os(name).map(PathBuf::from).and_then(absolute);
    if let Some(directory) = from_env("SMALLRL_PLUGIN_CACHE") {
        return Some(directory);
    }
    let user_cache = from_env("XDG_CACHE_HOME").or_else(|| from_env("HOME").map(|home| home.join(".cache")));
    let base = user_cache.unwrap_or_else(std::env::temp_dir);
    absolute(base.join("smallrl").join("wasmtime"))
}

/// The per-function cache (`function_cache.rs`): beside the module cache, `<its path>-functions`,
/// outside the directory whose size wasmtime's cache worker manages.
pub fn function_cache_directory() -> Option<PathBuf> {
    let modules = cache_directory()?;
    let name = format!("{}-functions", modules.file_name()?.to_string_lossy());
    Some(modules.with_file_name(name))
}

/// Advances the engine's epoch forever; a store's deadline is a number of ticks from its call.
fn start_epoch_ticker(engine: Engine) {
    std::thread::Builder::new()
        .name("plugin-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        })
        .expect("cannot spawn the plugin epoch thread");
}

/// The contract's host functions, through the bindings bindgen generates for each contract
/// version the host runs: `log` (0.1 to 0.6), the judge (0.3 to 0.6 environments) and the program
/// runner (0.4 to 0.6). A component that imports anything more fails to instantiate on the pure
/// linker.
fn host_linker(engine: &Engine) -> Result<Linker<StoreState>> {
    type Store = wasmtime::component::HasSelf<StoreState>;
    let mut linker = Linker::<StoreState>::new(engine);
    wit::reward::smallrl::reward::host::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    wit::v0_2::reward::smallrl::reward::host::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    wit::legacy::reward::smallrl::reward::host::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    wit::v0_3::reward::smallrl::reward::host::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    wit::environment::smallrl::reward::judge::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    wit::v0_3::environment::smallrl::reward::judge::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    wit::v0_4::reward::smallrl::reward::host::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    wit::v0_4::environment::smallrl::reward::judge::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    wit::v0_5::reward::smallrl::reward::host::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    wit::v0_5::environment::smallrl::reward::judge::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    wit::programs::add_to_linker::<StoreState, Store>(&mut linker, |state| state).map_err(anyhow::Error::from)?;
    for interface in &wit::PROGRAMS_INTERFACES[1..] {
        add_older_programs(&mut linker, interface)?;
    }
    Ok(linker)
}

/// A 0.5 or 0.4 plugin's `programs` import (`interface`, e.g. `smallrl:reward/programs@0.4.0`):
/// the current function, whose records are theirs field for field (component types are
/// structural).
fn add_older_programs(linker: &mut Linker<StoreState>, interface: &str) -> Result<()> {
    use wit::programs::{Host, Outcome, Program};
    let mut instance = linker.instance(interface).map_err(anyhow::Error::from)?;
    instance
        .func_wrap("run", |mut caller: wasmtime::StoreContextMut<'_, StoreState>, (programs,): (Vec<Program>,)| {
            let outcomes: Result<Vec<Outcome>, String> = Host::run(caller.data_mut(), programs)?;
            Ok((outcomes,))
        })
        .map_err(anyhow::Error::from)?;
    Ok(())
}

impl wit::v0_5::reward::smallrl::reward::host::Host for StoreState {
    fn log(&mut self, message: String) {
        self.record_log(truncate(message, MAX_LOG_BYTES));
    }
}

/// A 0.5 environment's judge: the current one's.
impl wit::v0_5::environment::smallrl::reward::judge::Host for StoreState {
    fn judge(&mut self, items: Vec<super::judge::JudgeItem>) -> wasmtime::Result<Result<Vec<f64>, String>> {
        wit::environment::smallrl::reward::judge::Host::judge(self, items)
    }
}

impl wit::v0_4::reward::smallrl::reward::host::Host for StoreState {
    fn log(&mut self, message: String) {
        self.record_log(truncate(message, MAX_LOG_BYTES));
    }
}

/// A 0.4 environment's judge: the current one's.
impl wit::v0_4::environment::smallrl::reward::judge::Host for StoreState {
    fn judge(&mut self, items: Vec<super::judge::JudgeItem>) -> wasmtime::Result<Result<Vec<f64>, String>> {
        wit::environment::smallrl::reward::judge::Host::judge(self, items)
    }
}

impl wit::v0_3::reward::smallrl::reward::host::Host for StoreState {
    fn log(&mut self, message: String) {
        self.record_log(truncate(message, MAX_LOG_BYTES));
    }
}

/// A 0.3 environment's judge: the current one's.
impl wit::v0_3::environment::smallrl::reward::judge::Host for StoreState {
    fn judge(&mut self, items: Vec<super::judge::JudgeItem>) -> wasmtime::Result<Result<Vec<f64>, String>> {
        wit::environment::smallrl::reward::judge::Host::judge(self, items)
    }
}

impl wit::reward::smallrl::reward::host::Host for StoreState {
    fn log(&mut self, message: String) {
        self.record_log(truncate(message, MAX_LOG_BYTES));
    }
}

impl wit::v0_2::reward::smallrl::reward::host::Host for StoreState {
    fn log(&mut self, message: String) {
        self.record_log(truncate(message, MAX_LOG_BYTES));
    }
}

impl wit::legacy::reward::smallrl::reward::host::Host for StoreState {
    fn log(&mut self, message: String) {
        self.record_log(truncate(message, MAX_LOG_BYTES));
    }
}

/// The judge: an error for the guest unless the run attached one; counted against the call's
/// judge budget (over it, the call traps); its time counts in the call's wall-clock limit.
impl wit::environment::smallrl::reward::judge::Host for StoreState {
    fn judge(&mut self, items: Vec<super::judge::JudgeItem>) -> wasmtime::Result<Result<Vec<f64>, String>> {
        let judge = StoreState::judge(self).cloned();
        super::judge::call(judge.as_ref(), self.judge_budget_mut(), &items)
    }
}

fn truncate(mut text: String, max_bytes: usize) -> String {
    if text.len() > max_bytes {
        let mut end = max_bytes;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(" [...]");
    }
    text
}
