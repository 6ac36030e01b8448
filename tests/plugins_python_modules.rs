//! Issue 47, items 2 and 3: what a Python module may import, and the pre-check before
//! componentize-py.
//!
//! - The pre-check reports a syntax error or an import that resolves to nothing as the user's
//!   error alone, with file and line, before componentize-py runs (a stand-in componentize-py
//!   that records being run shows it never started), in the grammar of the CPython the
//!   component embeds (3.14 syntax the project's Python 3.11 refuses passes).
//! - `plugin build` bundles the modules and packages beside the module that it imports, and
//!   the pure-Python packages named with `--package` or `--requirements`, pinned in
//!   `plugin info`; a package with native code is refused before the build, saying why.
//! - An edit's rebuild reuses the cached base component and its compiled code (item 3), and
//!   `plugin cache --prune` bounds those caches.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::smallrl_ok;

fn smallrl_with(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_smallrl"));
    command.args(args).env_remove("RUST_BACKTRACE");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("smallrl runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A componentize-py that answers its version and otherwise only records that it ran and fails,
/// with the project's Python beside it (the build runs pip with the Python beside the tool).
fn stand_in_componentize_py(dir: &Path) -> (PathBuf, PathBuf) {
    let python = dir.join("python");
    std::fs::write(&python, format!("#!/bin/sh\nexec '{}' \"$@\"\n", common::python().display())).unwrap();
    std::process::Command::new("chmod").arg("+x").arg(&python).status().unwrap();
    let marker = dir.join("componentize-py-ran");
    let script = dir.join("componentize-py");
    let body = format!(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'componentize-py 0.25.1'; exit 0; fi\ntouch '{}'\necho 'stand-in: not built' >&2\nexit 1\n",
        marker.display()
    );
    std::fs::write(&script, body).unwrap();
    std::process::Command::new("chmod").arg("+x").arg(&script).status().unwrap();
    (script, marker)
}

const REWARD_HEAD: &str = "import smallrl\n\n\n@smallrl.reward(name=\"checked\", version=\"0.1.0\", description=\"d\")\ndef score(sample, params):\n";

#[test]
fn the_pre_check_reports_the_users_error_before_componentize_py_in_its_cpythons_grammar() {
    let dir = tempfile::tempdir().unwrap();
    let (tool, marker) = stand_in_componentize_py(dir.path());
    let cache = dir.path().join("cache/wasmtime");
    let build = |name: &str, text: &str| {
        let module = dir.path().join(format!("{name}.py"));
        std::fs::write(&module, text).unwrap();
        // A private cache: componentize-py runs when no base for the module's imports is cached.
        let output = smallrl_with(&["plugin", "build", module.to_str().unwrap()], &[("SMALLRL_COMPONENTIZE_PY", &tool), ("SMALLRL_PLUGIN_CACHE", &cache)]);
        assert!(!output.status.success(), "the stand-in never builds");
        (module, stderr(&output))
    };

    let (module, said) = build("typo", &format!("{REWARD_HEAD}    if True:\n        return 1.0 +\n"));
    assert!(said.contains(&format!("{}:7: SyntaxError: invalid syntax\n    return 1.0 +\n                ^", module.display())), "{said}");
    assert!(!marker.exists(), "the syntax error was found before componentize-py ran");

    // A guarded import may fail at run time (the module handles it); an unguarded one may not.
    let (module, said) = build("missing", &format!("try:\n    import numpy\nexcept ImportError:\n    numpy = None\nimport yaml\n{REWARD_HEAD}    return 1.0\n"));
    assert!(said.contains(&format!("{}:5: ModuleNotFoundError: No module named 'yaml'\n    import yaml", module.display())), "{said}");
    assert!(said.contains("--requirements") && said.contains("standard library"), "says what a module may import: {said}");
    assert!(!marker.exists(), "the import was resolved before componentize-py ran");

    // An error in a helper module is reported at the helper's file and line.
    std::fs::write(dir.path().join("helper_bad.py"), "def f(:\n    pass\n").unwrap();
    let (_, said) = build("uses_helper", &format!("import helper_bad\n{REWARD_HEAD}    return 1.0\n"));
    assert!(said.contains(&format!("{}:1: SyntaxError:", dir.path().join("helper_bad.py").display())), "{said}");
    assert!(!marker.exists());

    // Python 3.14's `except A, B:` (PEP 758): the project's Python 3.11 refuses it, the check
    // (CPython 3.14, as the component) accepts it and hands the module to componentize-py. A
    // function's import is not checked: the build does not run it (it fails its call).
    let modern = format!("try:\n    pass\nexcept ValueError, TypeError:\n    pass\n{REWARD_HEAD}    import numpy\n    return 1.0\n");
    let old = Command::new(common::python()).args(["-c", &format!("compile({modern:?}, 'm', 'exec')")]).output().unwrap();
    assert!(!old.status.success(), "Python 3.11 refuses PEP 758's syntax");
    let (_, said) = build("modern", &modern);
    assert!(marker.exists() && said.contains("stand-in: not built"), "3.14 syntax passes the pre-check: {said}");
}

/// `name.py` beside `dir`'s module: the reward's formula uses a helper module and a local
/// package (two files), and the build bundles both.
#[test]
fn a_reward_imports_the_modules_and_packages_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("helper.py"), "def bangs(text):\n    return text.count('!')\n").unwrap();
    std::fs::create_dir_all(dir.path().join("scoring")).unwrap();
    std::fs::write(dir.path().join("scoring/__init__.py"), "from .scale import cap\n").unwrap();
    std::fs::write(dir.path().join("scoring/scale.py"), "def cap(value, most):\n    return min(value / most, 1.0)\n").unwrap();
    std::fs::write(dir.path().join("unrelated.py"), "raise SystemExit('not imported, not bundled')\n").unwrap();
    let module = dir.path().join("bangs.py");
    std::fs::write(&module, format!("import helper\nfrom scoring import cap\n{REWARD_HEAD}    return cap(helper.bangs(sample.completion), 4)\n")).unwrap();
    smallrl_ok(&["plugin", "build", module.to_str().unwrap()]);
    let wasm = dir.path().join("bangs.wasm");
    // 3 of at most 4 marks, and 6 capped at 1.
    let scored = smallrl_ok(&["plugin", "score", wasm.to_str().unwrap(), "--text", "a! b! c!", "--text", "!!!!!!"]);
    let values: Vec<&str> = scored.lines().map(|line| line.split('\t').next().unwrap()).collect();
    assert_eq!(values, ["0.750000", "1.000000"], "{scored}");
    let info = smallrl_ok(&["plugin", "info", wasm.to_str().unwrap()]);
    assert!(info.contains("bundled Python modules: helper.py, scoring/__init__.py, scoring/scale.py\n"), "{info}");
    assert!(info.contains("bundled Python packages: none\n"), "{info}");
}

/// A source directory of a pure-Python distribution `name` `version`, with `files` in its package.
fn source_package(dir: &Path, name: &str, version: &str, files: &[(&str, &[u8])], package_data: &str) -> PathBuf {
    let root = dir.join(format!("{name}_src"));
    std::fs::create_dir_all(root.join(name)).unwrap();
    let pyproject = format!(
        "[build-system]\nrequires = [\"setuptools\"]\nbuild-backend = \"setuptools.build_meta\"\n\n[project]\nname = \"{name}\"\nversion = \"{version}\"\n\n\
         [tool.setuptools]\npackages = [\"{name}\"]\n{package_data}"
    );
    std::fs::write(root.join("pyproject.toml"), pyproject).unwrap();
    for (file, contents) in files {
        std::fs::write(root.join(name).join(file), contents).unwrap();
    }
    root
}

#[test]
fn a_pure_python_package_is_bundled_and_pinned_and_a_native_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let package = source_package(dir.path(), "tinypkg", "0.3.1", &[("__init__.py", b"def triple(x):\n    return 3 * x\n")], "");
    let module = dir.path().join("uses_tinypkg.py");
    std::fs::write(&module, format!("import tinypkg\n{REWARD_HEAD}    return tinypkg.triple(len(sample.completion)) / 100\n")).unwrap();
    let without = smallrl_with(&["plugin", "build", module.to_str().unwrap()], &[]);
    assert!(stderr(&without).contains("No module named 'tinypkg'"), "not named, not bundled: {}", stderr(&without));

    smallrl_ok(&["plugin", "build", module.to_str().unwrap(), "--package", package.to_str().unwrap()]);
    let wasm = dir.path().join("uses_tinypkg.wasm");
    assert!(smallrl_ok(&["plugin", "score", wasm.to_str().unwrap(), "--text", "abcd"]).starts_with("0.120000"), "3 * 4 / 100");
    let info = smallrl_ok(&["plugin", "info", wasm.to_str().unwrap()]);
    assert!(info.contains("bundled Python packages: tinypkg==0.3.1\n"), "{info}");
    // The same package named in a requirements file (a path relative to the file).
    let requirements = dir.path().join("requirements.txt");
    std::fs::write(&requirements, "./tinypkg_src\n").unwrap();
    let output = dir.path().join("from_requirements.wasm");
    smallrl_ok(&["plugin", "build", module.to_str().unwrap(), "--requirements", requirements.to_str().unwrap(), "-o", output.to_str().unwrap()]);
    assert!(smallrl_ok(&["plugin", "info", output.to_str().unwrap()]).contains("bundled Python packages: tinypkg==0.3.1\n"));

    let native = source_package(
        dir.path(),
        "nativepkg",
        "1.0",
        &[("__init__.py", b"from ._speed import fast\n"), ("_speed.cpython-314-wasm32-wasi.so", b"\x00asm not really")],
        "\n[tool.setuptools.package-data]\nnativepkg = [\"*.so\"]\n",
    );
    let module = dir.path().join("uses_native.py");
    std::fs::write(&module, format!("import nativepkg\n{REWARD_HEAD}    return 1.0\n")).unwrap();
    let (tool, marker) = stand_in_componentize_py(dir.path());
    let refused = smallrl_with(&["plugin", "build", module.to_str().unwrap(), "--package", native.to_str().unwrap()], &[("SMALLRL_COMPONENTIZE_PY", &tool)]);
    let said = stderr(&refused);
    assert!(!refused.status.success());
    assert!(
        said.contains("nativepkg 1.0 has native code (the compiled extension nativepkg/_speed.cpython-314-wasm32-wasi.so)")
            && said.contains("cannot load compiled extensions, so only pure-Python packages can be bundled"),
        "{said}"
    );
    assert!(!dir.path().join("uses_native.wasm").exists() && !marker.exists(), "refused before componentize-py ran");
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// Issue 47.3, the edit cycle: a rebuild after a one-line edit is the cached base component and
/// the module's new files. componentize-py does not run (a stand-in that fails is the tool), the
/// cached base is unchanged, nothing is compiled again (the compiled-code caches gain no entry:
/// the host compiles the file less the module's files, which is the base), and the score is
/// the edited formula's.
#[test]
fn an_edit_rebuilds_on_the_cached_base_and_compiles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache/wasmtime");
    let env = [("SMALLRL_PLUGIN_CACHE", cache.as_path())];
    let module = dir.path().join("bangs.py");
    std::fs::write(&module, format!("{REWARD_HEAD}    return min(sample.completion.count('!') / 4, 1.0)\n")).unwrap();
    let wasm = dir.path().join("bangs.wasm");
    let build_and_score = |extra: &[(&str, &Path)]| {
        let built = smallrl_with(&["plugin", "build", module.to_str().unwrap()], &[env.as_slice(), extra].concat());
        assert!(built.status.success(), "{}", stderr(&built));
        let scored = smallrl_with(&["plugin", "score", wasm.to_str().unwrap(), "--text", "a! b!"], &env);
        assert!(scored.status.success(), "{}", stderr(&scored));
        String::from_utf8_lossy(&scored.stdout).split('\t').next().unwrap().to_string()
    };
    assert_eq!(build_and_score(&[]), "0.500000", "2 of 4 marks");
    let compiled = |dir: &str| files_under(&cache.with_file_name(dir)).into_iter().filter(|path| path.extension().is_none_or(|e| e != "stats")).count();
    let (modules, functions) = (compiled("wasmtime"), compiled("wasmtime-functions"));
    let builds = cache.with_file_name("python-builds");
    let bases: Vec<(PathBuf, Vec<u8>)> = files_under(&builds).into_iter().map(|path| (path.clone(), std::fs::read(path).unwrap())).collect();
    assert_eq!(bases.len(), 1, "one base: {bases:?}");

    std::fs::write(&module, std::fs::read_to_string(&module).unwrap().replace("/ 4", "/ 2")).unwrap();
    let (tool, marker) = stand_in_componentize_py(dir.path());
    assert_eq!(build_and_score(&[("SMALLRL_COMPONENTIZE_PY", &tool)]), "1.000000", "the edit: 2 of 2 marks");
    assert!(!marker.exists(), "componentize-py ran for an edit");
    let after: Vec<(PathBuf, Vec<u8>)> = files_under(&builds).into_iter().map(|path| (path.clone(), std::fs::read(path).unwrap())).collect();
    assert!(after == bases, "the cached base is unchanged");
    assert_eq!((compiled("wasmtime"), compiled("wasmtime-functions")), (modules, functions), "nothing compiled again");
    the_prune_bounds_the_python_caches(&cache, &wasm, &bases[0].0);
}

/// `plugin cache --prune` after the edit cycle: the two versions' files go (no smallrl holds
/// them) and the recently used base stays; the component loads and scores after it (its files
/// written again); `--keep-days 0` removes the base too.
fn the_prune_bounds_the_python_caches(cache: &Path, wasm: &Path, base: &Path) {
    let env = [("SMALLRL_PLUGIN_CACHE", cache)];
    let sources = cache.with_file_name("python-sources");
    assert_eq!(std::fs::read_dir(&sources).unwrap().count(), 2, "the files of both versions");
    let pruned = smallrl_with(&["plugin", "cache", "--prune"], &env);
    assert!(pruned.status.success(), "{}", stderr(&pruned));
    assert_eq!(String::from_utf8_lossy(&pruned.stdout).matches("removed ").count(), 2, "{}", String::from_utf8_lossy(&pruned.stdout));
    assert_eq!((std::fs::read_dir(&sources).unwrap().count(), base.exists()), (0, true), "the sources go, the base stays");
    let scored = smallrl_with(&["plugin", "score", wasm.to_str().unwrap(), "--text", "a! b!"], &env);
    assert_eq!(String::from_utf8_lossy(&scored.stdout).split('\t').next(), Some("1.000000"), "{}", stderr(&scored));
    assert!(smallrl_with(&["plugin", "cache", "--prune", "--keep-days", "0"], &env).status.success());
    assert!(!base.exists(), "a base unused for longer than the bound goes");
}
