//! A run directory's life: claimed when the first step can start, restartable while it holds
//! no checkpoint, never deleted.
//!
//! Invariant: nothing a checkpointed or finished run wrote is ever removed or overwritten by a
//! new start. A directory without a checkpoint (a run that failed before its first checkpoint)
//! is moved aside to `<name>.incomplete-<unix seconds>` (kept for inspection) and the run
//! starts afresh under its name, so the command that failed can simply be run again.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Marks the name of a run directory moved aside (sweeps' `--collect` skips them).
pub const MOVED_ASIDE: &str = ".incomplete-";

/// Whether `dir` holds a checkpoint (`checkpoint-N/`, complete by construction).
pub fn has_checkpoint(dir: &Path) -> Result<bool> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    Ok(entries.filter_map(|e| e.ok()).any(|e| e.file_name().to_string_lossy().starts_with("checkpoint-")))
}

/// Makes `dir` the empty directory of a new run. An existing directory with a checkpoint is an
/// error (it is resumed, never restarted); one without is moved aside. Returns the line for
/// train.log that says what happened to an earlier attempt, if there was one.
pub fn claim_new(dir: &Path) -> Result<Option<String>> {
    let mut note = None;
    if dir.exists() {
        if has_checkpoint(dir)? {
            bail!("run directory {} already exists: pass --resume {} to continue it, or change the seed/output dir", dir.display(), dir.display());
        }
        ensure_not_running(dir)?;
        let aside = move_aside(dir)?;
        note = Some(format!("restarted: an earlier attempt at this run left no checkpoint; its files are in {}", aside.display()));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create run directory {}", dir.display()))?;
    Ok(note)
}

/// Moves a run directory without a checkpoint to `<name>.incomplete-<unix seconds>` (a
/// numbered suffix if that exists) and returns where it went.
pub fn move_aside(dir: &Path) -> Result<PathBuf> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let name = dir.file_name().with_context(|| format!("{} has no directory name", dir.display()))?.to_string_lossy().into_owned();
    let mut aside = dir.with_file_name(format!("{name}{MOVED_ASIDE}{secs}"));
    for attempt in 1.. {
        if !aside.exists() {
            break;
        }
        aside = dir.with_file_name(format!("{name}{MOVED_ASIDE}{secs}-{attempt}"));
    }
    std::fs::rename(dir, &aside).with_context(|| format!("cannot move {} aside to {}", dir.display(), aside.display()))?;
    Ok(aside)
}

/// Takes the run's lock (an exclusive lock on its `train.lock`, released when the returned
/// file closes, also when the process dies), so two processes never write one run.
pub fn lock(dir: &Path) -> Result<File> {
    let path = dir.join("train.lock");
    let file = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            bail!("{} is being written by another smallrl process (its train.lock is held): wait for it or stop it", dir.display())
        }
        Err(std::fs::TryLockError::Error(error)) => Err(error).with_context(|| format!("cannot lock {}", path.display())),
    }
}

/// Refuses to move aside a directory that a live process is still writing.
fn ensure_not_running(dir: &Path) -> Result<()> {
    if dir.join("train.lock").exists() {
        drop(lock(dir)?);
    }
    Ok(())
}
