//! Sampling ahead: one queue of chunks over the run's sampler thread, for every mode that
//! samples a step's rollout before the step (`DrawMode::Ahead`): `max_steps_off_policy` k and
//! `sampling_steps_ahead` d (tinker-cookbook 0.6.1's `AsyncConfig`: a pipeline of depth k or d), and
//! `stream_minibatches` (tinker's StreamMinibatchConfig: the mini-batches of the step's batch).
//!
//! Chunk c is the rollout step c of an on-policy run would draw: its prompts, its coherence rows
//! (the last groups, sampled with the forget adapter off), its sampler and scoring seeds. At the
//! start of each step, with the weights then, chunks are posted to the run's sampler thread up to
//! the horizon: until (d + 1) rollouts' worth of groups are outstanding (posted, not yet trained
//! on or dropped; d shrinks to the steps left, so nothing is sampled past the run's end), or,
//! streamed, to the end of the step's batch. A chunk posted when nothing is queued is sampled at
//! once, with the step's own weights. The step takes groups oldest first. Without a group
//! filter a chunk is taken whole by the step it was drawn for, so step n trains the rollout
//! sampled with the weights of step max(0, n - d) (streamed: of its batch's first step), exactly
//! min(n, d) steps stale. With `dynamic_sampling_rounds` (only with `sampling_steps_ahead`) a
//! group whose rewards are all equal is dropped (tinker's `remove_constant_reward_groups`), the
//! surplus of a chunk stays for the next step, and a step that runs out of chunks samples one
//! itself, with its own weights, at most `dynamic_sampling_rounds` times. Nothing is dropped for
//! staleness: a group is at most d steps stale.
//!
//! On an episode environment a chunk is the episodes step c of an on-policy run would play
//! (its prompts, seeds and episode ids): the sampler thread plays them with its own instance of
//! the environment (`episodes.rs`, [`Episodes::play_ahead`]) and hands back each episode's
//! outcome, which the step scores when it takes the chunk; a chunk sampled at the step is
//! played on the run's own instance.
//!
//! Architecture invariant: which weights sample which group depends only on the keys and the
//! rewards (never on the thread's timing); a checkpoint saves the chunks posted and not used up
//! (`in_flight.*`, with the next chunk's index and its episodes' outcomes), which a resumed run
//! re-scores and trains on, so a resumed run equals the uninterrupted one. Checkpoints of
//! `max_steps_off_policy` and `stream_minibatches` runs written before the queue was one
//! (`in_flight.json` a list of batches, each in parts) are read and resumed as they were.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::{AheadHorizon, Draw, DrawnBatch, Drawing, tokenized};
use crate::grpo;
use crate::model::generate::Generation;
use crate::reward::Prompt;
use crate::rng;
use crate::train::episodes::{Episodes, Outcome};
use crate::train::metrics::{DynamicSampling, OffPolicy};
use crate::train::policy::Policy;

/// One chunk of groups sampled ahead.
struct Chunk {
    /// The step whose on-policy rollout it is (prompts and seeds).
    index: usize,
    /// The weights' version it was sampled with: optimizer steps done before.
    version: usize,
    fingerprint: Option<f64>,
    /// Sampler calls still with the thread (routed rows, then coherence rows), or the
    /// generation until it is scored (and the seconds spent sampling it).
    posted: usize,
    seconds: f64,
    generation: Option<Generation>,
    /// On an episode environment: how each of its episodes ended (kept until the chunk is used
    /// up: a checkpoint saves them, and a resumed run scores them again).
    outcomes: Option<Vec<Outcome>>,
    /// Scored when first taken: the chunk's batch and which of its groups are informative.
    scored: Option<(DrawnBatch, Vec<bool>)>,
    /// Groups before this one are trained on or dropped.
    next_group: usize,
}

impl Chunk {
    /// Takes the chunk's generation from the sampler thread when it is still there (waiting for
    /// it); returns the seconds the thread sat idle before its parts.
    fn collect(&mut self, policy: &mut Policy) -> Result<f64> {
        if self.generation.is_some() || self.scored.is_some() {
            return Ok(0.0);
        }
        let (mut parts, mut idle_seconds) = (Vec::with_capacity(self.posted), 0.0);
        for _ in 0..self.posted {
            let ahead = policy.take_ahead().with_context(|| format!("sampling the rollout of step {} ahead failed", self.index + 1))?;
            idle_seconds += ahead.sampler_idle_seconds;
            self.seconds += ahead.done.seconds;
            parts.push(ahead.done.value);
            if ahead.extra.is_some() {
                // A chunk of episodes: each job's outcomes, in the order its jobs were posted.
                self.outcomes.get_or_insert_with(Vec::new).extend(Episodes::outcomes(ahead.extra)?);
            }
        }
        self.generation = Some(policy.joined(parts));
        Ok(idle_seconds)
    }
}

/// The chunks posted and not used up, oldest first, and the next chunk's index.
#[derive(Default)]
pub(super) struct Queue {
    chunks: VecDeque<Chunk>,
    next_chunk: usize,
}

/// `in_flight.json` of a checkpoint.
#[derive(Serialize, Deserialize)]
struct Saved {
    next_chunk: usize,
    chunks: Vec<SavedChunk>,
}

#[derive(Serialize, Deserialize)]
struct SavedChunk {
    index: usize,
    policy_version: usize,
    next_group: usize,
    weights_fingerprint: Option<f64>,
    /// On an episode environment: its episodes' outcomes (the generation is in the tensors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    episodes: Option<Vec<Outcome>>,
}

/// One batch of the `in_flight.json` that `max_steps_off_policy` and `stream_minibatches`
/// checkpoints held before the queue was one: its tensors under `{i}.{part}.`.
#[derive(Deserialize)]
struct OldSavedBatch {
    step: usize,
    policy_version: usize,
    parts: usize,
    #[serde(default)]
    weights_fingerprint: Option<f64>,
}

const IN_FLIGHT_TENSORS: &str = "in_flight.safetensors";
const IN_FLIGHT_INDEX: &str = "in_flight.json";

impl Draw {
    fn groups_per_rollout(&self) -> usize {
        self.keys.rollout_rows / self.keys.num_generations()
    }

    /// Groups posted and neither trained on nor dropped.
    fn outstanding(&self) -> usize {
        self.queue.chunks.iter().map(|chunk| self.groups_per_rollout() - chunk.next_group).sum()
    }

    /// Whether the next chunk is posted at 0-based `step` (see the module's documentation).
    fn due(&self, step: usize, horizon: AheadHorizon) -> bool {
        let steps_left = self.keys.max_steps().saturating_sub(step + 1);
        match horizon {
            AheadHorizon::Steps { depth } => {
                let per_rollout = self.groups_per_rollout();
                self.outstanding() + per_rollout <= per_rollout * (depth.min(steps_left) + 1)
            }
            AheadHorizon::Streamed { substeps } => self.queue.next_chunk <= ((step / substeps + 1) * substeps - 1).min(step + steps_left),
        }
    }

    /// Posts the next chunk from the weights as they are; sampled now (not by the thread) when
    /// the step needs it at once (`now`: nothing else is queued).
    fn post_chunk(&mut self, now: bool, with: &mut Drawing) -> Result<()> {
        let index = self.queue.next_chunk;
        let prompts = self.step_prompts(index);
        let prompt_ids = tokenized(with.policy.tokenizer(), &prompts)?;
        let requests = with.policy.sample_requests(&prompt_ids, self.keys.coherence.rows_at(index), index, self.keys.seed());
        let version = with.policy.version();
        let empty = Chunk { index, version, fingerprint: None, posted: 0, seconds: 0.0, generation: None, outcomes: None, scored: None, next_group: 0 };
        let chunk = match (now, &self.episodes) {
            (true, None) => {
                let sampled = with.policy.sample(requests, with.log)?;
                Chunk { fingerprint: Some(sampled.fingerprint), seconds: sampled.seconds, generation: Some(sampled.generation), ..empty }
            }
            (false, None) => {
                let mut fingerprints = Vec::new();
                let posted = requests.len();
                for request in requests {
                    fingerprints.push(with.policy.sample_ahead(request)?);
                }
                Chunk { fingerprint: fingerprints.first().copied(), posted, ..empty }
            }
            (now, Some(episodes)) => {
                // Chunk c's episodes are those step c of an on-policy run plays (round 0): its
                // routed rows, then its coherence rows, one sampler job each.
                let first_id = (index * (self.keys.dynamic_sampling_rounds() + 1) * prompts.len()) as u64;
                match now {
                    true => {
                        let played = episodes.play_unscored(with.policy, with.rewards, &prompts, &requests, first_id).with_context(|| format!("the episodes of step {} failed", index + 1))?;
                        Chunk { fingerprint: Some(played.fingerprint), seconds: played.seconds, outcomes: Some(played.outcomes), generation: Some(played.generation), ..empty }
                    }
                    false => Chunk { fingerprint: Some(episodes.play_ahead(with.policy, &prompts, &requests, first_id)?), posted: requests.len(), ..empty },
                }
            }
        };
        self.queue.chunks.push_back(chunk);
        self.queue.next_chunk += 1;
        Ok(())
    }

    /// The step's rollout from the queue (see the module's documentation).
    pub(super) fn ahead_batch(&mut self, step: usize, horizon: AheadHorizon, with: &mut Drawing) -> Result<DrawnBatch> {
        // The first step of a run, or of a resumed one whose checkpoint held nothing in flight.
        self.queue.next_chunk = self.queue.next_chunk.max(step);
        // The oldest chunk is taken from the thread first, so that its decoders are spare again
        // when the next chunks are posted: the thread refreshes them in place (one snapshot's
        // memory, and the weight-delivery check sees the refresh) rather than folding new ones.
        let waiting = Instant::now();
        let mut idle_seconds = match self.queue.chunks.front_mut() {
            Some(oldest) => oldest.collect(with.policy)?,
            None => 0.0,
        };
        let mut wait_seconds = waiting.elapsed().as_secs_f64();
        while self.due(step, horizon) {
            let now = self.queue.chunks.is_empty();
            self.post_chunk(now, with)?;
        }
        let per_rollout = self.groups_per_rollout();
        let group = self.keys.num_generations();
        let pad = with.policy.model().config.eos_token_id as i64;
        let (mut kept, mut versions) = (None::<DrawnBatch>, Vec::with_capacity(per_rollout));
        let (mut counts, mut sampled_now) = (DynamicSampling::default(), 0);
        while versions.len() < per_rollout {
            if self.queue.chunks.is_empty() {
                ensure!(
                    sampled_now < self.keys.dynamic_sampling_rounds(),
                    "dynamic sampling at step {}: after {} chunks sampled at the step (dynamic_sampling_rounds) the pipeline holds only {} of the batch's {per_rollout} groups whose rewards differ ({} groups dropped for equal rewards): raise dynamic_sampling_rounds, or check whether the task is too easy or too hard for the model",
                    step + 1,
                    sampled_now,
                    versions.len(),
                    counts.groups_dropped
                );
                sampled_now += 1;
                self.post_chunk(true, with)?;
            }
            let waiting = Instant::now();
            let mut chunk = self.queue.chunks.pop_front().expect("posted above");
            idle_seconds += chunk.collect(with.policy)?;
            wait_seconds += waiting.elapsed().as_secs_f64();
            if chunk.scored.is_none() {
                // A chunk partly used before a checkpoint is scored again on resumption, as it was.
                counts.rounds += usize::from(chunk.next_group == 0);
                let prompts = self.step_prompts(chunk.index);
                let generation = chunk.generation.take().expect("taken above");
                let batch = self.scored_chunk(&chunk, prompts, generation, with)?;
                let informative = match self.keys.dynamic_sampling_rounds() {
                    0 => vec![true; per_rollout],
                    _ => grpo::informative_groups(&with.recipe.rewards(&batch.scored), &with.recipe.counted_rows(&batch.scored), group),
                };
                chunk.scored = Some((batch, informative));
            }
            let (batch, informative) = chunk.scored.as_ref().expect("scored above");
            let mut rows = Vec::new();
            while chunk.next_group < per_rollout && versions.len() < per_rollout {
                let g = chunk.next_group;
                chunk.next_group += 1;
                if !informative[g] {
                    counts.groups_dropped += 1;
                    continue;
                }
                rows.extend(g * group..(g + 1) * group);
                versions.push(chunk.version);
            }
            let surplus = informative[chunk.next_group..].iter().filter(|&&i| i).count();
            let whole = rows.len() == batch.samples.len();
            // The recipe marks the last rows of step `step`'s rollout as coherence rows: a chunk
            // with coherence rows must be that step's rollout, whole (config/checks.rs refuses
            // filtering with coherence rows, so this holds; a failure is a bug, never a relabel).
            let coherence_rows = self.keys.coherence.rows_at(chunk.index);
            ensure!(
                coherence_rows == 0 || (whole && chunk.index == step && versions.len() == per_rollout),
                "internal error: the chunk of step {} sampled {coherence_rows} coherence rows but step {} does not train it whole: coherence rows would be mislabelled",
                chunk.index + 1,
                step + 1
            );
            let chosen = match (rows.is_empty(), chunk.next_group == per_rollout && whole) {
                (true, _) => None,
                // A chunk trained whole stays as it was (the on-policy rollout, sampled ahead).
                (false, true) => chunk.scored.take().map(|(batch, _)| batch),
                (false, false) => Some(batch.select(&rows)),
            };
            if let Some(chosen) = chosen {
                kept = Some(match kept {
                    None => chosen,
                    Some(so_far) => so_far.concat(chosen, pad),
                });
            }
            if chunk.next_group < per_rollout {
                counts.groups_surplus = surplus;
                self.queue.chunks.push_front(chunk);
            }
        }
        let mut batch = kept.expect("a batch's groups");
        let oldest = *versions.iter().min().expect("a batch's groups");
        let newest = *versions.iter().max().expect("a batch's groups");
        let staleness_mean = versions.iter().map(|&v| (step - v) as f64).sum::<f64>() / versions.len() as f64;
        // The batch's fingerprint is its first chunk's, carried by the scored chunk.
        batch.off_policy = Some(OffPolicy { policy_version: oldest, staleness_max: step - oldest, staleness_min: step - newest, staleness_mean, wait_seconds, sampler_idle_seconds: idle_seconds });
        batch.dynamic_sampling = (self.keys.dynamic_sampling_rounds() > 0).then_some(counts);
        Ok(batch)
    }

    /// Scores a chunk's `generation` of `prompts`: its completions by the run's rewards, or its
    /// episodes by their outcomes (seeded as step `chunk.index` of an on-policy run).
    fn scored_chunk(&self, chunk: &Chunk, prompts: Vec<Prompt>, generation: Generation, with: &mut Drawing) -> Result<DrawnBatch> {
        let Some(outcomes) = &chunk.outcomes else {
            ensure!(self.episodes.is_none(), "internal error: the episodes of step {} sampled ahead came without their ends", chunk.index + 1);
            return self.scored(chunk.index, self.keys.seed(), prompts, (generation, chunk.seconds, chunk.fingerprint), with);
        };
        let scoring = Instant::now();
        let protocol_seed = rng::derive(self.keys.seed(), "protocol", chunk.index as u64);
        let scored = Episodes::score(with.rewards, with.policy.tokenizer(), &prompts, &generation, outcomes, protocol_seed);
        let (samples, scored) = scored.with_context(|| format!("scoring the episodes of step {} failed", chunk.index + 1))?;
        let score_seconds = scoring.elapsed().as_secs_f64();
        Ok(DrawnBatch { generation, samples, scored, generate_seconds: chunk.seconds, score_seconds, dynamic_sampling: None, off_policy: None, weights_fingerprint: chunk.fingerprint })
    }

    /// The chunks posted and not used up, for a checkpoint (waiting for the thread to finish
    /// them), with the next chunk's index: written even when none are left; `None` for a run
    /// that does not sample ahead.
    pub(in crate::train) fn in_flight(&mut self, policy: &mut Policy) -> Result<Option<(Vec<(String, Tensor)>, String)>> {
        if !matches!(self.keys.mode, super::DrawMode::Ahead(_)) {
            return Ok(None);
        }
        let mut tensors = Vec::new();
        let mut index = Vec::new();
        for (i, chunk) in self.queue.chunks.iter_mut().enumerate() {
            chunk.collect(policy)?;
            let generation = chunk.generation.as_ref().or(chunk.scored.as_ref().map(|(batch, _)| &batch.generation)).expect("made ready above");
            tensors.extend(generation.to_saved(&format!("{i}.")));
            let episodes = chunk.outcomes.clone();
            index.push(SavedChunk { index: chunk.index, policy_version: chunk.version, next_group: chunk.next_group, weights_fingerprint: chunk.fingerprint, episodes });
        }
        let saved = Saved { next_chunk: self.queue.next_chunk, chunks: index };
        Ok(Some((tensors, serde_json::to_string_pretty(&saved)?)))
    }

    /// Restores the chunks a checkpoint saved (scored again when taken, as they were); nothing
    /// when it has no `in_flight.*`.
    pub(in crate::train) fn restore_in_flight(&mut self, dir: &Path, policy: &Policy) -> Result<()> {
        let index_path = dir.join(IN_FLIGHT_INDEX);
        if !index_path.exists() {
            return Ok(());
        }
        let tensors_path = dir.join(IN_FLIGHT_TENSORS);
        let text = std::fs::read_to_string(&index_path).with_context(|| format!("cannot read {}", index_path.display()))?;
        let device = policy.model().device;
        let read_tensors = |any: bool| -> Result<BTreeMap<String, Tensor>> {
            match any {
                true => crate::model::weights::read_safetensors(&tensors_path),
                false => Ok(BTreeMap::new()),
            }
        };
        if let Ok(old) = serde_json::from_str::<Vec<OldSavedBatch>>(&text) {
            ensure!(self.episodes.is_none() || old.is_empty(), "{}: batches sampled ahead without their episodes' ends (written before episode runs sampled ahead)", index_path.display());
            let tensors = read_tensors(!old.is_empty())?;
            for (i, batch) in old.into_iter().enumerate() {
                let parts = (0..batch.parts)
                    .map(|j| Generation::from_saved(&tensors, &format!("{i}.{j}."), device))
                    .collect::<Result<Vec<_>>>()
                    .with_context(|| format!("{}: the batch of step {} sampled ahead", tensors_path.display(), batch.step + 1))?;
                ensure!(!parts.is_empty(), "{}: the batch of step {} sampled ahead has no parts", index_path.display(), batch.step + 1);
                let generation = Some(policy.joined(parts));
                let (index, version, fingerprint) = (batch.step, batch.policy_version, batch.weights_fingerprint);
                self.queue.chunks.push_back(Chunk { index, version, fingerprint, posted: 0, seconds: 0.0, generation, outcomes: None, scored: None, next_group: 0 });
                self.queue.next_chunk = index + 1;
            }
            return Ok(());
        }
        let saved: Saved = serde_json::from_str(&text).with_context(|| format!("{} is corrupt (not a checkpoint's batches sampled ahead)", index_path.display()))?;
        let tensors = read_tensors(!saved.chunks.is_empty())?;
        for (i, chunk) in saved.chunks.into_iter().enumerate() {
            let generation = Generation::from_saved(&tensors, &format!("{i}."), device).with_context(|| format!("{}: chunk {} sampled ahead", tensors_path.display(), chunk.index + 1))?;
            let (index, version, fingerprint, next_group) = (chunk.index, chunk.policy_version, chunk.weights_fingerprint, chunk.next_group);
            ensure!(
                chunk.episodes.is_some() == self.episodes.is_some(),
                "{}: chunk {} sampled ahead {} its episodes' ends, but the run {} an episode environment",
                index_path.display(),
                index + 1,
                if chunk.episodes.is_some() { "has" } else { "lacks" },
                if self.episodes.is_some() { "is on" } else { "is not on" }
            );
            ensure!(chunk.episodes.as_ref().is_none_or(|ends| ends.len() == generation.rows.len()), "{}: chunk {} sampled ahead has {} episodes but {} ends", index_path.display(), index + 1, generation.rows.len(), chunk.episodes.as_ref().map_or(0, Vec::len));
            let outcomes = chunk.episodes;
            self.queue.chunks.push_back(Chunk { index, version, fingerprint, posted: 0, seconds: 0.0, generation: Some(generation), outcomes, scored: None, next_group });
        }
        self.queue.next_chunk = saved.next_chunk;
        Ok(())
    }
}

/// Writes a checkpoint's in-flight chunks ([`Draw::in_flight`]) into its directory.
pub(in crate::train) fn write_in_flight(dir: &Path, in_flight: &(Vec<(String, Tensor)>, String)) -> Result<()> {
    crate::model::weights::write_safetensors(&dir.join(IN_FLIGHT_TENSORS), &in_flight.0)?;
    std::fs::write(dir.join(IN_FLIGHT_INDEX), &in_flight.1)?;
    Ok(())
}
