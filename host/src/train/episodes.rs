//! A run on a multi-turn episode environment (issue 48): each row of a batch is one episode
//! (`episode::run_episodes`, sampled with the run's decoder at its rows' adapter scales: a
//! batch's coherence rows with the forget adapter off, [`Episodes::play`]), scored at its end by
//! the environment ([`RewardModel::score_episodes`]); groups, advantages, routing, coherence
//! rows and interventions act on its row as on a single-turn completion, and the loss, ratio,
//! KL, entropy, the Fisher kernel and every per-token statistic count the model's tokens only
//! (`Generation::model_mask`, `grpo::loss_mask`). With `mask_truncated_completions` an episode
//! whose last token is not a stop token (its final turn cut, by `episode_max_turn_tokens` or the
//! episode's budget) leaves the loss, as TRL masks a multi-turn completion
//! (`CompletionRow::ended_with_eos`, set by `episode::lay_out`).
//!
//! The episode's token budget is `max_completion_length` (its turns and observations
//! together), so the memory planner and dr_grpo's constant need no other width; a turn is at
//! most `episode_max_turn_tokens`. A chat run's observations are written through the model's
//! chat template, continuing each prompt's conversation; a raw run's as plain text
//! (`episode::Observations`).
//!
//! What does not run episodes yet is refused by name before the run directory is written
//! ([`refuse_unsupported`]).

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use super::TrainConfig;
use super::policy::{Policy, SampleRequest};
use super::prompts::{PromptRender, conversation_of};
use crate::episode::{EpisodeBatch, EpisodeBound, EpisodePrompt, Observations, replay_episodes, run_episodes};
use crate::model::chat::ChatTemplate;
use crate::model::Tokenizer;
use crate::model::decode::DecodeModel;
use crate::model::config::LlamaConfig;
use crate::model::generate::{Generation, SamplingParams, default_decoder};
use crate::reward::{EnvPrompt, Prompt, RewardModel, Sample, ScoredBatch, samples_from_rows};

/// Per-episode metrics the host adds to a scored batch's metrics (their means are logged under
/// these keys, beside the environment's `env/<environment>/<metric>`): assistant turns,
/// observation tokens, and whether the turn or the token bound made the final turn the last
/// (1 or 0, so the mean is the fraction).
pub const TURNS: &str = "episodes/turns";
pub const OBSERVATION_TOKENS: &str = "episodes/observation_tokens";
pub const ENDED_BY_TURN_BOUND: &str = "episodes/ended_by_turn_bound";
pub const ENDED_BY_TOKEN_BOUND: &str = "episodes/ended_by_token_bound";

/// How a run's episodes are sampled, and the prompts as the environment wrote them (by the
/// rendered text the trainer holds), which each episode starts from.
pub struct Episodes {
    bounds: crate::plugins::EpisodeBounds,
    turn_tokens: usize,
    starts: HashMap<String, EnvPrompt>,
    /// The chat template of a chat run: observations are written through it (None: the
    /// plain-text protocol of raw prompts; `episode::Observations`).
    template: Option<ChatTemplate>,
}

/// An episode batch sampled and scored.
pub struct Played {
    pub generation: Generation,
    pub samples: Vec<Sample>,
    pub scored: ScoredBatch,
    pub generate_seconds: f64,
    pub score_seconds: f64,
    /// The fingerprint of the weights whose decoder played the episodes: a training batch's
    /// ([`Episodes::play`]); none for `smallrl eval`'s decoder of its own.
    pub fingerprint: Option<f64>,
}

/// Refuses what does not run episodes yet, naming each key, so that no part of a run silently
/// samples single turns from an episode environment. Packs run episodes: each run plays its
/// own with its own decoder (never stacked, see [`Episodes::play`]).
pub(super) fn refuse_unsupported(cfg: &TrainConfig, environment: &str) -> Result<()> {
    let refusals = [
        (cfg.samples_ahead(), "max_steps_off_policy, sampling_steps_ahead and stream_minibatches (sampling ahead): episodes are sampled on policy only, for now".to_string()),
        (
            cfg.sampling_truncates() && cfg.sampling_replay == crate::grpo::SamplingReplay::KeptSets,
            "sampling_replay kept_sets with top_k or top_p: kept sets are not recorded across turns; use sampling_replay: trl_1_16".into(),
        ),
    ];
    let refused: Vec<String> = refusals.into_iter().filter(|(refused, _)| *refused).map(|(_, why)| why).collect();
    ensure!(refused.is_empty(), "environment {environment} runs multi-turn episodes, which this run cannot yet: {}", refused.join("; "));
    Ok(())
}

impl Episodes {
    /// The run's episode settings, with the environment's `prompts` (training and evaluation,
    /// as generated, keyed by their text as `render` rendered them).
    pub fn new(cfg: &TrainConfig, prompts: Vec<(String, EnvPrompt)>, render: &PromptRender) -> Result<Self> {
        let bounds = crate::plugins::EpisodeBounds {
            max_turns: cfg.episode_max_turns,
            max_observation_bytes: cfg.episode_max_observation_bytes,
            max_observation_tokens: cfg.episode_max_observation_tokens,
            max_episode_tokens: cfg.max_completion_length,
        };
        let mut starts = HashMap::with_capacity(prompts.len());
        for (text, prompt) in prompts {
            if let Some(other) = starts.get(&text).filter(|other| **other != prompt) {
                bail!("two of the environment's prompts render to the same text but differ ({other:?} and {prompt:?}): an episode could not tell which one it starts from");
            }
            starts.insert(text, prompt);
        }
        Ok(Self { bounds, turn_tokens: cfg.episode_max_turn_tokens, starts, template: render.template().cloned() })
    }

    /// One episode per prompt (in order; a group's prompt repeated) from the policy, by
    /// `requests` (`Policy::sample_requests`: the routed rows at their adapter scales, then any
    /// coherence rows with the forget adapter off, each from its own seed, as single-turn rows
    /// are sampled): each request's rows are played by the decoder folded at its scales, its
    /// episodes numbered on from `first_id`. The batch is then scored as one, the protocol knobs
    /// drawn from `score_seed`, as a single-turn batch's routed and coherence rows are.
    ///
    /// In a pack the episodes are decoded with the run's own decoder, never stacked with the
    /// other runs' (a turn waits on the run's environment, and the runs' turns and episode
    /// ends differ), so a packed run's episodes are its solo run's token for token; its scoring
    /// and training passes stack as any run's.
    pub(super) fn play(&self, policy: &mut Policy, rewards: &mut RewardModel, prompts: &[Prompt], requests: &[SampleRequest], score_seed: u64, first_id: u64) -> Result<Played> {
        let started = Instant::now();
        let (mut joined, mut fingerprint, mut played_rows) = (None::<EpisodeBatch>, None, 0);
        let pad = i64::from(policy.model().config.eos_token_id);
        for request in requests {
            let rows = played_rows..played_rows + request.prompt_ids.len();
            ensure!(rows.end <= prompts.len(), "internal error: sampler requests for {} episodes of {} prompts", rows.end, prompts.len());
            // The decoder's refresh (folding the adapters at the request's scales) is part of sampling.
            let (decoder, weights, tokenizer, sampling) = policy.episode_sampler(&request.scales)?;
            let starts = self.episode_prompts(&prompts[rows.clone()], request.prompt_ids.clone())?;
            let batch = self.run(decoder, tokenizer, sampling, rewards, &starts, request.seed, first_id + rows.start as u64)?;
            joined = Some(match joined {
                None => batch,
                Some(so_far) => so_far.concat(batch, pad),
            });
            fingerprint = fingerprint.or(Some(weights));
            played_rows = rows.end;
        }
        ensure!(played_rows == prompts.len(), "internal error: sampler requests for {played_rows} episodes of {} prompts", prompts.len());
        let batch = joined.context("internal error: an episode batch without a sampler request")?;
        let generate_seconds = started.elapsed().as_secs_f64();
        let played = self.scored(batch, policy.tokenizer(), rewards, prompts, score_seed)?;
        Ok(Played { generate_seconds, fingerprint, ..played })
    }

    /// [`Episodes::play`] of every prompt at adapter `scales`, sampled and scored from `seeds`:
    /// the run's evaluations.
    pub(super) fn play_at(&self, policy: &mut Policy, rewards: &mut RewardModel, prompts: &[Prompt], scales: &[f64], seeds: (u64, u64), first_id: u64) -> Result<Played> {
        let prompt_ids = prompts.iter().map(|prompt| policy.tokenizer().encode(&prompt.text)).collect::<Result<_>>()?;
        let request = SampleRequest { scales: scales.to_vec(), prompt_ids, seed: seeds.0 };
        self.play(policy, rewards, prompts, &[request], seeds.1, first_id)
    }

    /// [`Episodes::play`] with `decoder` (the policy folded at the batch's adapter scales) and
    /// the run's `sampling` (its training batches' settings; each turn at most
    /// `episode_max_turn_tokens`): `smallrl eval` of a checkpoint plays its episodes here, with
    /// a decoder of its own, as the run's evaluations did.
    #[allow(clippy::too_many_arguments)]
    pub fn play_on(&self, decoder: &DecodeModel, tokenizer: &Tokenizer, sampling: &SamplingParams, rewards: &mut RewardModel, prompts: &[Prompt], seeds: (u64, u64), first_id: u64) -> Result<Played> {
        let started = Instant::now();
        let ids = prompts.iter().map(|prompt| tokenizer.encode(&prompt.text)).collect::<Result<_>>()?;
        let starts = self.episode_prompts(prompts, ids)?;
        let batch = self.run(decoder, tokenizer, sampling, rewards, &starts, seeds.0, first_id)?;
        let generate_seconds = started.elapsed().as_secs_f64();
        Ok(Played { generate_seconds, ..self.scored(batch, tokenizer, rewards, prompts, seeds.1)? })
    }

    /// Each of `prompts` with its token ids `ids` and the prompt the environment wrote for it.
    fn episode_prompts<'a>(&'a self, prompts: &'a [Prompt], ids: Vec<Vec<u32>>) -> Result<Vec<EpisodePrompt<'a>>> {
        ensure!(ids.len() == prompts.len(), "internal error: {} token lists for {} prompts", ids.len(), prompts.len());
        prompts
            .iter()
            .zip(ids)
            .map(|(prompt, ids)| {
                let env_prompt = self.starts.get(&prompt.text).context("internal error: a prompt the environment did not write started an episode")?;
                Ok(EpisodePrompt { env_prompt, prompt, ids })
            })
            .collect()
    }

    /// Plays `starts` on `decoder` from `seed`'s turn streams, episode ids from `first_id`.
    #[allow(clippy::too_many_arguments)]
    fn run(&self, decoder: &DecodeModel, tokenizer: &Tokenizer, sampling: &SamplingParams, rewards: &mut RewardModel, starts: &[EpisodePrompt], seed: u64, first_id: u64) -> Result<EpisodeBatch> {
        let params = SamplingParams { max_new_tokens: self.turn_tokens, kept_sets: false, ..*sampling };
        let environment = rewards.episode_environment().context("internal error: episodes without an episode environment")?;
        run_episodes(default_decoder(decoder), decoder, tokenizer, environment, starts, self.observations(starts)?, &params, seed, &self.bounds, first_id)
    }

    /// The episodes of `prompts` replayed from the `recorded` rollout (`replay_rollouts`; see
    /// `episode::replay_episodes`) in the run's environment, episode ids from `first_id`, then
    /// scored as [`Episodes::play`] scores them, the protocol knobs drawn from `score_seed`;
    /// nothing is sampled.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn replay(&self, config: &LlamaConfig, tokenizer: &Tokenizer, rewards: &mut RewardModel, prompts: &[Prompt], recorded: &Generation, score_seed: u64, first_id: u64) -> Result<Played> {
        let ids = prompts.iter().map(|prompt| tokenizer.encode(&prompt.text)).collect::<Result<_>>()?;
        let starts = self.episode_prompts(prompts, ids)?;
        let environment = rewards.episode_environment().context("internal error: episodes without an episode environment")?;
        let batch = replay_episodes(config, tokenizer, environment, &starts, self.observations(&starts)?, recorded, self.turn_tokens, &self.bounds, first_id)?;
        self.scored(batch, tokenizer, rewards, prompts, score_seed)
    }

    /// How `starts`' observations are written: through the chat template in a chat run.
    fn observations(&self, starts: &[EpisodePrompt]) -> Result<Observations<'_>> {
        Ok(match &self.template {
            None => Observations::PlainText,
            Some(template) => Observations::Chat { template, conversations: starts.iter().map(|start| conversation_of(start.prompt)).collect::<Result<_>>()? },
        })
    }

    /// `batch`'s episodes (of `prompts`, in order) scored at their ends, the protocol knobs
    /// drawn from `seed`, with the host's per-episode metrics; no timings or fingerprint yet.
    fn scored(&self, batch: EpisodeBatch, tokenizer: &Tokenizer, rewards: &mut RewardModel, prompts: &[Prompt], seed: u64) -> Result<Played> {
        let scoring = Instant::now();
        let samples = samples_from_rows(prompts, &batch.generation.rows, tokenizer)?;
        let mut scored = rewards.score_episodes(&samples, &batch.ends, seed)?;
        scored.metrics.extend(episode_metrics(&batch));
        Ok(Played { generation: batch.generation, samples, scored, generate_seconds: 0.0, score_seconds: scoring.elapsed().as_secs_f64(), fingerprint: None })
    }
}

/// The host's per-episode metrics ([`TURNS`] and the others), one value per episode.
fn episode_metrics(batch: &EpisodeBatch) -> Vec<(String, Vec<f64>)> {
    let bound = |which: EpisodeBound| batch.bounded.iter().map(|b| f64::from(u8::from(*b == Some(which)))).collect();
    vec![
        (TURNS.to_string(), batch.turns.iter().map(|&t| t as f64).collect()),
        (OBSERVATION_TOKENS.to_string(), batch.observation_tokens.iter().map(|&t| t as f64).collect()),
        (ENDED_BY_TURN_BOUND.to_string(), bound(EpisodeBound::Turns)),
        (ENDED_BY_TOKEN_BOUND.to_string(), bound(EpisodeBound::Tokens)),
    ]
}
