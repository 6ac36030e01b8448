//! Helpers shared by the integration tests: where the repository and the shared fixtures are,
//! and a fixed libtorch thread count (oversubscribed threads on 2 cores are many times slower).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Once;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host/ has a parent").to_path_buf()
}

/// `../shared/fixtures/<name>` relative to the repository root; panics with a clear message if
/// the fixtures are missing, never skips.
pub fn fixture(name: &str) -> PathBuf {
    let path = repo_root().join("../shared/fixtures").join(name);
    assert!(path.exists(), "test fixture {} is missing (tests need ../shared/fixtures)", path.display());
    path
}

pub fn one_thread() {
    static INIT: Once = Once::new();
    INIT.call_once(|| tch::set_num_threads(1));
}

/// Largest absolute difference between two tensors of the same shape.
pub fn max_abs_diff(a: &tch::Tensor, b: &tch::Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shapes differ");
    (a.to_kind(tch::Kind::Double) - b.to_kind(tch::Kind::Double)).abs().max().double_value(&[])
}

/// The project's Python (the venv made by `make setup`), for reference scripts.
pub fn python() -> PathBuf {
    let python = repo_root().join(".venv/bin/python");
    assert!(python.exists(), "{} is missing: run `make setup`", python.display());
    python
}
