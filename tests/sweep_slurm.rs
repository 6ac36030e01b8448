//! `smallrl sweep --emit slurm` for CUDA sweeps (issue 27): GPUs per array task, packs of runs
//! per task as a local CUDA sweep packs them, CPUs per task, and the cluster's partition, time,
//! account and extra `#SBATCH` lines from `--slurm-config` and the `--slurm-*` flags. Checked on
//! the emitted script's text and its job list (each pack's configs resolve to the planned
//! runs); nothing is submitted (no SLURM here).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{repo_root, smallrl};
use serde_json::{Map, Value};
use smallrl::sweep::plan::{self, SweepSpec, parse_fixed, parse_grid};
use smallrl::train::TrainConfig;

const HAPPY_CONFIG: &str = "configs/sentence_length_10_smooth_with_happy.yaml";
const GRID: &str = "seed=1,2,3";

fn config() -> String {
    repo_root().join(HAPPY_CONFIG).to_string_lossy().into_owned()
}

/// `smallrl sweep --config HAPPY --grid seed=1,2,3 --fixed FIXED --emit slurm EXTRA`.
fn emit(out: &Path, fixed: &str, extra: &[&str]) -> Output {
    let config = config();
    let mut args = vec!["sweep", "--config", &config, "--grid", GRID, "--fixed", fixed, "max_steps=4", "--emit", "slurm"];
    args.extend(["--output-dir", out.to_str().unwrap()]);
    args.extend(extra);
    smallrl(&args)
}

fn succeeded(output: Output) -> String {
    assert!(output.status.success(), "smallrl sweep failed:\n{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

fn failed(output: Output) -> String {
    assert!(!output.status.success(), "smallrl sweep should have failed:\n{}", String::from_utf8_lossy(&output.stdout));
    String::from_utf8(output.stderr).unwrap()
}

/// The planned runs' names (3 routed runs and their 3 baselines).
fn planned(out: &Path, fixed: &str) -> BTreeSet<String> {
    let spec = SweepSpec {
        config_files: vec![repo_root().join(HAPPY_CONFIG)],
        fixed: [parse_fixed(fixed).unwrap(), parse_fixed("max_steps=4").unwrap()].into_iter().collect::<Map<String, Value>>(),
        grid: vec![parse_grid(GRID).unwrap()],
        output_dir: out.to_path_buf(),
        intervention_arms: Vec::new(),
    };
    plan::plan(&spec).unwrap().runs.into_iter().map(|run| run.name).collect()
}

/// Every `#SBATCH` line's option, in order.
fn sbatch_lines(script: &str) -> Vec<&str> {
    script.lines().filter_map(|line| line.strip_prefix("#SBATCH ")).collect()
}

/// One job-list line: the run names its `--pack-config` / `--config` files resolve to, the
/// other words after `train`, and its log file.
struct Job {
    runs: Vec<String>,
    options: Vec<String>,
    log: PathBuf,
}

fn read_jobs(out: &Path) -> Vec<Job> {
    let text = std::fs::read_to_string(out.join("jobs.txt")).unwrap();
    text.lines()
        .map(|line| {
            let (command, log) = line.split_once(" > ").unwrap();
            let log = PathBuf::from(log.strip_suffix(" 2>&1").unwrap());
            let words: Vec<&str> = command.split_whitespace().collect();
            assert_eq!(words[1], "train", "{line}");
            let (mut runs, mut options) = (Vec::new(), Vec::new());
            let mut rest = words[2..].iter();
            while let Some(word) = rest.next() {
                match *word {
                    "--config" | "--pack-config" => {
                        let config = TrainConfig::resolve(Some(Path::new(rest.next().unwrap())), Map::new()).unwrap();
                        runs.push(config.run_name().unwrap());
                        options.push(word.to_string());
                    }
                    other => options.push(other.to_string()),
                }
            }
            Job { runs, options, log }
        })
        .collect()
}

/// The script is valid bash and runs exactly the job list's commands, one per array index.
fn check_script_runs_the_jobs(out: &Path, script: &str) {
    let status = std::process::Command::new("bash").arg("-n").arg(out.join("sweep.sbatch")).status().unwrap();
    assert!(status.success(), "bash -n rejects the script:\n{script}");
    let text = std::fs::read_to_string(out.join("jobs.txt")).unwrap();
    for (index, line) in text.lines().enumerate() {
        assert!(script.contains(&format!("  {index}) exec {line} ;;\n")), "array index {index} runs {line}:\n{script}");
    }
}

#[test]
fn a_cuda_sweep_packs_its_runs_on_one_gpu_per_task_with_the_clusters_lines() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cluster");
    let slurm_yaml = dir.path().join("slurm.yaml");
    std::fs::write(&slurm_yaml, "slurm_partition: gpu\nslurm_time: \"2:00:00\"\nslurm_account: lab\nslurm_sbatch: [\"--mem=16G\", \"#SBATCH --constraint=a100\"]\n").unwrap();
    let stdout = succeeded(emit(
        &out,
        "device=cuda",
        &["--pack", "4", "--pack-workers", "2", "--slurm-config", slurm_yaml.to_str().unwrap(), "--slurm-time", "4:00:00", "--slurm-cpus-per-task", "6", "--slurm-sbatch=--qos=short"],
    ));
    assert!(stdout.contains("2 array tasks of 4 run(s), 1 GPU(s) and 6 CPU(s) each"), "{stdout}");

    let script = std::fs::read_to_string(out.join("sweep.sbatch")).unwrap();
    // The flag's time over the file's; the file's extra lines, then the flag's.
    let expected = [
        "--job-name=smallrl-sweep",
        "--array=0-1",
        "--cpus-per-task=6",
        "--gres=gpu:1",
        "--partition=gpu",
        "--time=4:00:00",
        "--account=lab",
        "--mem=16G",
        "--constraint=a100",
        "--qos=short",
        "--output=/dev/null",
    ];
    assert_eq!(sbatch_lines(&script), expected, "{script}");
    check_script_runs_the_jobs(&out, &script);

    let jobs = read_jobs(&out);
    assert_eq!(jobs.len(), 2, "6 runs in packs of 4: 4 + 2");
    assert_eq!(jobs.iter().map(|job| job.runs.len()).collect::<Vec<_>>(), [4, 2]);
    for job in &jobs {
        let mut expected_options = vec!["--pack-config"; job.runs.len()];
        expected_options.extend(["--threads", "3", "--pack-workers", "2"]);
        assert_eq!(job.options, expected_options, "6 CPUs for 2 pack workers: 3 threads a run");
        assert_eq!(job.log, out.join("logs").join(format!("pack-of-{}.log", job.runs[0])), "the log a local sweep's pack writes");
    }
    let emitted: Vec<&String> = jobs.iter().flat_map(|job| &job.runs).collect();
    assert_eq!(emitted.len(), 6);
    assert_eq!(emitted.into_iter().cloned().collect::<BTreeSet<_>>(), planned(&out, "device=cuda"), "each planned run in exactly one pack");
    assert!(planned(&out, "device=cuda").iter().all(|name| !out.join(name).exists()), "emitting runs nothing");
}

#[test]
fn without_pack_a_cuda_sweep_packs_as_a_local_one_and_a_cpu_sweep_asks_for_no_gpu() {
    let dir = tempfile::tempdir().unwrap();
    // On CUDA (asked for, whatever this machine has): min(16, runs) runs a task, one GPU.
    let out = dir.path().join("cuda");
    succeeded(emit(&out, "device=cuda", &[]));
    let script = std::fs::read_to_string(out.join("sweep.sbatch")).unwrap();
    assert_eq!(sbatch_lines(&script), ["--job-name=smallrl-sweep", "--array=0-0", "--cpus-per-task=1", "--gres=gpu:1", "--output=/dev/null"], "{script}");
    let jobs = read_jobs(&out);
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].runs.iter().cloned().collect::<BTreeSet<_>>(), planned(&out, "device=cuda"));
    check_script_runs_the_jobs(&out, &script);

    // On the CPU: one run a task, no GPU, as before.
    let out = dir.path().join("cpu");
    succeeded(emit(&out, "device=cpu", &["--slurm-partition", "cpu"]));
    let script = std::fs::read_to_string(out.join("sweep.sbatch")).unwrap();
    assert_eq!(sbatch_lines(&script), ["--job-name=smallrl-sweep", "--array=0-5", "--cpus-per-task=1", "--partition=cpu", "--output=/dev/null"], "{script}");
    let jobs = read_jobs(&out);
    assert!(jobs.iter().all(|job| job.runs.len() == 1 && job.options == ["--config", "--threads", "1"]));
    for job in &jobs {
        assert_eq!(job.log, out.join("logs").join(format!("{}.log", job.runs[0])));
    }
    check_script_runs_the_jobs(&out, &script);

    // `auto` with a GPU asked for: the node's GPU is used.
    let out = dir.path().join("auto");
    succeeded(emit(&out, "device=auto", &["--slurm-gpus-per-task", "1", "--pack", "3"]));
    let script = std::fs::read_to_string(out.join("sweep.sbatch")).unwrap();
    assert!(sbatch_lines(&script).contains(&"--gres=gpu:1") && sbatch_lines(&script).contains(&"--array=0-1"), "{script}");
}

#[test]
fn inconsistent_slurm_options_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    let message = failed(emit(&out, "device=cpu", &["--slurm-gpus-per-task", "1"]));
    assert!(message.contains("slurm_gpus_per_task is 1, but the runs are on the CPU"), "{message}");
    let message = failed(emit(&out, "device=cuda", &["--slurm-gpus-per-task", "0"]));
    assert!(message.contains("the runs ask for CUDA (device cuda), so slurm_gpus_per_task cannot be 0"), "{message}");
    let message = failed(emit(&out, "device=cuda", &["--slurm-gpus-per-task", "2"]));
    assert!(message.contains("slurm_gpus_per_task is 2") && message.contains("--pack N"), "{message}");
    let message = failed(emit(&out, "device=cuda:1", &[]));
    assert!(message.contains("a run asks for cuda:1, but SLURM shows an array task only its own GPU, as cuda:0"), "{message}");
    let message = failed(emit(&out, "device=cuda", &["--slurm-time", "4h"]));
    assert!(message.contains(r#"slurm_time "4h" is not a SLURM time limit"#), "{message}");
    let message = failed(emit(&out, "device=cuda", &["--pack", "2", "--pack-workers", "2", "--slurm-cpus-per-task", "1"]));
    assert!(message.contains("slurm_cpus_per_task is 1, fewer than the 2 pack workers"), "{message}");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "slurm_partition: gpu\nslurm_gpus: 1\n").unwrap();
    let message = failed(emit(&out, "device=cuda", &["--slurm-config", bad.to_str().unwrap()]));
    assert!(message.contains("bad.yaml") && message.contains("slurm_gpus") && message.contains("slurm_gpus_per_task"), "{message}");
    assert!(!out.join("sweep.sbatch").exists(), "nothing is written when the options are refused");

    let message = failed(smallrl(&["sweep", "--config", &config(), "--slurm-partition", "gpu", "--dry-run"]));
    assert!(message.contains("add --emit slurm"), "the --slurm-* flags need --emit slurm: {message}");
}
