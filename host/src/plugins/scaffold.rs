//! `smallrl plugin new NAME`: a standalone plugin crate that builds as it is, with native
//! tests (one of them an insta snapshot of the template's results on a few texts, shipped
//! accepted; for `--episode` episodes played by hand), a build script that produces
//! `NAME.wasm`, and the SDK found by relative path.

use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, ensure};

use super::PluginKind;

/// The SDK crate in this checkout (compile-time location of the host crate).
fn sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/sdk")
}

fn componentize_manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/componentize/Cargo.toml")
}

/// Writes the crate to `<dir>/<name>/` and returns that directory.
pub fn scaffold(name: &str, dir: &Path, kind: PluginKind) -> Result<PathBuf> {
    check_name(name)?;
    let (lib, snapshot) = match kind {
        PluginKind::Environment => (super::scaffold_env::lib_rs(name, &type_name(name), SNAPSHOT_TEXTS), super::scaffold_env::template_snapshot(SNAPSHOT_TEXTS)),
        _ => (lib_rs(name, kind), template_snapshot(kind)),
    };
    let extra = if kind == PluginKind::Environment { "serde_json = \"1\"\n" } else { "" };
    write_crate(name, dir, &kind.to_string(), extra, INSTA, vec![("src/lib.rs", lib), (SNAPSHOT_FILE, snapshot)])
}

/// `smallrl plugin new NAME --episode`: an episode environment crate (the SDK's feature
/// `episode`; `scaffold_episode.rs` holds its template, whose own tests play episodes
/// natively), in `<dir>/<name>/`; returns that directory.
pub fn scaffold_episode(name: &str, dir: &Path) -> Result<PathBuf> {
    check_name(name)?;
    write_crate(name, dir, "episode", "serde_json = \"1\"\n", "", vec![("src/lib.rs", super::scaffold_episode::lib_rs(name, &type_name(name)))])
}

/// Writes a crate with the SDK's `feature`, `extra` dependencies and `dev` dev-dependencies
/// (manifest lines), its build script and toolchain file, and `files` (paths in the crate).
fn write_crate(name: &str, dir: &Path, feature: &str, extra: &str, dev: &str, files: Vec<(&str, String)>) -> Result<PathBuf> {
    let crate_dir = dir.join(name);
    ensure!(!crate_dir.exists(), "{} already exists: choose another name or --dir", crate_dir.display());
    std::fs::create_dir_all(crate_dir.join("src")).with_context(|| format!("cannot create {}", crate_dir.join("src").display()))?;
    let canonical = |path: &Path| path.canonicalize().with_context(|| format!("cannot find {}", path.display()));
    let sdk = relative_path(&canonical(&crate_dir)?, &canonical(&sdk_dir())?);
    let componentize = canonical(&componentize_manifest())?;
    let common = [
        ("Cargo.toml", cargo_toml(name, &sdk, feature, extra, dev)),
        ("rust-toolchain.toml", RUST_TOOLCHAIN.to_string()),
        ("build.sh", build_script(name, &componentize)),
    ];
    for (file, contents) in common.into_iter().chain(files) {
        let path = crate_dir.join(file);
        let parent = path.parent().expect("a file in the crate");
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
        std::fs::write(&path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    }
    set_executable(&crate_dir.join("build.sh"))?;
    Ok(crate_dir)
}

/// A plugin name is snake_case: a crate name, a Python module name and a metric name alike.
pub(super) fn check_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    ensure!(valid, "plugin name {name:?} must be snake_case (a-z, 0-9, _; starting with a letter)");
    Ok(())
}

/// The Rust type name for a snake_case plugin name (`my_reward` -> `MyReward`).
fn type_name(name: &str) -> String {
    let capitalize = |part: &str| {
        let mut chars = part.chars();
        chars.next().map(|first| first.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
    };
    name.split('_').map(capitalize).collect()
}

/// `to` relative to `from` when they share a root (so the crate can move with the checkout).
pub(super) fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let ups = std::iter::repeat_n(Component::ParentDir, from.len() - common);
    ups.chain(to[common..].iter().copied()).collect()
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let permissions = std::fs::Permissions::from_mode(0o755);
    std::fs::set_permissions(path, permissions).with_context(|| format!("cannot make {} executable", path.display()))
}

/// The texts the template's snapshot test pins (written into `src/lib.rs`).
const SNAPSHOT_TEXTS: &[&str] = &["", "a sad day", "a happy day", "a happy happy day", "Happy? HAPPY! so unhappy."];
/// Where insta keeps the template's snapshot (`snapshot_path` in the test is relative to `src/`).
const SNAPSHOT_FILE: &str = "snapshots/fixed_texts.snap";
/// The template's parameters at their defaults (`word`, `max_count` in `lib_rs`).
const TEMPLATE_WORD: &str = "happy";
const TEMPLATE_MAX_COUNT: usize = 2;

/// The accepted snapshot of the template's function on `SNAPSHOT_TEXTS`, computed with the SDK
/// helper the template calls, so a fresh crate's `cargo test` passes; `tests/plugin_scaffold.rs`
/// runs that test, so this file and the template cannot drift apart unnoticed.
fn template_snapshot(kind: PluginKind) -> String {
    let result = |text: &str| {
        let count = smallrl_plugin_sdk::text::count_matches(text, TEMPLATE_WORD, false);
        match kind {
            PluginKind::Reward => (count as f64 / TEMPLATE_MAX_COUNT as f64).min(1.0).to_string(),
            PluginKind::Detector => (count >= TEMPLATE_MAX_COUNT).to_string(),
            PluginKind::Environment => unreachable!("scaffold refuses environments"),
        }
    };
    // The generated test's line format: the result, then the text.
    let body: Vec<String> = SNAPSHOT_TEXTS.iter().map(|text| format!("{:<20} {text:?}", result(text))).collect();
    format!("---\nsource: src/lib.rs\nexpression: lines\n---\n{}\n", body.join("\n"))
}

const RUST_TOOLCHAIN: &str = "[toolchain]\nchannel = \"1.95.0\"\ntargets = [\"wasm32-unknown-unknown\"]\nprofile = \"minimal\"\n";

/// The reward, detector and environment templates' snapshot tests.
const INSTA: &str = "# Snapshot tests of your function (`cargo insta review` needs `cargo install cargo-insta`).\ninsta = \"1.49\"\n";

fn cargo_toml(name: &str, sdk: &Path, feature: &str, extra: &str, dev: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"

[lib]
# cdylib: the wasm plugin; rlib: native unit tests (`cargo test`).
crate-type = ["cdylib", "rlib"]

[dependencies]
smallrl-plugin-sdk = {{ path = "{sdk}", features = ["{feature}"] }}
{extra}
[dev-dependencies]
{dev}
# A standalone crate, not a member of the smallrl workspace.
[workspace]

[profile.release]
opt-level = 3
lto = true
codegen-units = 1
panic = "abort"
strip = true
"#,
        sdk = sdk.display(),
    )
}

fn build_script(name: &str, componentize: &Path) -> String {
    format!(
        r#"#!/usr/bin/env bash
# Builds {name}.wasm, a smallrl plugin component, next to this crate.
set -euo pipefail
cd "$(dirname "$0")"
target_dir="${{CARGO_TARGET_DIR:-target}}"
cargo build --quiet --release --target wasm32-unknown-unknown
# The componentizer builds in its own checkout's target directory (`make plugins` built it).
env -u CARGO_TARGET_DIR cargo run --quiet --manifest-path {componentize} -- \
    "$target_dir/wasm32-unknown-unknown/release/{name}.wasm={name}.wasm"
echo "built $(pwd)/{name}.wasm"
"#,
        componentize = componentize.display()
    )
}

fn lib_rs(name: &str, kind: PluginKind) -> String {
    let type_name = type_name(name);
    let (trait_name, method, output, export, body, test_assert) = match kind {
        PluginKind::Reward => (
            "Reward",
            "score",
            "f64",
            "export_reward",
            "let count = text::count_matches(&sample.completion, &self.word, false);\n        (count as f64 / self.max_count as f64).min(1.0)",
            "assert_eq!(plugin.score(&sample(\"a happy happy day\")), 1.0);\n        assert_eq!(plugin.score(&sample(\"a sad day\")), 0.0);",
        ),
        PluginKind::Detector => (
            "Detector",
            "detect",
            "bool",
            "export_detector",
            "text::count_matches(&sample.completion, &self.word, false) as u64 >= self.max_count",
            "assert!(plugin.detect(&sample(\"a happy happy day\")));\n        assert!(!plugin.detect(&sample(\"a happy day\")));",
        ),
        PluginKind::Environment => unreachable!("scaffold refuses environments"),
    };
    format!(
        r#"//! `{name}`: a smallrl {kind} plugin. Edit `{method}` and the parameters, then `./build.sh`
//! and try it: `smallrl plugin score {name}.wasm --text "a happy day"`.

use smallrl_plugin_sdk::{{Param, Params, Plugin, {trait_name}, Sample, text}};

pub struct {type_name} {{
    word: String,
    max_count: u64,
}}

impl Plugin for {type_name} {{
    const NAME: &'static str = "{name}";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "counts `word` in the completion against `max_count`";

    fn params() -> Vec<Param> {{
        vec![
            Param::string("word", "{TEMPLATE_WORD}", "the word to count (substrings count too)"),
            Param::integer("max_count", {TEMPLATE_MAX_COUNT}, "the count that earns the full result"),
        ]
    }}

    fn from_params(params: &Params) -> Result<Self, String> {{
        Ok(Self {{ word: params.string("word"), max_count: params.positive_integer("max_count")? }})
    }}
}}

impl {trait_name} for {type_name} {{
    fn {method}(&self, sample: &Sample) -> {output} {{
        {body}
    }}
}}

smallrl_plugin_sdk::{export}!({type_name});

#[cfg(test)]
mod tests {{
    use super::*;

    fn sample(completion: &str) -> Sample {{
        Sample {{ completion: completion.to_string(), ..Sample::default() }}
    }}

    #[test]
    fn follows_the_formula() {{
        let plugin: {type_name} = smallrl_plugin_sdk::configure("{{}}").unwrap();
        {test_assert}
    }}

    /// The texts the snapshot pins. To pin more behaviour, add texts and run `cargo test`: the
    /// new results wait in `snapshots/fixed_texts.snap.new` until you accept them with
    /// `cargo insta review` (`cargo install cargo-insta`), or with
    /// `INSTA_UPDATE=always cargo test`. Commit `snapshots/`: then a changed result fails the test.
    const TEXTS: &[&str] = &{texts:?};

    #[test]
    fn snapshot_of_fixed_texts() {{
        let plugin: {type_name} = smallrl_plugin_sdk::configure("{{}}").unwrap();
        let lines = TEXTS.iter().map(|text| format!("{{:<20}} {{text:?}}", plugin.{method}(&sample(text)))).collect::<Vec<_>>().join("\n");
        insta::with_settings!({{snapshot_path => "../snapshots", prepend_module_to_snapshot => false}}, {{
            insta::assert_snapshot!("fixed_texts", lines);
        }});
    }}
}}
"#,
        kind = kind,
        texts = SNAPSHOT_TEXTS,
    )
}
