//! Atomic file-system writes: results and checkpoints are written beside their destination and
//! renamed into place, so a crash never leaves a half-written file that looks complete.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// `dir/.name.tmp-<pid>`: a temporary path on the same file system as `path`.
pub fn temp_sibling(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Writes `contents` to `path` atomically (temporary file, fsync, rename).
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = temp_sibling(path);
    let mut file = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    file.write_all(contents).with_context(|| format!("cannot write {}", tmp.display()))?;
    file.sync_all().with_context(|| format!("cannot flush {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot move {} into place", path.display()))
}

/// Fills a directory through `fill` in a temporary sibling and renames it to `dir` only when
/// `fill` succeeded, so `dir` is either absent or complete. An existing `dir` is an error.
pub fn create_dir_atomic(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    anyhow::ensure!(!dir.exists(), "{} already exists; refusing to overwrite it", dir.display());
    let tmp = temp_sibling(dir);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot remove stale {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    if let Err(e) = fill(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, dir).with_context(|| format!("cannot move {} into place", dir.display()))
}

/// Creates `path` atomically through `fill`, which writes a temporary sibling that keeps the
/// file's extension (writers such as image encoders choose the format from it); renamed into
/// place only when `fill` succeeded.
pub fn create_file_atomic(path: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".tmp-{}-{name}", std::process::id()));
    if let Err(e) = fill(&tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot move {} into place", path.display()))
}
