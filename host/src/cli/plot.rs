//! `smallrl plot RUN_DIR...`: training curves of any runs.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::defaults;

#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Run directories (each with a metrics.jsonl).
    #[arg(required = true)]
    pub run_dirs: Vec<PathBuf>,
    /// Where curves.png is written.
    #[arg(long, default_value = defaults::PLOT_OUTPUT_DIR)]
    pub out: PathBuf,
}

pub fn run(args: PlotArgs) -> Result<()> {
    let path = crate::sweep::plot::plot_runs(&args.run_dirs, &args.out)?;
    println!("curves: {}", path.display());
    Ok(())
}
