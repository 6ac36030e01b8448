//! `smallrl export`: a checkpoint as an HF `LlamaForCausalLM` directory with the adapters merged
//! at chosen scales (e.g. `--scales 1,0` for retain only).

use std::path::PathBuf;

use anyhow::{Result, ensure};
use clap::Args;

use crate::train::checkpoint;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// A `checkpoint-N` directory of a run.
    pub checkpoint: PathBuf,
    /// The new model directory (must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// One scale per adapter slot (DualLoRA: retain,forget). Default: every adapter on.
    #[arg(long, value_delimiter = ',')]
    pub scales: Option<Vec<f64>>,
    /// libtorch intra-op threads.
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(args: ExportArgs) -> Result<()> {
    crate::device::set_threads(args.threads)?;
    let restored = checkpoint::restore_model(&args.checkpoint, tch::Device::Cpu)?;
    let slots = restored.adapters.slots.len();
    let scales = args.scales.unwrap_or_else(|| vec![1.0; slots]);
    ensure!(
        scales.len() == slots,
        "--scales needs {slots} value(s) for adapters {:?}, got {}",
        restored.adapters.slots,
        scales.len()
    );
    crate::model::export::save_hf_dir(&restored.model, &scales, &restored.tokenizer_path, &args.out)?;
    println!("wrote {} (adapters {:?} at scales {scales:?})", args.out.display(), restored.adapters.slots);
    Ok(())
}
