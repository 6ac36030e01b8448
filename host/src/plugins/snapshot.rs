//! `smallrl plugin snapshot`: a built plugin's results on a file of texts as an insta snapshot
//! file, so a lab pins its reward plugins in CI without writing Rust, and `cargo insta review`
//! and insta's documentation apply.
//!
//! The file is insta's text-snapshot format: a YAML header between `---` lines (`source`: the
//! texts file; `expression`: the command that takes the snapshot; `info`: the plugin's name,
//! version, kind, SHA-256 and resolved parameters), then the body, one line per text. As in
//! insta, the body is what is compared, and the parameters must agree too; another build of
//! the plugin with the same results passes with a note.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Plugin, PluginInfo, PluginKind, PluginLimits, Sample};

/// What the header's `info` records about the plugin.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PluginIdentity {
    pub plugin: String,
    pub version: String,
    pub kind: String,
    pub sha256: String,
    /// Every parameter: the given ones over the plugin's declared defaults.
    pub params: Value,
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    source: String,
    expression: String,
    info: PluginIdentity,
}

/// A snapshot taken now or read from a file.
#[derive(Debug)]
pub struct PluginSnapshot {
    header: Header,
    /// One line per text: the result, then the text as a JSON string (and its prompt and
    /// end-of-sequence flag when they are not the defaults).
    body: String,
}

/// What `--check` found.
#[derive(Debug, PartialEq)]
pub enum CheckOutcome {
    Same,
    /// Same results from another build (different version or SHA-256): worth re-recording.
    SameResultsOtherPlugin { stored: String, now: String },
}

/// Scores `samples` with the plugin at `path` (under `limits`) and builds its snapshot.
/// `source` is how the texts file is named in the header, `expression` the command that
/// re-takes it.
pub fn take(path: &Path, params_json: &str, limits: PluginLimits, samples: &[Sample], source: &str, expression: &str) -> Result<PluginSnapshot> {
    ensure!(!samples.is_empty(), "{source} has no texts to snapshot");
    let bytes = std::fs::read(path).with_context(|| format!("cannot read plugin {}", path.display()))?;
    let mut plugin = Plugin::load(path, params_json, limits)?;
    let results: Vec<String> = match plugin.kind() {
        PluginKind::Reward => plugin.score_optional(samples)?.iter().map(|score| score.map_or_else(|| "none".to_string(), |score| score.to_string())).collect(),
        PluginKind::Detector => plugin.detect(samples)?.iter().map(bool::to_string).collect(),
        PluginKind::Environment => anyhow::bail!("{} is an environment: its snapshot tests live in its crate (plugins/sorting/src/tests.rs)", plugin.label()),
    };
    let info = identity(plugin.info(), &bytes, params_json)?;
    let body = results.iter().zip(samples).map(|(result, sample)| body_line(result, sample)).collect::<Vec<_>>().join("\n");
    Ok(PluginSnapshot { header: Header { source: source.into(), expression: expression.into(), info }, body })
}

fn identity(info: &PluginInfo, bytes: &[u8], params_json: &str) -> Result<PluginIdentity> {
    let mut params = serde_json::Map::new();
    for param in &info.params {
        let default = serde_json::from_str(&param.default_json)
            .with_context(|| format!("plugin {} declares a default for {} that is not JSON", info.name, param.name))?;
        params.insert(param.name.clone(), default);
    }
    // `Plugin::load` accepted only a JSON object.
    let given: serde_json::Map<String, Value> = serde_json::from_str(params_json).with_context(|| format!("--params {params_json} is not a JSON object"))?;
    params.extend(given);
    Ok(PluginIdentity {
        plugin: info.name.clone(),
        version: info.version.clone(),
        kind: info.kind.to_string(),
        sha256: super::sha256_hex(bytes),
        params: Value::Object(params),
    })
}

fn body_line(result: &str, sample: &Sample) -> String {
    let quoted = |text: &str| serde_json::to_string(text).expect("strings serialize");
    let mut line = format!("{result:<20} {}", quoted(&sample.completion));
    if !sample.prompt.is_empty() {
        line.push_str(&format!("  prompt={}", quoted(&sample.prompt)));
    }
    if !sample.ended_with_eos {
        line.push_str("  no_eos");
    }
    line
}

impl PluginSnapshot {
    pub fn identity(&self) -> &PluginIdentity {
        &self.header.info
    }

    /// The file's text: the YAML header between `---` lines, then the body.
    pub fn render(&self) -> Result<String> {
        let header = crate::yaml::to_string(&self.header)?;
        Ok(format!("---\n{header}---\n{}\n", self.body))
    }

    /// Reads a snapshot file this command wrote (or `cargo insta review` accepted).
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read snapshot {}", path.display()))?;
        let text = text.replace("\r\n", "\n");
        let parts = text.strip_prefix("---\n").and_then(|rest| rest.split_once("\n---\n"));
        let (header, body) = parts.with_context(|| format!("{} is not an insta snapshot file (a `---` header, then the body)", path.display()))?;
        let header: Header = crate::yaml::from_str(header)
            .with_context(|| format!("{}: the header lacks source, expression or info (plugin, version, kind, sha256, params)", path.display()))?;
        Ok(Self { header, body: body.to_string() })
    }

    /// Compares this fresh snapshot with `stored` the way insta does (the body, trailing
    /// whitespace ignored) and the parameters; the error says what changed, with a line diff.
    pub fn check(&self, stored: &PluginSnapshot, stored_path: &Path) -> Result<CheckOutcome> {
        let (now, then) = (&self.header.info, &stored.header.info);
        let (fresh_body, stored_body) = (self.body.trim_end(), stored.body.trim_end());
        if fresh_body != stored_body || now.params != then.params {
            let header = [("plugin", describe(then), describe(now)), ("params", then.params.to_string(), now.params.to_string())];
            let header: Vec<String> = header.iter().map(|(label, old, new)| line_diff(&format!("{label}: {old}"), &format!("{label}: {new}"))).collect();
            bail!(
                "the results of {} differ from {} (- stored, + now):\n{}\n{}",
                now.plugin,
                stored_path.display(),
                header.join("\n"),
                line_diff(stored_body, fresh_body)
            );
        }
        if (now.plugin.as_str(), now.version.as_str(), now.sha256.as_str()) != (then.plugin.as_str(), then.version.as_str(), then.sha256.as_str()) {
            return Ok(CheckOutcome::SameResultsOtherPlugin { stored: describe(then), now: describe(now) });
        }
        Ok(CheckOutcome::Same)
    }
}

fn describe(identity: &PluginIdentity) -> String {
    format!("{} {} ({}) sha256 {}", identity.plugin, identity.version, identity.kind, identity.sha256)
}

/// Where insta puts a snapshot awaiting review: `NAME.snap.new` beside `NAME.snap`.
pub fn pending_path(snapshot: &Path) -> PathBuf {
    snapshot.with_extension("snap.new")
}

/// A line diff (`similar`, the diff insta itself uses): every line, `-` stored, `+` now, two
/// spaces unchanged.
fn line_diff(old: &str, new: &str) -> String {
    let (old, new): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let diff = similar::TextDiff::from_slices(&old, &new);
    let marked = |change: similar::Change<&str>| {
        let sign = match change.tag() {
            similar::ChangeTag::Equal => ' ',
            similar::ChangeTag::Delete => '-',
            similar::ChangeTag::Insert => '+',
        };
        format!("{sign} {}", change.value())
    };
    diff.iter_all_changes().map(marked).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_marks_changed_lines_only() {
        let diff = line_diff("1 a\n0.5 b\n0 c", "1 a\n1 b\n0 c\n0 d");
        assert_eq!(diff, "  1 a\n- 0.5 b\n+ 1 b\n  0 c\n+ 0 d");
    }
}
