//! `smallrl plugin build FILE.py`: a Python module (written with the SDK in
//! `plugins/python/smallrl`, or a TRL reward function) into a component, by componentize-py
//! (pinned by `make setup`) against the contract this host speaks.
//!
//! The edit cycle (issue 47): componentize-py (10 to 40 s) builds only a *base* per world, SDK,
//! installed packages and set of imported modules, cached by their hash, whose app module does
//! not contain the user's module (`smallrl/_loader.py`); the module's files are appended to the
//! base as a custom section (`python_sources.rs`), and the host compiles the file less that
//! section, so every rebuild with the same imports is the cached base plus new files and loads
//! from wasmtime's cache. The module's top level runs at each instance's first call, under its
//! fuel, not at build time.
//!
//! The world is the module's kind: the SDK declaration it uses (`@smallrl.detector`,
//! `smallrl.Environment`, `smallrl.EpisodeEnvironment`, ...; a reward otherwise), or `--kind`. An
//! environment (single-turn or episodes) that never calls `smallrl.judge` is built against its
//! world without the judge import, so it runs without a `judge:` (a component that imports the
//! judge needs one).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::python_check;
use super::python_deps::{self, BuildRecord};
use super::python_sources;
use super::wit::CONTRACT;

/// The componentize-py release builds are made with (`scripts/requirements.txt` pins it).
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// What a build produced.
pub struct Built {
    pub output: PathBuf,
    pub kind: ModuleKind,
    /// Whether the base component came from the build cache.
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
/// (`python_deps.rs`), the base component (componentize-py, unless the build cache has it), and
/// the module's files written after it (`python_sources.rs`); the result must load and declare
/// its plugin before it is written.
pub fn build(source: &Path, output: Option<&Path>, kind: Option<ModuleKind>, packages: &Packages) -> Result<Built> {
    let started = Instant::now();
    let text = std::fs::read_to_string(source).with_context(|| format!("cannot read the Python module {}", source.display()))?;
    let module = module_name(source)?;
    let kind = kind.unwrap_or_else(|| declared_kind(&text));
    let world = World::of(kind, &text);
    let output = output.map(Path::to_path_buf).unwrap_or_else(|| source.with_extension("wasm"));
    let tool = componentize_py();
    check_version(&tool)?;
    let python = tool.with_file_name("python");
    let installed = python_deps::install(packages.requirements.as_deref(), &packages.paths, &python, cache_dir().map(|dir| dir.with_file_name(python_deps::DEPS_DIR)))?;
    let top_level = installed.as_ref().map(|i| i.top_level.clone()).unwrap_or_default();
    let checked = python_check::precheck(source, &text, &module, &top_level)?;
    let record = BuildRecord {
        modules: checked.sources.keys().filter(|rel| **rel != format!("{module}.py")).cloned().collect(),
        packages: installed.as_ref().map(|i| i.pins.clone()).unwrap_or_default(),
    };
    let imported: BTreeSet<String> = BASE_IMPORTS.iter().map(|name| name.to_string()).chain(checked.imported).collect();
    let base = Base { world, imported: &imported, packages: installed.as_ref().map(|i| (i.dir.as_path(), i.digest.as_str())) };
    let (bytes, cached) = base.component(&tool, source)?;
    let carried = python_sources::Carried { module, files: checked.sources };
    let bytes = python_deps::with_record(python_sources::with_sources(bytes, &carried), &record);
    crate::fsutil::create_file_atomic(&output, |tmp| {
        std::fs::write(tmp, &bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
        // The module's top level runs here, at the component's first call, as it will in a run.
        let loaded = super::Plugin::unconfigured(tmp, super::NO_PARAMS, super::PluginLimits::default());
        let shown = |error: anyhow::Error| format!("{error:#}").replace(&tmp.display().to_string(), &output.display().to_string());
        loaded.map(drop).map_err(|error| anyhow::anyhow!("{}: the module does not load as a {kind}: {}", source.display(), shown(error)))
    })?;
    Ok(Built { output, kind, cached, took: started.elapsed() })
}

/// What every base imports besides the modules the plugin's files name: the standard library
/// the program runner offers programs (`plugins/python/runner/program_runner.py`), so that
/// adding one of these imports in an edit keeps the base, and the world's imports the SDK
/// reaches only in a call (`smallrl.judge`, `smallrl.run_programs`).
const BASE_IMPORTS: [&str; 27] = [
    "bisect", "collections", "copy", "dataclasses", "decimal", "enum", "fractions", "functools", "heapq", "io", "itertools", "json", "math",
    "operator", "os", "random", "re", "statistics", "string", "textwrap", "types", "typing", "unicodedata", "smallrl",
    "wit_world.imports.host", "wit_world.imports.programs", "wit_world.imports.judge",
];

/// A base component: CPython, the SDK and `world`'s bindings pre-initialised by componentize-py
/// with `imported` imported (and the installed packages' folder on the path), whose app module
/// (`smallrl/_loader.py`) imports the plugin's own module at run time.
struct Base<'a> {
    world: World,
    imported: &'a BTreeSet<String>,
    /// The installed packages' folder and digest.
    packages: Option<(&'a Path, &'a str)>,
}

impl Base<'_> {
    /// The base's bytes, from the build cache or built now (then cached); whether it was cached.
    fn component(&self, tool: &Path, source: &Path) -> Result<(Vec<u8>, bool)> {
        let key = self.cache_key()?;
        let cached = cache_dir().map(|dir| dir.join(format!("base-{key}.wasm")));
        if let (Some(path), Some((packages, _))) = (&cached, self.packages) {
            super::python_cache::refer_to_packages(path, packages);
        }
        if let Some((path, bytes)) = cached.as_ref().and_then(|path| Some((path, std::fs::read(path).ok()?))) {
            super::python_cache::mark_used(path);
            return Ok((bytes, true));
        }
        let work = tempdir(&key)?;
        let built = work.join("base.wasm");
        let result = componentize(tool, &work, self, &built, source).and_then(|()| std::fs::read(&built).with_context(|| format!("cannot read {}", built.display())));
        let _ = std::fs::remove_dir_all(&work);
        let bytes = result?;
        if let Some(cached) = cached {
            // A cache that cannot be written only costs the next build its time.
            let _ = std::fs::create_dir_all(cached.parent().expect("the cache file has a directory")).map_err(anyhow::Error::from).and_then(|()| crate::fsutil::write_atomic(&cached, &bytes));
        }
        Ok((bytes, false))
    }

    /// SHA-256 over everything the base is made of: the tool's version, the world, the contract,
    /// every file of the SDK, the installed packages and the imported modules.
    fn cache_key(&self) -> Result<String> {
        let mut parts: Vec<Vec<u8>> = vec![COMPONENTIZE_PY_VERSION.into(), self.world.name().into(), self.packages.map_or("no packages", |(_, digest)| digest).into()];
        parts.extend(self.imported.iter().map(|name| name.as_bytes().to_vec()));
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

    /// The app module: `imported` imported (one that fails stays missing: the plugin's own
    /// import of it then fails at its line), then the export classes made.
    fn app(&self) -> String {
        let (names, kind) = self.world.exports();
        let list = serde_json::to_string(&self.imported).expect("names serialise");
        format!(
            "# Written by `smallrl plugin build`: the base of {kind} plugins (smallrl/_loader.py imports the plugin's module at run time).\n\
             import importlib\n\nfor _name in {list}:\n    try:\n        importlib.import_module(_name)\n    except Exception:\n        pass\n\n\
             from smallrl._loader import exports\n\n{names} = exports(\"{kind}\")\n"
        )
    }
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

/// What a Python module is built as: a plugin kind, or an episode environment (an environment
/// of the episode-environment world: `smallrl.EpisodeEnvironment`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleKind {
    Reward,
    Detector,
    Environment,
    EpisodeEnvironment,
}

impl std::fmt::Display for ModuleKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModuleKind::Reward => "reward",
            ModuleKind::Detector => "detector",
            ModuleKind::Environment => "environment",
            ModuleKind::EpisodeEnvironment => "episode environment",
        })
    }
}

/// The kind a module declares with the SDK: an episode environment, environment or detector by
/// its class or decorator, else a reward (an SDK reward or a TRL reward function).
fn declared_kind(text: &str) -> ModuleKind {
    let code = || text.lines().map(str::trim_start).filter(|line| !line.starts_with('#'));
    let class = |base: &str| code().any(|line| line.starts_with("class ") && line.contains(base));
    if class("EpisodeEnvironment)") {
        ModuleKind::EpisodeEnvironment
    } else if class("Environment)") {
        ModuleKind::Environment
    } else if code().any(|line| line.starts_with("@smallrl.detector")) || class("Detector)") {
        ModuleKind::Detector
    } else {
        ModuleKind::Reward
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
    /// An episode environment that calls the host's judge.
    EpisodeEnvironmentWithJudge,
    /// An episode environment that does not: the `episode-environment` world less `judge`.
    EpisodeEnvironment,
}

impl World {
    fn of(kind: ModuleKind, text: &str) -> Self {
        let judge = text.contains("judge(");
        match kind {
            ModuleKind::Reward => World::Reward,
            ModuleKind::Detector => World::Detector,
            ModuleKind::Environment if judge => World::EnvironmentWithJudge,
            ModuleKind::Environment => World::Environment,
            ModuleKind::EpisodeEnvironment if judge => World::EpisodeEnvironmentWithJudge,
            ModuleKind::EpisodeEnvironment => World::EpisodeEnvironment,
        }
    }

    fn name(self) -> &'static str {
        match self {
            World::Reward => "reward",
            World::Detector => "detector",
            World::EnvironmentWithJudge => "environment",
            World::Environment => "environment-without-judge",
            World::EpisodeEnvironmentWithJudge => "episode-environment",
            World::EpisodeEnvironment => "episode-environment-without-judge",
        }
    }

    /// What the app module binds (the export classes componentize-py looks for).
    fn exports(self) -> (&'static str, &'static str) {
        match self {
            World::Reward => ("Plugin, Scorer", "reward"),
            World::Detector => ("Plugin, Flagger", "detector"),
            World::EnvironmentWithJudge | World::Environment => ("Env", "environment"),
            World::EpisodeEnvironmentWithJudge | World::EpisodeEnvironment => ("Env, Episodes", "episode"),
        }
    }

    /// The world file of a judge-free world: the contract's world of the same exports less the
    /// `judge` import (the contract itself is unchanged); None for the contract's own worlds.
    fn judge_free(self) -> Option<String> {
        let exports: &[&str] = match self {
            World::Environment => &["env"],
            World::EpisodeEnvironment => &["env", "episodes"],
            _ => return None,
        };
        let version = CONTRACT.rsplit_once('@').expect("the contract has a version").1;
        let exports: String = exports.iter().map(|export| format!("    export smallrl:reward/{export}@{version};\n")).collect();
        Some(format!(
            "package smallrl-build:python;\n\nworld {} {{\n    import smallrl:reward/host@{version};\n    import smallrl:reward/programs@{version};\n{exports}}}\n",
            self.name()
        ))
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

/// Built components, beside the compiled-code cache.
fn cache_dir() -> Option<PathBuf> {
    super::python_cache_root().map(|root| root.join(super::python_cache::BUILDS_DIR))
}

fn tempdir(key: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("smallrl-python-build-{}-{}", std::process::id(), &key[..16]));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create the build directory {}", dir.display()))?;
    Ok(dir)
}

/// Runs componentize-py in `work` (the base's app module and the WIT) and writes the base
/// component to `output`.
fn componentize(tool: &Path, work: &Path, base: &Base, output: &Path, source: &Path) -> Result<()> {
    let world = base.world;
    std::fs::write(work.join("app.py"), base.app()).with_context(|| format!("cannot write into {}", work.display()))?;
    let wit = match world.judge_free() {
        Some(world_file) => {
            let dir = work.join("wit");
            std::fs::create_dir_all(dir.join("deps/smallrl"))?;
            std::fs::write(dir.join("world.wit"), world_file)?;
            std::fs::copy(wit_file(), dir.join("deps/smallrl/smallrl-reward.wit"))?;
            dir
        }
        None => wit_file(),
    };
    let mut command = Command::new(tool);
    command.arg("-d").arg(&wit).args(["-w", world.name(), "componentize", "app", "-p"]).arg(work).arg("-p").arg(sdk_dir());
    if let Some((packages, _)) = base.packages {
        command.arg("-p").arg(packages);
    }
    // componentize-py also puts its own Python's site-packages on the path (the project venv's):
    // the pre-check, not the path, is what refuses a package that was not named.
    let run = command.arg("-o").arg(output).output().with_context(|| format!("cannot run {}", tool.display()))?;
    if !run.status.success() {
        let said = String::from_utf8_lossy(&run.stderr);
        let said = said.trim();
        let tail = &said[said.len().saturating_sub(4000)..];
        bail!("componentize-py could not build the base of {} as a {} ({CONTRACT}):\n{tail}", source.display(), world.exports().1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_is_the_sdk_declaration() {
        assert_eq!(declared_kind("import smallrl\n@smallrl.reward(name='x')\ndef score(s, p):\n    return 1.0\n"), ModuleKind::Reward);
        assert_eq!(declared_kind("def f(prompts, completions, **kwargs):\n    return []\n"), ModuleKind::Reward);
        assert_eq!(declared_kind("@smallrl.detector(name='x')\ndef detect(s, p): ..."), ModuleKind::Detector);
        assert_eq!(declared_kind("class Flags(smallrl.Detector):\n    pass"), ModuleKind::Detector);
        assert_eq!(declared_kind("class Sorting(smallrl.Environment):\n    pass"), ModuleKind::Environment);
        assert_eq!(declared_kind("class Guess(smallrl.EpisodeEnvironment):\n    pass"), ModuleKind::EpisodeEnvironment);
        assert_eq!(declared_kind("# class Sorting(smallrl.Environment):\n@smallrl.reward()\ndef s(x, p): ..."), ModuleKind::Reward);
        assert_eq!(World::of(ModuleKind::Environment, "smallrl.judge([item])"), World::EnvironmentWithJudge);
        assert_eq!(World::of(ModuleKind::Environment, "x = 1"), World::Environment);
        assert_eq!(World::of(ModuleKind::EpisodeEnvironment, "smallrl.judge([item])"), World::EpisodeEnvironmentWithJudge);
        assert_eq!(World::of(ModuleKind::EpisodeEnvironment, "x = 1"), World::EpisodeEnvironment);
        let world = World::EpisodeEnvironment.judge_free().unwrap();
        assert!(world.contains("world episode-environment-without-judge {") && world.contains("export smallrl:reward/episodes@0.6.0;") && !world.contains("judge@"), "{world}");
        assert!(World::EnvironmentWithJudge.judge_free().is_none() && World::EpisodeEnvironmentWithJudge.judge_free().is_none());
    }

    #[test]
    fn module_names_are_identifiers_the_build_does_not_use() {
        assert_eq!(module_name(Path::new("a/my_reward.py")).unwrap(), "my_reward");
        for bad in ["a/my-reward.py", "a/1st.py", "a/app.py", "a/smallrl.py", "a/reward.txt"] {
            assert!(module_name(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
