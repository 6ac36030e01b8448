//! `smallrl pretrain`: causal-LM training (see `crate::pretrain`).

use anyhow::Result;

pub use crate::pretrain::PretrainConfig as PretrainArgs;

pub fn run(args: PretrainArgs) -> Result<()> {
    let summary = crate::pretrain::run(args)?;
    println!(
        "{}: held-out loss {:.4} -> {:.4}",
        summary.model_dir.display(),
        summary.initial_heldout_loss,
        summary.final_heldout_loss
    );
    Ok(())
}
