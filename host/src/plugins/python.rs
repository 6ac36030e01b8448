//! `smallrl plugin build FILE.py`: a Python module (written with the SDK in
//! `plugins/python/smallrl`, or a TRL reward function) into a component, by componentize-py
//! (pinned by `make setup`) against the contract this host speaks. Builds are cached by the
//! hash of everything that goes in, so a second build of the same module is a copy.
//!
//! The world is the module's kind: the SDK declaration it uses (`@smallrl.detector`,
//! `smallrl.Environment`, ...; a reward otherwise), or `--kind`. An environment that never calls
//! `smallrl.judge` is built against a world without the judge import, so it runs without a
//! `judge:` (a component that imports the judge needs one).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::PluginKind;
use super::python_check;
use super::python_deps::{self, BuildRecord};
use super::wit::CONTRACT;

/// The componentize-py release builds are made with (`scripts/requirements.txt` pins it).
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// What a build produced.
pub struct Built {
    pub output: PathBuf,
    pub kind: PluginKind,
    /// Whether the component came from the build cache.
    pub cached: bool,
    pub took: Duration,
}

/// The Python SDK (the `smallrl` package) in this checkout.
pub fn sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/python")
}

/// The directory that holds the SDK's `smallrl` package, absolute (`smallrl plugin sdk --path`:
/// what a module's own tests put on `PYTHONPATH`, wherever the module lives); an error when
/// the checkout this binary was built in no longer has it.
pub fn sdk_path() -> Result<PathBuf> {
    let dir = sdk_dir();
    let package = dir.join("smallrl/__init__.py");
    ensure!(package.is_file(), "the Python SDK is not at {} (this smallrl was built in a checkout that no longer has it): build smallrl again in its checkout", package.display());
    dir.canonicalize().with_context(|| format!("cannot resolve {}", dir.display()))
}

fn wit_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit/smallrl-reward.wit")
}

/// `$SMALLRL_COMPONENTIZE_PY`, else the project venv's (`make setup`).
fn componentize_py() -> PathBuf {
    match std::env::var_os("SMALLRL_COMPONENTIZE_PY") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/componentize-py"),
    }
}

/// The packages a build installs besides the SDK (`--requirements`, `--package`).
#[derive(Clone, Debug, Default)]
pub struct Packages {
    pub requirements: Option<PathBuf>,
    pub paths: Vec<PathBuf>,
}

/// Builds `source` into `output` (default: the module's path with `.wasm`): the pre-check
/// (`python_check.rs`: milliseconds, the user's error alone), the named packages installed
/// (`python_deps.rs`), then componentize-py, unless the build cache has the result.
pub fn build(source: &Path, output: Option<&Path>, kind: Option<PluginKind>, packages: &Packages) -> Result<Built> {
    let started = Instant::now();
    let text = std::fs::read_to_string(source).with_context(|| format!("cannot read the Python module {}", source.display()))?;
    let module = module_name(source)?;
    let kind = kind.unwrap_or_else(|| declared_kind(&text));
    let world = World::of(kind, &text);
    let output = output.map(Path::to_path_buf).unwrap_or_else(|| source.with_extension("wasm"));
    let tool = componentize_py();
    check_version(&tool)?;
    let python = tool.with_file_name("python");
    let installed = python_deps::install(packages.requirements.as_deref(), &packages.paths, &python, cache_dir().map(|dir| dir.with_file_name("python-deps")))?;
    let top_level = installed.as_ref().map(|i| i.top_level.clone()).unwrap_or_default();
    let sources = python_check::precheck(source, &text, &module, &top_level)?;
    let record = BuildRecord {
        modules: sources.keys().filter(|rel| **rel != format!("{module}.py")).cloned().collect(),
        packages: installed.as_ref().map(|i| i.pins.clone()).unwrap_or_default(),
    };
    let key = cache_key(&sources, world, installed.as_ref().map(|i| i.digest.as_str()))?;
    let cached_path = cache_dir().map(|dir| dir.join(format!("{key}.wasm")));
    if let Some(cached) = cached_path.as_ref().filter(|path| path.is_file()) {
        copy_atomic(cached, &output)?;
        return Ok(Built { output, kind, cached: true, took: started.elapsed() });
    }
    let work = tempdir(&key)?;
    let inputs = Inputs { source, module: &module, sources: &sources, world, packages: installed.as_ref().map(|i| i.dir.as_path()), record: &record };
    let result = componentize(&tool, &work, &inputs, &output);
    let _ = std::fs::remove_dir_all(&work);
    result?;
    if let Some(cached) = cached_path {
        // A cache that cannot be written only costs the next build its time.
        let _ = std::fs::create_dir_all(cached.parent().expect("the cache file has a directory")).and_then(|()| {
            let tmp = crate::fsutil::temp_sibling(&cached);
            std::fs::copy(&output, &tmp).and_then(|_| std::fs::rename(&tmp, &cached))
        });
    }
    Ok(Built { output, kind, cached: false, took: started.elapsed() })
}

/// What componentize-py is given.
struct Inputs<'a> {
    source: &'a Path,
    module: &'a str,
    sources: &'a python_check::Sources,
    world: World,
    packages: Option<&'a Path>,
    record: &'a BuildRecord,
}

/// The module's name: its file stem, a Python identifier that shadows nothing the build adds.
fn module_name(source: &Path) -> Result<String> {
    ensure!(source.extension().is_some_and(|e| e == "py"), "{} is not a Python module (.py)", source.display());
    let stem = source.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let identifier = stem.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') && stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    ensure!(identifier, "{}: the module name {stem:?} is not a Python identifier: rename the file (letters, digits, _)", source.display());
    ensure!(!["app", "smallrl", "wit_world", "componentize_py_types"].contains(&stem.as_str()), "{}: the module name {stem:?} is taken by the build: rename the file", source.display());
    Ok(stem)
}

/// The kind a module declares with the SDK: an environment or detector by its class or
/// decorator, else a reward (an SDK reward or a TRL reward function).
fn declared_kind(text: &str) -> PluginKind {
    let code = || text.lines().map(str::trim_start).filter(|line| !line.starts_with('#'));
    if code().any(|line| line.starts_with("class ") && line.contains("Environment)")) {
        PluginKind::Environment
    } else if code().any(|line| line.starts_with("@smallrl.detector") || (line.starts_with("class ") && line.contains("Detector)"))) {
        PluginKind::Detector
    } else {
        PluginKind::Reward
    }
}

/// The contract world a module is built against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum World {
    Reward,
    Detector,
    /// An environment that calls the host's judge.
    EnvironmentWithJudge,
    /// An environment that does not: the `environment` world without the `judge` import.
    Environment,
}

impl World {
    fn of(kind: PluginKind, text: &str) -> Self {
        match kind {
            PluginKind::Reward => World::Reward,
            PluginKind::Detector => World::Detector,
            PluginKind::Environment if text.contains("judge(") => World::EnvironmentWithJudge,
            PluginKind::Environment => World::Environment,
        }
    }

    fn name(self) -> &'static str {
        match self {
            World::Reward => "reward",
            World::Detector => "detector",
            World::EnvironmentWithJudge => "environment",
            World::Environment => "environment-without-judge",
        }
    }

    /// What the app module binds (the export classes componentize-py looks for).
    fn exports(self) -> (&'static str, &'static str) {
        match self {
            World::Reward => ("Plugin, Scorer", "reward"),
            World::Detector => ("Plugin, Flagger", "detector"),
            World::EnvironmentWithJudge | World::Environment => ("Env", "environment"),
        }
    }
}

fn check_version(tool: &Path) -> Result<()> {
    let output = Command::new(tool).arg("--version").output().with_context(|| {
        format!("cannot run {}: `make setup` installs componentize-py {COMPONENTIZE_PY_VERSION} into .venv (or set SMALLRL_COMPONENTIZE_PY)", tool.display())
    })?;
    let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
    ensure!(
        version == format!("componentize-py {COMPONENTIZE_PY_VERSION}"),
        "{} is {version:?}, but smallrl builds with componentize-py {COMPONENTIZE_PY_VERSION} (the version its tests hold): run `make setup`",
        tool.display()
    );
    Ok(())
}

/// SHA-256 over everything a build reads: the tool's version, the world, the contract, the
/// module and the local files it bundles, every file of the SDK, and the installed packages.
fn cache_key(sources: &python_check::Sources, world: World, packages: Option<&str>) -> Result<String> {
    let mut parts: Vec<Vec<u8>> = vec![COMPONENTIZE_PY_VERSION.into(), world.name().into(), packages.unwrap_or("no packages").into()];
    for (rel, text) in sources {
        parts.push(rel.as_bytes().to_vec());
        parts.push(text.as_bytes().to_vec());
    }
    parts.push(std::fs::read(wit_file()).with_context(|| format!("cannot read the contract {}", wit_file().display()))?);
    let sdk = sdk_dir().join("smallrl");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&sdk)
        .with_context(|| format!("cannot read the Python SDK {}", sdk.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "py"))
        .collect();
    files.sort();
    for file in files {
        parts.push(file.file_name().expect("a file").to_string_lossy().as_bytes().to_vec());
        parts.push(std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?);
    }
    let joined: Vec<u8> = parts.iter().flat_map(|part| (part.len() as u64).to_le_bytes().into_iter().chain(part.iter().copied())).collect();
    Ok(super::sha256_hex(&joined))
}

/// Built components, beside the compiled-code cache.
fn cache_dir() -> Option<PathBuf> {
    super::cache_directory().and_then(|wasmtime| wasmtime.parent().map(|dir| dir.join("python-builds")))
}

fn tempdir(key: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("smallrl-python-build-{}-{}", std::process::id(), &key[..16]));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create the build directory {}", dir.display()))?;
    Ok(dir)
}

/// The world file of a judge-free environment: the contract's `environment` world less the
/// `judge` import (the contract itself is unchanged).
fn judge_free_world() -> String {
    let version = CONTRACT.rsplit_once('@').expect("the contract has a version").1;
    format!(
        "package smallrl-build:python;\n\nworld environment-without-judge {{\n    import smallrl:reward/host@{version};\n    import smallrl:reward/programs@{version};\n    export smallrl:reward/env@{version};\n}}\n"
    )
}

/// Runs componentize-py in `work` (the module and its local files, the app module that binds
/// it, the WIT) and writes the component, with its build record, to `output` atomically.
fn componentize(tool: &Path, work: &Path, inputs: &Inputs, output: &Path) -> Result<()> {
    let (module, source, world) = (inputs.module, inputs.source, inputs.world);
    for (rel, text) in inputs.sources {
        let path = work.join(rel);
        std::fs::create_dir_all(path.parent().expect("a file in the build directory"))?;
        std::fs::write(&path, text).with_context(|| format!("cannot write into {}", work.display()))?;
    }
    let (names, kind) = world.exports();
    let app = format!("# Written by `smallrl plugin build`: binds {module} to the {kind} world.\nfrom smallrl._component import bind\nimport {module} as _module\n\n{names} = bind(_module, \"{kind}\")\n");
    std::fs::write(work.join("app.py"), app).with_context(|| format!("cannot write into {}", work.display()))?;
    let wit = match world {
        World::Environment => {
            let dir = work.join("wit");
            std::fs::create_dir_all(dir.join("deps/smallrl"))?;
            std::fs::write(dir.join("world.wit"), judge_free_world())?;
            std::fs::copy(wit_file(), dir.join("deps/smallrl/smallrl-reward.wit"))?;
            dir
        }
        _ => wit_file(),
    };
    crate::fsutil::create_file_atomic(output, |tmp| {
        let mut command = Command::new(tool);
        command.arg("-d").arg(&wit).args(["-w", world.name(), "componentize", "app", "-p"]).arg(work).arg("-p").arg(sdk_dir());
        if let Some(packages) = inputs.packages {
            command.arg("-p").arg(packages);
        }
        // componentize-py also puts its own Python's site-packages on the path (the project venv's):
        // the pre-check, not the path, is what refuses a package that was not named.
        let run = command.arg("-o").arg(tmp).output().with_context(|| format!("cannot run {}", tool.display()))?;
        if !run.status.success() {
            let said = String::from_utf8_lossy(&run.stderr);
            if let Some(error) = module_error(&said, inputs.sources, source) {
                bail!("{error}");
            }
            let said = said.trim();
            let tail = &said[said.len().saturating_sub(4000)..];
            bail!("componentize-py could not build {} as a {kind} ({CONTRACT}):\n{tail}", source.display());
        }
        let bytes = std::fs::read(tmp).with_context(|| format!("cannot read {}", tmp.display()))?;
        std::fs::write(tmp, python_deps::with_record(bytes, inputs.record)).with_context(|| format!("cannot write {}", tmp.display()))?;
        Ok(())
    })
}

/// The user's own error out of componentize-py's output, when the build failed inside the
/// module or a local file it bundles (an exception at import time, an import the pre-check
/// could not foresee): the traceback's last frame in those files, its path (`/0/<file>` in the
/// build) mapped back to the user's file, with its code line and the exception; None when the
/// failure lies elsewhere.
fn module_error(said: &str, sources: &python_check::Sources, source: &Path) -> Option<String> {
    let lines: Vec<&str> = said.lines().collect();
    let frame_of = |line: &str| sources.keys().find(|rel| line.starts_with(&format!("  File \"/0/{rel}\", line "))).cloned();
    let at = lines.iter().rposition(|line| frame_of(line).is_some())?;
    let rel = frame_of(lines[at]).expect("found above");
    let frame = format!("  File \"/0/{rel}\", line ");
    let line_number: String = lines[at][frame.len()..].chars().take_while(char::is_ascii_digit).collect();
    let code: Vec<&str> = lines[at + 1..].iter().take_while(|line| line.starts_with("    ")).copied().collect();
    let error = lines[at + 1 + code.len()..].iter().find(|line| !line.trim().is_empty() && !line.starts_with(' '))?;
    let hint = match error.starts_with("ModuleNotFoundError") {
        true => "\n(a component bundles the module, the modules and packages in its folder that it imports, the SDK, the standard library componentize-py ships and the packages named with `--requirements` or `--package`)",
        false => "",
    };
    let folder = source.parent().unwrap_or(Path::new(""));
    Some(format!("{}:{line_number}: {error}\n{}{hint}", folder.join(rel).display(), code.join("\n")))
}

/// Copies `from` to `to` through a temporary sibling, so `to` is whole or absent.
fn copy_atomic(from: &Path, to: &Path) -> Result<()> {
    crate::fsutil::create_file_atomic(to, |tmp| {
        std::fs::copy(from, tmp).with_context(|| format!("cannot copy {} to {}", from.display(), tmp.display()))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_is_the_sdk_declaration() {
        assert_eq!(declared_kind("import smallrl\n@smallrl.reward(name='x')\ndef score(s, p):\n    return 1.0\n"), PluginKind::Reward);
        assert_eq!(declared_kind("def f(prompts, completions, **kwargs):\n    return []\n"), PluginKind::Reward);
        assert_eq!(declared_kind("@smallrl.detector(name='x')\ndef detect(s, p): ..."), PluginKind::Detector);
        assert_eq!(declared_kind("class Flags(smallrl.Detector):\n    pass"), PluginKind::Detector);
        assert_eq!(declared_kind("class Sorting(smallrl.Environment):\n    pass"), PluginKind::Environment);
        assert_eq!(declared_kind("# class Sorting(smallrl.Environment):\n@smallrl.reward()\ndef s(x, p): ..."), PluginKind::Reward);
        assert_eq!(World::of(PluginKind::Environment, "smallrl.judge([item])"), World::EnvironmentWithJudge);
        assert_eq!(World::of(PluginKind::Environment, "x = 1"), World::Environment);
    }

    #[test]
    fn the_users_error_is_taken_out_of_componentize_pys_traceback() {
        // componentize-py 0.25.1's output for a syntax error in line 5 of bad.py.
        let said = "Traceback (most recent call last):\n  File \"/venv/bin/componentize-py\", line 10, in <module>\n    sys.exit(script())\nAssertionError: Traceback (most recent call last):\n  File \"/0/app.py\", line 3, in <module>\n    import bad as _module\n  File \"/0/bad.py\", line 5\n    return 1.0 +\n                ^\nSyntaxError: invalid syntax\n\n\nCaused by:\n    SyntaxError: invalid syntax (bad.py, line 5)\n";
        let sources = |rel: &str| python_check::Sources::from([(rel.to_string(), String::new())]);
        assert_eq!(module_error(said, &sources("bad.py"), Path::new("my/bad.py")).unwrap(), "my/bad.py:5: SyntaxError: invalid syntax\n    return 1.0 +\n                ^");
        assert_eq!(module_error(said, &sources("other.py"), Path::new("my/other.py")), None, "not in the module");
    }

    #[test]
    fn module_names_are_identifiers_the_build_does_not_use() {
        assert_eq!(module_name(Path::new("a/my_reward.py")).unwrap(), "my_reward");
        for bad in ["a/my-reward.py", "a/1st.py", "a/app.py", "a/smallrl.py", "a/reward.txt"] {
            assert!(module_name(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
