//! Cranelift's incremental compilation cache on disk: compiled code per *function*, keyed by
//! the function's own code and what it refers to, so a component that shares most functions
//! with one compiled before reuses their machine code. A Python component rebuilt after an edit
//! is the same CPython (thousands of functions) with another memory snapshot and a few other
//! functions: wasmtime's module cache, keyed on the whole component, misses, and this one hits
//! for nearly every function (plugins/README.md, "The edit cycle", has the figures).
//!
//! One file per function, `<dir>/<first two hex digits>/<SHA-256 of the key>`, written through a
//! temporary sibling so a reader sees a whole entry or none. A missing or unreadable entry is a
//! miss (cranelift compiles the function); an entry cranelift cannot use is recompiled by it.

use std::borrow::Cow;
use std::path::PathBuf;

use wasmtime::CacheStore;

#[derive(Debug)]
pub struct FunctionCache {
    dir: PathBuf,
}

impl FunctionCache {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    fn entry(&self, key: &[u8]) -> PathBuf {
        let name = super::sha256_hex(key);
        self.dir.join(&name[..2]).join(name)
    }
}

impl CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        std::fs::read(self.entry(key)).ok().map(Cow::Owned)
    }

    /// A failed write only costs the next compilation of this function its time.
    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let path = self.entry(key);
        let parent = path.parent().expect("an entry lies in a fan-out directory");
        std::fs::create_dir_all(parent).is_ok() && crate::fsutil::write_atomic(&path, &value).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_a_missing_key_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FunctionCache::new(dir.path().join("functions"));
        assert!(cache.get(b"key").is_none());
        assert!(cache.insert(b"key", b"code".to_vec()));
        assert_eq!(cache.get(b"key").as_deref(), Some(&b"code"[..]));
        assert!(cache.get(b"other key").is_none());
    }
}
