//! CUDA graphs: record a sequence of libtorch ops once, then launch all of it with one call.
//!
//! tch has no CUDA-graph API (tch-rs#632), so `cuda_graph.cpp` wraps `at::cuda::CUDAGraph`;
//! `build.rs` compiles it against libtorch's headers only when libtorch is a CUDA build with
//! CUDA headers at hand, and sets `cfg(smallrl_cuda_graphs)`. Without it [`availability`] says
//! why and [`CudaGraph::run_and_capture`] is an error: callers check first and decode eagerly.
//!
//! A replay repeats the recorded kernels on the same memory: the captured code must read and
//! write only tensors that outlive the graph (temporaries come from the graph's private memory
//! pool) and must not synchronise with the host (no `.int64_value()`, no data-dependent shapes).

use tch::Device;

/// Why graphs cannot be used on `device` (`Err` with the reason), or `Ok` when they can.
pub fn availability(device: Device) -> std::result::Result<(), String> {
    let Device::Cuda(_) = device else {
        return Err(format!("CUDA graphs need a CUDA device, not {device:?}"));
    };
    if cfg!(smallrl_cuda_graphs) { Ok(()) } else { Err(format!("this binary has no CUDA-graph shim: {}", build_status())) }
}

/// What `build.rs` said about the shim: "built", or why it was not.
pub fn build_status() -> &'static str {
    env!("SMALLRL_CUDA_GRAPHS_BUILD")
}

/// Whether the shim was compiled and linked into this binary.
pub fn shim_linked() -> bool {
    cfg!(smallrl_cuda_graphs)
}

pub use imp::CudaGraph;

#[cfg(smallrl_cuda_graphs)]
mod imp {
    use std::ffi::{CStr, c_char, c_int, c_void};

    use anyhow::{Result, bail};
    use tch::Device;

    unsafe extern "C" {
        fn smallrl_graph_free_error(message: *mut c_char);
        fn smallrl_graph_new(device: c_int, out: *mut *mut c_void) -> *mut c_char;
        fn smallrl_graph_enter_side_stream(graph: *mut c_void) -> *mut c_char;
        fn smallrl_graph_leave_side_stream(graph: *mut c_void) -> *mut c_char;
        fn smallrl_graph_capture_begin(graph: *mut c_void) -> *mut c_char;
        fn smallrl_graph_capture_end(graph: *mut c_void) -> *mut c_char;
        fn smallrl_graph_replay(graph: *mut c_void) -> *mut c_char;
        fn smallrl_graph_abort(graph: *mut c_void) -> *mut c_char;
        fn smallrl_graph_delete(graph: *mut c_void) -> *mut c_char;
    }

    /// The shim's error message (owned by us once returned) as a Result.
    fn check(message: *mut c_char, what: &str) -> Result<()> {
        if message.is_null() {
            return Ok(());
        }
        // SAFETY: a non-null return is a NUL-terminated string the shim malloc'ed for us.
        let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
        unsafe { smallrl_graph_free_error(message) };
        bail!("CUDA graph {what}: {text}")
    }

    /// One captured graph (an `at::cuda::CUDAGraph` with its side stream and memory pool).
    pub struct CudaGraph {
        raw: *mut c_void,
    }

    // SAFETY: an at::cuda::CUDAGraph is not tied to the thread that made it once capture has
    // ended (capture itself happens inside `run_and_capture`); every use goes through `&self`
    // or `Drop`, and the decoder that owns it serialises replays behind a mutex.
    unsafe impl Send for CudaGraph {}

    /// Ends a capture that did not finish (an error or panic in the captured code), so the
    /// stream leaves capture mode before the graph is freed.
    struct Unfinished(*mut c_void);

    impl Drop for Unfinished {
        fn drop(&mut self) {
            // SAFETY: the pointer is a live graph until CudaGraph's drop frees it.
            let message = unsafe { smallrl_graph_abort(self.0) };
            if let Err(e) = check(message, "abort") {
                eprintln!("{e:#}");
            }
        }
    }

    impl CudaGraph {
        /// Runs `body` once for real on a side stream (the warm-up capture needs: cuBLAS
        /// handles and workspaces are made outside the capture), then records a second call of
        /// `body` without running it. So `body`'s effects happen once here; each
        /// [`Self::replay`] repeats them.
        pub fn run_and_capture(device: Device, mut body: impl FnMut()) -> Result<Self> {
            let Device::Cuda(index) = device else { bail!("CUDA graphs need a CUDA device, not {device:?}") };
            let mut raw = std::ptr::null_mut();
            check(unsafe { smallrl_graph_new(index as c_int, &mut raw) }, "creation")?;
            let graph = Self { raw };
            let unfinished = Unfinished(raw);
            check(unsafe { smallrl_graph_enter_side_stream(raw) }, "side stream")?;
            body();
            check(unsafe { smallrl_graph_capture_begin(raw) }, "capture begin")?;
            body();
            check(unsafe { smallrl_graph_capture_end(raw) }, "capture end")?;
            check(unsafe { smallrl_graph_leave_side_stream(raw) }, "side stream")?;
            std::mem::forget(unfinished);
            Ok(graph)
        }

        /// Launches the recorded work on the current stream (asynchronously).
        pub fn replay(&self) -> Result<()> {
            check(unsafe { smallrl_graph_replay(self.raw) }, "replay")
        }
    }

    impl Drop for CudaGraph {
        fn drop(&mut self) {
            // SAFETY: `raw` came from smallrl_graph_new and is freed only here.
            if let Err(e) = check(unsafe { smallrl_graph_delete(self.raw) }, "release") {
                eprintln!("{e:#}");
            }
        }
    }
}

#[cfg(not(smallrl_cuda_graphs))]
mod imp {
    use anyhow::{Result, bail};
    use tch::Device;

    /// Without the shim no graph can exist ([`super::availability`] says why).
    pub enum CudaGraph {}

    impl CudaGraph {
        pub fn run_and_capture(device: Device, _body: impl FnMut()) -> Result<Self> {
            bail!("no CUDA graphs on {device:?}: {}", super::build_status())
        }

        pub fn replay(&self) -> Result<()> {
            match *self {}
        }
    }
}
