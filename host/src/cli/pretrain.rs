//! `smallrl pretrain`: causal-LM training (see `crate::pretrain`).

use anyhow::Result;
use clap::Args;

use crate::hyperparams::parse_override;
use crate::pretrain::{PretrainConfig, PretrainFlags};

#[derive(Args, Debug)]
pub struct PretrainArgs {
    #[command(flatten)]
    pub flags: PretrainFlags,
    /// Any pre-training key as key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

pub fn run(args: PretrainArgs) -> Result<()> {
    let mut keys = args.flags.to_map()?;
    for text in &args.set {
        let (key, value) = parse_override(text)?;
        keys.insert(key, value);
    }
    let config: PretrainConfig = crate::hyperparams::resolve(None, keys, "pre-training configuration")?;
    let summary = crate::pretrain::run(config)?;
    println!(
        "{}: held-out loss {:.4} -> {:.4}",
        summary.model_dir.display(),
        summary.initial_heldout_loss,
        summary.final_heldout_loss
    );
    Ok(())
}
