//! `smallrl plugin snapshot`: a plugin's results on a file of texts, written as an insta
//! snapshot or checked against the stored one (a failed check leaves `.snap.new` beside it).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::plugin_samples::read_texts;
use crate::model::tokenizer::Tokenizer;
use crate::plugins::{NO_PARAMS, PluginLimits, snapshot as plugin_snapshot};

pub(super) struct SnapshotArgs<'a> {
    pub plugin: &'a Path,
    pub texts: &'a Path,
    pub params: Option<&'a str>,
    pub tokenizer: Option<&'a Path>,
    pub out: &'a Path,
}

pub(super) fn default_snapshot_path(plugin: &Path) -> PathBuf {
    let stem = plugin.file_stem().map_or_else(|| "plugin".into(), |s| s.to_string_lossy().into_owned());
    plugin.with_file_name(crate::defaults::PLUGIN_SNAPSHOT_DIR).join(format!("{stem}.snap"))
}

pub(super) fn snapshot(args: &SnapshotArgs, limits: PluginLimits, check: bool) -> Result<()> {
    let tokenizer = args.tokenizer.map(Tokenizer::from_file).transpose()?;
    let samples = read_texts(args.texts, tokenizer.as_ref())?;
    let source = args.texts.display().to_string();
    let fresh = plugin_snapshot::take(args.plugin, args.params.unwrap_or(NO_PARAMS), limits, &samples, &source, &snapshot_command(args))?;
    if !check {
        // The default directory (`snapshots/` beside the plugin) does not exist in a fresh
        // checkout, nor may a directory given with --out.
        if let Some(dir) = args.out.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create the snapshot directory {}", dir.display()))?;
        }
        crate::fsutil::write_atomic(args.out, fresh.render()?.as_bytes())?;
        // A `.snap.new` a failed --check left is accepted or overruled now: stale either way.
        let pending = plugin_snapshot::pending_path(args.out);
        if pending.exists() {
            std::fs::remove_file(&pending).with_context(|| format!("cannot remove the stale {}", pending.display()))?;
        }
        println!("wrote {} ({} texts)", args.out.display(), samples.len());
        return Ok(());
    }
    anyhow::ensure!(args.out.exists(), "no snapshot at {}: run the same command without --check to write it", args.out.display());
    let stored = plugin_snapshot::PluginSnapshot::read(args.out)?;
    let pending = plugin_snapshot::pending_path(args.out);
    match fresh.check(&stored, args.out) {
        Ok(outcome) => {
            if let plugin_snapshot::CheckOutcome::SameResultsOtherPlugin { stored, now } = outcome {
                println!("note: the snapshot records {stored}, the plugin is {now}; every result is the same (run without --check to record it)");
            }
            println!("{} matches ({} texts)", args.out.display(), samples.len());
            Ok(())
        }
        Err(difference) => {
            crate::fsutil::write_atomic(&pending, fresh.render()?.as_bytes())?;
            Err(difference.context(format!(
                "snapshot check failed; the new results are in {} (accept them with `cargo insta review` or by running without --check)",
                pending.display()
            )))
        }
    }
}

/// The command line that re-takes a snapshot (its header's `expression`).
fn snapshot_command(args: &SnapshotArgs) -> String {
    let mut command = format!("smallrl plugin snapshot {} --texts {}", args.plugin.display(), args.texts.display());
    if let Some(params) = args.params {
        command.push_str(&format!(" --params '{params}'"));
    }
    if let Some(tokenizer) = args.tokenizer {
        command.push_str(&format!(" --tokenizer {}", tokenizer.display()));
    }
    command
}
