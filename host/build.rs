//! Links libtorch so that the binary, tests and examples run without LD_LIBRARY_PATH.
//! `DEP_TCH_LIBTORCH_LIB` comes from torch-sys (a direct dependency for that reason).
fn main() {
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .expect("torch-sys did not report DEP_TCH_LIBTORCH_LIB: run `make setup` first");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    // Keep libtorch_cuda linked even though no symbol of it is referenced directly; otherwise
    // CUDA is silently unavailable on a GPU machine.
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
}
