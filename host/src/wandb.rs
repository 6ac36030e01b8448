//! `smallrl wandb-sync`: a run directory into a Weights & Biases run, through the official
//! `wandb` Python SDK (there is no Rust SDK). This side finds the project's Python, reads the
//! run's `config.yaml` with smallrl's YAML reader and runs `scripts/wandb_sync.py` (compiled
//! into the binary, so the script always matches it) with the configuration as JSON on its
//! standard input; the script logs the config, `metrics.jsonl`, `routing_eval.jsonl` and the
//! samples (see its docstring).
//!
//! The run directory is only read, so a failed sync never harms a run and is simply redone.
//! The wandb run id is derived from the run directory's absolute path: syncing the same
//! directory again (after more steps, or after `train --resume`) continues the same wandb run,
//! and two different directories never share one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};

/// The sync script, as compiled into the binary.
pub const SCRIPT: &str = include_str!("../../scripts/wandb_sync.py");

/// Where the project's Python is looked for, beside the checkout that built the binary.
const VENV_PYTHON: &str = ".venv/bin/python";

/// Where a run goes in wandb.
#[derive(Clone, Debug, Default)]
pub struct SyncOptions {
    /// `None`: [`crate::defaults::WANDB_PROJECT`].
    pub project: Option<String>,
    pub entity: Option<String>,
    pub group: Option<String>,
    /// `online`, `offline` or `disabled`; `None` leaves it to `WANDB_MODE`, else wandb's default.
    pub mode: Option<String>,
}

/// The wandb run id of a run directory: `smallrl-` and the first 24 hex digits of the SHA-256
/// of its canonical absolute path (letters, digits and `-` only, as wandb requires).
pub fn run_id(run_dir: &Path) -> Result<String> {
    use sha2::Digest;
    let absolute = run_dir.canonicalize().with_context(|| format!("run directory {} does not exist", run_dir.display()))?;
    let digest = sha2::Sha256::digest(absolute.as_os_str().as_encoded_bytes());
    Ok(format!("smallrl-{}", digest.iter().take(12).map(|byte| format!("{byte:02x}")).collect::<String>()))
}

/// The Python that runs the sync: `$SMALLRL_PYTHON` when set, else the project's venv
/// (`.venv/bin/python`) of the checkout the running binary sits in (`target/<profile>/smallrl`),
/// else that of the checkout it was built from. The error lists what was tried.
pub fn python() -> Result<PathBuf> {
    if let Some(python) = std::env::var_os(crate::defaults::PYTHON_ENV) {
        let python = PathBuf::from(python);
        ensure!(python.is_file(), "{}={} does not exist: point it at a Python with scripts/requirements.txt installed", crate::defaults::PYTHON_ENV, python.display());
        return Ok(python);
    }
    let beside_binary = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join(VENV_PYTHON)));
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(|root| root.join(VENV_PYTHON));
    let candidates: Vec<PathBuf> = beside_binary.into_iter().chain(built_from).collect();
    if let Some(found) = candidates.iter().find(|path| path.is_file()) {
        return Ok(found.clone());
    }
    let tried: Vec<String> = candidates.iter().map(|path| path.display().to_string()).collect();
    bail!(
        "no Python for wandb: tried {}; run `make setup` in the smallrl checkout (it creates .venv with the pinned wandb), or set {} to a Python with scripts/requirements.txt installed",
        tried.join(", "),
        crate::defaults::PYTHON_ENV
    )
}

/// Copies `run_dir` into its wandb run (created, or continued when it exists). Prints the
/// script's output; an error says how to retry.
pub fn sync(run_dir: &Path, options: &SyncOptions) -> Result<()> {
    let config_path = run_dir.join("config.yaml");
    ensure!(config_path.is_file(), "{} is not a smallrl run directory: it has no config.yaml", run_dir.display());
    let config: serde_json::Value = crate::yaml::read_file(&config_path)?;
    let config = serde_json::to_vec(&config).context("a run configuration serializes to JSON")?;
    let python = python()?;
    let id = run_id(run_dir)?;
    let project = options.project.clone().unwrap_or_else(|| crate::defaults::WANDB_PROJECT.to_string());

    let mut command = Command::new(&python);
    command.arg("-c").arg(SCRIPT).arg(run_dir).args(["--id", &id, "--project", &project]);
    for (flag, value) in [("--entity", &options.entity), ("--group", &options.group), ("--mode", &options.mode)] {
        if let Some(value) = value {
            command.args([flag, value]);
        }
    }
    let mut child = command.stdin(Stdio::piped()).spawn().with_context(|| format!("cannot run {}", python.display()))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let written = stdin.write_all(&config);
    drop(stdin);
    let status = child.wait().with_context(|| format!("cannot wait for {}", python.display()))?;
    if !status.success() {
        bail!(
            "wandb sync of {} failed ({status}, the error is above); the run directory was only read, so run the same command again once the cause is fixed",
            run_dir.display()
        );
    }
    written.with_context(|| format!("cannot pass the configuration to {}", python.display()))
}
