//! `smallrl plugin cache --prune`: the bound on the Python caches beside the compiled-code
//! cache (issue 47). `python-sources/<SHA-256>/` holds the files a built Python component
//! carries (`python_sources.rs`), written again from the component whenever it loads, so every
//! entry no live plugin holds may go: each holder keeps a shared lock on the entry, and the prune
//! takes the lock exclusively (without waiting) before it moves the entry out of place, so a
//! run's entry is never touched and a load never sees half an entry. `python-builds/base-*.wasm`
//! are componentize-py's base components (`python.rs`), needed only by `plugin build`, which
//! marks one used (its modification time) at each cache hit: bases unused for longer than
//! `--keep-days` go (one unlink each; a build that already read one holds its bytes).
//! `python-deps/<request>/` are the packages a build installed (`python_deps.rs`): a base built
//! with packages names their folder in `base-<key>.deps`, and a folder goes when no cached base
//! names it and no build used it for `--keep-days`, under the same lock discipline as the
//! sources (a build holds its folder's lock file shared while it runs).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};

use super::python_deps::{DEPS_DIR, LOCK_FILE};
use super::python_sources::{SOURCES_DIR, lock_file};

/// The folder of base components, beside the compiled-code cache.
pub const BUILDS_DIR: &str = "python-builds";

/// What a prune removed and kept.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub removed: Vec<PathBuf>,
    /// Sources (packages) directories a live plugin (build) holds.
    pub in_use: Vec<PathBuf>,
    pub bytes_freed: u64,
}

/// [`super::python_cache_root`], or why there is none.
pub fn root() -> Result<PathBuf> {
    super::python_cache_root().context("no plugin cache directory (set SMALLRL_PLUGIN_CACHE or HOME)")
}

/// Marks a cached base used now, so that a prune keeps it; a failure only makes it older.
pub fn mark_used(base: &Path) {
    let _ = std::fs::File::options().append(true).open(base).and_then(|file| file.set_modified(SystemTime::now()));
}

/// Records that the cached base `base` was built with the packages of the folder `packages`
/// (`base-<key>.deps` beside it), so that a prune keeps that folder while the base is cached; a
/// failure only lets the folder go sooner (the next build installs it again).
pub fn refer_to_packages(base: &Path, packages: &Path) {
    let name = packages.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let _ = crate::fsutil::write_atomic(&base.with_extension(REFERENCE), name.as_bytes());
}

const REFERENCE: &str = "deps";

/// Removes from `root` every sources directory no live plugin holds, leftovers of interrupted
/// writes older than `keep`, and base components not used for longer than `keep`.
pub fn prune(root: &Path, keep: Duration) -> Result<Pruned> {
    let mut pruned = Pruned::default();
    let now = SystemTime::now();
    let stale = |path: &Path| -> bool {
        let modified = std::fs::symlink_metadata(path).and_then(|meta| meta.modified());
        modified.is_ok_and(|time| now.duration_since(time).unwrap_or_default() > keep)
    };
    for entry in entries(&root.join(SOURCES_DIR))? {
        if is_trash(&entry) {
            // Another prune's, which removes it; one interrupted leaves it, old, to the next.
            if stale(&entry) {
                remove(&entry, &mut pruned)?;
            }
            continue;
        }
        match lock_file(&entry) {
            Some(lock) => prune_sources(&entry, &lock, &mut pruned)?,
            None if stale(&entry) => remove(&entry, &mut pruned)?,
            None => {}
        }
    }
    for entry in entries(&root.join(BUILDS_DIR))? {
        let base = entry.file_name().is_some_and(|name| name.to_string_lossy().starts_with("base-"));
        if base && entry.extension().is_some_and(|e| e == "wasm") && stale(&entry) {
            remove(&entry, &mut pruned)?;
        }
    }
    let referenced = referenced_packages(root, &mut pruned)?;
    for entry in entries(&root.join(DEPS_DIR))? {
        let name = entry.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let lock = entry.join(LOCK_FILE);
        let used = if lock.is_file() { &lock } else { &entry };
        if referenced.contains(&name) || !stale(used) {
            continue;
        }
        if is_trash(&entry) {
            remove(&entry, &mut pruned)?; // an interrupted prune's, that old
            continue;
        }
        match lock.is_file() {
            true => prune_sources(&entry, &lock, &mut pruned)?,
            // Leftovers (an interrupted install's or prune's) and folders from before the lock.
            false => remove(&entry, &mut pruned)?,
        }
    }
    Ok(pruned)
}

/// The packages folders the cached bases name; references whose base is gone are removed.
fn referenced_packages(root: &Path, pruned: &mut Pruned) -> Result<std::collections::BTreeSet<String>> {
    let mut referenced = std::collections::BTreeSet::new();
    for entry in entries(&root.join(BUILDS_DIR))?.into_iter().filter(|entry| entry.extension().is_some_and(|e| e == REFERENCE)) {
        match entry.with_extension("wasm").is_file() {
            true => referenced.extend(std::fs::read_to_string(&entry).ok()),
            false => remove(&entry, pruned)?,
        }
    }
    Ok(referenced)
}

/// A complete sources or packages directory: moved out of place under its exclusive lock, then
/// removed; kept when a live plugin or build holds it.
fn prune_sources(dir: &Path, lock: &Path, pruned: &mut Pruned) -> Result<()> {
    let file = match std::fs::File::open(lock) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()), // another prune's
        Err(error) => return Err(error).with_context(|| format!("cannot open {}", lock.display())),
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(pruned.in_use.push(dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(error)) => return Err(error).with_context(|| format!("cannot lock {}", lock.display())),
    }
    if !lock.is_file() {
        return Ok(()); // Moved away by another prune between the open and the lock.
    }
    let bytes = size(dir);
    let trash = dir.with_extension(format!("{TRASH}{}", std::process::id()));
    std::fs::rename(dir, &trash).with_context(|| format!("cannot move {} out of place", dir.display()))?;
    drop(file);
    std::fs::remove_dir_all(&trash).with_context(|| format!("cannot remove {}", trash.display()))?;
    pruned.removed.push(dir.to_path_buf());
    pruned.bytes_freed += bytes;
    Ok(())
}

const TRASH: &str = "pruning-";

fn is_trash(path: &Path) -> bool {
    path.extension().is_some_and(|extension| extension.to_string_lossy().starts_with(TRASH))
}

fn remove(path: &Path, pruned: &mut Pruned) -> Result<()> {
    let bytes = size(path);
    let removed = match path.is_dir() {
        true => std::fs::remove_dir_all(path),
        false => std::fs::remove_file(path),
    };
    match removed {
        Ok(()) => {}
        // Removed meanwhile (a fill's own clean-up, another prune): nothing left to free.
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error).with_context(|| format!("cannot remove {}", path.display())),
    }
    pruned.removed.push(path.to_path_buf());
    pruned.bytes_freed += bytes;
    Ok(())
}

/// The entries of `dir`, sorted; none when it does not exist.
fn entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let read = match std::fs::read_dir(dir) {
        Ok(read) => read,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut paths = read.map(|entry| entry.map(|e| e.path())).collect::<std::io::Result<Vec<_>>>().with_context(|| format!("cannot read {}", dir.display()))?;
    paths.sort();
    Ok(paths)
}

/// Bytes of the files under `path` (0 for what cannot be read).
fn size(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::read_dir(path).map_or(0, |read| read.flatten().map(|entry| size(&entry.path())).sum()),
        Ok(meta) => meta.len(),
        Err(_) => 0,
    }
}

#[cfg(test)]
#[path = "python_cache_tests.rs"]
mod tests;
