//! `smallrl plugin ...` (owned by the plugin work; see issue 4).
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum PluginCommand {}

pub fn run(command: PluginCommand) -> Result<()> {
    match command {}
}
