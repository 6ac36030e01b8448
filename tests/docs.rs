//! The documentation against the code. README.md and the book under docs/ (mdBook's layout):
//! every `smallrl <command> --flag` written there exists in the binary (read from its `--help`,
//! which clap writes from the command tree), every key of a key table exists in the
//! hyperparameter table, docs/src/reference.md's key table is the one generated from that table
//! (`SMALLRL_UPDATE_DOCS=1 cargo test --test docs` rewrites it), SUMMARY.md lists every chapter
//! and every relative link (and its `#anchor`) resolves.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use smallrl::hyperparams::Hyperparameters;
use smallrl::train::TrainConfig;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host/ has a parent").to_path_buf()
}

/// README.md and every chapter of the book, with their text.
fn documents() -> Vec<(PathBuf, String)> {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    files.extend(chapter_files());
    files.into_iter().map(|f| (f.clone(), std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display())))).collect()
}

fn chapter_files() -> Vec<PathBuf> {
    let dir = repo_root().join("docs/src");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files
}

/// The command tree: each command path (`["plugin", "snapshot"]`) with the long flags its
/// `--help` lists.
fn command_tree() -> BTreeMap<Vec<String>, BTreeSet<String>> {
    help_tree().into_iter().map(|(path, (flags, _))| (path, flags)).collect()
}

/// Each command path with its long flags and its `--help` text, in the order clap lists them.
fn help_tree() -> Vec<(Vec<String>, (BTreeSet<String>, String))> {
    fn walk(path: Vec<String>, tree: &mut Vec<(Vec<String>, (BTreeSet<String>, String))>) {
        let output = Command::new(env!("CARGO_BIN_EXE_smallrl")).args(&path).arg("--help").env("COLUMNS", "100").output().unwrap();
        assert!(output.status.success(), "smallrl {} --help failed: {}", path.join(" "), String::from_utf8_lossy(&output.stderr));
        let help = String::from_utf8(output.stdout).unwrap();
        let (mut flags, mut subcommands, mut in_commands) = (BTreeSet::new(), Vec::new(), false);
        for line in help.lines() {
            if line.ends_with(':') && !line.starts_with(' ') {
                in_commands = line == "Commands:";
                continue;
            }
            let trimmed = line.trim_start();
            if in_commands && line.starts_with("  ") && !trimmed.is_empty() {
                let name = trimmed.split_whitespace().next().unwrap();
                if name != "help" {
                    subcommands.push(name.to_string());
                }
            } else if trimmed.starts_with('-') {
                if let Some(flag) = trimmed.split([' ', ',', '=']).find(|t| t.starts_with("--")) {
                    flags.insert(flag.to_string());
                }
            }
        }
        tree.push((path.clone(), (flags, help)));
        for sub in subcommands {
            let mut next = path.clone();
            next.push(sub);
            walk(next, tree);
        }
    }
    let mut tree = Vec::new();
    walk(Vec::new(), &mut tree);
    tree
}

/// The pieces of code in a markdown text: each line of a fenced block (a line ending in `\`
/// joined with the next), and each inline code span (newlines as spaces).
fn code_pieces(text: &str) -> Vec<String> {
    let (mut pieces, mut prose, mut fenced, mut pending) = (Vec::new(), String::new(), false, String::new());
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            pending.push_str(line.trim_end().trim_end_matches('\\'));
            pending.push(' ');
            if !line.trim_end().ends_with('\\') {
                pieces.push(std::mem::take(&mut pending));
            }
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    let mut spans = prose.split('`');
    spans.next();
    while let Some(span) = spans.next() {
        pieces.push(span.replace('\n', " "));
        spans.next();
    }
    pieces
}

/// The long flag a token starts with (`[--scales` -> `--scales`, `--slurm-sbatch=--mem=16G` ->
/// `--slurm-sbatch`). A snake_case flag (`--allow_approx_lora_kappa`) is the original Python
/// tool's, which the guides cite beside smallrl's kebab-case ones: not smallrl's.
fn flag_of(token: &str) -> Option<String> {
    let token = token.trim_start_matches(['[', '(', '"', '\'']);
    let rest = token.strip_prefix("--")?;
    let name: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '_').collect();
    if name.contains('_') {
        return None;
    }
    (!name.is_empty() && name.starts_with(|c: char| c.is_ascii_lowercase())).then(|| format!("--{name}"))
}

/// Flags of other programs that the documentation shows beside smallrl's (sbatch's `#SBATCH`
/// lines, the TensorBoard viewer, cargo), `--mem`, the value of `--slurm-sbatch=--mem=16G`, and
/// `--kebab-case`, the guides' name for the spelling of every flag.
const OTHER_PROGRAMS_FLAGS: &[&str] =
    &["--kebab-case", "--array", "--cpus-per-task", "--gres", "--gpus", "--partition", "--time", "--account", "--mem", "--logdir", "--release", "--test", "--lib"];

#[test]
fn every_documented_command_and_flag_exists_in_the_binary() {
    let tree = command_tree();
    let all_flags: BTreeSet<&String> = tree.values().flatten().collect();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (file, text) in documents() {
        let name = file.strip_prefix(repo_root()).unwrap().display().to_string();
        if name == "docs/src/cli.md" {
            continue; // the binary's own help (checked against it by the test below)
        }
        for piece in code_pieces(&text) {
            let piece = piece.split(" # ").next().unwrap();
            let tokens: Vec<&str> = piece.split_whitespace().collect();
            // The command each flag belongs to: the nearest `smallrl <command>` before it on the line.
            let mut current: Option<Vec<Vec<String>>> = None;
            let mut i = 0;
            while i < tokens.len() {
                let token = tokens[i];
                if token == "smallrl" || token.ends_with("/smallrl") {
                    // Alternatives (`bench sample|train`) at each level.
                    let mut paths = vec![Vec::new()];
                    while let Some(next) = tokens.get(i + 1) {
                        let extended: Vec<Vec<String>> = paths
                            .iter()
                            .flat_map(|p: &Vec<String>| next.split('|').map(move |alt| [p.clone(), vec![alt.to_string()]].concat()))
                            .collect();
                        if !extended.is_empty() && extended.iter().all(|p| tree.contains_key(p)) {
                            paths = extended;
                            i += 1;
                        } else {
                            break;
                        }
                    }
                    let first = tokens.get(i + 1).copied().unwrap_or("");
                    if paths == vec![Vec::<String>::new()] && first.starts_with(|c: char| c.is_ascii_lowercase()) && tree.keys().all(|p| p.first().map(String::as_str) != Some(first)) {
                        problems.push(format!("{name}: `smallrl {first}` is not a command (in `{}`)", piece.trim()));
                    }
                    checked += 1;
                    current = Some(paths);
                } else if ["|", "&&", ";", ">", "2>&1"].contains(&token) {
                    current = None;
                } else if let Some(flag) = flag_of(token) {
                    checked += 1;
                    match &current {
                        Some(paths) if paths.iter().any(|p| !p.is_empty()) => {
                            if !paths.iter().any(|p| tree[p].contains(&flag)) {
                                let commands: Vec<String> = paths.iter().map(|p| p.join(" ")).collect();
                                problems.push(format!("{name}: `smallrl {}` has no {flag} (in `{}`)", commands.join("|"), piece.trim()));
                            }
                        }
                        _ => {
                            if !all_flags.contains(&flag) && !OTHER_PROGRAMS_FLAGS.contains(&flag.as_str()) {
                                problems.push(format!("{name}: no smallrl command has {flag} (in `{}`)", piece.trim()));
                            }
                        }
                    }
                }
                i += 1;
            }
        }
    }
    assert!(checked > 200, "only {checked} commands and flags found: is the parser still reading the documentation?");
    assert!(problems.is_empty(), "documented commands or flags that the binary lacks:\n{}", problems.join("\n"));
}

#[test]
fn every_key_in_a_key_table_is_a_hyperparameter() {
    let known: BTreeSet<&str> = TrainConfig::KEYS.iter().map(|k| k.name).collect();
    let (mut problems, mut checked) = (Vec::new(), 0);
    for (file, text) in documents() {
        let mut in_table = false;
        for line in text.lines() {
            if line.starts_with("| key | values (default)") {
                in_table = true;
                continue;
            }
            if !line.starts_with('|') {
                in_table = false;
            }
            if !in_table || line.starts_with("|---") {
                continue;
            }
            let cell = line.split('|').nth(1).unwrap();
            for span in cell.split('`').skip(1).step_by(2) {
                let key = span.split(':').next().unwrap().trim();
                checked += 1;
                if !known.contains(key) {
                    problems.push(format!("{}: `{key}` is not a key of the hyperparameter table (host/src/train/config/mod.rs)", file.display()));
                }
            }
        }
    }
    assert!(checked >= 20, "only {checked} keys found in key tables");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

const GENERATED_BEGIN: &str = "<!-- generated by tests/docs.rs (SMALLRL_UPDATE_DOCS=1 cargo test --test docs): do not edit -->";
const GENERATED_END: &str = "<!-- end of the generated part -->";

/// The key table, from the hyperparameter table itself: name, flag, default, help line.
fn generated_key_table() -> String {
    smallrl::hyperparams::key_reference::<TrainConfig>()
}

/// Checks that the generated part of `chapter` (between the markers) is `expected`, or with
/// `SMALLRL_UPDATE_DOCS` set rewrites it.
fn check_generated(chapter: &str, expected: &str, what: &str) {
    let path = repo_root().join("docs/src").join(chapter);
    let text = std::fs::read_to_string(&path).unwrap();
    let (before, rest) = text.split_once(GENERATED_BEGIN).unwrap_or_else(|| panic!("{chapter} lacks the start marker {GENERATED_BEGIN}"));
    let (generated, after) = rest.split_once(GENERATED_END).unwrap_or_else(|| panic!("{chapter} lacks the end marker {GENERATED_END}"));
    let expected = format!("\n{expected}");
    if generated != expected {
        if std::env::var_os("SMALLRL_UPDATE_DOCS").is_some() {
            std::fs::write(&path, format!("{before}{GENERATED_BEGIN}{expected}{GENERATED_END}{after}")).unwrap();
            println!("rewrote {}", path.display());
        } else {
            panic!("{}'s {what} is out of date: SMALLRL_UPDATE_DOCS=1 cargo test --test docs rewrites it", path.display());
        }
    }
}

/// Every command's `--help`, as clap writes it from the command tree.
fn generated_command_reference() -> String {
    let mut text = String::new();
    for (path, (_, help)) in help_tree() {
        let command = if path.is_empty() { "smallrl".to_string() } else { format!("smallrl {}", path.join(" ")) };
        text.push_str(&format!("\n## {command}\n\n```text\n{}\n```\n", help.trim_end()));
    }
    text
}

#[test]
fn the_command_line_chapter_is_the_binarys_help() {
    check_generated("cli.md", &generated_command_reference(), "command-line reference");
}

#[test]
fn the_reference_chapter_holds_the_generated_key_table() {
    let expected = generated_key_table();
    check_generated("reference.md", &expected, "key table");
    let expected = format!("\n{expected}");
    // Every key is in it once (the generated table is the "vice versa": no key goes undocumented).
    for key in TrainConfig::KEYS {
        assert_eq!(expected.matches(&format!("| `{}` |", key.name)).count(), 1, "{}", key.name);
    }
}

#[test]
fn the_summary_lists_every_chapter() {
    let summary = std::fs::read_to_string(repo_root().join("docs/src/SUMMARY.md")).unwrap();
    assert!(repo_root().join("docs/book.toml").is_file(), "docs/book.toml (mdBook's) is missing");
    let mut chapters = 0;
    for file in chapter_files() {
        let name = file.file_name().unwrap().to_str().unwrap();
        if name != "SUMMARY.md" {
            chapters += 1;
            assert!(summary.contains(&format!("]({name})")), "docs/src/SUMMARY.md does not list {name}");
        }
    }
    assert!(chapters >= 8, "{chapters} chapters");
}

/// GitHub's (and mdBook's) anchor of a heading.
fn anchor(heading: &str) -> String {
    let text = heading.trim_start_matches('#').trim().to_lowercase();
    text.chars().filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ').collect::<String>().replace(' ', "-")
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.insert(anchor(line));
        }
    }
    found
}

#[test]
fn every_relative_link_resolves() {
    let (mut problems, mut checked) = (Vec::new(), 0);
    for (file, text) in documents() {
        for part in text.split("](").skip(1) {
            let Some(target) = part.split(')').next() else { continue };
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            checked += 1;
            let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
            let resolved = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
            if !resolved.exists() {
                problems.push(format!("{}: link to {target}: no {}", file.display(), resolved.display()));
            } else if !fragment.is_empty() {
                let target_text = std::fs::read_to_string(&resolved).unwrap();
                if !anchors(&target_text).contains(fragment) {
                    problems.push(format!("{}: link to {target}: no heading with anchor #{fragment}", file.display()));
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} links found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
