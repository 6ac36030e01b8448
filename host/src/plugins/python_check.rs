//! The pre-check of `smallrl plugin build` (issue 47): before componentize-py spends its 10 to
//! 40 s compiling the interpreter, every file the build will bundle is compiled and its imports
//! resolved, in milliseconds, and the user's error is reported alone with its file and line.
//!
//! Why in the sandbox: componentize-py 0.25.1 embeds CPython 3.14, while the project's Python is
//! 3.11 (and no 3.14 is installed here): parsing with another version would refuse 3.14 syntax
//! (`except A, B:`, t-strings) or accept what 3.14 removed, and would list another standard
//! library. The program runner (`plugins/program_runner.wasm`, `programs.rs`) is built by the
//! same componentize-py, so it embeds the same CPython: the check (`python_precheck.py`) runs
//! there as a program, in a fresh instance (a few milliseconds once the runner is compiled;
//! the runner is in the wasmtime cache after its first use).
//!
//! What resolves: `smallrl` (the SDK), a module `X.py` or package `X/` in the module's folder
//! (bundled: a package with all its `.py` files), a package the build installs
//! ([`super::python_deps`]), and the interpreter's standard library. An import inside a `try`
//! that catches ImportError or under `if TYPE_CHECKING:` (the module handles its absence), or
//! in a function body (the build does not run it; it fails that call, as in the component), may
//! stay unresolved; a local file it names is still bundled. A local file that shadows a standard-library module is refused: the
//! build's path puts the standard library first, so the file would silently not be the one
//! imported.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;

use super::programs::{self, Program, ProgramLimits, Status};

const PRECHECK: &str = include_str!("python_precheck.py");

#[derive(Deserialize)]
struct Report {
    stdlib: BTreeSet<String>,
    version: String,
    files: BTreeMap<String, FileReport>,
}

#[derive(Deserialize)]
struct FileReport {
    syntax_error: Option<SyntaxError>,
    #[serde(default)]
    imports: Vec<Import>,
}

#[derive(Deserialize)]
struct SyntaxError {
    #[serde(rename = "type")]
    kind: String,
    message: String,
    line: Option<usize>,
    column: Option<usize>,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Import {
    module: String,
    /// `from module import a, b`: `a` and `b` (submodules or attributes).
    #[serde(default)]
    names: Vec<String>,
    level: u32,
    line: usize,
    guarded: bool,
    /// In a function body or under `if TYPE_CHECKING:`: not run when the module is imported.
    #[serde(default)]
    deferred: bool,
}

/// The files a module bundles: its own and the local modules and packages it imports, as
/// paths relative to its folder (`/`-separated) with their text; the module's own is
/// `<module>.py`.
pub type Sources = BTreeMap<String, String>;

/// What the pre-check found: the files to bundle, and every module of the standard library or
/// the installed packages the files import when they are imported (for `from X import a`, `X.a`
/// too, which may be a submodule), which the base component imports at build time
/// (`python.rs`): a component has no files to import them from later. A function's import
/// finds only what some module imported so (or the base's own list), as before the base.
pub struct Checked {
    pub sources: Sources,
    pub imported: BTreeSet<String>,
}

/// Checks `source` (text `text`, module name `module`) and every local file it imports; the
/// files to bundle, or the first error as the user's own (`file:line: Error: message`).
/// `packages`: the top-level names the build's installed packages provide.
pub fn precheck(source: &Path, text: &str, module: &str, packages: &BTreeSet<String>) -> Result<Checked> {
    // "" for a module in the current directory: `helper.py` is read and shown as such.
    let folder = source.parent().unwrap_or(Path::new(""));
    let mut sources = Sources::from([(format!("{module}.py"), text.to_owned())]);
    let mut pending = vec![format!("{module}.py")];
    let mut imported = BTreeSet::new();
    while !pending.is_empty() {
        let batch: BTreeMap<&str, &str> = pending.iter().map(|rel| (rel.as_str(), sources[rel].as_str())).collect();
        let report = run(&batch)?;
        pending.clear();
        ensure!(!report.stdlib.contains(module), "{}: the module name {module:?} is a standard-library module's, which the build would import in its place: rename the file", source.display());
        for (rel, file) in &report.files {
            let shown = folder.join(rel);
            if let Some(error) = &file.syntax_error {
                bail!("{}", syntax_message(&shown, error));
            }
            for import in &file.imports {
                let local = resolve(folder, rel, import, &sources[rel], &shown, &report, packages)?;
                let top = import.module.split('.').next().unwrap_or_default();
                // Only the standard library and the named packages: a guarded import of anything
                // else stays missing, never taken from the Python componentize-py runs in.
                if local.is_empty() && import.level == 0 && !import.deferred && (report.stdlib.contains(top) || packages.contains(top)) {
                    imported.insert(import.module.clone());
                    imported.extend(import.names.iter().filter(|name| *name != "*").map(|name| format!("{}.{name}", import.module)));
                }
                for (new, text) in local {
                    if !sources.contains_key(&new) {
                        sources.insert(new.clone(), text);
                        pending.push(new);
                    }
                }
            }
        }
    }
    Ok(Checked { sources, imported })
}

/// The check over `files` in a fresh runner instance.
fn run(files: &BTreeMap<&str, &str>) -> Result<Report> {
    let program = Program::source(PRECHECK).with_stdin(serde_json::to_string(files).expect("names and texts serialise"));
    let outcome = programs::run(&[program], ProgramLimits::default()).context("the pre-check of the module (in the program runner) could not run")?.remove(0);
    ensure!(outcome.status == Status::Normal, "the pre-check of the module ended with {:?}:\n{}", outcome.status, outcome.stderr);
    serde_json::from_str(&outcome.stdout).with_context(|| format!("the pre-check's report is not JSON: {}", outcome.stdout))
}

fn syntax_message(shown: &Path, error: &SyntaxError) -> String {
    let line = error.line.map_or(String::new(), |line| format!("{line}:"));
    let mut message = format!("{}:{line} {}: {}", shown.display(), error.kind, error.message);
    // As CPython's traceback shows it: the line without its indentation, the caret moved along.
    if let Some(text) = error.text.as_deref().map(str::trim_end).filter(|text| !text.trim().is_empty()) {
        let code = text.trim_start();
        message.push_str(&format!("\n    {code}"));
        if let Some(column) = error.column.and_then(|column| column.checked_sub(1 + text.len() - code.len())) {
            message.push_str(&format!("\n    {}^", " ".repeat(column)));
        }
    }
    message
}

/// The local files an import brings in (none when it is the SDK, an installed package or the
/// standard library), or the user's error when it resolves to nothing.
fn resolve(folder: &Path, rel: &str, import: &Import, text: &str, shown: &Path, report: &Report, packages: &BTreeSet<String>) -> Result<Vec<(String, String)>> {
    let code = text.lines().nth(import.line.saturating_sub(1)).unwrap_or("").trim();
    let at = format!("{}:{}", shown.display(), import.line);
    if import.level > 0 {
        // Within a local package every file is bundled; the module itself has no package.
        ensure!(rel.contains('/') || import.guarded, "{at}: ImportError: attempted relative import with no known parent package\n    {code}");
        return Ok(Vec::new());
    }
    let top = import.module.split('.').next().unwrap_or_default();
    // The SDK is always the build's own (`plugins/python/smallrl` beside the standard Python
    // plugins is that SDK, not a local package: its glue imports componentize-py's generated
    // modules, which exist only inside the build).
    if top == "smallrl" {
        return Ok(Vec::new());
    }
    let local = local_files(folder, top)?;
    if !local.is_empty() {
        ensure!(
            !report.stdlib.contains(top),
            "{}: `{top}` beside the module has the name of a standard-library module, which the build imports in its place: rename it",
            folder.join(&local[0].0).display()
        );
        return Ok(local);
    }
    if packages.contains(top) || report.stdlib.contains(top) || import.guarded {
        return Ok(Vec::new());
    }
    bail!(
        "{at}: ModuleNotFoundError: No module named '{top}'\n    {code}\n\
         (a component bundles the module, the modules and packages in its folder that it imports, the SDK `smallrl`, \
         Python {}'s standard library, and the pure-Python packages named with `--requirements` or `--package`)",
        report.version
    )
}

/// `top.py` in `folder`, or every `.py` file of the package `top/` (with its text), relative to
/// `folder`; empty when neither exists.
fn local_files(folder: &Path, top: &str) -> Result<Vec<(String, String)>> {
    let file = folder.join(format!("{top}.py"));
    if file.is_file() {
        return Ok(vec![(format!("{top}.py"), read(&file)?)]);
    }
    let package = folder.join(top);
    let mut found = Vec::new();
    if package.join("__init__.py").is_file() {
        collect_python(folder, &package, &mut found)?;
    }
    Ok(found)
}

fn collect_python(folder: &Path, dir: &Path, found: &mut Vec<(String, String)>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if path.is_dir() && name != "__pycache__" && !name.starts_with('.') {
            collect_python(folder, &path, found)?;
        } else if path.is_file() && name.ends_with(".py") {
            let rel = path.strip_prefix(folder).expect("under the folder").components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
            found.push((rel, read(&path)?));
        }
    }
    Ok(())
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read the Python file {}", path.display()))
}
