//! `smallrl wandb-sync RUN_DIR...`: runs into Weights & Biases (`crate::wandb`).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use crate::defaults;
use crate::wandb::{SyncOptions, sync};

#[derive(Args, Debug)]
pub struct WandbSyncArgs {
    /// Run directories (each with a config.yaml); each becomes the wandb run named like it, and
    /// syncing one again continues that wandb run.
    #[arg(required = true)]
    pub run_dirs: Vec<PathBuf>,
    /// The wandb project.
    #[arg(long, default_value = defaults::WANDB_PROJECT)]
    pub project: String,
    /// The wandb entity (user or team) [default: wandb's: your default entity].
    #[arg(long)]
    pub entity: Option<String>,
    /// The wandb group of the runs (e.g. a sweep's name).
    #[arg(long)]
    pub group: Option<String>,
    /// wandb's mode [default: $WANDB_MODE, else online]; `offline` writes the runs under
    /// $WANDB_DIR (default ./wandb) for a later `wandb sync`.
    #[arg(long, value_parser = ["online", "offline", "disabled"])]
    pub mode: Option<String>,
}

pub fn run(args: WandbSyncArgs) -> Result<()> {
    let options = SyncOptions { project: Some(args.project), entity: args.entity, group: args.group, mode: args.mode };
    let mut failed = Vec::new();
    for run_dir in &args.run_dirs {
        if let Err(error) = sync(run_dir, &options) {
            eprintln!("error: {error:#}");
            failed.push(run_dir.display().to_string());
        }
    }
    if !failed.is_empty() {
        bail!("{} of {} runs were not synced: {} (each error is above; the others were)", failed.len(), args.run_dirs.len(), failed.join(", "));
    }
    Ok(())
}
