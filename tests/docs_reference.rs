//! The documentation cannot drift from the code: the command-line reference in
//! `docs/src/cli.md` is what clap generates from the binary's definitions, and every relative
//! link in the project's Markdown names a file or folder that exists.

mod common;

use std::path::{Path, PathBuf};

use common::repo_root;

const CLI_REFERENCE: &str = "docs/src/cli.md";

/// Set to rewrite `docs/src/cli.md` from the code instead of comparing.
const WRITE: &str = "SMALLRL_WRITE_DOCS";

#[test]
fn the_command_line_reference_is_generated_from_the_binary() {
    let path = repo_root().join(CLI_REFERENCE);
    let generated = format!("<!-- Generated from the clap definitions by `{WRITE}=1 cargo test --test docs_reference`; do not edit. -->\n\n{}", smallrl::cli::reference_markdown());
    if std::env::var_os(WRITE).is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(committed == generated, "{CLI_REFERENCE} is out of date with the binary's flags: run `{WRITE}=1 cargo test --test docs_reference` and commit it");
    for flag in ["--reward-plugin", "--resume", "--emit", "--chat"] {
        assert!(generated.contains(flag), "the reference lists {flag}");
    }
}

/// Markdown files of the project (not under target/ or a dependency's folder).
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "node_modules" {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The targets of `[text](target)` links in `text`.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        if let Some(end) = after.find(')') {
            out.push(after[..end].trim().to_string());
        }
        rest = after;
    }
    out
}

#[test]
fn every_relative_link_names_a_file_that_exists() {
    let root = repo_root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(files.iter().any(|f| f.ends_with("README.md")), "the walk finds the README");
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for target in link_targets(&text) {
            let path = target.split('#').next().unwrap_or("").split_whitespace().next().unwrap_or("");
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") || path.contains('{') {
                continue;
            }
            let resolved = file.parent().unwrap().join(path);
            if !resolved.exists() {
                broken.push(format!("{}: {target}", file.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(broken.is_empty(), "relative links to nothing:\n{}", broken.join("\n"));
}

#[test]
fn the_link_reader_finds_targets() {
    assert_eq!(link_targets("see [a](docs/a.md#x) and [b](https://x.y) (not a link)"), ["docs/a.md#x", "https://x.y"]);
}
