//! `smallrl plugin snapshot` writes insta snapshot files of a built plugin's results, and
//! `--check` compares with them. The files are read by insta itself (its parser, and its own
//! assertion against the stored file); the results are compared with the plugin's scores, and
//! the recorded SHA-256 with `sha256sum`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{load, standard_plugin};
use smallrl::plugins::Sample;
use smallrl::plugins::snapshot::PluginSnapshot;

/// Edge cases of counting: none, one, several with punctuation, case, a substring, quotes.
const TEXTS: &[&str] = &["a sad day", "a happy day", "happy happy happy!", "Unhappy? \"quoted\" HAPPY"];

struct Case {
    _dir: tempfile::TempDir,
    texts: PathBuf,
    snapshot: PathBuf,
}

fn case() -> Case {
    let dir = tempfile::tempdir().unwrap();
    let texts = dir.path().join("texts.txt");
    std::fs::write(&texts, TEXTS.join("\n") + "\n").unwrap();
    let snapshot = dir.path().join("pinned.snap");
    Case { _dir: dir, texts, snapshot }
}

fn snapshot(case: &Case, plugin: &str, params: &str, check: bool) -> Output {
    let plugin = standard_plugin(plugin);
    let mut command = Command::new(env!("CARGO_BIN_EXE_smallrl"));
    command.args(["plugin", "snapshot"]).arg(&plugin).arg("--texts").arg(&case.texts);
    command.args(["--params", params]).arg("--out").arg(&case.snapshot);
    if check {
        command.arg("--check");
    }
    command.env_remove("RUST_BACKTRACE").output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn succeeded(output: Output) -> String {
    assert!(output.status.success(), "smallrl plugin snapshot failed: {}", stderr(&output));
    String::from_utf8(output.stdout).unwrap()
}

fn scores(plugin: &str, params: &str) -> Vec<f64> {
    let samples: Vec<Sample> = TEXTS.iter().map(|text| Sample { completion: text.to_string(), ..Sample::default() }).collect();
    load(&standard_plugin(plugin), params).score(&samples).unwrap()
}

/// The documented body: per text, the result left-aligned in 20 columns, then the text as a
/// JSON string.
fn expected_body(results: &[f64]) -> String {
    let line = |(result, text): (&f64, &&str)| format!("{result:<20} {}", serde_json::to_string(text).unwrap());
    results.iter().zip(TEXTS).map(line).collect::<Vec<_>>().join("\n")
}

fn sha256sum(path: &Path) -> String {
    let output = Command::new("sha256sum").arg(path).output().expect("sha256sum (coreutils) runs");
    String::from_utf8(output.stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

#[test]
fn writes_a_snapshot_that_insta_reads_and_accepts() {
    let case = case();
    succeeded(snapshot(&case, "happy_count", r#"{"max_count": 2}"#, false));
    let written = std::fs::read(&case.snapshot).unwrap();

    let parsed = insta::Snapshot::from_file(&case.snapshot).expect("insta parses the file");
    assert_eq!(parsed.metadata().source(), Some(case.texts.to_str().unwrap()));
    let expression = parsed.metadata().expression().unwrap();
    assert!(expression.starts_with("smallrl plugin snapshot ") && expression.contains(r#"--params '{"max_count": 2}'"#), "{expression}");
    let body = expected_body(&scores("happy_count", r#"{"max_count": 2}"#));
    assert_eq!(parsed.as_text().unwrap().to_string(), body);

    // insta's own assertion, against the file as the stored snapshot `pinned`.
    insta::with_settings!({ snapshot_path => case.snapshot.parent().unwrap(), prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!("pinned", body);
    });
    assert_eq!(std::fs::read(&case.snapshot).unwrap(), written, "insta found the file up to date and left it alone");

    let identity = PluginSnapshot::read(&case.snapshot).unwrap().identity().clone();
    assert_eq!((identity.plugin.as_str(), identity.kind.as_str()), ("happy_count", "reward"));
    assert_eq!(identity.sha256, sha256sum(&standard_plugin("happy_count")));
    assert_eq!(identity.params, serde_json::json!({"max_count": 2, "whole_word": false}), "given params over the declared defaults");
}

#[test]
fn check_passes_unchanged_and_fails_with_a_diff_after_a_change() {
    let case = case();
    succeeded(snapshot(&case, "happy_binary", "{}", false));
    let stdout = succeeded(snapshot(&case, "happy_binary", "{}", true));
    assert!(stdout.contains("matches (4 texts)"), "{stdout}");

    // Another plugin with the same parameters: happy_exp pays 1 - 2^-count instead of 1.
    let changed = snapshot(&case, "happy_exp", "{}", true);
    assert!(!changed.status.success(), "a changed score fails the check");
    let message = stderr(&changed);
    assert!(message.contains("- plugin: happy_binary") && message.contains("+ plugin: happy_exp"), "{message}");
    let (stored, now) = (scores("happy_binary", "{}"), scores("happy_exp", "{}"));
    assert_ne!(stored[2], now[2]);
    let text = serde_json::to_string(TEXTS[2]).unwrap();
    assert!(message.contains(&format!("- {:<20} {text}", stored[2])), "{message}");
    assert!(message.contains(&format!("+ {:<20} {text}", now[2])), "{message}");
    assert!(message.contains(&format!("  {:<20} {}", now[0], serde_json::to_string(TEXTS[0]).unwrap())), "unchanged lines stay: {message}");
    let pending = insta::Snapshot::from_file(&case.snapshot.with_extension("snap.new")).expect("the pending snapshot parses");
    assert_eq!(pending.as_text().unwrap().to_string(), expected_body(&now));

    // The same plugin with other parameters: the header says which.
    let other_params = snapshot(&case, "happy_binary", r#"{"whole_word": true}"#, true);
    assert!(!other_params.status.success());
    let message = stderr(&other_params);
    assert!(message.contains(r#"- params: {"whole_word":false}"#) && message.contains(r#"+ params: {"whole_word":true}"#), "{message}");
}

#[test]
fn check_without_a_stored_snapshot_says_how_to_write_one() {
    let case = case();
    let output = snapshot(&case, "happy_count", "{}", true);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("without --check to write it"), "{}", stderr(&output));
}

/// A new user in a fresh checkout: `smallrl plugin snapshot plugins/happy.wasm --texts
/// texts.txt` from the repository root, where `plugins/snapshots/` (the default directory)
/// does not exist yet. It is created, and `--check` then finds the file at the same default.
#[test]
fn the_default_snapshot_directory_is_created_in_a_fresh_checkout() {
    let checkout = tempfile::tempdir().unwrap();
    std::fs::create_dir(checkout.path().join("plugins")).unwrap();
    std::fs::copy(standard_plugin("happy"), checkout.path().join("plugins/happy.wasm")).unwrap();
    std::fs::write(checkout.path().join("texts.txt"), TEXTS.join("\n") + "\n").unwrap();
    let default_dir = checkout.path().join("plugins/snapshots");
    assert!(!default_dir.exists());

    let run = |extra: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_smallrl"));
        command.current_dir(checkout.path()).args(["plugin", "snapshot", "plugins/happy.wasm", "--texts", "texts.txt"]).args(extra);
        command.env_remove("RUST_BACKTRACE").output().unwrap()
    };
    let stdout = succeeded(run(&[]));
    assert!(stdout.contains("wrote plugins/snapshots/happy.snap (4 texts)"), "{stdout}");
    let written = default_dir.join("happy.snap");
    let parsed = insta::Snapshot::from_file(&written).expect("insta parses the file");
    // plugins/happy.wasm is the happy_count reward with its default parameters.
    assert_eq!(parsed.as_text().unwrap().to_string(), expected_body(&scores("happy_count", "{}")));
    let entries: Vec<_> = std::fs::read_dir(&default_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(entries, [std::ffi::OsString::from("happy.snap")], "no temporary file is left behind");

    let stdout = succeeded(run(&["--check"]));
    assert!(stdout.contains("plugins/snapshots/happy.snap matches (4 texts)"), "{stdout}");
}

/// Issue 47.5: the `.snap.new` a failed `--check` left is removed once the snapshot is taken
/// again (accepted), so no stale pending snapshot stays beside it.
#[test]
fn taking_the_snapshot_again_removes_the_pending_one() {
    let case = case();
    succeeded(snapshot(&case, "happy_binary", "{}", false));
    assert!(!snapshot(&case, "happy_exp", "{}", true).status.success());
    let pending = case.snapshot.with_extension("snap.new");
    assert!(pending.exists(), "the failed check left the new results");
    succeeded(snapshot(&case, "happy_exp", "{}", false));
    assert!(!pending.exists(), "accepted: nothing pending");
    succeeded(snapshot(&case, "happy_exp", "{}", true));
}
