//! `smallrl sweep --emit slurm` against a real single-node SLURM (issue 27): Debian's
//! `slurmctld`, `slurmd` and `munge` (installed by `make setup`) started as this test's children
//! with a generated `slurm.conf` on localhost (free ports, every file in a temporary directory,
//! nothing of the machine's own configuration used). A small CPU sweep in packs of 2 is
//! emitted, submitted with `sbatch`, waited for, checked task by task with `scontrol`, and
//! collected; its summary equals that of the same sweep run locally (the runs are
//! deterministic).
//!
//! Skipped, saying why, where the daemons cannot run: not root (slurmd runs jobs as their
//! user, and SlurmUser root keeps the configuration self-contained) or SLURM not installed.
//! When they can run and do not come up, the test fails with their logs.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{repo_root, smallrl};

const DAEMONS: [&str; 3] = ["/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd"];

/// munged, slurmctld and slurmd of one test, stopped (and waited for) when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    children: Vec<(&'static str, Child)>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Cluster {
    fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// A SLURM client command with this cluster's configuration.
    fn client(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", self.conf());
        command
    }

    fn logs(&self) -> String {
        let mut text = String::new();
        for name in ["munged.out", "slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log"] {
            let content = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let tail: Vec<&str> = content.lines().rev().take(15).collect();
            text.push_str(&format!("--- {name}\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n")));
        }
        text
    }
}

/// Why SLURM cannot run here, if it cannot.
fn cannot_run() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref() != Some("0") {
        return Some(format!("not root (uid {uid:?}): the test's slurmctld and slurmd run as root"));
    }
    let missing: Vec<&str> = DAEMONS.iter().copied().filter(|path| !Path::new(path).exists()).collect();
    if !missing.is_empty() {
        return Some(format!("{missing:?} not installed: `make setup` installs slurmctld, slurmd, slurm-client and munge"));
    }
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn(dir: &Path, name: &'static str, program: &str, args: &[String]) -> (&'static str, Child) {
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).unwrap();
    let err = out.try_clone().unwrap();
    let child = Command::new(program).args(args).stdin(Stdio::null()).stdout(out).stderr(err).spawn().unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    (name, child)
}

/// Starts munged, slurmctld and slurmd and waits until the node is idle.
fn start_cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let path = |name: &str| root.join(name).to_string_lossy().into_owned();
    for sub in ["state", "spool"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
    }
    // munge: a fresh key, the socket in the temporary directory.
    std::fs::write(dir.path().join("munge.key"), read_random(1024)).unwrap();
    let chmod = Command::new("chmod").args(["400", &path("munge.key")]).status().unwrap();
    assert!(chmod.success());
    let socket = path("munge.sock");
    let mut cluster = Cluster { dir, children: Vec::new() };
    let munged_args: Vec<String> = vec![
        "--foreground".into(),
        "--force".into(),
        format!("--key-file={}", path("munge.key")),
        format!("--socket={socket}"),
        format!("--pid-file={}", path("munged.pid")),
        format!("--log-file={}", path("munged.log")),
        format!("--seed-file={}", path("munged.seed")),
    ];
    cluster.children.push(spawn(cluster.dir.path(), "munged", DAEMONS[0], &munged_args));
    wait_for(&cluster, "munged's socket", Duration::from_secs(20), || Path::new(&socket).exists());

    // The node as slurmd sees this machine (`slurmd -C`: CPUs, sockets, cores, memory).
    let node = Command::new(DAEMONS[2]).arg("-C").output().unwrap();
    let node = String::from_utf8(node.stdout).unwrap();
    let node = node.lines().find(|line| line.starts_with("NodeName=")).expect("slurmd -C prints the node").to_string();
    let host = node.split_whitespace().next().unwrap().trim_start_matches("NodeName=").to_string();
    let conf = format!(
        "ClusterName=smallrltest\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={}\nSlurmdPort={}\nSlurmUser=root\nSlurmdUser=root\n\
         AuthType=auth/munge\nAuthInfo=socket={socket}\nCredType=cred/munge\nStateSaveLocation={}\nSlurmdSpoolDir={}\n\
         SlurmctldPidFile={}\nSlurmdPidFile={}\nSlurmctldLogFile={}\nSlurmdLogFile={}\n\
         ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
         SchedulerType=sched/backfill\nJobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
         MpiDefault=none\nReturnToService=2\n{node} NodeAddr=127.0.0.1 State=UNKNOWN\n\
         PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
        free_port(),
        free_port(),
        path("state"),
        path("spool"),
        path("slurmctld.pid"),
        path("slurmd.pid"),
        path("slurmctld.log"),
        path("slurmd.log"),
    );
    std::fs::write(cluster.conf(), conf).unwrap();
    let conf_args = |extra: &[&str]| -> Vec<String> { ["-D", "-f", &cluster.conf().to_string_lossy()].iter().chain(extra).map(|s| s.to_string()).collect() };
    let (ctld, slurmd) = (conf_args(&[]), conf_args(&[]));
    cluster.children.push(spawn(cluster.dir.path(), "slurmctld", DAEMONS[1], &ctld));
    cluster.children.push(spawn(cluster.dir.path(), "slurmd", DAEMONS[2], &slurmd));
    wait_for(&cluster, "the node to be idle", Duration::from_secs(60), || {
        let output = cluster.client("sinfo").args(["-h", "-o", "%T"]).output().unwrap();
        String::from_utf8_lossy(&output.stdout).trim() == "idle"
    });
    cluster
}

fn read_random(n: usize) -> Vec<u8> {
    use std::io::Read;
    let mut bytes = vec![0; n];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut bytes).unwrap();
    bytes
}

/// Polls `ready` until it holds; fails with the daemons' logs after `limit` or when one exited.
fn wait_for(cluster: &Cluster, what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        let exited: Vec<String> = cluster.children.iter().map(|(name, child)| (name, child.id())).filter(|(_, pid)| !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(*pid)).map(|(name, _)| name.to_string()).collect();
        assert!(exited.is_empty(), "{exited:?} exited while waiting for {what}:\n{}", cluster.logs());
        assert!(start.elapsed() < limit, "no {what} after {limit:?}:\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
}

/// A 2-seed CPU sweep of tiny DualLoRA runs with their baselines (4 runs), in packs of 2.
fn sweep_args(out: &Path) -> Vec<String> {
    let config = repo_root().join("configs/sentence_length_10_smooth_with_happy.yaml");
    let mut args: Vec<String> = ["sweep", "--config", &config.to_string_lossy(), "--output-dir", &out.to_string_lossy(), "--pack", "2"].map(String::from).to_vec();
    args.extend(["--grid", "seed=1,2", "--fixed"].map(String::from));
    args.extend(common::tiny_sweep_fixed());
    args
}

fn succeeded(output: Output, what: &str) -> String {
    assert!(output.status.success(), "{what} failed:\n{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn an_emitted_sweep_runs_on_a_real_slurm_and_collects_to_the_local_sweeps_table() {
    if let Some(reason) = cannot_run() {
        println!("an_emitted_sweep_runs_on_a_real_slurm_and_collects_to_the_local_sweeps_table: skipped: {reason}");
        return;
    }
    let cluster = start_cluster();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cluster");
    // Each task gets the threads a run of the local sweep below gets (cores / 2 jobs), so that
    // both compute the same numbers; the node has the machine's cores, enough for both tasks.
    let threads = (std::thread::available_parallelism().unwrap().get() / 2).max(1).to_string();
    let mut args = sweep_args(&out);
    args.extend(["--emit", "slurm", "--slurm-partition", "debug", "--slurm-time", "10", "--slurm-cpus-per-task", &threads].map(String::from));
    let stdout = succeeded(smallrl(&args.iter().map(String::as_str).collect::<Vec<_>>()), "smallrl sweep --emit slurm");
    assert!(stdout.contains(&format!("2 array tasks of 2 run(s), 0 GPU(s) and {threads} CPU(s) each")), "{stdout}");

    let submitted = succeeded(cluster.client("sbatch").arg("--parsable").arg(out.join("sweep.sbatch")).output().unwrap(), "sbatch");
    let job = submitted.trim().split(';').next().unwrap().to_string();
    wait_for(&cluster, &format!("job {job} to finish"), Duration::from_secs(600), || {
        let queued = cluster.client("squeue").args(["-h", "-j", &job]).output().unwrap();
        queued.status.success() && queued.stdout.is_empty()
    });
    let shown = succeeded(cluster.client("scontrol").args(["show", "job", &job]).output().unwrap(), "scontrol show job");
    let states: Vec<&str> = shown.split_whitespace().filter(|w| w.starts_with("JobState=") || w.starts_with("ExitCode=")).collect();
    assert_eq!(states, ["JobState=COMPLETED", "ExitCode=0:0", "JobState=COMPLETED", "ExitCode=0:0"], "both array tasks completed:\n{shown}\n{}", cluster.logs());

    let collected = succeeded(smallrl(&["sweep", "--collect", out.to_str().unwrap()]), "smallrl sweep --collect");
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let rows: Vec<&str> = summary.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{collected}");
    assert!(rows.iter().all(|row| row.ends_with(",4,OK")), "every run finished its 4 steps:\n{summary}");
    println!("SLURM job {job}: {states:?}; collected:\n{summary}");
    for log in std::fs::read_dir(out.join("logs")).unwrap() {
        let name = log.unwrap().file_name().to_string_lossy().into_owned();
        assert!(name.starts_with("pack-of-"), "each task logs as a local pack does: {name}");
    }

    // The same sweep on this machine (2 jobs of cores / 2 threads, as the array's tasks): the
    // same table.
    let local = tmp.path().join("local");
    let mut args = sweep_args(&local);
    args.extend(["--jobs", "2"].map(String::from));
    succeeded(smallrl(&args.iter().map(String::as_str).collect::<Vec<_>>()), "the local sweep");
    assert_eq!(std::fs::read_to_string(local.join("summary.csv")).unwrap(), summary, "the cluster's runs are the local runs");
}
