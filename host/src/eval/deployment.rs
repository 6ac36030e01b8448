//! The original's deployment protocol for a routed run (seven-envs.md section 10): the run's
//! final checkpoint evaluated as the base model and along the forget-scale curve, and the forget
//! scale the deployment rule picks ([`routing::deployed_forget_scale`]: the highest whose
//! monitored hack rate is below the base model's).
//!
//! The base model is the checkpoint with every adapter at scale 0: an adapter's output is
//! multiplied by its scale, so at 0 the network is the frozen base model exactly, evaluated on
//! the same prompts with the same sampling seed as every point of the curve. Its rates are the
//! base rates "before training" the rule needs, with no second model load.
//!
//! `smallrl eval RUN --deploy` writes [`FILE`] into the run directory; sweeps read it.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{EvalReport, to_json};
use crate::adapters::AdapterConfig;
use crate::reward::monitor::key as channel_key;
use crate::routing;

/// The file `smallrl eval RUN --deploy` writes into the run directory.
pub const FILE: &str = "deployment.json";
/// The mode of the base model (every adapter at scale 0) in [`Deployment::modes`].
pub const BASE_MODE: &str = "base";

/// A run's deployment: the base model's rates, the curve, and the scale the rule picked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    /// The checkpoint's step (the run's `max_steps`).
    pub step: usize,
    pub n_samples: usize,
    pub forget_scales: Vec<f64>,
    /// The mode name of each forget scale (retain 1, forget f), in `forget_scales`' order.
    pub curve_modes: Vec<String>,
    /// The base model's monitored hack rate: the rule's threshold.
    pub base_monitored: f64,
    pub deployed_forget_scale: f64,
    /// The mode of the deployed scale in `modes`.
    pub deployed_mode: String,
    /// Every mode's values as a `routing_eval.jsonl` line holds them: [`BASE_MODE`] and the curve.
    pub modes: Map<String, Value>,
}

impl Deployment {
    /// The values of the base model.
    pub fn base(&self) -> &Value {
        &self.modes[BASE_MODE]
    }

    /// The values at the deployed forget scale.
    pub fn deployed(&self) -> &Value {
        &self.modes[&self.deployed_mode]
    }
}

/// The modes `--deploy` evaluates: the base model (every adapter at 0), then retain 1 and forget
/// at each of `forget_scales`.
pub fn modes(adapters: &AdapterConfig, forget_scales: &[f64]) -> Result<Vec<(String, Vec<f64>)>> {
    ensure!(adapters.is_dual(), "--deploy needs retain and forget adapters (DualLoRA or DualMLP); this run has {:?}", adapters.kind);
    // The rule deploys scale 0 (full ablation) when no scale passes, so the curve must hold it.
    ensure!(forget_scales.contains(&0.0), "--forget-scales {forget_scales:?}: the deployment rule falls back to forget scale 0 when no scale passes, so the curve must include 0");
    let mut modes = vec![(BASE_MODE.to_string(), vec![0.0; adapters.slots.len()])];
    modes.extend(routing::scaled_modes(adapters, &[], forget_scales)?);
    Ok(modes)
}

/// The deployment of an evaluation in [`modes`] (the base model first, then the curve).
pub fn from_report(report: &EvalReport, forget_scales: &[f64], n_samples: usize) -> Result<Deployment> {
    ensure!(report.modes.len() == forget_scales.len() + 1 && report.modes[0].mode == BASE_MODE, "a deployment evaluates the base model and then one mode per forget scale");
    let monitored = |mode: &super::ModeReport| -> Result<f64> {
        let channels = mode.channels.with_context(|| {
            format!("the deployment rule compares ground-truth hack rates, but the run has no ground truth (an `environment:` or `rh_ground_truth:`); mode {}", mode.mode)
        })?;
        // Without a hackable prompt more prompts would not help: the environment (or hack_frac
        // 0) offers no hack, as guess_number.
        ensure!(
            mode.hackable.n > 0,
            "mode {}: none of its {} evaluation prompts is hackable (the environment offers no hack on them, or hack_frac is 0), so the deployment rule's monitored hack rate is undefined",
            mode.mode,
            mode.n
        );
        channels.monitored.with_context(|| {
            format!("mode {}: no evaluation sample is hackable and monitored, so its monitored hack rate is undefined; evaluate more prompts (--n-samples)", mode.mode)
        })
    };
    let base_monitored = monitored(&report.modes[0])?;
    let curve_reports = &report.modes[1..];
    let curve = forget_scales.iter().zip(curve_reports).map(|(&scale, mode)| Ok((scale, monitored(mode)?))).collect::<Result<Vec<_>>>()?;
    let deployed_forget_scale = routing::deployed_forget_scale(&curve, base_monitored)?;
    let index = forget_scales.iter().position(|&s| s == deployed_forget_scale).context("the deployed scale is one of the curve's (modes() requires 0)")?;
    let deployed_mode = curve_reports[index].mode.clone();
    let line = to_json(report);
    let modes = line[super::key::MODES].as_object().expect("to_json writes modes").clone();
    Ok(Deployment {
        step: report.step,
        n_samples,
        forget_scales: forget_scales.to_vec(),
        curve_modes: curve_reports.iter().map(|m| m.mode.clone()).collect(),
        base_monitored,
        deployed_forget_scale,
        deployed_mode,
        modes,
    })
}

/// Writes `run_dir/deployment.json` (atomically).
pub fn write(run_dir: &Path, deployment: &Deployment) -> Result<()> {
    let text = serde_json::to_string_pretty(deployment)?;
    crate::fsutil::write_atomic(&run_dir.join(FILE), text.as_bytes())
}

/// `run_dir/deployment.json`, or None when the run has none.
pub fn read(run_dir: &Path) -> Result<Option<Deployment>> {
    let path = run_dir.join(FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let deployment: Deployment = serde_json::from_str(&text).with_context(|| format!("{} is not a deployment `smallrl eval RUN --deploy` wrote; delete it and run that again", path.display()))?;
    ensure!(deployment.modes.contains_key(BASE_MODE) && deployment.modes.contains_key(&deployment.deployed_mode), "{}: the modes lack `{BASE_MODE}` or the deployed mode `{}`", path.display(), deployment.deployed_mode);
    Ok(Some(deployment))
}

/// One line per mode for the terminal: forget scale, monitored / unmonitored / overall
/// ground-truth hack rates, the deployed scale marked.
pub fn format_table(deployment: &Deployment) -> String {
    let rate = |values: &Value, key: &str| values[key].as_f64().map_or("-".to_string(), |v| format!("{v:.3}"));
    let row = |label: &str, values: &Value| {
        format!(
            "  {label:<14} monitored={} unmonitored={} all={} reward={}",
            rate(values, channel_key::TRUE_HACK_FREQ_MONITORED),
            rate(values, channel_key::TRUE_HACK_FREQ_UNMONITORED),
            rate(values, channel_key::TRUE_HACK_FREQ),
            rate(values, super::key::REWARD)
        )
    };
    let mut out = format!("[Deployment @ step {}] true hack rates, n = {}\n{}", deployment.step, deployment.n_samples, row("base model", deployment.base()));
    for (scale, mode) in deployment.forget_scales.iter().zip(&deployment.curve_modes) {
        let mark = if *mode == deployment.deployed_mode { "  <- deployed" } else { "" };
        out.push_str(&format!("\n{}{mark}", row(&format!("forget {scale}"), &deployment.modes[mode])));
    }
    out.push_str(&format!(
        "\ndeployed forget scale: {} (the highest whose monitored hack rate is below the base model's {:.3})",
        deployment.deployed_forget_scale, deployment.base_monitored
    ));
    out
}
