//! The step's batch drawn, from the run's prompt streams and the policy to a scored batch:
//! prompts → samples → scores, in one of three modes ([`DrawMode`]): on policy (the policy's
//! seat at the engine, now; with an episode environment, played as multi-turn episodes,
//! `episodes.rs`: one arm of `round`'s match), sampled ahead (`max_steps_off_policy`,
//! `sampling_steps_ahead`, `stream_minibatches`: one queue of chunks, `pipeline.rs`) or a
//! finished run's recorded rollouts (`replay_rollouts`, `replay.rs`).
//!
//! With DAPO's dynamic sampling (`dynamic_sampling_rounds`), groups whose rewards are all equal
//! are dropped and more prompts sampled in further rounds until the batch is full, as verl's
//! DAPO recipe does: kept groups in the order they were generated, the batch cut to
//! `batch_size` (the surplus discarded), and an error when the rounds run out (verl raises
//! "Generated too many"; its 0 means no limit, here 0 means off).
//!
//! Architecture invariant: round 0 is the batch a run without dynamic sampling draws (same
//! prompts, same seeds), so a run whose groups all differ is that run; round `r > 0` draws its
//! prompts from a second seeded stream at positions fixed by `(batch, r)` and its seeds from
//! `(seed, "dynamic-sampling-round", r)`, so a resumed run draws the same batch.

use std::time::Instant;

use anyhow::{Context, Result, ensure};

use super::TrainConfig;
use super::metrics::{DynamicSampling, OffPolicy};
use super::policy::Policy;
use super::prompts::PromptStream;
use super::recipe::{CoherenceSchedule, Recipe};
use crate::grpo;
use crate::hyperparams::Part;
use crate::model::Tokenizer;
use crate::model::generate::Generation;
use crate::reward::{Prompt, RewardModel, Sample, ScoredBatch, samples_from_rows};
use crate::rng;
use crate::runlog::RunLog;

mod pipeline;
mod replay;

pub(super) use pipeline::write_in_flight;
pub use replay::check_recorded;

/// The keys that say which prompts a step draws, how many and when, resolved once
/// (`TrainConfig::draw_keys`). A key the draw reads as it is (`seed`, `num_generations`,
/// `batch_size`, `dynamic_sampling_rounds`, `max_steps`) is its row's alone: the row ends
/// `=> DrawKeys`, which gives the draw the accessor `keys.seed()` ([`Part`]); the fields here
/// are what several keys make together.
#[derive(Debug, Clone)]
pub struct DrawKeys {
    /// The resolved configuration, read only through the accessors of the rows that name
    /// this part ([`Part`]).
    pub(super) table: TrainConfig,
    /// Completions of a rollout: the batch, or with `stream_minibatches` one mini-batch.
    pub rollout_rows: usize,
    pub steps_per_rollout: usize,
    pub coherence: CoherenceSchedule,
    pub mode: DrawMode,
}

impl Part<TrainConfig> for DrawKeys {
    fn table(&self) -> &TrainConfig {
        &self.table
    }
}

/// Where a step's rollout comes from, resolved once from the keys.
#[derive(Debug, Clone, PartialEq)]
pub enum DrawMode {
    /// Sampled at the step, with its weights (dynamic sampling's rounds too).
    OnPolicy,
    /// Sampled ahead by the run's sampler thread (`pipeline.rs`); with `dynamic_rounds` above 0
    /// (only `sampling_steps_ahead`), groups of equal rewards are dropped.
    Ahead(AheadHorizon),
    /// `replay_rollouts`: a finished run's recorded rollouts trained on instead of sampling.
    Replay(std::path::PathBuf),
}

/// How far ahead the run's sampler thread is given rollouts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AheadHorizon {
    /// `max_steps_off_policy` or `sampling_steps_ahead` d: up to d + 1 rollouts' worth of groups.
    Steps { depth: usize },
    /// `stream_minibatches`: the mini-batches of the step's batch (`num_substeps` of them).
    Streamed { substeps: usize },
}

/// The run's prompt streams and its batches sampled ahead.
pub(super) struct Draw {
    keys: DrawKeys,
    pub prompts: PromptStream,
    /// The prompts of dynamic sampling's extra rounds: the same prompts in another seeded order.
    extra_prompts: Option<PromptStream>,
    /// The coherence prompts of the retain verifier (`rh_detector_verifies_retain_samples`):
    /// the hackable and detectable training prompts in their own seeded order.
    verifier_prompts: Option<PromptStream>,
    /// In `DrawMode::Ahead`: the chunks sampled ahead.
    queue: pipeline::Queue,
    /// A multi-turn episode environment's: each row is an episode (`episodes.rs`; on policy in
    /// rounds, or ahead in the queue's chunks).
    episodes: Option<super::episodes::Episodes>,
}

/// What drawing a batch samples with and scores with (borrowed from the trainer).
pub(super) struct Drawing<'a> {
    pub policy: &'a mut Policy,
    pub rewards: &'a mut RewardModel,
    pub recipe: &'a Recipe,
    pub log: &'a mut RunLog,
}

/// A sampled and scored batch (or one round of it).
pub(super) struct DrawnBatch {
    pub generation: Generation,
    pub samples: Vec<Sample>,
    pub scored: ScoredBatch,
    pub generate_seconds: f64,
    pub score_seconds: f64,
    pub dynamic_sampling: Option<DynamicSampling>,
    /// Sampled ahead: how stale the batch was.
    pub off_policy: Option<OffPolicy>,
    /// The fingerprint of the weights that sampled the batch's first rows, carried from the
    /// sampler call with the rows (`None` for a replayed batch, which another run sampled, and
    /// for one restored from a checkpoint written before smallrl recorded it).
    pub weights_fingerprint: Option<f64>,
}

impl DrawnBatch {
    fn select(&self, rows: &[usize]) -> DrawnBatch {
        DrawnBatch {
            generation: self.generation.select_rows(rows),
            samples: rows.iter().map(|&r| self.samples[r].clone()).collect(),
            scored: self.scored.select(rows),
            ..*self
        }
    }

    fn concat(mut self, other: DrawnBatch, pad: i64) -> DrawnBatch {
        // `ScoredBatch::concat` joins metrics by position, and the host's are per batch (an
        // episode batch's call counts exist where every episode showed tools).
        let keys = |batch: &DrawnBatch| batch.scored.metrics.iter().map(|(key, _)| key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&self), keys(&other), "dynamic sampling's rounds log different metrics: they cannot be joined");
        self.samples.extend(other.samples);
        DrawnBatch {
            generation: self.generation.concat(other.generation, pad),
            scored: self.scored.concat(other.scored),
            generate_seconds: self.generate_seconds + other.generate_seconds,
            score_seconds: self.score_seconds + other.score_seconds,
            ..self
        }
    }
}

impl Draw {
    /// The draw of a run with `keys`, from its training `prompts` (the verifier's stream of
    /// coherence prompts with `verifier_prompts`).
    pub fn new(keys: DrawKeys, prompts: Vec<Prompt>, verifier_prompts: Option<Vec<Prompt>>, episodes: Option<super::episodes::Episodes>) -> Self {
        let extra_prompts = (keys.dynamic_sampling_rounds() > 0).then(|| PromptStream::new(prompts.clone(), rng::derive(keys.seed(), "dynamic-sampling-prompts", 0)));
        let verifier_prompts = verifier_prompts.map(|prompts| PromptStream::new(prompts, rng::derive(keys.seed(), "verifier-prompts", 0)));
        let prompts = PromptStream::new(prompts, keys.seed());
        Self { keys, prompts, extra_prompts, verifier_prompts, queue: Default::default(), episodes }
    }

    /// The run's episode settings, on a multi-turn episode environment.
    pub fn episodes(&self) -> Option<&super::episodes::Episodes> {
        self.episodes.as_ref()
    }

    /// The step's batch, by the draw's mode: sampled ahead, taken from the queue
    /// (`pipeline.rs`); on policy or replayed, drawn at the step in rounds.
    pub fn batch(&mut self, step: usize, with: &mut Drawing) -> Result<DrawnBatch> {
        match self.keys.mode {
            DrawMode::Ahead(horizon) => self.ahead_batch(step, horizon, with),
            DrawMode::OnPolicy | DrawMode::Replay(_) => self.in_rounds(step, with),
        }
    }

    /// The step's batch drawn at the step: one round, or with dynamic sampling only groups whose
    /// rewards differ (see the module's documentation), and the counts of what it took.
    fn in_rounds(&mut self, step: usize, with: &mut Drawing) -> Result<DrawnBatch> {
        let prompts = self.step_prompts(step);
        let first = self.round(step, 0, prompts, with)?;
        let max_rounds = self.keys.dynamic_sampling_rounds();
        if max_rounds == 0 {
            return Ok(first);
        }
        let (group, needed) = (self.keys.num_generations(), self.keys.batch_size() / self.keys.num_generations());
        let pad = with.policy.model().config.eos_token_id as i64;
        let mut counts = DynamicSampling::default();
        let (mut kept, mut kept_groups, mut round) = (None::<DrawnBatch>, 0, first);
        loop {
            counts.rounds += 1;
            let informative = grpo::informative_groups(&with.recipe.rewards(&round.scored), &with.recipe.counted_rows(&round.scored), group);
            counts.groups_dropped += informative.iter().filter(|&&i| !i).count();
            let wanted: Vec<usize> = (0..informative.len()).filter(|&g| informative[g]).collect();
            let taken = wanted.len().min(needed - kept_groups);
            counts.groups_surplus += wanted.len() - taken;
            let rows: Vec<usize> = wanted[..taken].iter().flat_map(|&g| g * group..(g + 1) * group).collect();
            // A round kept whole stays as it was (round 0 of a batch without equal groups is
            // exactly the batch without dynamic sampling).
            let chosen = if rows.len() == round.samples.len() { round } else { round.select(&rows) };
            kept_groups += taken;
            kept = Some(match kept {
                None => chosen,
                Some(so_far) => so_far.concat(chosen, pad),
            });
            if kept_groups == needed {
                break;
            }
            ensure!(
                counts.rounds < max_rounds,
                "dynamic sampling at step {}: after {} generation rounds (dynamic_sampling_rounds) only {kept_groups} of the batch's {needed} groups have rewards that differ ({} groups dropped for equal rewards): raise dynamic_sampling_rounds, or check whether the task is too easy or too hard for the model (verl's DAPO stops the same way)",
                step + 1,
                counts.rounds,
                counts.groups_dropped
            );
            let prompts = self.extra_prompts(step, counts.rounds);
            round = self.round(step, counts.rounds, prompts, with)?;
        }
        let mut batch = kept.expect("at least one round");
        batch.dynamic_sampling = Some(counts);
        Ok(batch)
    }

    /// Samples and scores one round of prompts (each repeated `num_generations` times): by the
    /// draw's mode, and on policy by whether the run plays multi-turn episodes.
    fn round(&mut self, step: usize, round: usize, prompt_texts: Vec<Prompt>, with: &mut Drawing) -> Result<DrawnBatch> {
        let prompt_ids = tokenized(with.policy.tokenizer(), &prompt_texts)?;
        let coherence_rows = self.keys.coherence.rows_at(step);
        let seed = self.round_seed(round);
        // Episode ids count the run's episodes: round r of step s starts at (s * (R + 1) + r) * rows.
        let first_id = ((step * (self.keys.dynamic_sampling_rounds() + 1) + round) * prompt_texts.len()) as u64;
        match (&self.keys.mode, &self.episodes) {
            (DrawMode::OnPolicy, Some(episodes)) => {
                let requests = with.policy.sample_requests(&prompt_ids, coherence_rows, step, seed);
                played(episodes, step, seed, first_id, &requests, &prompt_texts, with)
            }
            (DrawMode::OnPolicy, None) => {
                let sampled = with.policy.sample(with.policy.sample_requests(&prompt_ids, coherence_rows, step, seed), with.log)?;
                self.scored(step, seed, prompt_texts, (sampled.generation, sampled.seconds, Some(sampled.fingerprint)), with)
            }
            (DrawMode::Replay(dir), None) => {
                let generation = replay::generation(dir, step, &prompt_ids, with.policy.model().device)?;
                self.scored(step, seed, prompt_texts, (generation, 0.0, None), with)
            }
            (DrawMode::Replay(dir), Some(episodes)) => replayed(episodes, dir, step, seed, first_id, &prompt_texts, with),
            (DrawMode::Ahead(_), None) => anyhow::bail!("internal error: a rollout sampled ahead is drawn by the queue, not in rounds"),
            (DrawMode::Ahead(_), Some(_)) => anyhow::bail!("internal error: episodes sampled ahead are drawn by the queue, not in rounds"),
        }
    }

    /// Scores a generation of `prompt_texts` drawn for `step` from `seed` (with its sampling
    /// seconds and its weights' fingerprint).
    fn scored(&self, step: usize, seed: u64, prompt_texts: Vec<Prompt>, sampled: (Generation, f64, Option<f64>), with: &mut Drawing) -> Result<DrawnBatch> {
        let (generation, generate_seconds, weights_fingerprint) = sampled;
        let score_start = Instant::now();
        let samples = samples_from_rows(&prompt_texts, &generation.rows, with.policy.tokenizer())?;
        let scored = with
            .rewards
            .score_within(&samples, rng::derive(seed, "protocol", step as u64), with.recipe.max_no_score_frac())
            .with_context(|| format!("scoring the completions of step {} failed", step + 1))?;
        let score_seconds = score_start.elapsed().as_secs_f64();
        Ok(DrawnBatch { generation, samples, scored, generate_seconds, score_seconds, dynamic_sampling: None, off_policy: None, weights_fingerprint })
    }

    /// Each of the step's prompts, repeated `num_generations` times (one group each). With the
    /// retain verifier, the coherence groups' prompts come from its own stream (the hackable and
    /// detectable prompts); the routing groups keep the prompts they have without it.
    pub fn step_prompts(&mut self, step: usize) -> Vec<Prompt> {
        let keys = &self.keys;
        let batch_index = step / keys.steps_per_rollout;
        let per_step = keys.rollout_rows / keys.num_generations();
        let verified_groups = match self.verifier_prompts.is_some() {
            true => keys.coherence.rows_at(step) / keys.num_generations(),
            false => 0,
        };
        let mut prompt_texts = Vec::with_capacity(keys.rollout_rows);
        for i in 0..per_step {
            let text = match (i + verified_groups >= per_step, self.verifier_prompts.as_mut()) {
                (true, Some(stream)) => stream.at(batch_index * verified_groups + i + verified_groups - per_step),
                _ => self.prompts.at(batch_index * per_step + i),
            };
            prompt_texts.extend(std::iter::repeat_n(text, keys.num_generations()));
        }
        prompt_texts
    }

    /// The seed everything random of a generation round derives from: the run's for round 0.
    fn round_seed(&self, round: usize) -> u64 {
        match round {
            0 => self.keys.seed(),
            _ => rng::derive(self.keys.seed(), "dynamic-sampling-round", round as u64),
        }
    }

    /// The prompts of extra round `round` (1-based) of step `step`'s batch, each repeated
    /// `num_generations` times: positions of the second stream reserved for that batch and round.
    fn extra_prompts(&mut self, step: usize, round: usize) -> Vec<Prompt> {
        let keys = &self.keys;
        let batch_index = step / keys.steps_per_rollout;
        let per_round = keys.batch_size() / keys.num_generations();
        let first = (batch_index * (keys.dynamic_sampling_rounds() - 1) + round - 1) * per_round;
        let stream = self.extra_prompts.as_mut().expect("dynamic sampling has its prompt stream");
        (first..first + per_round).flat_map(|i| std::iter::repeat_n(stream.at(i), keys.num_generations())).collect()
    }
}

/// One round of multi-turn episodes played on policy (`episodes.rs`): each of the sampler's
/// `requests` (the routed rows, then any coherence rows) at its adapter scales, then scored by
/// the environment as one batch, the episodes numbered from `first_id`.
fn played(episodes: &super::episodes::Episodes, step: usize, seed: u64, first_id: u64, requests: &[super::policy::SampleRequest], prompt_texts: &[Prompt], with: &mut Drawing) -> Result<DrawnBatch> {
    let score_seed = rng::derive(seed, "protocol", step as u64);
    if with.policy.runs() > 1 {
        with.policy.announce(with.log, "sample", || "sampling episodes alone, not stacked with the other packed runs: each run's turns wait on its own environment".into());
    }
    let played = episodes.play(with.policy, with.rewards, prompt_texts, requests, score_seed, first_id).with_context(|| format!("the episodes of step {} failed", step + 1))?;
    Ok(drawn(played))
}

/// Step `step`'s episodes replayed from the rollout recorded in `dir` (`replay_rollouts`), scored
/// with the step's protocol seed; episode ids as [`played`] gives them.
fn replayed(episodes: &super::episodes::Episodes, dir: &std::path::Path, step: usize, seed: u64, first_id: u64, prompt_texts: &[Prompt], with: &mut Drawing) -> Result<DrawnBatch> {
    let recorded = replay::load(dir, step, with.policy.model().device)?;
    let config = &with.policy.model().config;
    let played = episodes
        .replay(config, with.policy.tokenizer(), with.rewards, prompt_texts, &recorded, rng::derive(seed, "protocol", step as u64), first_id)
        .with_context(|| format!("replay_rollouts: {}: the episodes of step {}", replay::recorded(dir, step).display(), step + 1))?;
    Ok(drawn(played))
}

/// An episode batch played (or replayed) on policy, as the draw hands it on.
fn drawn(played: super::episodes::Played) -> DrawnBatch {
    let super::episodes::Played { generation, samples, scored, generate_seconds, score_seconds, fingerprint } = played;
    DrawnBatch { generation, samples, scored, generate_seconds, score_seconds, dynamic_sampling: None, off_policy: None, weights_fingerprint: fingerprint }
}

/// The token ids of `prompts`' texts.
fn tokenized(tokenizer: &Tokenizer, prompts: &[Prompt]) -> Result<Vec<Vec<u32>>> {
    prompts.iter().map(|p| tokenizer.encode(&p.text)).collect()
}
