// CUDA-graph capture and replay for smallrl (tch has no CUDA-graph API, tch-rs#632).
//
// Compiled by host/build.rs with the `cc` crate against libtorch's own headers, the way
// torch-sys compiles its wrapper, and only when that libtorch is a CUDA build whose CUDA
// headers are found. The Rust side is model/cuda_graph.rs; every function here catches C++
// exceptions and returns them as a message (NULL on success) that the caller frees with
// smallrl_graph_free_error, so no exception crosses into Rust.
//
// Device and stream guards are libtorch's generic ones (c10::DeviceGuard, c10::StreamGuard):
// the CUDA-specific guards are inline code calling the CUDA runtime directly, which would make
// this object need libcudart at link time; the generic ones dispatch into libc10_cuda.
//
// A graph's memory comes from the private pool at::cuda::CUDAGraph asks the caching allocator
// for at capture; reset() (also run by the destructor) gives the pool back.

#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>

namespace {

struct Graph {
  at::cuda::CUDAGraph graph;
  c10::DeviceIndex device;
  // The side stream work is captured on (capture cannot run on the default stream).
  c10::cuda::CUDAStream side_stream;
  // Set while the caller's ops run on the side stream (warm-up and capture).
  std::optional<c10::StreamGuard> on_side_stream;
  bool capturing = false;

  explicit Graph(c10::DeviceIndex device)
      : device(device), side_stream(c10::cuda::getStreamFromPool(false, device)) {}
};

char* error_message(const char* what) {
  char* copy = static_cast<char*>(std::malloc(std::strlen(what) + 1));
  if (copy != nullptr) std::strcpy(copy, what);
  return copy;
}

template <typename F>
char* guarded(F body) {
  try {
    body();
    return nullptr;
  } catch (const std::exception& e) {
    return error_message(e.what());
  } catch (...) {
    return error_message("unknown C++ exception in the CUDA-graph shim");
  }
}

}  // namespace

extern "C" {

void smallrl_graph_free_error(char* message) { std::free(message); }

// A new, empty graph for CUDA device `device`.
char* smallrl_graph_new(int device, void** out) {
  return guarded([&] {
    c10::DeviceGuard device_guard(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    *out = new Graph(static_cast<c10::DeviceIndex>(device));
  });
}

// Waits for the device, then makes the side stream current: ops the caller issues from now on
// run (or, between capture_begin and capture_end, are recorded) there.
char* smallrl_graph_enter_side_stream(void* graph) {
  return guarded([&] {
    auto* g = static_cast<Graph*>(graph);
    TORCH_CHECK(!g->on_side_stream.has_value(), "already on the capture stream");
    c10::DeviceGuard device_guard(c10::Device(c10::DeviceType::CUDA, g->device));
    c10::cuda::device_synchronize();
    g->on_side_stream.emplace(g->side_stream.unwrap());
  });
}

// Restores the caller's stream and waits for the side stream's work.
char* smallrl_graph_leave_side_stream(void* graph) {
  return guarded([&] {
    auto* g = static_cast<Graph*>(graph);
    TORCH_CHECK(g->on_side_stream.has_value(), "not on the capture stream");
    g->on_side_stream.reset();
    c10::DeviceGuard device_guard(c10::Device(c10::DeviceType::CUDA, g->device));
    c10::cuda::device_synchronize();
  });
}

char* smallrl_graph_capture_begin(void* graph) {
  return guarded([&] {
    auto* g = static_cast<Graph*>(graph);
    TORCH_CHECK(g->on_side_stream.has_value(), "capture must begin on the side stream");
    // Thread-local capture: a pack's worker threads (train --pack-workers) keep launching and
    // allocating on their own while this thread records; only this thread's unsafe calls are
    // refused during the capture.
    g->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    g->capturing = true;
  });
}

char* smallrl_graph_capture_end(void* graph) {
  return guarded([&] {
    auto* g = static_cast<Graph*>(graph);
    TORCH_CHECK(g->capturing, "capture_end without capture_begin");
    g->capturing = false;
    g->graph.capture_end();
  });
}

// Launches the recorded work on the caller's current stream.
char* smallrl_graph_replay(void* graph) {
  return guarded([&] {
    auto* g = static_cast<Graph*>(graph);
    TORCH_CHECK(!g->capturing && !g->on_side_stream.has_value(), "replay during capture");
    g->graph.replay();
  });
}

// Ends an unfinished capture (after an error in the captured code) and leaves the side stream,
// so that the process can go on; the graph is unusable afterwards.
char* smallrl_graph_abort(void* graph) {
  return guarded([&] {
    auto* g = static_cast<Graph*>(graph);
    if (g->capturing) {
      g->capturing = false;
      try {
        g->graph.capture_end();
      } catch (...) {
        // The capture was invalid already; what matters is that the stream left capture mode.
      }
    }
    g->on_side_stream.reset();
    g->graph.reset();
  });
}

// Releases the executable graph and its memory pool, then the graph itself.
char* smallrl_graph_delete(void* graph) {
  auto* g = static_cast<Graph*>(graph);
  char* error = guarded([&] {
    g->on_side_stream.reset();
    g->graph.reset();
  });
  delete g;
  return error;
}

}  // extern "C"
