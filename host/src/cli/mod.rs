//! Command-line interface: argument parsing and dispatch to one module per subcommand. Each
//! subcommand module turns its arguments into library calls and prints; no logic lives here.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod plugin;

#[derive(Parser)]
#[command(name = "smallrl", version, about = "GRPO with gradient routing on tiny LLaMA models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect, scaffold and run reward / hack-detector plugins (WebAssembly components).
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
}

pub fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Plugin(command) => plugin::run(command),
    }
}
