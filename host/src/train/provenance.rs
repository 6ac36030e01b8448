//! What a run records about its plugin files, so that a resumed run scores with the plugins it
//! started with: the SHA-256 of each file (and of the datasets read for `hf-dataset`
//! parameters, and the judge's weights), in the run's `config.yaml` (`plugin_sha256`).
//!
//! Invariant: a run never continues with a plugin whose bytes differ from the recorded ones
//! unless the user said so (`--accept-changed-plugins`), and then train.log says which changed.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail};

use super::TrainConfig;

/// What [`reconcile`] decided.
#[derive(Debug, PartialEq)]
pub enum Hashes {
    /// The loaded plugins are the recorded ones (or a new run records them now).
    Same,
    /// A run written by a smallrl that did not record hashes: they are recorded now.
    RecordedNow,
    /// Plugins changed and the user accepted it; the line says which.
    Accepted(String),
}

/// Checks the loaded plugins' hashes against those in `cfg` (recorded when a run started, or
/// pinned by a config file) and leaves the loaded ones in `cfg`. `resuming` decides what an
/// empty record means: a new run records, an old run directory is recorded now.
pub fn reconcile(cfg: &mut TrainConfig, loaded: BTreeMap<String, String>, resuming: bool, accept_changed: bool) -> Result<Hashes> {
    if cfg.plugin_sha256.is_empty() {
        cfg.plugin_sha256 = loaded;
        return Ok(if resuming { Hashes::RecordedNow } else { Hashes::Same });
    }
    let changes = differences(&cfg.plugin_sha256, &loaded);
    if changes.is_empty() {
        return Ok(Hashes::Same);
    }
    let listed = changes.join("; ");
    if !accept_changed {
        let what = if resuming { "since the run started" } else { "from the hashes the config pins (plugin_sha256)" };
        let hint = if resuming {
            "restore the original plugin files, or pass --accept-changed-plugins to continue with the new ones (train.log records it)"
        } else {
            "use the pinned plugin files, or remove `plugin_sha256` from the config"
        };
        bail!("plugin files changed {what}: {listed}. A run must score with the plugins it was configured with: {hint}");
    }
    cfg.plugin_sha256 = loaded;
    Ok(Hashes::Accepted(format!("continuing with changed plugin files (--accept-changed-plugins): {listed}")))
}

/// One line per plugin whose hash differs, or that is recorded but not loaded (or the reverse).
fn differences(recorded: &BTreeMap<String, String>, loaded: &BTreeMap<String, String>) -> Vec<String> {
    let mut paths: Vec<&String> = recorded.keys().chain(loaded.keys()).collect();
    paths.sort();
    paths.dedup();
    let short = |hash: Option<&String>| hash.map_or("none".to_string(), |h| h.chars().take(12).collect());
    paths
        .into_iter()
        .filter(|path| recorded.get(*path) != loaded.get(*path))
        .map(|path| format!("{path} (sha256 {} recorded, {} now)", short(recorded.get(path)), short(loaded.get(path))))
        .collect()
}

/// Rewrites `plugin_sha256` in a run directory's `config.yaml` (atomically), keeping every other
/// key as it was saved.
pub fn save_hashes(run_dir: &Path, hashes: &BTreeMap<String, String>) -> Result<()> {
    let path = run_dir.join("config.yaml");
    let mut saved = TrainConfig::resolve(Some(&path), Default::default())?;
    saved.plugin_sha256 = hashes.clone();
    crate::fsutil::write_atomic(&path, crate::yaml::to_string(&saved)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn changed_plugins_are_refused_unless_accepted() {
        let mut cfg = TrainConfig { plugin_sha256: hashes(&[("plugins/a.wasm", "aaaa"), ("plugins/b.wasm", "bbbb")]), ..TrainConfig::default() };
        let loaded = hashes(&[("plugins/a.wasm", "aaaa"), ("plugins/b.wasm", "cccc")]);
        let error = format!("{:#}", reconcile(&mut cfg.clone(), loaded.clone(), true, false).unwrap_err());
        assert!(error.contains("plugins/b.wasm (sha256 bbbb recorded, cccc now)"), "{error}");
        assert!(!error.contains("a.wasm"), "unchanged plugins are not listed: {error}");
        assert!(matches!(reconcile(&mut cfg, loaded.clone(), true, true).unwrap(), Hashes::Accepted(line) if line.contains("b.wasm")));
        assert_eq!(cfg.plugin_sha256, loaded, "the accepted hashes are recorded");
    }

    #[test]
    fn an_empty_record_is_filled() {
        let loaded = hashes(&[("plugins/a.wasm", "aaaa")]);
        let mut cfg = TrainConfig::default();
        assert_eq!(reconcile(&mut cfg, loaded.clone(), false, false).unwrap(), Hashes::Same);
        assert_eq!(cfg.plugin_sha256, loaded);
        let mut old_run = TrainConfig::default();
        assert_eq!(reconcile(&mut old_run, loaded, true, false).unwrap(), Hashes::RecordedNow);
    }
}
