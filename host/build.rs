//! Links libtorch so that the binary, tests and examples run without LD_LIBRARY_PATH, and
//! compiles the CUDA-graph shim (`src/model/cuda_graph.cpp`) when libtorch is a CUDA build.
//! `DEP_TCH_LIBTORCH_LIB` comes from torch-sys (a direct dependency for that reason).
use std::path::{Path, PathBuf};

/// The cfg under which `model::cuda_graph` has its CUDA implementation.
const GRAPHS_CFG: &str = "smallrl_cuda_graphs";

fn main() {
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .expect("torch-sys did not report DEP_TCH_LIBTORCH_LIB: run `make setup` first");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    // Keep libtorch_cuda linked even though no symbol of it is referenced directly; otherwise
    // CUDA is silently unavailable on a GPU machine.
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo::rustc-check-cfg=cfg({GRAPHS_CFG})");
    println!("cargo:rerun-if-env-changed=SMALLRL_CUDA_INCLUDE");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    // Why the shim was or was not built, for the runtime's one-line explanation.
    let status = match std::fs::canonicalize(&lib).map_err(|e| format!("cannot resolve {lib}: {e}")).and_then(|lib| cuda_graph_shim(&lib)) {
        Ok(()) => {
            println!("cargo:rustc-cfg={GRAPHS_CFG}");
            "built".to_string()
        }
        Err(reason) => reason,
    };
    println!("cargo:rustc-env=SMALLRL_CUDA_GRAPHS_BUILD={status}");
}

/// Compiles the shim if `lib` (libtorch's library directory) belongs to a CUDA build of
/// libtorch and the CUDA runtime headers are found; otherwise says what is missing.
fn cuda_graph_shim(lib: &Path) -> Result<(), String> {
    let source = "src/model/cuda_graph.cpp";
    println!("cargo:rerun-if-changed={source}");
    if !lib.join("libtorch_cuda.so").exists() {
        return Err(format!("libtorch at {} is not a CUDA build (no libtorch_cuda.so)", lib.display()));
    }
    let root = lib.parent().ok_or("libtorch's lib directory has no parent")?;
    let include = root.join("include");
    if !include.join("ATen/cuda/CUDAGraph.h").exists() {
        return Err(format!("{} has no ATen/cuda/CUDAGraph.h", include.display()));
    }
    let cuda_includes = cuda_includes(root)?;
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .includes(&cuda_includes)
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .file(source)
        .try_compile("smallrl_cuda_graph")
        .map_err(|e| format!("the CUDA-graph shim did not compile: {e}"))?;
    println!("cargo:rustc-link-search=native={}", lib.display());
    for library in ["torch_cuda", "c10_cuda", "c10"] {
        println!("cargo:rustc-link-lib=dylib={library}");
    }
    Ok(())
}

/// Include directories with the CUDA runtime headers: an explicit one, a CUDA toolkit, or the
/// CUDA wheels PyPI's torch installs beside itself (`nvidia/cu13/include`), whose runtime
/// headers need the compiler's `crt/` headers from another wheel (triton ships them). The
/// runtime headers come first: they set the `CUDA_VERSION` libtorch's headers are read with.
fn cuda_includes(torch_root: &Path) -> Result<Vec<PathBuf>, String> {
    const RUNTIME: &str = "cuda_runtime_api.h";
    const CRT: &str = "crt/host_config.h";
    if let Some(explicit) = std::env::var_os("SMALLRL_CUDA_INCLUDE") {
        // Named explicitly: used as given, never replaced by a guess.
        let dir = PathBuf::from(explicit);
        return if dir.join(RUNTIME).exists() && dir.join(CRT).exists() {
            Ok(vec![dir])
        } else {
            Err(format!("SMALLRL_CUDA_INCLUDE={} lacks {RUNTIME} or {CRT}", dir.display()))
        };
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    candidates.extend(std::env::var_os("CUDA_HOME").map(|home| PathBuf::from(home).join("include")));
    candidates.push("/usr/local/cuda/include".into());
    if let Some(site_packages) = torch_root.parent() {
        let mut wheels: Vec<PathBuf> = std::fs::read_dir(site_packages.join("nvidia")).into_iter().flatten().flatten().map(|entry| entry.path().join("include")).collect();
        wheels.sort();
        candidates.extend(wheels);
        candidates.push(site_packages.join("triton/backends/nvidia/include"));
    }
    let missing = || format!("no CUDA headers ({RUNTIME} and {CRT}) in $CUDA_HOME/include, /usr/local/cuda/include or the wheels beside {}: set SMALLRL_CUDA_INCLUDE", torch_root.display());
    let runtime = candidates.iter().find(|dir| dir.join(RUNTIME).exists()).ok_or_else(missing)?;
    if runtime.join(CRT).exists() {
        return Ok(vec![runtime.clone()]);
    }
    let crt = candidates.iter().find(|dir| dir.join(CRT).exists()).ok_or_else(missing)?;
    Ok(vec![runtime.clone(), crt.clone()])
}
