//! The step's batch drawn: prompts, sampled, scored; with DAPO's dynamic sampling
//! (`dynamic_sampling_rounds`), groups whose rewards are all equal dropped and more prompts
//! sampled in further rounds until the batch is full, as verl's DAPO recipe does: kept groups
//! in the order they were generated, the batch cut to `batch_size` (the surplus discarded), and
//! an error when the rounds run out (verl raises "Generated too many"; its 0 means no limit,
//! here 0 means off).
//!
//! Architecture invariant: round 0 is the batch a run without dynamic sampling draws (same
//! prompts, same seeds), so a run whose groups all differ is that run; round `r > 0` draws its
//! prompts from a second seeded stream at positions fixed by `(batch, r)` and its seeds from
//! `(seed, "dynamic-sampling-round", r)`, so a resumed run draws the same batch.

use std::time::Instant;

use anyhow::{Context, Result, ensure};

use super::Trainer;
use super::ahead::OffPolicy;
use super::metrics::DynamicSampling;
use crate::eval;
use crate::grpo;
use crate::intervention::{self, Intervention};
use crate::model::generate::Generation;
use crate::reward::{Prompt, Sample, ScoredBatch};
use crate::rng;

/// A sampled and scored batch (or one round of it).
pub(super) struct DrawnBatch {
    pub generation: Generation,
    pub samples: Vec<Sample>,
    pub scored: ScoredBatch,
    pub generate_seconds: f64,
    pub score_seconds: f64,
    pub dynamic_sampling: Option<DynamicSampling>,
    /// With `max_steps_off_policy`: how stale the batch was.
    pub off_policy: Option<OffPolicy>,
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

impl Trainer {
    /// The step's batch; with dynamic sampling, only groups whose rewards differ (see the
    /// module's documentation), and the counts of what it took.
    pub(super) fn draw_batch(&mut self, step: usize) -> Result<DrawnBatch> {
        let prompts = self.step_prompts(step);
        let first = self.draw_round(step, 0, prompts)?;
        let max_rounds = self.cfg.dynamic_sampling_rounds;
        if max_rounds == 0 {
            return Ok(first);
        }
        let (group, needed) = (self.cfg.num_generations, self.cfg.batch_size / self.cfg.num_generations);
        let pad = self.model.config.eos_token_id as i64;
        let mut counts = DynamicSampling::default();
        let (mut kept, mut kept_groups, mut round) = (None::<DrawnBatch>, 0, first);
        loop {
            counts.rounds += 1;
            let informative = grpo::informative_groups(&self.trained_rewards(&round.scored), &self.advantage_rows(&round.scored), group);
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
            round = self.draw_round(step, counts.rounds, prompts)?;
        }
        let mut batch = kept.expect("at least one round");
        batch.dynamic_sampling = Some(counts);
        Ok(batch)
    }

    /// Samples and scores one round of prompts (each repeated `num_generations` times).
    fn draw_round(&mut self, step: usize, round: usize, prompt_texts: Vec<Prompt>) -> Result<DrawnBatch> {
        let prompt_ids = self.tokenized(&prompt_texts)?;
        let coherence_rows = self.cfg.coherence_rows(step);
        let seed = self.round_seed(round);
        let (generation, generate_seconds, off_policy) = match self.cfg.samples_ahead() {
            false => {
                let (generation, seconds) = self.sample(&prompt_ids, coherence_rows, step, seed)?;
                (generation, seconds, None)
            }
            true => {
                let (generation, seconds, off_policy) = self.sample_off_policy(&prompt_ids, coherence_rows, step)?;
                (generation, seconds, Some(off_policy))
            }
        };

        let score_start = Instant::now();
        let samples = eval::to_samples(&prompt_texts, &generation.rows, &self.tokenizer)?;
        let scored = self
            .rewards
            .score(&samples, rng::derive(seed, "protocol", step as u64))
            .with_context(|| format!("scoring the completions of step {} failed", step + 1))?;
        let score_seconds = score_start.elapsed().as_secs_f64();
        Ok(DrawnBatch { generation, samples, scored, generate_seconds, score_seconds, dynamic_sampling: None, off_policy })
    }

    pub(super) fn tokenized(&self, prompts: &[Prompt]) -> Result<Vec<Vec<u32>>> {
        prompts.iter().map(|p| self.tokenizer.encode(&p.text)).collect()
    }

    /// The seed everything random of a generation round derives from: the run's for round 0.
    fn round_seed(&self, round: usize) -> u64 {
        match round {
            0 => self.cfg.seed,
            _ => rng::derive(self.cfg.seed, "dynamic-sampling-round", round as u64),
        }
    }

    /// The prompts of extra round `round` (1-based) of step `step`'s batch, each repeated
    /// `num_generations` times: positions of the second stream reserved for that batch and round.
    fn extra_prompts(&mut self, step: usize, round: usize) -> Vec<Prompt> {
        let batch_index = step / self.cfg.steps_per_rollout();
        let per_round = self.cfg.batch_size / self.cfg.num_generations;
        let first = (batch_index * (self.cfg.dynamic_sampling_rounds - 1) + round - 1) * per_round;
        let stream = self.extra_prompts.as_mut().expect("dynamic sampling has its prompt stream");
        (first..first + per_round).flat_map(|i| std::iter::repeat_n(stream.at(i), self.cfg.num_generations)).collect()
    }

    /// The rewards the advantages are computed from: after `intervention: penalty`'s penalty.
    pub(super) fn trained_rewards(&self, scored: &ScoredBatch) -> Vec<f64> {
        match self.cfg.intervention {
            Intervention::Penalty => intervention::penalised(&scored.reward, &scored.flags(), self.cfg.rh_penalty),
            _ => scored.reward.clone(),
        }
    }

    /// The rows whose rewards enter the advantages: all, or with `intervention: filter` the
    /// unflagged ones.
    fn advantage_rows(&self, scored: &ScoredBatch) -> Vec<bool> {
        match self.cfg.intervention {
            Intervention::Filter => scored.flags().iter().map(|f| !f).collect(),
            _ => vec![true; scored.reward.len()],
        }
    }
}
