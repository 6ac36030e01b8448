//! Optional views of a run for people watching it, beside `metrics.jsonl` (which stays the
//! record): TensorBoard event files (`tensorboard`) and every generated completion as JSON
//! lines (`log_completions`, `completions.jsonl`). The trainer calls four hooks: after each
//! step, after each routing evaluation, when a batch is generated, and when it resumes.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tch::{Kind, Tensor};

use crate::runlog::Jsonl;
use crate::reward::{Sample, ScoredBatch};
use crate::tensorboard::EventWriter;

/// The TensorBoard tag of the `[Sample @ step N]` text.
pub const SAMPLE_TAG: &str = "sample";
/// Routing-evaluation scalars are tagged `<prefix>/<mode>/<metric>`.
pub const EVAL_TAG_PREFIX: &str = "routing_eval";
pub const COMPLETIONS_FILE: &str = "completions.jsonl";

pub struct LiveLogs {
    tensorboard: Option<EventWriter>,
    completions: Option<Jsonl>,
}

/// A generated batch as the completions log records it.
pub struct BatchRecord<'a> {
    /// The first optimizer step that trains on the batch (1-based, as in metrics.jsonl).
    pub step: usize,
    pub samples: &'a [Sample],
    pub scored: &'a ScoredBatch,
    /// The rewards the advantages came from (`reward - rh_penalty` for flagged samples with
    /// `intervention: penalty`).
    pub trained_rewards: &'a [f64],
    pub component_names: Vec<&'a str>,
    pub advantages: &'a Tensor,
    /// The rows routed as flagged (the placebo's draw with `intervention: placebo`).
    pub routed: &'a [bool],
    pub ablated: &'a [bool],
}

impl LiveLogs {
    /// Opens the logs a run asked for (a new event file per process, as TensorBoard expects).
    pub fn open(run_dir: &Path, tensorboard: bool, log_completions: bool) -> Result<Self> {
        let tensorboard = tensorboard.then(|| EventWriter::create(run_dir)).transpose()?;
        let completions = log_completions.then(|| Jsonl::new(run_dir.join(COMPLETIONS_FILE)));
        Ok(Self { tensorboard, completions })
    }

    /// A resumed run continues after checkpoint step `step`: what the interrupted process
    /// logged after it is dropped (TensorBoard is told to drop it; the completions are cut).
    pub fn resume_after(&mut self, step: usize) -> Result<()> {
        if let Some(writer) = &mut self.tensorboard {
            writer.restart_at(step as u64 + 1)?;
        }
        self.completions.as_ref().map_or(Ok(()), |log| log.truncate_after(step).map(drop))
    }

    /// After a step: every number (and flag) of its metrics line, and the sample shown in the log.
    pub fn step(&mut self, metrics: &Value, sample: Option<(&str, &str)>) -> Result<()> {
        let Some(writer) = &mut self.tensorboard else { return Ok(()) };
        let step = metrics["step"].as_u64().context("a metrics line has no step")?;
        let object = metrics.as_object().context("a metrics line is an object")?;
        let scalars = object.iter().filter(|(key, _)| *key != "step").filter_map(|(key, value)| Some((key.as_str(), scalar(value)?)));
        writer.scalars(step, scalars)?;
        match sample {
            Some((prompt, completion)) => writer.text(SAMPLE_TAG, step, &format!("{prompt} ||| {completion}")),
            None => Ok(()),
        }
    }

    /// After a routing evaluation (a `routing_eval.jsonl` line): each mode's numbers.
    pub fn routing_eval(&mut self, evaluation: &Value) -> Result<()> {
        let Some(writer) = &mut self.tensorboard else { return Ok(()) };
        let step = evaluation["step"].as_u64().context("a routing evaluation has no step")?;
        let modes = evaluation["modes"].as_object().context("a routing evaluation has no modes")?;
        for (mode, values) in modes {
            let values = values.as_object().context("a routing evaluation mode is an object")?;
            let tags: Vec<(String, f64)> =
                values.iter().filter_map(|(key, value)| Some((format!("{EVAL_TAG_PREFIX}/{mode}/{key}"), scalar(value)?))).collect();
            writer.scalars(step, tags.iter().map(|(tag, value)| (tag.as_str(), *value)))?;
        }
        Ok(())
    }

    /// When a batch is generated: one line per completion.
    pub fn batch(&self, record: BatchRecord) -> Result<()> {
        let Some(log) = &self.completions else { return Ok(()) };
        let advantages = Vec::<f64>::try_from(record.advantages.to_kind(Kind::Double).to_device(tch::Device::Cpu))
            .context("advantages are a vector")?;
        let lines: Vec<Value> = record.samples.iter().enumerate().map(|(index, sample)| completion_line(&record, index, sample, advantages[index])).collect();
        log.append_all(&lines)
    }
}

/// A JSON value as a TensorBoard scalar: numbers as they are, booleans as 0 or 1 (a curve of a
/// flag's rate); text and nulls are not scalars.
fn scalar(value: &Value) -> Option<f64> {
    value.as_f64().or_else(|| value.as_bool().map(f64::from))
}

fn completion_line(record: &BatchRecord, index: usize, sample: &Sample, advantage: f64) -> Value {
    let scored = record.scored;
    let flag = |flags: &Option<Vec<bool>>| flags.as_ref().map(|flags| flags[index]);
    let mut line = json!({
        "step": record.step,
        "index": index,
        "prompt": sample.prompt,
        "completion": sample.completion,
        "num_tokens": sample.completion_ids.len(),
        "ended_with_eos": sample.ended_with_eos,
        "reward": scored.reward[index],
        "trained_reward": record.trained_rewards[index],
        "advantage": advantage,
        "detector": flag(&scored.detector_raw),
        "is_rh": flag(&scored.is_rh),
        "hacked": flag(&scored.hacked),
        "routed": record.routed[index],
        "eligible": scored.eligible[index],
        "hackable": scored.hackable[index],
        "monitored": scored.monitored[index],
        "ablated": record.ablated[index],
    });
    for (name, scores) in record.component_names.iter().zip(&scored.components) {
        line[format!("rewards/{name}")] = scores[index].into();
    }
    // The environment's own outcome of this sample (code_tests' `stopped`: its program ran out
    // of fuel, memory or output), beside the means metrics.jsonl logs.
    for (key, values) in &scored.metrics {
        line[key.as_str()] = values[index].into();
    }
    if scored.unscored[index] {
        // No score (`max_no_score_frac`): its rewards and advantage above are placeholders 0.
        line["no_score"] = true.into();
    }
    line
}
