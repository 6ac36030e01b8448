//! The user's Python files inside a component `smallrl plugin build` wrote (issue 47: the edit
//! cycle). The component is a *base* (CPython, the SDK, the world's bindings and the modules the
//! files import, pre-initialised by componentize-py) followed by the custom section
//! [`SOURCES_SECTION`] (JSON: the module's name and its files) and the build record
//! ([`super::python_deps::RECORD_SECTION`]). Loading strips both before compiling, so every
//! plugin built on one base compiles to the same code, which wasmtime's cache keeps: a rebuilt
//! module loads in milliseconds. The files are written once into a directory named by their
//! hash, which the sandbox preopens read-only as `.` (`wasi.rs`); the base's app module
//! (`plugins/python/smallrl/_loader.py`) imports the module from there on the instance's first
//! call. The plugin's SHA-256 (provenance, the sandbox's seeds) stays that of the whole file.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use super::python_deps::{RECORD_SECTION, read_leb128, with_section};

/// The custom section that carries the user's files.
pub const SOURCES_SECTION: &str = "smallrl-python-sources";

/// The file in the sources directory that names the module to import (`_loader.py` reads it).
const MODULE_FILE: &str = ".smallrl-module";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    /// The module `plugin build` was given (its file is `<module>.py`).
    pub module: String,
    /// Paths relative to the module's folder (`/`-separated) and their text.
    pub files: BTreeMap<String, String>,
}

/// `base` with `carried` appended as its [`SOURCES_SECTION`].
pub fn with_sources(base: Vec<u8>, carried: &Carried) -> Vec<u8> {
    with_section(base, SOURCES_SECTION, &serde_json::to_vec(carried).expect("names and texts serialise"))
}

/// A component file's base (the bytes to compile) and the files it carries: the file itself and
/// None when it carries none (a component built otherwise, or by an older smallrl).
pub fn split<'a>(path: &Path, bytes: &'a [u8]) -> Result<(Cow<'a, [u8]>, Option<Carried>)> {
    let sections = top_level_sections(bytes);
    let Some(sources) = sections.iter().find(|section| section.name == SOURCES_SECTION) else {
        return Ok((Cow::Borrowed(bytes), None));
    };
    let carried: Carried = serde_json::from_slice(&bytes[sources.data.clone()])
        .with_context(|| format!("plugin {}: its {SOURCES_SECTION} section is not the module and files `smallrl plugin build` writes", path.display()))?;
    check(path, &carried)?;
    let mut base = bytes.to_vec();
    // Back to front, so the ranges before stay valid.
    for section in sections.iter().rev().filter(|section| [SOURCES_SECTION, RECORD_SECTION].contains(&section.name.as_str())) {
        base.drain(section.whole.clone());
    }
    Ok((Cow::Owned(base), Some(carried)))
}

/// Names a path may have: the module folder's own `.py` files and packages, nothing above it.
fn check(path: &Path, carried: &Carried) -> Result<()> {
    let identifier = |part: &str| part.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    ensure!(identifier(&carried.module) && carried.files.contains_key(&format!("{}.py", carried.module)), "plugin {}: it carries no file for its module {:?}", path.display(), carried.module);
    for rel in carried.files.keys() {
        let parts: Vec<&str> = rel.split('/').collect();
        let (file, dirs) = parts.split_last().expect("split yields one part");
        let named = file.strip_suffix(".py").is_some_and(identifier) && dirs.iter().all(|dir| identifier(dir));
        ensure!(named, "plugin {}: it carries the file {rel:?}, which is no Python module path of a module's folder", path.display());
    }
    Ok(())
}

/// A sources directory in use: the path the sandbox preopens and a shared lock on its
/// [`MODULE_FILE`], held while any instance may import from it, so that `plugin cache --prune`
/// (`python_cache.rs`), which takes the lock exclusively before it moves a directory away,
/// never removes one a live run needs.
#[derive(Clone, Debug)]
pub struct SourcesDir {
    path: PathBuf,
    _lock: Arc<File>,
}

impl SourcesDir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The directory holding `carried`'s files and [`MODULE_FILE`], made once per content: beside the
/// compiled-code cache, `python-sources/<SHA-256>`; locked (shared) for as long as it is held.
pub fn directory(carried: &Carried) -> Result<SourcesDir> {
    let root = super::python_cache_root().unwrap_or_else(std::env::temp_dir);
    directory_in(&root, carried)
}

/// [`directory`] under `root` (the compiled-code cache's parent).
pub fn directory_in(root: &Path, carried: &Carried) -> Result<SourcesDir> {
    let digest = super::sha256_hex(&serde_json::to_vec(carried).expect("names and texts serialise"));
    let dir = root.join(SOURCES_DIR).join(digest);
    // A prune may move the directory away between the lock and the check: then fill it again.
    for _ in 0..3 {
        if let Some(lock) = locked(&dir)? {
            return Ok(SourcesDir { path: dir, _lock: Arc::new(lock) });
        }
        fill(&dir, carried)?;
    }
    anyhow::bail!("{}: removed again each time it was written (a prune running in a loop?)", dir.display())
}

/// The cache folder of sources directories, beside the compiled-code cache.
pub const SOURCES_DIR: &str = "python-sources";

/// [`MODULE_FILE`] of `dir` open and locked shared, if `dir` is complete and still in place.
fn locked(dir: &Path) -> Result<Option<File>> {
    let Ok(file) = File::open(dir.join(MODULE_FILE)) else { return Ok(None) };
    file.lock_shared().with_context(|| format!("cannot lock {}", dir.join(MODULE_FILE).display()))?;
    Ok(dir.join(MODULE_FILE).is_file().then_some(file))
}

/// Writes `carried`'s files into `dir` through a temporary directory renamed into place.
fn fill(dir: &Path, carried: &Carried) -> Result<()> {
    // Unique per process and thread: two loads of one plugin may fill it at once.
    static FILLS: AtomicUsize = AtomicUsize::new(0);
    let tmp = dir.with_extension(format!("tmp-{}-{}", std::process::id(), FILLS.fetch_add(1, Ordering::Relaxed)));
    let write = || -> Result<()> {
        for (rel, text) in &carried.files {
            let file = tmp.join(rel);
            std::fs::create_dir_all(file.parent().expect("under the directory"))?;
            std::fs::write(&file, text)?;
        }
        std::fs::write(tmp.join(MODULE_FILE), &carried.module)?;
        Ok(())
    };
    let written = write().with_context(|| format!("cannot write the plugin's Python files into {}", tmp.display()));
    let renamed = written.and_then(|()| std::fs::rename(&tmp, dir).with_context(|| format!("cannot move {} into place", tmp.display())));
    let _ = std::fs::remove_dir_all(&tmp);
    // Another load may have put the same files there first.
    ensure!(dir.join(MODULE_FILE).is_file(), "{:#}", renamed.err().unwrap_or_else(|| anyhow::anyhow!("{} is incomplete", dir.display())));
    Ok(())
}

/// Whether `dir` (an entry of [`SOURCES_DIR`]) is a complete sources directory; then its
/// [`MODULE_FILE`], the file live loads lock.
pub fn lock_file(dir: &Path) -> Option<PathBuf> {
    Some(dir.join(MODULE_FILE)).filter(|file| file.is_file())
}

struct Section {
    name: String,
    data: std::ops::Range<usize>,
    whole: std::ops::Range<usize>,
}

/// The top-level custom sections of a component (empty past a malformed section header).
fn top_level_sections(bytes: &[u8]) -> Vec<Section> {
    let mut found = Vec::new();
    let mut at = 8; // magic and version/layer
    while at < bytes.len() {
        let Some((size, after)) = read_leb128(bytes, at + 1) else { break };
        let Some(end) = after.checked_add(size as usize).filter(|&end| end <= bytes.len()) else { break };
        if bytes[at] == 0 {
            let Some((name_len, name_at)) = read_leb128(bytes, after) else { break };
            let Some(data_at) = name_at.checked_add(name_len as usize).filter(|&data_at| data_at <= end) else { break };
            found.push(Section { name: String::from_utf8_lossy(&bytes[name_at..data_at]).into_owned(), data: data_at..end, whole: at..end });
        }
        at = end;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carried(files: &[(&str, &str)]) -> Carried {
        Carried { module: "my_reward".into(), files: files.iter().map(|(rel, text)| (rel.to_string(), text.to_string())).collect() }
    }

    #[test]
    fn the_base_is_the_file_less_the_sources_and_the_record() {
        // A minimal component header followed by an unrelated custom section.
        let base = vec![0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00, 0x00, 0x04, 0x03, b'a', b'b', b'c'];
        let sources = carried(&[("my_reward.py", "x = 1\n"), ("pkg/__init__.py", "")]);
        let record = super::super::python_deps::BuildRecord { modules: vec!["pkg/__init__.py".into()], packages: vec![] };
        let file = super::super::python_deps::with_record(with_sources(base.clone(), &sources), &record);
        let (stripped, found) = split(Path::new("p.wasm"), &file).unwrap();
        assert_eq!((stripped.as_ref(), found), (&base[..], Some(sources)));
        let (untouched, none) = split(Path::new("p.wasm"), &base).unwrap();
        assert_eq!((untouched.as_ref(), none), (&base[..], None), "a component without sources is compiled as it is");
    }

    #[test]
    fn paths_outside_the_modules_folder_are_refused() {
        let base = vec![0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
        for bad in ["../evil.py", "/etc/x.py", "pkg/../../x.py", "data.txt", "a b.py"] {
            let file = with_sources(base.clone(), &carried(&[("my_reward.py", ""), (bad, "")]));
            let error = split(Path::new("p.wasm"), &file).unwrap_err().to_string();
            assert!(error.contains("p.wasm") && error.contains(bad), "{bad}: {error}");
        }
        let file = with_sources(base, &carried(&[("other.py", "")]));
        assert!(split(Path::new("p.wasm"), &file).unwrap_err().to_string().contains("no file for its module"));
    }
}
