//! `--emit slurm`: the runs a sweep would start, as a SLURM array job (one command per array
//! index) and a job-list file beside it. Results land in the same layout, so
//! `smallrl sweep --collect DIR` builds the same table and charts afterwards.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::plan::{CacheState, Plan};
use super::runner::{self, log_path};
use crate::defaults;

/// Writes `<output>/sweep.sbatch` and `<output>/jobs.txt`; returns the script's path, or None
/// when every run is already finished.
pub fn emit(plan: &Plan, exe: &Path) -> Result<Option<PathBuf>> {
    runner::prepare(plan)?;
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let commands: Vec<(String, String)> = plan
        .runs
        .iter()
        .filter(|r| r.state != CacheState::Finished)
        .map(|run| {
            let args = runner::train_args(plan, run, defaults::SLURM_CPUS_PER_RUN);
            let words: Vec<String> = std::iter::once(exe.as_os_str()).chain(args.iter().map(|a| a.as_os_str())).map(|w| quote(&w.to_string_lossy())).collect();
            (words.join(" "), quote(&log_path(&plan.output_dir, &run.name).to_string_lossy()))
        })
        .collect();
    if commands.is_empty() {
        return Ok(None);
    }
    let jobs: String = commands.iter().map(|(c, log)| format!("{c} > {log} 2>&1\n")).collect();
    crate::fsutil::write_atomic(&plan.output_dir.join("jobs.txt"), jobs.as_bytes())?;
    let script_path = plan.output_dir.join("sweep.sbatch");
    crate::fsutil::write_atomic(&script_path, script(&commands, &cwd).as_bytes())?;
    Ok(Some(script_path))
}

fn script(commands: &[(String, String)], cwd: &Path) -> String {
    let mut text = format!(
        "#!/bin/bash\n# smallrl sweep: one training run per array index (the same commands, in order, are in jobs.txt).\n\
         #SBATCH --job-name=smallrl-sweep\n#SBATCH --array=0-{}\n#SBATCH --cpus-per-task={}\n#SBATCH --output=/dev/null\nset -euo pipefail\ncd {}\n\
         case \"$SLURM_ARRAY_TASK_ID\" in\n",
        commands.len() - 1,
        defaults::SLURM_CPUS_PER_RUN,
        quote(&cwd.to_string_lossy())
    );
    for (i, (command, log)) in commands.iter().enumerate() {
        text.push_str(&format!("  {i}) exec {command} > {log} 2>&1 ;;\n"));
    }
    text.push_str("  *) echo \"no run for array index $SLURM_ARRAY_TASK_ID\" >&2; exit 1 ;;\nesac\n");
    text
}

/// Single-quotes a word for the shell unless it is plainly safe.
fn quote(word: &str) -> String {
    if !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:+,".contains(c)) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
