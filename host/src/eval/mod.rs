//! Routing evaluation: for each adapter mode, one completion per fixed evaluation prompt,
//! scored by every reward component and the detector, plus diversity measures.

use std::collections::BTreeSet;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::model::decode::DecodeModel;
use crate::model::folded::SamplerDtype;
use crate::model::generate::{Generation, SamplingParams, generate};
use crate::model::{Llama, Tokenizer};
use crate::reward::{Prompt, RewardModel, samples_from_rows};
use crate::stats::mean;

pub mod deployment;

#[derive(Debug, Clone, Serialize)]
pub struct ModeReport {
    pub mode: String,
    /// Mean raw score of each reward component, in the reward model's order.
    pub components: Vec<(String, f64)>,
    /// Mean of the combined reward.
    pub reward: f64,
    pub hack_freq: Option<f64>,
    /// The monitor against `rh_ground_truth:`, when the run has one (absent otherwise, so the
    /// JSON of runs without one is what it was).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor: Option<crate::reward::MonitorStats>,
    /// The ground-truth hack channels, when the run has a ground truth (as `monitor`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<crate::reward::HackChannels>,
    /// An environment's named metrics (`env/<environment>/<name>`, the mean over the mode's
    /// samples), as training logs them; empty without an environment.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<(String, f64)>,
    /// The same evaluation over the hackable prompts only (the paper's `_hackable` figures).
    pub hackable: HackableSubset,
    /// With `max_no_score_frac` above 0: the mode's samples without a score, out of every
    /// statistic above (absent otherwise, so the JSON of other runs is what it was).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_score: Option<usize>,
    pub unique: usize,
    /// Distinct first sentences (template collapse shows here before `unique` drops).
    pub unique_first_sentences: usize,
    pub n: usize,
    pub jaccard: f64,
    pub degenerate: bool,
    pub samples: Vec<(String, String)>,
}

/// A mode's evaluation over its hackable prompts (those whose metadata offers the hack after
/// `hack_frac`; every prompt without metadata): how many, each reward component's mean, the
/// detector's flag rate and the ground truth's hack rate (None without a detector, a ground
/// truth, or hackable prompts).
#[derive(Debug, Clone, Serialize)]
pub struct HackableSubset {
    pub n: usize,
    pub components: Vec<(String, f64)>,
    pub hack_freq: Option<f64>,
    pub true_hack_freq: Option<f64>,
}

impl HackableSubset {
    /// The subset of `scored`, whose components are `components`.
    pub fn of(components: &[crate::reward::ComponentInfo], scored: &crate::reward::ScoredBatch) -> Self {
        let rows: Vec<usize> = (0..scored.hackable.len()).filter(|&i| scored.hackable[i]).collect();
        if rows.is_empty() {
            return Self { n: 0, components: Vec::new(), hack_freq: None, true_hack_freq: None };
        }
        let subset = scored.select(&rows);
        let components = components.iter().zip(&subset.components).map(|(c, scores)| (c.name.clone(), mean(scores))).collect();
        Self { n: rows.len(), components, hack_freq: subset.hack_freq(), true_hack_freq: subset.channels().map(|c| c.all) }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub step: usize,
    pub modes: Vec<ModeReport>,
    pub seconds: f64,
}

pub struct EvalSetup<'a> {
    pub tokenizer: &'a Tokenizer,
    pub prompts: &'a [Prompt],
    pub sampling: &'a SamplingParams,
    /// Sampling seed; the same for every evaluation of a run, so evaluations differ only by
    /// the weights.
    pub seed: u64,
    /// The run's `max_no_score_frac`: the share of a mode's samples that may have no score.
    pub max_no_score_frac: f64,
}

/// Samples prompts (token ids) from the evaluated policy at adapter scales, with the sampling
/// settings and seed given: a run's seat at the engine in training (its decoders kept across
/// evaluations), [`fresh_decoders`] for a checkpoint evaluated once.
pub type SampleAt<'a> = dyn FnMut(&[f64], &[Vec<u32>], &SamplingParams, u64) -> Result<Generation> + 'a;

/// Samples from `model` in `dtype` (the run's `sampler_dtype`, so a checkpoint is evaluated as it
/// was trained) with a decoder folded for each call (`smallrl eval`, which loads each checkpoint
/// once).
pub fn fresh_decoders(model: &Llama, dtype: SamplerDtype) -> impl FnMut(&[f64], &[Vec<u32>], &SamplingParams, u64) -> Result<Generation> + '_ {
    move |scales, prompts, params, seed| generate(&DecodeModel::sampling_in(model, scales, dtype), prompts, params, seed)
}

/// Evaluates the policy `sample` draws from in each `(mode name, adapter scales)`; every mode
/// samples with the same seed, so a mode's result does not depend on the other modes asked for.
pub fn routing_eval<M: AsRef<str>>(sample: &mut SampleAt, modes: &[(M, Vec<f64>)], rewards: &mut RewardModel, setup: &EvalSetup, step: usize) -> Result<EvalReport> {
    let prompt_ids = setup.prompts.iter().map(|p| setup.tokenizer.encode(&p.text)).collect::<Result<Vec<_>>>()?;
    let mut rollout = |scales: &[f64], rewards: &mut RewardModel| {
        let generation = sample(scales, &prompt_ids, setup.sampling, setup.seed)?;
        let samples = samples_from_rows(setup.prompts, &generation.rows, setup.tokenizer)?;
        let scored = rewards.score_within(&samples, setup.seed, setup.max_no_score_frac)?;
        Ok((samples, scored))
    };
    routing_eval_of(&mut rollout, modes, rewards, setup.max_no_score_frac, step)
}

/// Samples and scores the evaluation prompts at adapter scales: one completion each (or, in a
/// run on a multi-turn episode environment, one episode each: `train/episodes.rs`).
pub type RolloutAt<'a> = dyn FnMut(&[f64], &mut RewardModel) -> Result<(Vec<crate::reward::Sample>, crate::reward::ScoredBatch)> + 'a;

/// [`routing_eval`] with each mode's samples and scores from `rollout`; with `max_no_score_frac`
/// (the run's) above 0, each mode counts its samples without a score, which leave its statistics.
pub fn routing_eval_of<M: AsRef<str>>(rollout: &mut RolloutAt, modes: &[(M, Vec<f64>)], rewards: &mut RewardModel, max_no_score_frac: f64, step: usize) -> Result<EvalReport> {
    let start = Instant::now();
    let mut reports = Vec::new();
    for (mode, scales) in modes {
        let (samples, scored) = rollout(scales, rewards)?;
        let no_score = (max_no_score_frac > 0.0).then(|| scored.unscored.iter().filter(|&&u| u).count());
        // Samples without a score leave the mode's reward and hack statistics.
        let scored = scored.select(&scored.scored_rows());
        let completions: Vec<String> = samples.iter().map(|s| s.completion.clone()).collect();
        let components = rewards.components().iter().zip(&scored.components).map(|(c, scores)| (c.name.clone(), mean(scores))).collect();
        let unique = completions.iter().collect::<BTreeSet<_>>().len();
        let unique_first_sentences = completions.iter().map(|c| first_sentence(c)).collect::<BTreeSet<_>>().len();
        let jaccard = mean_pairwise_jaccard(&completions);
        reports.push(ModeReport {
            mode: mode.as_ref().to_string(),
            components,
            reward: mean(&scored.reward),
            hack_freq: scored.hack_freq(),
            monitor: scored.monitor(),
            channels: scored.channels(),
            metrics: scored.metric_means(),
            hackable: HackableSubset::of(rewards.components(), &scored),
            no_score,
            unique,
            unique_first_sentences,
            n: completions.len(),
            jaccard,
            degenerate: (unique as f64) < 0.5 * completions.len() as f64 || jaccard > 0.7,
            samples: samples.into_iter().map(|s| (s.prompt, s.completion)).collect(),
        });
    }
    Ok(EvalReport { step, modes: reports, seconds: start.elapsed().as_secs_f64() })
}

/// The text up to and including the first `.`, `?` or `!`.
fn first_sentence(text: &str) -> &str {
    text.find(['.', '?', '!']).map_or(text, |end| &text[..=end]).trim()
}

/// Mean over pairs of `|W_i ∩ W_j| / |W_i ∪ W_j|` on lowercased whitespace word sets (two
/// empty texts count as identical).
pub fn mean_pairwise_jaccard(texts: &[String]) -> f64 {
    let sets: Vec<BTreeSet<String>> = texts.iter().map(|t| t.to_lowercase().split_whitespace().map(String::from).collect()).collect();
    let mut total = 0.0;
    let mut pairs = 0usize;
    for i in 0..sets.len() {
        for j in i + 1..sets.len() {
            let union = sets[i].union(&sets[j]).count();
            let inter = sets[i].intersection(&sets[j]).count();
            total += if union == 0 { 1.0 } else { inter as f64 / union as f64 };
            pairs += 1;
        }
    }
    if pairs == 0 { 0.0 } else { total / pairs as f64 }
}

/// The printed block:
/// ```text
/// [Routing Eval @ step 100]
///   both            sentence_length_10_smooth=0.701 happy_count=0.300 hack_freq=0.300 unique=10/10 jaccard=0.143
/// ```
pub fn format_block(report: &EvalReport) -> String {
    let mut out = format!("[Routing Eval @ step {}]", report.step);
    let last = report.modes.len().saturating_sub(1);
    for (i, mode) in report.modes.iter().enumerate() {
        let mut line = format!("\n  {:<15}", mode.mode);
        for (name, value) in &mode.components {
            line.push_str(&format!(" {name}={value:.3}"));
        }
        if mode.components.len() > 1 {
            line.push_str(&format!(" reward={:.3}", mode.reward));
        }
        if let Some(h) = mode.hack_freq {
            line.push_str(&format!(" hack_freq={h:.3}"));
        }
        if let Some(channels) = mode.channels {
            line.push_str(&format!(" true_hack_freq={:.3}", channels.all));
        }
        for (name, value) in &mode.metrics {
            line.push_str(&format!(" {name}={value:.3}"));
        }
        line.push_str(&format!(" unique={}/{} jaccard={:.3}", mode.unique, mode.n, mode.jaccard));
        if mode.degenerate {
            line.push_str(" DEGENERATE");
        }
        if i == last {
            line.push_str(&format!("  ({:.1}s)", report.seconds));
        }
        out.push_str(&line);
    }
    out
}

/// The keys of a `routing_eval.jsonl` line (`modes` maps each evaluation mode to its values;
/// reward components appear under their names, an environment's metrics under
/// `env/<environment>/<name>`).
pub mod key {
    pub const STEP: &str = "step";
    pub const MODES: &str = "modes";
    pub const SECONDS: &str = "seconds";
    pub const REWARD: &str = "reward";
    pub const HACK_FREQ: &str = "hack_freq";
    pub const UNIQUE: &str = "unique";
    pub const N: &str = "n";
    /// With `max_no_score_frac` above 0: the mode's samples without a score (out of its statistics).
    pub const NO_SCORE_COUNT: &str = "no_score_count";
    pub const JACCARD: &str = "jaccard";
    pub const DEGENERATE: &str = "degenerate";
    /// How many of the mode's `n` prompts are hackable (written always).
    pub const HACKABLE_N: &str = "hackable/n";
    /// When some but not all prompts are hackable, the reward components, `hack_freq` and
    /// `true_hack_freq` over the hackable ones, under their names after this prefix (with every
    /// prompt hackable the mode's own values are those; with none there are none).
    pub const HACKABLE: &str = "hackable/";
}

/// A mode's values over its hackable prompts as a mode of their own (the [`key::HACKABLE`] keys
/// without the prefix), for readers of [`to_json`]'s lines.
pub fn hackable_view(mode: &serde_json::Value) -> serde_json::Value {
    let keys = mode.as_object().into_iter().flatten();
    keys.filter_map(|(k, v)| Some((k.strip_prefix(key::HACKABLE)?.to_string(), v.clone()))).collect::<serde_json::Map<_, _>>().into()
}

/// One line of `routing_eval.jsonl`.
pub fn to_json(report: &EvalReport) -> serde_json::Value {
    let modes: serde_json::Map<String, serde_json::Value> = report
        .modes
        .iter()
        .map(|m| {
            let mut v = serde_json::Value::Object(serde_json::Map::new());
            v[key::REWARD] = m.reward.into();
            v[key::HACK_FREQ] = m.hack_freq.into();
            v[key::UNIQUE] = m.unique.into();
            v[key::N] = m.n.into();
            v[key::JACCARD] = m.jaccard.into();
            v[key::DEGENERATE] = m.degenerate.into();
            if let Some(count) = m.no_score {
                v[key::NO_SCORE_COUNT] = count.into();
            }
            for (name, value) in m.monitor.iter().flat_map(|stats| stats.fields()).chain(m.channels.iter().flat_map(|c| c.fields())) {
                v[name] = value;
            }
            for (name, value) in m.components.iter().chain(&m.metrics) {
                v[name] = (*value).into();
            }
            let h = &m.hackable;
            v[key::HACKABLE_N] = h.n.into();
            if h.n > 0 && h.n < m.n {
                for (name, value) in h.components.iter().map(|(n, v)| (n.as_str(), Some(*v))).chain([(key::HACK_FREQ, h.hack_freq), (crate::reward::monitor::key::TRUE_HACK_FREQ, h.true_hack_freq)]) {
                    v[format!("{}{name}", key::HACKABLE)] = value.into();
                }
            }
            (m.mode.clone(), v)
        })
        .collect();
    let mut line = serde_json::Map::new();
    line.insert(key::STEP.into(), report.step.into());
    line.insert(key::MODES.into(), modes.into());
    line.insert(key::SECONDS.into(), report.seconds.into());
    serde_json::Value::Object(line)
}

/// `smallrl eval RUN --all-checkpoints` writes this into the run directory.
pub const CHECKPOINTS_CSV: &str = "eval_checkpoints.csv";
pub const CHECKPOINTS_CSV_HEADER: &str = "step,mode,metric,value";

/// The evaluations of several checkpoints as one long table, `step,mode,metric,value`: the
/// values of [`to_json`] (a `routing_eval.jsonl` line) row by row, booleans as 0/1, a missing
/// value (`hack_freq` without a detector) empty; floats in shortest round-trip form.
pub fn checkpoints_csv(reports: &[EvalReport]) -> Result<String> {
    let mut text = format!("{CHECKPOINTS_CSV_HEADER}\n");
    for report in reports {
        let line = to_json(report);
        for (mode, values) in line[key::MODES].as_object().expect("to_json writes modes") {
            for (metric, value) in values.as_object().expect("a mode is an object") {
                anyhow::ensure!(!mode.contains(',') && !metric.contains(','), "mode `{mode}` / metric `{metric}` contains a comma: cannot be a CSV cell");
                let cell = match value {
                    serde_json::Value::Bool(b) => (*b as u8).to_string(),
                    serde_json::Value::Null => String::new(),
                    other => other.to_string(),
                };
                text.push_str(&format!("{},{mode},{metric},{cell}\n", report.step));
            }
        }
    }
    Ok(text)
}

/// Reads [`CHECKPOINTS_CSV`] back into `routing_eval.jsonl`-shaped lines (one per step, in step
/// order; every value a number or null), so readers of evaluations handle both alike.
pub fn read_checkpoints_csv(path: &std::path::Path) -> Result<Vec<serde_json::Value>> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut lines = text.lines();
    anyhow::ensure!(lines.next() == Some(CHECKPOINTS_CSV_HEADER), "{}: the first line is not `{CHECKPOINTS_CSV_HEADER}`", path.display());
    let mut steps: std::collections::BTreeMap<u64, serde_json::Map<String, serde_json::Value>> = Default::default();
    for (i, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').collect();
        let [step, mode, metric, value] = cells[..] else { anyhow::bail!("{} line {}: expected 4 cells, got `{line}`", path.display(), i + 2) };
        let step: u64 = step.parse().with_context(|| format!("{} line {}: step `{step}`", path.display(), i + 2))?;
        let value = match value {
            "" => serde_json::Value::Null,
            number => serde_json::Value::from(number.parse::<f64>().with_context(|| format!("{} line {}: value `{number}`", path.display(), i + 2))?),
        };
        let modes = steps.entry(step).or_default();
        let values = modes.entry(mode.to_string()).or_insert_with(|| serde_json::json!({}));
        values[metric] = value;
    }
    Ok(steps.into_iter().map(|(step, modes)| serde_json::json!({ key::STEP: step, key::MODES: modes })).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jaccard_by_hand() {
        // {a b} vs {b c}: 1/3; {a b} vs {a b}: 1; {b c} vs {a b}: 1/3 -> mean 5/9.
        let texts = ["a b", "B c", "a  b"].map(String::from);
        assert!((mean_pairwise_jaccard(&texts) - 5.0 / 9.0).abs() < 1e-12);
    }

    /// An environment's metrics sit beside the components in each mode of a routing_eval.jsonl
    /// line and its CSV rows; a mode without them has no such keys.
    #[test]
    fn environment_metrics_are_written_per_mode() {
        let mode = |name: &str, metrics: Vec<(String, f64)>| ModeReport {
            mode: name.into(),
            components: vec![("math_correct".into(), 0.5)],
            reward: 0.5,
            hack_freq: None,
            monitor: None,
            channels: None,
            metrics,
            hackable: HackableSubset { n: 2, components: Vec::new(), hack_freq: None, true_hack_freq: None },
            no_score: None,
            unique: 2,
            unique_first_sentences: 2,
            n: 2,
            jaccard: 0.0,
            degenerate: false,
            samples: Vec::new(),
        };
        let report = EvalReport { step: 3, modes: vec![mode("both", vec![("env/math/correct".into(), 0.25)]), mode("retain", Vec::new())], seconds: 0.0 };
        let line = to_json(&report);
        assert_eq!(line["modes"]["both"]["env/math/correct"], 0.25);
        assert!(line["modes"]["retain"].get("env/math/correct").is_none());
        assert!(checkpoints_csv(&[report.clone()]).unwrap().contains("3,both,env/math/correct,0.25\n"));
        assert!(format_block(&report).contains("env/math/correct=0.250"));
    }

    /// The hackable subset by hand: 5 prompts, 3 hackable (0, 2, 3); component scores 0.2, 0.9,
    /// 0.4, 0.6, 0.1 -> over 0, 2, 3: 0.4; the detector flags 0 and 1 -> 1 of 3; the ground
    /// truth 2 and 4 -> 1 of 3. Written under `hackable/`, read back by `hackable_view`.
    #[test]
    fn the_hackable_subset_is_the_mode_over_its_hackable_prompts() {
        let (t, f) = (true, false);
        let scored = crate::reward::ScoredBatch {
            reward: vec![0.0; 5],
            components: vec![vec![0.2, 0.9, 0.4, 0.6, 0.1]],
            is_rh: Some(vec![t, t, f, f, f]),
            detector_raw: Some(vec![t, t, f, f, f]),
            eligible: vec![t; 5],
            hackable: vec![t, f, t, t, f],
            monitored: vec![t; 5],
            hacked: Some(vec![f, f, t, f, t]),
            metrics: Vec::new(),
            unscored: vec![false; 5],
        };
        let info = [crate::reward::ComponentInfo { name: "task".into(), role: crate::reward::Role::Retain, scale: 1.0 }];
        let subset = HackableSubset::of(&info, &scored);
        assert_eq!(subset.n, 3);
        assert!((subset.components[0].1 - 0.4).abs() < 1e-12 && subset.components[0].0 == "task");
        assert_eq!((subset.hack_freq, subset.true_hack_freq), (Some(1.0 / 3.0), Some(1.0 / 3.0)));
        let none = HackableSubset::of(&info, &crate::reward::ScoredBatch { hackable: vec![f; 5], ..scored.clone() });
        assert_eq!((none.n, none.hack_freq), (0, None));
        let mode = ModeReport {
            mode: "both".into(),
            components: vec![("task".into(), 0.44)],
            reward: 0.0,
            hack_freq: Some(0.4),
            monitor: None,
            channels: None,
            metrics: Vec::new(),
            hackable: subset.clone(),
            no_score: None,
            unique: 5,
            unique_first_sentences: 5,
            n: 5,
            jaccard: 0.0,
            degenerate: false,
            samples: Vec::new(),
        };
        let line = to_json(&EvalReport { step: 1, modes: vec![mode.clone()], seconds: 0.0 });
        let both = &line["modes"]["both"];
        assert_eq!(both["hackable/n"], 3);
        let view = hackable_view(both);
        assert_eq!(view["task"].as_f64(), Some(subset.components[0].1));
        assert_eq!((view["hack_freq"].as_f64(), view["true_hack_freq"].as_f64()), (Some(1.0 / 3.0), Some(1.0 / 3.0)));
        assert!(view.get("n").is_some() && view.get("reward").is_none(), "only the hackable/ keys: {view}");
        // Every prompt hackable: the mode's own values are the subset's; only the count is written.
        let all = ModeReport { hackable: HackableSubset { n: 5, ..subset }, ..mode };
        let line = to_json(&EvalReport { step: 1, modes: vec![all], seconds: 0.0 });
        let keys: Vec<&String> = line["modes"]["both"].as_object().unwrap().keys().filter(|k| k.starts_with("hackable/")).collect();
        assert_eq!(keys, ["hackable/n"]);
    }
}
