//! ARCHITECTURE.md's dependency table ("What may depend on what") is the crate's: for every
//! top-level module of `host/src`, the modules it names as `crate::<module>` in code (comments
//! and `$crate::` in macro bodies aside) are exactly the ones the table lists, so the document
//! cannot drift from the `use` lines. Beyond the table: no import circle among the modules of
//! any folder (at every level, in both crates), and no source file over 600 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Top-level modules: `src/<name>.rs` and `src/<name>/` (lib.rs and main.rs aside).
fn modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| match p.extension() {
            Some(ext) if ext == "rs" => p.file_stem().map(|s| s.to_string_lossy().into_owned()),
            None if p.is_dir() => p.file_name().map(|s| s.to_string_lossy().into_owned()),
            _ => None,
        })
        .filter(|m| m != "lib" && m != "main")
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The identifiers after each `crate::` (and inside `crate::{...}`) in a line of code.
fn crate_paths(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let macro_path = rest[..at].ends_with('$');
        let after = &rest[at + "crate::".len()..];
        if !macro_path {
            if let Some(group) = after.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                out.extend(group.split(',').map(|item| item.trim().split("::").next().unwrap_or("").to_string()));
            } else {
                out.push(after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
            }
        }
        rest = after;
    }
    out
}

fn actual_dependencies(src: &Path, modules: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut deps: BTreeMap<String, BTreeSet<String>> = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        let Some(set) = deps.get_mut(&module) else { continue };
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for target in crate_paths(line) {
                if target != module && modules.contains(&target) {
                    set.insert(target);
                }
            }
        }
    }
    deps
}

/// The table: the first fenced block after "## What may depend on what", one `module → a, b`
/// line per module (text in parentheses is commentary: external crates, what is used).
fn documented_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).unwrap();
    let section = doc.split("## What may depend on what").nth(1).expect("ARCHITECTURE.md has the dependency section");
    let block = section.split("```").nth(1).expect("the section has a fenced table");
    let mut table = BTreeMap::new();
    for line in block.lines().filter(|l| l.contains('→')) {
        let (module, targets) = line.split_once('→').unwrap();
        let mut plain = String::new();
        let mut depth = 0;
        for c in targets.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => plain.push(c),
                _ => {}
            }
        }
        let targets = plain.split(',').map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect();
        assert!(table.insert(module.trim().to_string(), targets).is_none(), "{} is listed twice", module.trim());
    }
    table
}

#[test]
fn the_dependency_table_matches_the_code() {
    let src = repo_root().join("host/src");
    let modules = modules(&src);
    let actual = actual_dependencies(&src, &modules);
    let documented = documented_dependencies();
    let listed: BTreeSet<String> = documented.keys().cloned().collect();
    assert_eq!(listed, modules, "ARCHITECTURE.md must list every top-level module of host/src once");
    let mut wrong = Vec::new();
    for (module, uses) in &actual {
        let table = &documented[module];
        let undocumented: Vec<&String> = uses.difference(table).collect();
        let unused: Vec<&String> = table.difference(uses).collect();
        if !undocumented.is_empty() || !unused.is_empty() {
            wrong.push(format!("{module}: uses but not listed {undocumented:?}; listed but not used {unused:?}"));
        }
    }
    assert!(wrong.is_empty(), "ARCHITECTURE.md's dependency table is out of date:\n{}", wrong.join("\n"));
}

#[test]
fn the_parse_reads_use_lines_and_skips_macro_paths() {
    assert_eq!(crate_paths("use crate::{adapters::Ranks, model};"), ["adapters", "model"]);
    assert_eq!(crate_paths("let x = crate::yaml::from_str(s)?; crate::fsutil::write(p)"), ["yaml", "fsutil"]);
    assert!(crate_paths("impl $crate::hyperparams::FlagValue for X").is_empty());
}

/// A file's module path inside its crate: `a/b.rs` is `[a, b]`, `a/mod.rs` is `[a]`, the root `[]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file.strip_prefix(src).unwrap().with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// Every module path a line of code names, absolute: `crate::a::b`, `super::x`, `self::y`, with
/// `{...}` groups expanded one level (`crate::a::{b, c}` names `a::b` and `a::c`).
fn named_paths(line: &str, module: &[String]) -> Vec<Vec<String>> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut at = 0;
    while at < line.len() {
        let rest = &line[at..];
        let boundary = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b'$' || bytes[at - 1] == b':');
        let base: Option<(Vec<String>, usize)> = if !boundary {
            None
        } else if rest.starts_with("crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("self::") {
            Some((module.to_vec(), "self::".len()))
        } else if rest.starts_with("super::") {
            let mut base = module.to_vec();
            let mut len = 0;
            while rest[len..].starts_with("super::") {
                base.pop();
                len += "super::".len();
            }
            Some((base, len))
        } else {
            None
        };
        let Some((mut path, len)) = base else {
            at += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let mut tail = &rest[len..];
        loop {
            if let Some(group) = tail.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                out.extend(group.split(',').map(|item| [path.clone(), vec![ident(item.trim())]].concat()));
                break;
            }
            let name = ident(tail);
            if name.is_empty() {
                out.push(path);
                break;
            }
            path.push(name.clone());
            tail = &tail[name.len()..];
            match tail.strip_prefix("::") {
                Some(next) => tail = next,
                None => {
                    out.push(path);
                    break;
                }
            }
        }
        at += len;
    }
    out
}

/// The module paths of a crate (from its files) and, per file's module, the paths it names.
fn crate_graph(src: &Path) -> (BTreeSet<Vec<String>>, Vec<(Vec<String>, Vec<Vec<String>>)>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(src, f)).collect();
    let uses = files
        .iter()
        .map(|file| {
            let module = module_path(src, file);
            let text = std::fs::read_to_string(file).unwrap();
            let named = text.lines().filter(|l| !l.trim_start().starts_with("//")).flat_map(|l| named_paths(l, &module)).collect();
            (module, named)
        })
        .collect();
    (modules, uses)
}

/// For each folder F, the graph over its child modules: a -> b when code in F::a (or below it)
/// names F::b (or below it). Returns the first circle found, as names.
fn folder_circles(src: &Path) -> Vec<String> {
    let (modules, uses) = crate_graph(src);
    let mut circles = Vec::new();
    let folders: BTreeSet<Vec<String>> = modules.iter().filter(|m| !m.is_empty()).map(|m| m[..m.len() - 1].to_vec()).collect();
    for folder in folders {
        let children: BTreeSet<String> = modules.iter().filter(|m| m.len() == folder.len() + 1 && m.starts_with(&folder)).map(|m| m[folder.len()].clone()).collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, named) in &uses {
            if module.len() <= folder.len() || !module.starts_with(&folder) {
                continue;
            }
            let from = &module[folder.len()];
            for path in named {
                if path.len() > folder.len() && path.starts_with(&folder) && children.contains(&path[folder.len()]) && &path[folder.len()] != from {
                    edges.entry(from.clone()).or_default().insert(path[folder.len()].clone());
                }
            }
        }
        if let Some(circle) = find_circle(&edges) {
            circles.push(format!("{}: {}", if folder.is_empty() { "(crate root)".to_string() } else { folder.join("/") }, circle.join(" -> ")));
        }
    }
    circles
}

/// A circle in a directed graph (depth-first search), as the nodes along it.
fn find_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(node: &str, edges: &BTreeMap<String, BTreeSet<String>>, stack: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            return Some([&stack[at..], &[node.to_string()]].concat());
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, edges, stack, done) {
                return Some(circle);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_folder_has_an_import_circle() {
    let mut circles = Vec::new();
    for src in ["host/src", "host/native/src"] {
        circles.extend(folder_circles(&repo_root().join(src)).into_iter().map(|c| format!("{src}: {c}")));
    }
    assert!(circles.is_empty(), "import circles (move the shared item to the module both sides need, or down a level):\n{}", circles.join("\n"));
}

#[test]
fn the_circle_finder_sees_circles_through_super_crate_and_groups() {
    let module = vec!["train".to_string(), "rollout".to_string()];
    let named = named_paths("use super::{dump, dynamic::Flags}; let x = crate::train::step::run(); $crate::a::b", &module);
    let strings: Vec<String> = named.iter().map(|p| p.join("::")).collect();
    assert_eq!(strings, ["train::dump", "train::dynamic", "train::step::run"]);
    let edges: BTreeMap<String, BTreeSet<String>> =
        [("a", &["b"][..]), ("b", &["c"]), ("c", &["a"])].iter().map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect())).collect();
    assert_eq!(find_circle(&edges), Some(vec!["a".to_string(), "b".into(), "c".into(), "a".into()]));
    let acyclic: BTreeMap<String, BTreeSet<String>> = [("a", &["b", "c"][..]), ("b", &["c"])].iter().map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect())).collect();
    assert_eq!(find_circle(&acyclic), None);
}

/// The most lines a source file may have: past it, a file holds more than one concern.
const MAX_FILE_LINES: usize = 600;

#[test]
fn no_source_file_is_over_600_lines() {
    let mut files = Vec::new();
    for dir in ["host/src", "host/native/src", "tests", "plugins"] {
        rust_files_outside_target(&repo_root().join(dir), &mut files);
    }
    assert!(files.len() > 50, "the walk found the sources ({} files)", files.len());
    let long: Vec<String> = files
        .iter()
        .map(|f| (f, std::fs::read_to_string(f).unwrap().lines().count()))
        .filter(|(_, lines)| *lines > MAX_FILE_LINES)
        .map(|(f, lines)| format!("{} ({lines} lines)", f.strip_prefix(repo_root()).unwrap().display()))
        .collect();
    assert!(long.is_empty(), "files over {MAX_FILE_LINES} lines: split them by concern:\n{}", long.join("\n"));
}

fn rust_files_outside_target(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files_outside_target(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every file name ARCHITECTURE.md (and plugins/ARCHITECTURE-plugins.md) gives in backticks or
/// in the step diagram (`llama.rs`, `train/draw/pipeline.rs`, `tests/train/resume.rs`) is a file
/// of the repository: some file's path ends with it. The map cannot name a file that was moved
/// or removed. Both documents stay under 15,000 bytes (a map, not a manual).
#[test]
fn every_file_the_architecture_names_exists() {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in ["host", "plugins", "tests", "scripts", "wit", "docs", "configs"] {
        all_files(&root.join(dir), &mut files);
    }
    let paths: Vec<String> = files.iter().map(|f| format!("/{}", f.strip_prefix(&root).unwrap().to_string_lossy())).collect();
    let mut missing = Vec::new();
    for doc in ["ARCHITECTURE.md", "plugins/ARCHITECTURE-plugins.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        assert!(text.len() < 15_000, "{doc} is {} bytes: keep the map under 15,000", text.len());
        for name in named_files(&text) {
            if !paths.iter().any(|p| p.ends_with(&format!("/{name}"))) {
                missing.push(format!("{doc}: {name}"));
            }
        }
    }
    assert!(missing.is_empty(), "named but not in the repository:\n{}", missing.join("\n"));
}

/// The words of `text` that name a source or document file (`a/b.rs`, `x.md`, `y.sh`, `z.py`,
/// `w.wit`), without the punctuation around them.
fn named_files(text: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || "_-./".contains(c);
    text.split(|c: char| !is_name(c))
        .map(|w| w.trim_matches('.').trim_start_matches("./").to_string())
        .filter(|w| [".rs", ".md", ".sh", ".py", ".wit"].iter().any(|ext| w.ends_with(ext)) && !w.starts_with('/') && !w.contains(".."))
        .collect()
}

fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for path in entries.map(|e| e.unwrap().path()) {
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() && name != "target" && !name.starts_with('.') {
            all_files(&path, out);
        } else if path.is_file() {
            out.push(path);
        }
    }
}

#[test]
fn file_names_are_read_from_prose_and_diagrams() {
    let names = named_files("see `llama.rs` and (`tests/train/resume.rs`), train/step.rs. Also docs.\n │ train/recipe.rs  x.md");
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["llama.rs", "tests/train/resume.rs", "train/recipe.rs", "train/step.rs", "x.md"]);
}
