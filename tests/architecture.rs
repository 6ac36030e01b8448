//! ARCHITECTURE.md's dependency table ("What may depend on what") is the crate's: for every
//! top-level module of `host/src`, the modules it names as `crate::<module>` in code (comments
//! and `$crate::` in macro bodies aside) are exactly the ones the table lists, so the document
//! cannot drift from the `use` lines.

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
