//! Device and thread selection. `--device auto|cpu|cuda[:N]` and `--threads N` resolve here so
//! that every command treats them the same way.

use anyhow::{Context, Result, bail};
use tch::{Device, Kind};

/// `--device`: `auto` (CUDA device 0 when libtorch sees a GPU, else the CPU), `cpu`, `cuda` or
/// `cuda:N`; written back as spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    Auto,
    Cpu,
    /// `cuda` (`None`) or `cuda:N`.
    Cuda(Option<usize>),
}

impl DeviceSpec {
    pub fn parse(spec: &str) -> Result<Self> {
        Ok(match spec {
            "auto" => Self::Auto,
            "cpu" => Self::Cpu,
            "cuda" => Self::Cuda(None),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(index)) => Self::Cuda(Some(index)),
                _ => bail!("unknown device {other:?}: use auto, cpu, cuda or cuda:N"),
            },
        })
    }

    /// The libtorch device; a CUDA device libtorch does not see is an error.
    pub fn resolve(self) -> Result<Device> {
        match self {
            Self::Auto => Ok(Device::cuda_if_available()),
            Self::Cpu => Ok(Device::Cpu),
            Self::Cuda(index) => cuda(index.unwrap_or(0)),
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(None) => f.write_str("cuda"),
            Self::Cuda(Some(index)) => write!(f, "cuda:{index}"),
        }
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = anyhow::Error;
    fn from_str(spec: &str) -> Result<Self> {
        Self::parse(spec)
    }
}

impl serde::Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DeviceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let spec = <String as serde::Deserialize>::deserialize(deserializer)?;
        Self::parse(&spec).map_err(serde::de::Error::custom)
    }
}

impl crate::hyperparams::FlagValue for DeviceSpec {
    type Flag = Self;
}

/// Parses and resolves `auto`, `cpu`, `cuda` or `cuda:N` (see [`DeviceSpec`]).
pub fn parse_device(spec: &str) -> Result<Device> {
    DeviceSpec::parse(spec)?.resolve()
}

fn cuda(index: usize) -> Result<Device> {
    let count = tch::Cuda::device_count() as usize;
    if index >= count {
        bail!("--device cuda:{index} requested but libtorch sees {count} CUDA device(s)");
    }
    Ok(Device::Cuda(index))
}

/// Whether NVIDIA's MPS control daemon (`nvidia-cuda-mps-control`) is running, from the
/// processes' `comm` files under `proc_root` (`/proc`). Concurrent CUDA processes share one GPU
/// by time-slicing unless MPS runs, which let their kernels overlap.
pub fn mps_daemon_running(proc_root: &std::path::Path) -> bool {
    let Ok(entries) = std::fs::read_dir(proc_root) else { return false };
    entries.flatten().any(|entry| std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|comm| comm.trim_end() == "nvidia-cuda-mps-control"))
}

/// What `sweep --jobs N` says when its runs share a CUDA device: whether MPS is running and,
/// if not, how to start it (the recipe verified on an H100, figures measured there).
pub fn mps_advice(jobs: usize, mps_running: bool) -> String {
    if mps_running {
        return format!("{jobs} concurrent runs share the GPU through MPS (nvidia-cuda-mps-control is running)");
    }
    format!(
        "{jobs} concurrent runs will time-slice the GPU: MPS is not running. With MPS their kernels overlap \
         (on one H100, 12 DualLoRA runs made 17.2 steps/s in all with MPS, 6.5 without). Start it before the sweep:\n  \
         export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; nvidia-cuda-mps-control -d\n\
         (the sweep's runs must see the same two variables; stop it with `echo quit | nvidia-cuda-mps-control`)"
    )
}

/// Sets libtorch's intra-op thread count. `None` means one thread per core. On a busy 2-core
/// machine oversubscribed OpenMP threads are many times slower, so tests always pass `Some(1)`.
pub fn set_threads(threads: Option<usize>) -> Result<usize> {
    let threads = match threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(n) => n,
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    };
    tch::set_num_threads(threads as i32);
    Ok(threads)
}

/// The environment variables that choose how libgomp's idle workers wait: a user's choice of
/// either is kept; [`short_openmp_spin`] sets the first where neither is set.
pub const OPENMP_WAIT_VARS: [&str; 2] = ["GOMP_SPINCOUNT", "OMP_WAIT_POLICY"];

/// Runs this process again with `GOMP_SPINCOUNT` set to [`crate::defaults::OPENMP_SPIN_COUNT`]
/// where the environment sets neither of [`OPENMP_WAIT_VARS`]; returns only where one is set.
/// libtorch's OpenMP runtime (GNU libgomp, which MKL and oneDNN share in the PyPI wheel) lets
/// each idle worker spin 300,000 iterations before it sleeps. Where another process, or this
/// one's sampler thread or plugins, holds a core, a spinning worker keeps the core its partner
/// needs at every barrier, and a step of thousands of small parallel regions slows many times;
/// sleeping at once (`OMP_WAIT_POLICY=PASSIVE`) costs a quiet machine 10-60% in wake-ups.
/// 10,000 spins kept the quiet figures and most of the sleeping workers' gain under load
/// (docs/src/performance.md, "The binary's own wait policy"). libgomp reads the variables once,
/// when it is loaded before `main`, hence the new image (same process id, arguments and
/// environment otherwise). Numerics are untouched: only how a worker waits changes.
pub fn short_openmp_spin() -> Result<()> {
    use std::os::unix::process::CommandExt;
    if OPENMP_WAIT_VARS.iter().any(|var| std::env::var_os(var).is_some()) {
        return Ok(());
    }
    let [spin_count, _] = OPENMP_WAIT_VARS;
    let exe = std::env::current_exe().context("cannot find the smallrl executable to run again with GOMP_SPINCOUNT set")?;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    let error = std::process::Command::new(&exe).arg0(arg0).args(args).env(spin_count, crate::defaults::OPENMP_SPIN_COUNT).exec();
    Err(error).with_context(|| {
        format!(
            "cannot run {} again with {spin_count}={} (libtorch's idle OpenMP threads would spin 30 times longer): set {spin_count} yourself (e.g. {}), or OMP_WAIT_POLICY",
            exe.display(),
            crate::defaults::OPENMP_SPIN_COUNT,
            crate::defaults::OPENMP_SPIN_COUNT
        )
    })
}

/// How libtorch's idle OpenMP workers wait in this process, as train.log and `bench` report it.
pub fn openmp_wait() -> String {
    let set: Vec<String> = OPENMP_WAIT_VARS.iter().filter_map(|var| std::env::var(var).ok().map(|value| format!("{var}={value}"))).collect();
    match set.is_empty() {
        true => "GOMP_SPINCOUNT and OMP_WAIT_POLICY unset (libgomp's default: 300,000 spins before an idle worker sleeps)".into(),
        false => set.join(", "),
    }
}

/// Makes the C allocator keep freed memory for reuse instead of handing it back to the
/// kernel. glibc serves every block above 32 MiB with a fresh `mmap` and unmaps it on free, so
/// each training step's `[tokens, vocab]` logits, log-softmax and their gradients (67 MB each
/// for 32 × 128 tokens) were zero-filled page by page again on every step: about 40% of a
/// GRPO step's training time went to page faults. Serving all blocks from the heap and never
/// trimming it costs only that the process keeps its peak size. Process-wide, so the binary
/// calls it once at start.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before other threads start.
    unsafe {
        let ok = libc::mallopt(libc::M_MMAP_MAX, 0) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1 && libc::mallopt(libc::M_TOP_PAD, 64 << 20) == 1;
        assert!(ok, "glibc rejected the allocator settings (mallopt)");
    }
}

crate::choice::choice! {
    /// `--dtype`: float32 (the default, what the references are computed in) or bfloat16
    /// (CUDA). The short spellings are kept as written, so saved configs and run names that
    /// used them stay the same.
    pub enum Dtype ("dtype") {
        Float32 = "float32",
        Fp32 = "fp32",
        Bfloat16 = "bfloat16",
        Bf16 = "bf16",
    }
}

impl Dtype {
    pub fn kind(self) -> Kind {
        match self {
            Self::Float32 | Self::Fp32 => Kind::Float,
            Self::Bfloat16 | Self::Bf16 => Kind::BFloat16,
        }
    }
}

/// Parses a `--dtype` word (see [`Dtype`]).
pub fn parse_dtype(name: &str) -> Result<Kind> {
    Ok(Dtype::parse(name)?.kind())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mps_daemon_is_found_by_its_process_name_only() {
        let proc_root = tempfile::tempdir().unwrap();
        let process = |pid: &str, comm: &str| {
            std::fs::create_dir(proc_root.path().join(pid)).unwrap();
            std::fs::write(proc_root.path().join(pid).join("comm"), comm).unwrap();
        };
        process("1", "systemd\n");
        process("7", "nvidia-cuda-mps-server\n");
        assert!(!mps_daemon_running(proc_root.path()), "the per-client server is not the control daemon");
        process("42", "nvidia-cuda-mps-control\n");
        assert!(mps_daemon_running(proc_root.path()));
        assert!(!mps_daemon_running(&proc_root.path().join("absent")));
    }

    #[test]
    fn mps_advice_says_how_to_start_it_only_when_it_is_not_running() {
        assert!(mps_advice(12, false).contains("nvidia-cuda-mps-control -d"));
        assert!(!mps_advice(12, true).contains("-d"));
    }
}
