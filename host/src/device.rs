//! Device and thread selection. `--device auto|cpu|cuda[:N]` and `--threads N` resolve here so
//! that every command treats them the same way.

use anyhow::{Result, bail};
use tch::{Device, Kind};

/// Parses `auto`, `cpu`, `cuda` or `cuda:N`. `auto` is CUDA device 0 when libtorch sees a GPU.
pub fn parse_device(spec: &str) -> Result<Device> {
    match spec {
        "auto" => Ok(Device::cuda_if_available()),
        "cpu" => Ok(Device::Cpu),
        "cuda" => cuda(0),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(index)) => cuda(index),
            _ => bail!("unknown device {other:?}: use auto, cpu, cuda or cuda:N"),
        },
    }
}

fn cuda(index: usize) -> Result<Device> {
    let count = tch::Cuda::device_count() as usize;
    if index >= count {
        bail!("--device cuda:{index} requested but libtorch sees {count} CUDA device(s)");
    }
    Ok(Device::Cuda(index))
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

/// `--dtype`: float32 (the default, what the references are computed in) or bfloat16 (CUDA).
pub fn parse_dtype(name: &str) -> Result<Kind> {
    match name {
        "float32" | "fp32" => Ok(Kind::Float),
        "bfloat16" | "bf16" => Ok(Kind::BFloat16),
        other => bail!("unknown --dtype {other:?}: use float32 or bfloat16"),
    }
}
