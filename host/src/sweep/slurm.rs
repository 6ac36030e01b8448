//! `--emit slurm`: the runs a sweep would start, as a SLURM array job (one command per array
//! index: one run, or one pack of runs as a local sweep packs them) and a job-list file beside
//! it. Results land in the same layout, so `smallrl sweep --collect DIR` builds the same table
//! and charts afterwards.
//!
//! Resources per array task: `--cpus-per-task` (each run's libtorch threads are its share),
//! `--gres=gpu:N` when the runs are on CUDA (one pack per GPU), and the cluster's
//! `--partition`, `--time`, `--account` and any further `#SBATCH` lines, from
//! [`SlurmOptions`] (`smallrl sweep --slurm-config FILE` and `--slurm-*` flags).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;

use super::plan::{CacheState, Plan, PlannedRun};
use super::runner::{self, log_path, pack_log_path};
use crate::defaults;
use crate::device::DeviceSpec;

/// What the array job asks SLURM for; the keys of `--slurm-config FILE` (YAML).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmOptions {
    /// `#SBATCH --partition=`.
    pub slurm_partition: Option<String>,
    /// `#SBATCH --time=` (SLURM's formats: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`).
    pub slurm_time: Option<String>,
    /// `#SBATCH --account=`.
    pub slurm_account: Option<String>,
    /// GPUs per array task (`#SBATCH --gres=gpu:N`): default 1 when the runs ask for CUDA
    /// (`device: cuda` or `cuda:N`), else none.
    pub slurm_gpus_per_task: Option<usize>,
    /// CPUs per array task (`#SBATCH --cpus-per-task=`): default
    /// [`defaults::SLURM_CPUS_PER_RUN`] per pack worker; each run gets `cpus / pack workers`
    /// libtorch threads.
    pub slurm_cpus_per_task: Option<usize>,
    /// Further `#SBATCH` lines, as written after `#SBATCH ` (e.g. `--mem=16G`, `--qos=short`).
    #[serde(default)]
    pub slurm_sbatch: Vec<String>,
}

impl SlurmOptions {
    /// `--slurm-config FILE`.
    pub fn read(path: &Path) -> Result<Self> {
        crate::yaml::read_file(path).with_context(|| {
            format!("{}: the keys of a SLURM config are slurm_partition, slurm_time, slurm_account, slurm_gpus_per_task, slurm_cpus_per_task, slurm_sbatch (a list)", path.display())
        })
    }

    /// These options with each key that `over` sets replaced (flags over the file).
    pub fn overridden_by(self, over: SlurmOptions) -> Self {
        Self {
            slurm_partition: over.slurm_partition.or(self.slurm_partition),
            slurm_time: over.slurm_time.or(self.slurm_time),
            slurm_account: over.slurm_account.or(self.slurm_account),
            slurm_gpus_per_task: over.slurm_gpus_per_task.or(self.slurm_gpus_per_task),
            slurm_cpus_per_task: over.slurm_cpus_per_task.or(self.slurm_cpus_per_task),
            slurm_sbatch: self.slurm_sbatch.into_iter().chain(over.slurm_sbatch).collect(),
        }
    }
}

/// How the runs are grouped into array tasks.
#[derive(Clone, Copy, Debug)]
pub struct Grouping {
    /// Runs per array task (1: `smallrl train --config`, more: `--pack-config ...`).
    pub pack: usize,
    /// `train --pack-workers` of a pack.
    pub pack_workers: usize,
}

/// What [`emit`] wrote.
#[derive(Debug)]
pub struct Emitted {
    pub script: PathBuf,
    pub tasks: usize,
    pub runs_per_task: usize,
    pub gpus_per_task: usize,
    pub cpus_per_task: usize,
}

/// Whether a run asks for CUDA by its configuration (not whether this machine has a GPU: a
/// cluster's login node usually has none).
pub fn requests_cuda(run: &PlannedRun) -> bool {
    matches!(run.config.device, DeviceSpec::Cuda(_))
}

/// Writes `<output>/sweep.sbatch` and `<output>/jobs.txt`; None when every run is already
/// finished.
pub fn emit(plan: &Plan, exe: &Path, options: &SlurmOptions, grouping: Grouping) -> Result<Option<Emitted>> {
    let to_run: Vec<&PlannedRun> = plan.runs.iter().filter(|r| r.state != CacheState::Finished).collect();
    if to_run.is_empty() {
        return Ok(None);
    }
    let resources = resources(&to_run, options, grouping)?;
    runner::prepare(plan)?;
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let commands: Vec<(String, String)> = to_run
        .chunks(grouping.pack.max(1))
        .map(|runs| {
            let (args, log) = match runs {
                [run] if grouping.pack <= 1 => (runner::train_args(plan, run, resources.threads_per_run), log_path(&plan.output_dir, &run.name)),
                _ => (
                    runner::packed_train_args(plan, runs, resources.threads_per_run, grouping.pack_workers),
                    pack_log_path(&plan.output_dir, &runs[0].name),
                ),
            };
            let words: Vec<String> = std::iter::once(exe.as_os_str()).chain(args.iter().map(|a| a.as_os_str())).map(|w| quote(&w.to_string_lossy())).collect();
            (words.join(" "), quote(&log.to_string_lossy()))
        })
        .collect();
    let jobs: String = commands.iter().map(|(c, log)| format!("{c} > {log} 2>&1\n")).collect();
    crate::fsutil::write_atomic(&plan.output_dir.join("jobs.txt"), jobs.as_bytes())?;
    let script_path = plan.output_dir.join("sweep.sbatch");
    crate::fsutil::write_atomic(&script_path, script(&commands, &cwd, options, &resources, grouping).as_bytes())?;
    Ok(Some(Emitted {
        script: script_path,
        tasks: commands.len(),
        runs_per_task: grouping.pack.max(1),
        gpus_per_task: resources.gpus_per_task,
        cpus_per_task: resources.cpus_per_task,
    }))
}

struct Resources {
    gpus_per_task: usize,
    cpus_per_task: usize,
    threads_per_run: usize,
}

fn resources(runs: &[&PlannedRun], options: &SlurmOptions, grouping: Grouping) -> Result<Resources> {
    ensure!(grouping.pack >= 1 && grouping.pack_workers >= 1, "--pack and --pack-workers must be at least 1");
    let on_cuda = runs.iter().filter(|run| requests_cuda(run)).count();
    ensure!(
        on_cuda == 0 || on_cuda == runs.len(),
        "{on_cuda} of the {} runs ask for CUDA and the others do not: one array job gives every task the same resources; set device for all runs (--fixed device=cuda)",
        runs.len()
    );
    let gpus_per_task = options.slurm_gpus_per_task.unwrap_or(if on_cuda > 0 { defaults::SLURM_GPUS_PER_TASK_ON_CUDA } else { 0 });
    if on_cuda > 0 {
        ensure!(gpus_per_task >= 1, "the runs ask for CUDA (device {}), so slurm_gpus_per_task cannot be 0", runs[0].config.device);
    }
    if gpus_per_task > 0 {
        ensure!(
            !runs.iter().any(|run| run.config.device == DeviceSpec::Cpu),
            "slurm_gpus_per_task is {gpus_per_task}, but the runs are on the CPU (device cpu): give --fixed device=cuda (or auto), or no GPUs"
        );
    }
    if let Some(index) = runs.iter().find_map(|run| match run.config.device {
        DeviceSpec::Cuda(Some(index)) if index >= gpus_per_task.max(1) => Some(index),
        _ => None,
    }) {
        bail!("a run asks for cuda:{index}, but SLURM shows an array task only its own GPU, as cuda:0: use device=cuda");
    }
    ensure!(
        gpus_per_task <= 1,
        "slurm_gpus_per_task is {gpus_per_task}: an array task trains one run or one pack on one GPU, so more would sit idle; put more runs on each GPU with --pack N"
    );
    let cpus_per_task = options.slurm_cpus_per_task.unwrap_or(defaults::SLURM_CPUS_PER_RUN * grouping.pack_workers);
    ensure!(
        cpus_per_task >= grouping.pack_workers,
        "slurm_cpus_per_task is {cpus_per_task}, fewer than the {} pack workers that step the runs at once",
        grouping.pack_workers
    );
    for (key, value) in [("slurm_partition", &options.slurm_partition), ("slurm_account", &options.slurm_account), ("slurm_time", &options.slurm_time)] {
        if let Some(value) = value {
            ensure!(!value.is_empty() && !value.chars().any(char::is_whitespace), "{key} {value:?} must be one word");
        }
    }
    if let Some(time) = &options.slurm_time {
        ensure!(
            time.chars().all(|c| c.is_ascii_digit() || c == ':' || c == '-'),
            "slurm_time {time:?} is not a SLURM time limit: use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
        );
    }
    for line in &options.slurm_sbatch {
        if line.contains('\n') || line.trim().is_empty() {
            bail!("slurm_sbatch line {line:?} must be one non-empty line, e.g. --mem=16G");
        }
    }
    Ok(Resources { gpus_per_task, cpus_per_task, threads_per_run: (cpus_per_task / grouping.pack_workers).max(1) })
}

fn script(commands: &[(String, String)], cwd: &Path, options: &SlurmOptions, resources: &Resources, grouping: Grouping) -> String {
    let unit = if grouping.pack > 1 { format!("one pack of up to {} runs", grouping.pack) } else { "one training run".to_string() };
    let mut text = format!(
        "#!/bin/bash\n# smallrl sweep: {unit} per array index (the same commands, in order, are in jobs.txt).\n\
         #SBATCH --job-name=smallrl-sweep\n#SBATCH --array=0-{}\n#SBATCH --cpus-per-task={}\n",
        commands.len() - 1,
        resources.cpus_per_task,
    );
    if resources.gpus_per_task > 0 {
        text.push_str(&format!("#SBATCH --gres=gpu:{}\n", resources.gpus_per_task));
    }
    for (flag, value) in [("partition", &options.slurm_partition), ("time", &options.slurm_time), ("account", &options.slurm_account)] {
        if let Some(value) = value {
            text.push_str(&format!("#SBATCH --{flag}={value}\n"));
        }
    }
    for line in &options.slurm_sbatch {
        let line = line.trim();
        text.push_str(&format!("#SBATCH {}\n", line.strip_prefix("#SBATCH").map_or(line, str::trim_start)));
    }
    text.push_str(&format!("#SBATCH --output=/dev/null\nset -euo pipefail\ncd {}\ncase \"$SLURM_ARRAY_TASK_ID\" in\n", quote(&cwd.to_string_lossy())));
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
