//! `sampling_steps_ahead` d: tinker-cookbook's newer asynchronous mode (`AsyncConfig` with
//! `pipeline_depth`, PR 822) as a group pipeline. Groups are sampled in chunks of a batch's
//! worth: chunk c is the batch step c of an on-policy run would draw (its prompts, sampler and
//! scoring seeds). At the start of each step, with the weights then, the run's sampler thread is
//! given chunks until up to (d + 1) batches' worth of groups are outstanding (posted, not yet
//! trained on or dropped; d shrinks to the steps left, so nothing is sampled past the run's end).
//! The step takes groups oldest first: with `dynamic_sampling_rounds` a group whose rewards are
//! all equal is dropped (tinker's `remove_constant_reward_groups`), the surplus of a chunk stays
//! for the next step, and a step that runs out of chunks samples one itself, with its own
//! weights, at most `dynamic_sampling_rounds` times. Nothing is dropped for staleness: a group
//! is at most d steps stale. Without filtering, chunk c trains step c, sampled with the weights
//! of step max(0, c - d): the batches of `max_steps_off_policy` d exactly.
//!
//! Architecture invariant: which weights sample which group depends only on the keys and the
//! rewards (never on the thread's timing); a checkpoint saves the chunks posted and not used up
//! (`in_flight.*`, with the next chunk's index), which a resumed run re-scores and trains on.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::{Draw, DrawnBatch, Drawing, tokenized};
use crate::grpo;
use crate::model::generate::Generation;
use crate::train::metrics::{DynamicSampling, OffPolicy};
use crate::train::policy::Policy;

/// One chunk of groups sampled ahead.
struct Chunk {
    /// The step whose on-policy batch it is (prompts and seeds).
    index: usize,
    /// The weights' version it was sampled with: optimizer steps done before.
    version: usize,
    fingerprint: Option<f64>,
    /// Sampler calls still with the thread, or the generation until it is scored (and the
    /// seconds spent sampling it).
    posted: usize,
    seconds: f64,
    generation: Option<Generation>,
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
            let ahead = policy.seat.take_ahead().with_context(|| format!("sampling chunk {} ahead failed", self.index + 1))?;
            idle_seconds += ahead.sampler_idle_seconds;
            self.seconds += ahead.done.seconds;
            parts.push(ahead.done.value);
        }
        self.generation = Some(policy.joined(parts));
        Ok(idle_seconds)
    }
}

/// The chunks posted and not used up, oldest first, and the next chunk's index.
#[derive(Default)]
pub(super) struct GroupPipeline {
    chunks: VecDeque<Chunk>,
    next_chunk: usize,
}

/// `in_flight.json` of a checkpoint in this mode.
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
}

impl Draw {
    fn groups_per_batch(&self) -> usize {
        self.keys.batch_size / self.keys.group_size
    }

    /// Groups posted and neither trained on nor dropped.
    fn outstanding(&self) -> usize {
        self.pipeline.chunks.iter().map(|chunk| self.groups_per_batch() - chunk.next_group).sum()
    }

    /// Posts the next chunk from the weights as they are; sampled now (not by the thread) when
    /// the step needs it at once (`now`: nothing else is queued).
    fn post_chunk(&mut self, now: bool, with: &mut Drawing) -> Result<()> {
        let index = self.pipeline.next_chunk;
        let prompt_ids = tokenized(&with.policy.tokenizer, &self.step_prompts(index))?;
        let requests = with.policy.sample_requests(&prompt_ids, 0, index, self.keys.seed);
        let version = with.policy.optimizer.step;
        let chunk = match now {
            true => {
                let (generation, seconds) = with.policy.sample(requests, with.log)?;
                let fingerprint = with.policy.seat.take_fingerprints().first().copied();
                Chunk { index, version, fingerprint, posted: 0, seconds, generation: Some(generation), scored: None, next_group: 0 }
            }
            false => {
                let mut fingerprints = Vec::new();
                let posted = requests.len();
                for request in requests {
                    fingerprints.push(with.policy.seat.sample_ahead(&with.policy.model, &request.scales, request.prompt_ids, with.policy.sampling, request.seed)?);
                }
                Chunk { index, version, fingerprint: fingerprints.first().copied(), posted, seconds: 0.0, generation: None, scored: None, next_group: 0 }
            }
        };
        self.pipeline.chunks.push_back(chunk);
        self.pipeline.next_chunk += 1;
        Ok(())
    }

    /// The step's batch from the group pipeline (see the module's documentation).
    pub(super) fn pipeline_batch(&mut self, step: usize, depth: usize, with: &mut Drawing) -> Result<DrawnBatch> {
        let per_batch = self.groups_per_batch();
        let depth = depth.min(self.keys.max_steps.saturating_sub(step + 1));
        while self.outstanding() + per_batch <= per_batch * (depth + 1) {
            let now = self.pipeline.chunks.is_empty();
            self.post_chunk(now, with)?;
        }
        let group = self.keys.group_size;
        let pad = with.policy.model.config.eos_token_id as i64;
        let (mut kept, mut versions) = (None::<DrawnBatch>, Vec::with_capacity(per_batch));
        let (mut counts, mut sampled_now, mut wait_seconds, mut idle_seconds, mut fingerprint) = (DynamicSampling::default(), 0, 0.0, 0.0, None);
        while versions.len() < per_batch {
            if self.pipeline.chunks.is_empty() {
                ensure!(
                    sampled_now < self.keys.dynamic_rounds,
                    "dynamic sampling at step {}: after {} chunks sampled at the step (dynamic_sampling_rounds) the pipeline holds only {} of the batch's {per_batch} groups whose rewards differ ({} groups dropped for equal rewards): raise dynamic_sampling_rounds, or check whether the task is too easy or too hard for the model",
                    step + 1,
                    sampled_now,
                    versions.len(),
                    counts.groups_dropped
                );
                sampled_now += 1;
                self.post_chunk(true, with)?;
            }
            let waiting = Instant::now();
            let mut chunk = self.pipeline.chunks.pop_front().expect("posted above");
            idle_seconds += chunk.collect(with.policy)?;
            wait_seconds += waiting.elapsed().as_secs_f64();
            if chunk.scored.is_none() {
                // A chunk partly used before a checkpoint is scored again on resumption, as it was.
                counts.rounds += usize::from(chunk.next_group == 0);
                let prompts = self.step_prompts(chunk.index);
                let generation = chunk.generation.take().expect("taken above");
                let batch = self.scored(chunk.index, self.keys.seed, prompts, generation, chunk.seconds, None, with)?;
                let informative = match self.keys.dynamic_rounds {
                    0 => vec![true; per_batch],
                    _ => grpo::informative_groups(&with.recipe.rewards(&batch.scored), &with.recipe.counted_rows(&batch.scored), group),
                };
                chunk.scored = Some((batch, informative));
            }
            let (batch, informative) = chunk.scored.as_ref().expect("scored above");
            let mut rows = Vec::new();
            while chunk.next_group < per_batch && versions.len() < per_batch {
                let g = chunk.next_group;
                chunk.next_group += 1;
                if !informative[g] {
                    counts.groups_dropped += 1;
                    continue;
                }
                rows.extend(g * group..(g + 1) * group);
                versions.push(chunk.version);
                fingerprint = fingerprint.or(chunk.fingerprint);
            }
            let surplus = informative[chunk.next_group..].iter().filter(|&&i| i).count();
            let whole = rows.len() == batch.samples.len();
            let chosen = match (rows.is_empty(), chunk.next_group == per_batch && whole) {
                (true, _) => None,
                // A chunk trained whole stays as it was (the batch of max_steps_off_policy).
                (false, true) => chunk.scored.take().map(|(batch, _)| batch),
                (false, false) => Some(batch.select(&rows)),
            };
            if let Some(chosen) = chosen {
                kept = Some(match kept {
                    None => chosen,
                    Some(so_far) => so_far.concat(chosen, pad),
                });
            }
            if chunk.next_group < per_batch {
                counts.groups_surplus = surplus;
                self.pipeline.chunks.push_front(chunk);
            }
        }
        let mut batch = kept.expect("a batch's groups");
        let oldest = *versions.iter().min().expect("a batch's groups");
        let staleness_mean = versions.iter().map(|&v| (step - v) as f64).sum::<f64>() / versions.len() as f64;
        let weights_fingerprint = fingerprint;
        batch.off_policy = Some(OffPolicy { policy_version: oldest, staleness: step - oldest, staleness_mean, wait_seconds, sampler_idle_seconds: idle_seconds, weights_fingerprint });
        batch.dynamic_sampling = (self.keys.dynamic_rounds > 0).then_some(counts);
        Ok(batch)
    }

    /// The chunks posted and not used up, for a checkpoint (waiting for the thread to finish
    /// them), with the next chunk's index: written even when none are left.
    pub(super) fn pipeline_in_flight(&mut self, policy: &mut Policy) -> Result<(Vec<(String, Tensor)>, String)> {
        let mut tensors = Vec::new();
        let mut index = Vec::new();
        for (i, chunk) in self.pipeline.chunks.iter_mut().enumerate() {
            chunk.collect(policy)?;
            let generation = chunk.generation.as_ref().or(chunk.scored.as_ref().map(|(batch, _)| &batch.generation)).expect("made ready above");
            tensors.extend(generation.to_saved(&format!("{i}.")));
            index.push(SavedChunk { index: chunk.index, policy_version: chunk.version, next_group: chunk.next_group, weights_fingerprint: chunk.fingerprint });
        }
        let saved = Saved { next_chunk: self.pipeline.next_chunk, chunks: index };
        Ok((tensors, serde_json::to_string_pretty(&saved)?))
    }

    /// Restores the chunks a checkpoint saved (scored again when taken, as they were).
    pub(super) fn restore_pipeline(&mut self, index_path: &Path, tensors_path: &Path, device: tch::Device) -> Result<()> {
        let text = std::fs::read_to_string(index_path).with_context(|| format!("cannot read {}", index_path.display()))?;
        let saved: Saved = serde_json::from_str(&text).with_context(|| format!("{} is corrupt (not a sampling_steps_ahead checkpoint?)", index_path.display()))?;
        let tensors: BTreeMap<String, Tensor> = match saved.chunks.is_empty() {
            true => BTreeMap::new(),
            false => crate::model::weights::read_safetensors(tensors_path)?,
        };
        for (i, chunk) in saved.chunks.into_iter().enumerate() {
            let generation = Generation::from_saved(&tensors, &format!("{i}."), device).with_context(|| format!("{}: chunk {} sampled ahead", tensors_path.display(), chunk.index + 1))?;
            let (index, version, fingerprint, next_group) = (chunk.index, chunk.policy_version, chunk.weights_fingerprint, chunk.next_group);
            self.pipeline.chunks.push_back(Chunk { index, version, fingerprint, posted: 0, seconds: 0.0, generation: Some(generation), scored: None, next_group });
        }
        self.pipeline.next_chunk = saved.next_chunk;
        Ok(())
    }
}
