//! The pure-Python packages a module names (`smallrl plugin build --requirements FILE`,
//! `--package PATH`, issue 47): installed by pip (the project venv's, beside componentize-py)
//! into a build-private folder that componentize-py bundles, with the versions pip chose pinned
//! in the build's record. Installs are cached by the hash of what was named (the requirements
//! file's text and every file of a named wheel or source directory), so an edit of the module
//! does not run pip again.
//!
//! A package with native code (an extension module `*.so`, `*.pyd`, `*.dylib`, or a wheel that
//! is not pure-Python) is refused before the build: a component runs CPython compiled to
//! WebAssembly, which cannot load a compiled extension, and componentize-py would otherwise
//! fail, or the import fail at run time, far from the cause.
//!
//! The record of a build (its local modules and pinned packages) travels in the component as a
//! custom section, [`RECORD_SECTION`], which wasmtime ignores and `plugin info` prints.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

/// The folder of installed packages, one folder per request, beside the base components.
pub const DEPS_DIR: &str = "python-deps";

/// The file in a packages folder that a build using it holds locked shared (`plugin cache
/// --prune` takes it exclusively before it removes the folder) and marks used (its modification
/// time); not part of the folder's digest.
pub const LOCK_FILE: &str = ".smallrl-build-lock";

/// The custom section that holds a Python build's [`BuildRecord`] (JSON).
pub const RECORD_SECTION: &str = "smallrl-python-build";

/// What a Python build bundled besides the module, the SDK and the standard library.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildRecord {
    /// The local files (relative to the module's folder) bundled with it.
    pub modules: Vec<String>,
    /// The installed packages, `name==version`, sorted.
    pub packages: Vec<String>,
}

/// Packages installed for a build.
pub struct Installed {
    /// The folder componentize-py reads them from.
    pub dir: PathBuf,
    /// `name==version` of every distribution pip installed, sorted.
    pub pins: Vec<String>,
    /// The top-level module names they provide (what an import may name).
    pub top_level: BTreeSet<String>,
    /// SHA-256 of every installed file: part of the build's hash.
    pub digest: String,
    /// The shared lock on the folder's [`LOCK_FILE`] while the build uses it (none for a
    /// scratch folder).
    _held: Option<std::fs::File>,
}

/// Installs what `requirements` and `packages` name (None when neither names anything).
pub fn install(requirements: Option<&Path>, packages: &[PathBuf], python: &Path, cache: Option<PathBuf>) -> Result<Option<Installed>> {
    if requirements.is_none() && packages.is_empty() {
        return Ok(None);
    }
    let key = request_key(requirements, packages)?;
    let cached = cache.is_some();
    let scratch;
    let dir = match cache {
        Some(cache) => cache.join(&key),
        None => {
            scratch = std::env::temp_dir().join(format!("smallrl-python-deps-{}-{}", std::process::id(), &key[..16]));
            scratch
        }
    };
    let held = loop {
        if !dir.is_dir() {
            install_into(requirements, packages, python, &dir)?;
        }
        if !cached {
            break None;
        }
        // None: a prune moved the folder away meanwhile; install it again.
        if let Some(file) = hold(&dir)? {
            break Some(file);
        }
    };
    let (pins, top_level) = describe(&dir)?;
    let digest = super::sha256_hex(&tree_bytes(&dir, &|name| name != LOCK_FILE)?);
    Ok(Some(Installed { dir, pins, top_level, digest, _held: held }))
}

/// pip's install of the request into `dir`, through a temporary folder renamed into place.
fn install_into(requirements: Option<&Path>, packages: &[PathBuf], python: &Path, dir: &Path) -> Result<()> {
    let tmp = crate::fsutil::temp_sibling(dir);
    let _ = std::fs::remove_dir_all(&tmp);
    let result = pip_install(requirements, packages, python, &tmp).and_then(|()| refuse_native(&tmp));
    if let Err(error) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(error);
    }
    std::fs::create_dir_all(dir.parent().expect("a cache entry has a parent"))?;
    if std::fs::rename(&tmp, dir).is_err() {
        // Another build installed the same request meanwhile: use its folder.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(())
}

/// `dir`'s [`LOCK_FILE`] (created in a folder installed before it existed) locked shared and
/// marked used; None when the folder is no longer in place.
pub(super) fn hold(dir: &Path) -> Result<Option<std::fs::File>> {
    let lock = dir.join(LOCK_FILE);
    let file = match std::fs::File::options().create(true).append(true).open(&lock) {
        Ok(file) => file,
        Err(_) if !dir.is_dir() => return Ok(None),
        Err(error) => return Err(error).with_context(|| format!("cannot open {}", lock.display())),
    };
    file.lock_shared().with_context(|| format!("cannot lock {}", lock.display()))?;
    if !lock.is_file() {
        return Ok(None);
    }
    // A failure only makes the folder look older to a prune, which a held lock still stops.
    let _ = file.set_modified(std::time::SystemTime::now());
    Ok(Some(file))
}

/// The hash of a request: the requirements file's text, and each named path's files.
fn request_key(requirements: Option<&Path>, packages: &[PathBuf]) -> Result<String> {
    let mut bytes = Vec::new();
    if let Some(file) = requirements {
        bytes.extend(b"requirements\0");
        bytes.extend(std::fs::read(file).with_context(|| format!("cannot read the requirements file {}", file.display()))?);
    }
    for path in packages {
        ensure!(path.exists(), "the package {} does not exist (give a wheel or a source directory)", path.display());
        bytes.extend(b"\0package\0");
        bytes.extend(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default().as_bytes());
        // A source directory's build leaves build/ and *.egg-info in it: not part of the package.
        bytes.extend(tree_bytes(path, &|name: &str| !(name == "build" || name == "dist" || name.ends_with(".egg-info") || name == "__pycache__" || name.starts_with('.')))?);
    }
    Ok(super::sha256_hex(&bytes))
}

/// A file's bytes, or a directory's files (relative names and bytes, sorted, length-prefixed),
/// skipping entries whose name `keep` refuses.
fn tree_bytes(path: &Path, keep: &dyn Fn(&str) -> bool) -> Result<Vec<u8>> {
    if path.is_file() {
        return std::fs::read(path).with_context(|| format!("cannot read {}", path.display()));
    }
    let mut files = Vec::new();
    walk(path, path, keep, &mut files)?;
    files.sort();
    let mut bytes = Vec::new();
    for (rel, file) in files {
        let contents = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
        for part in [rel.as_bytes(), &contents] {
            bytes.extend((part.len() as u64).to_le_bytes());
            bytes.extend(part);
        }
    }
    Ok(bytes)
}

fn walk(root: &Path, dir: &Path, keep: &dyn Fn(&str) -> bool, files: &mut Vec<(String, PathBuf)>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !keep(&name) {
            continue;
        }
        if path.is_dir() {
            walk(root, &path, keep, files)?;
        } else {
            files.push((path.strip_prefix(root).expect("under the root").to_string_lossy().into_owned(), path));
        }
    }
    Ok(())
}

fn pip_install(requirements: Option<&Path>, packages: &[PathBuf], python: &Path, target: &Path) -> Result<()> {
    let mut command = Command::new(python);
    command.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile", "--no-warn-script-location", "--no-build-isolation", "--target"]);
    command.arg(target);
    if let Some(file) = requirements {
        // pip reads a requirements file's relative paths from the current directory.
        command.arg("-r").arg(file.canonicalize().with_context(|| format!("cannot find the requirements file {}", file.display()))?);
        command.current_dir(file.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new(".")));
    }
    for path in packages {
        command.arg(path.canonicalize().with_context(|| format!("cannot find the package {}", path.display()))?);
    }
    let output = command.output().with_context(|| format!("cannot run {} -m pip (the project's Python, `make setup`)", python.display()))?;
    if !output.status.success() {
        let said = String::from_utf8_lossy(&output.stderr);
        bail!("pip could not install the packages the module names:\n{}", said.trim());
    }
    Ok(())
}

/// Refuses an installed tree that holds native code, naming the file and its distribution.
fn refuse_native(dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    walk(dir, dir, &|_| true, &mut files)?;
    for (rel, path) in &files {
        let native = [".so", ".pyd", ".dylib", ".dll"].iter().any(|ext| rel.ends_with(ext));
        let impure = rel.ends_with(".dist-info/WHEEL") && std::fs::read_to_string(path)?.lines().any(|line| line.trim() == "Root-Is-Purelib: false");
        if native || impure {
            let what = if native { format!("the compiled extension {rel}") } else { format!("a platform wheel ({rel} says Root-Is-Purelib: false)") };
            bail!(
                "{} has native code ({what}): a component runs CPython compiled to WebAssembly, which cannot load compiled \
                 extensions, so only pure-Python packages can be bundled",
                owner(dir, rel).unwrap_or_else(|| "a named package".into())
            );
        }
    }
    Ok(())
}

/// The distribution (`name version`) whose RECORD lists `rel`.
fn owner(dir: &Path, rel: &str) -> Option<String> {
    let dist_info = std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.to_string_lossy().ends_with(".dist-info"));
    for info in dist_info {
        let record = std::fs::read_to_string(info.join("RECORD")).unwrap_or_default();
        if record.lines().any(|line| line.split(',').next() == Some(rel)) {
            return metadata(&info).map(|(name, version)| format!("{name} {version}"));
        }
    }
    None
}

/// Name and Version from a `.dist-info` folder's METADATA.
fn metadata(info: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(info.join("METADATA")).ok()?;
    let field = |key: &str| text.lines().find_map(|line| line.strip_prefix(key).map(|v| v.trim().to_string()));
    Some((field("Name:")?, field("Version:")?))
}

/// The pins and top-level names of an installed folder.
fn describe(dir: &Path) -> Result<(Vec<String>, BTreeSet<String>)> {
    let mut pins = Vec::new();
    let mut top_level = BTreeSet::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.ends_with(".dist-info") {
            let (dist, version) = metadata(&path).with_context(|| format!("{} has no Name and Version", path.display()))?;
            pins.push(format!("{dist}=={version}"));
        } else if let Some(module) = name.strip_suffix(".py") {
            top_level.insert(module.to_string());
        } else if path.is_dir() && !name.ends_with(".data") && !name.ends_with(".egg-info") && name != "bin" && name != "__pycache__" {
            top_level.insert(name);
        }
    }
    pins.sort();
    Ok((pins, top_level))
}

/// `bytes` (a component) with `record` appended as its [`RECORD_SECTION`] custom section.
pub fn with_record(bytes: Vec<u8>, record: &BuildRecord) -> Vec<u8> {
    with_section(bytes, RECORD_SECTION, &serde_json::to_vec(record).expect("a record serialises"))
}

/// `bytes` (a component) with the custom section `name` holding `data` appended.
pub(super) fn with_section(mut bytes: Vec<u8>, name: &str, data: &[u8]) -> Vec<u8> {
    let mut payload = leb128(name.len() as u64);
    payload.extend(name.as_bytes());
    payload.extend(data);
    bytes.push(0); // a custom section
    bytes.extend(leb128(payload.len() as u64));
    bytes.extend(payload);
    bytes
}

/// The [`BuildRecord`] a component carries, if any (a top-level custom section).
pub fn record_of(bytes: &[u8]) -> Option<BuildRecord> {
    let mut at = 8; // magic and version/layer
    while at < bytes.len() {
        let id = bytes[at];
        let (size, after) = read_leb128(bytes, at + 1)?;
        let end = after.checked_add(size as usize).filter(|&end| end <= bytes.len())?;
        if id == 0 {
            let (name_len, name_at) = read_leb128(bytes, after)?;
            let data_at = name_at.checked_add(name_len as usize).filter(|&data_at| data_at <= end)?;
            if &bytes[name_at..data_at] == RECORD_SECTION.as_bytes() {
                return serde_json::from_slice(&bytes[data_at..end]).ok();
            }
        }
        at = end;
    }
    None
}

fn leb128(mut value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

pub(super) fn read_leb128(bytes: &[u8], mut at: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(at)?;
        at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value, at));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_a_custom_section() {
        // A minimal component header followed by an unrelated custom section.
        let mut bytes = vec![0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00, 0x00, 0x04, 0x03, b'a', b'b', b'c'];
        assert_eq!(record_of(&bytes), None);
        let record = BuildRecord { modules: vec!["helper.py".into()], packages: vec!["tinypkg==0.3.1".into()] };
        bytes = with_record(bytes, &record);
        assert_eq!(record_of(&bytes), Some(record));
        assert_eq!(leb128(624_485), vec![0xe5, 0x8e, 0x26], "the LEB128 example of the wasm spec");
    }
}
