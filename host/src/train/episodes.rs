//! A run on a multi-turn episode environment (issue 48): each row of a batch is one episode
//! (`episode::run_episodes`, sampled with the run's decoder at the batch's adapter scales),
//! scored at its end by the environment ([`RewardModel::score_episodes`]); groups, advantages,
//! routing and interventions act on its row as on a single-turn completion, and the loss, ratio,
//! KL, entropy and every per-token statistic count the model's tokens only
//! (`Generation::model_mask`, `grpo::loss_mask`).
//!
//! The episode's token budget is `max_completion_length` (its turns and observations
//! together), so the memory planner and dr_grpo's constant need no other width; a turn is at
//! most `episode_max_turn_tokens`. A chat run's observations are written through the model's
//! chat template, continuing each prompt's conversation; a raw run's as plain text
//! (`episode::Observations`).
//!
//! Sampling ahead (`max_steps_off_policy`, `sampling_steps_ahead`, `stream_minibatches`): the
//! run's sampler thread plays a chunk's episodes itself ([`Episodes::play_ahead`]), with a
//! second instance of the environment (`Plugin::another_instance`: the same component and
//! parameters; an episode is a function of its prompt, id and turns, and a WASI guest's
//! randomness of the call's inputs, so either instance plays it alike), and hands back the
//! generation with each episode's [`Outcome`], which the run scores when it takes the chunk
//! ([`Episodes::score`]) and a checkpoint saves with the chunks in flight. The ratio to the
//! sampler is over the model's tokens only, as every per-token term (observation tokens have
//! sampling log-probability 0 and model mask 0).
//!
//! What does not run episodes yet is refused by name before the run directory is written
//! ([`refuse_unsupported`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde::{Deserialize, Serialize};

use super::TrainConfig;
use super::policy::Policy;
use super::prompts::{PromptRender, conversation_of};
use crate::engine::Extra;
use crate::episode::{EpisodeBatch, EpisodeBound, EpisodePrompt, Observations, run_episodes};
use crate::model::chat::ChatTemplate;
use crate::model::Tokenizer;
use crate::model::decode::DecodeModel;
use crate::model::generate::{Decoder, Generation, SamplingParams, default_decoder};
use crate::plugins::{EpisodeEnd, Plugin};
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
    rules: Rules,
    /// With sampling ahead: the sampler thread's instance of the environment and its tokenizer.
    ahead: Option<Arc<Mutex<(Plugin, Tokenizer)>>>,
}

/// What playing a batch's episodes needs beside a decoder and an environment (shared with the
/// sampler thread).
#[derive(Clone)]
struct Rules {
    bounds: crate::plugins::EpisodeBounds,
    turn_tokens: usize,
    starts: Arc<HashMap<String, EnvPrompt>>,
    /// The chat template of a chat run: observations are written through it (None: the
    /// plain-text protocol of raw prompts; `episode::Observations`).
    template: Option<ChatTemplate>,
}

/// How one episode ended and what the host counted of it: what scoring a played batch needs
/// beside its generation (carried from the sampler thread; saved with a checkpoint's chunks in
/// flight, its floats read back bit for bit: serde_json's `float_roundtrip`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub components: Vec<f64>,
    pub metrics: Vec<f64>,
    pub monitor: bool,
    pub ground_truth: bool,
    pub turns: usize,
    pub observation_tokens: usize,
    pub bounded: Option<EpisodeBound>,
}

impl Outcome {
    fn of(batch: &EpisodeBatch) -> Vec<Outcome> {
        let outcome = |i: usize| {
            let EpisodeEnd { components, metrics, monitor, ground_truth } = batch.ends[i].clone();
            Outcome { components, metrics, monitor, ground_truth, turns: batch.turns[i], observation_tokens: batch.observation_tokens[i], bounded: batch.bounded[i] }
        };
        (0..batch.ends.len()).map(outcome).collect()
    }

    fn end(&self) -> EpisodeEnd {
        EpisodeEnd { components: self.components.clone(), metrics: self.metrics.clone(), monitor: self.monitor, ground_truth: self.ground_truth }
    }
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

/// Episodes played and not yet scored: the seconds they took, the fingerprint of the weights
/// that played them.
pub(super) struct Unscored {
    pub generation: Generation,
    pub outcomes: Vec<Outcome>,
    pub seconds: f64,
    pub fingerprint: f64,
}

/// Refuses what does not run episodes yet, naming each key, so that no part of a run silently
/// samples single turns from an episode environment. Packs run episodes: each run plays its
/// own with its own decoder (never stacked, see [`Episodes::play`]).
pub(super) fn refuse_unsupported(cfg: &TrainConfig, environment: &str) -> Result<()> {
    let refusals = [
        (cfg.replay_rollouts.is_some(), "replay_rollouts: recorded rollouts of episodes are not replayed yet".to_string()),
        (cfg.coh_samples_per_rollout > 0 || cfg.rh_detector_verifies_retain_samples, "coh_samples_per_rollout and rh_detector_verifies_retain_samples (coherence rows): episodes are sampled at the routed scales only, for now".into()),
        (cfg.mask_truncated_completions, "mask_truncated_completions: an episode's last turn cut by episode_max_turn_tokens is not a truncated episode, and which are is not settled yet".into()),
        (cfg.fisher_kernel_every > 0, "fisher_kernel_every: the Fisher kernel's sequence log-probabilities would count observation tokens".into()),
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
        let rules = Rules { bounds, turn_tokens: cfg.episode_max_turn_tokens, starts: Arc::new(starts), template: render.template().cloned() };
        Ok(Self { rules, ahead: None })
    }

    /// Gives the run's sampler thread its own instance of the environment (`rewards`'s, started
    /// again: [`Plugin::another_instance`]) and a copy of the tokenizer, to play episodes ahead.
    pub(super) fn sample_ahead(&mut self, rewards: &mut RewardModel, tokenizer: &Tokenizer) -> Result<()> {
        let environment = rewards.episode_environment().context("internal error: episodes without an episode environment")?;
        let second = environment.another_instance().context("the run samples ahead (max_steps_off_policy, sampling_steps_ahead or stream_minibatches): its sampler thread plays episodes with an instance of the environment of its own")?;
        self.ahead = Some(Arc::new(Mutex::new((second, tokenizer.clone()))));
        Ok(())
    }

    /// One episode per prompt (in order; a group's prompt repeated) from the policy at adapter
    /// `scales`, each turn drawn from `seeds.0`'s streams; then scored, the protocol knobs drawn
    /// from `seeds.1`. Episode ids start at `first_id`.
    ///
    /// In a pack the episodes are decoded with the run's own decoder, never stacked with the
    /// other runs' (a turn waits on the run's environment, and the runs' turns and episode
    /// ends differ), so a packed run's episodes are its solo run's token for token; its scoring
    /// and training passes stack as any run's.
    pub(super) fn play(&self, policy: &mut Policy, rewards: &mut RewardModel, prompts: &[Prompt], scales: &[f64], seeds: (u64, u64), first_id: u64) -> Result<Played> {
        let unscored = self.play_unscored(policy, rewards, prompts, scales, seeds.0, first_id)?;
        let scoring = Instant::now();
        let (samples, scored) = Self::score(rewards, policy.tokenizer(), prompts, &unscored.generation, &unscored.outcomes, seeds.1)?;
        let score_seconds = scoring.elapsed().as_secs_f64();
        Ok(Played { generation: unscored.generation, samples, scored, generate_seconds: unscored.seconds, score_seconds, fingerprint: Some(unscored.fingerprint) })
    }

    /// [`Episodes::play`] before scoring, on the run's own instance of the environment (a chunk
    /// sampled ahead that the step samples itself is played here).
    pub(super) fn play_unscored(&self, policy: &mut Policy, rewards: &mut RewardModel, prompts: &[Prompt], scales: &[f64], seed: u64, first_id: u64) -> Result<Unscored> {
        let started = Instant::now();
        let (decoder, fingerprint, tokenizer, sampling) = policy.episode_sampler(scales)?;
        let environment = rewards.episode_environment().context("internal error: episodes without an episode environment")?;
        let (generation, outcomes) = self.rules.run(default_decoder(decoder), decoder, tokenizer, sampling, environment, prompts, seed, first_id)?;
        // The decoder's refresh is part of sampling.
        Ok(Unscored { generation, outcomes, seconds: started.elapsed().as_secs_f64(), fingerprint })
    }

    /// [`Episodes::play`] with `decoder` (the policy folded at the batch's adapter scales) and
    /// the run's `sampling` (its training batches' settings; each turn at most
    /// `episode_max_turn_tokens`): `smallrl eval` of a checkpoint plays its episodes here, with
    /// a decoder of its own, as the run's evaluations did.
    #[allow(clippy::too_many_arguments)]
    pub fn play_on(&self, decoder: &DecodeModel, tokenizer: &Tokenizer, sampling: &SamplingParams, rewards: &mut RewardModel, prompts: &[Prompt], seeds: (u64, u64), first_id: u64) -> Result<Played> {
        let started = Instant::now();
        let environment = rewards.episode_environment().context("internal error: episodes without an episode environment")?;
        let (generation, outcomes) = self.rules.run(default_decoder(decoder), decoder, tokenizer, sampling, environment, prompts, seeds.0, first_id)?;
        let generate_seconds = started.elapsed().as_secs_f64();
        let scoring = Instant::now();
        let (samples, scored) = Self::score(rewards, tokenizer, prompts, &generation, &outcomes, seeds.1)?;
        Ok(Played { generation, samples, scored, generate_seconds, score_seconds: scoring.elapsed().as_secs_f64(), fingerprint: None })
    }

    /// Posts a chunk's episodes (`prompts`, as [`Episodes::play`]'s) to the run's sampler
    /// thread, played there from the policy's weights as they are now with the thread's
    /// instance of the environment; returns the weights' fingerprint. The thread hands back the
    /// generation and the episodes' [`Outcome`]s ([`Episodes::outcomes`]).
    pub(super) fn play_ahead(&self, policy: &mut Policy, prompts: &[Prompt], scales: &[f64], seed: u64, first_id: u64) -> Result<f64> {
        let side = self.ahead.clone().context("internal error: episodes played ahead without the sampler thread's environment")?;
        let (rules, prompts, sampling) = (self.rules.clone(), prompts.to_vec(), *policy.sampling());
        let play = move |decoding: Decoder, decoder: &DecodeModel| -> Result<(Generation, Extra)> {
            let mut side = side.lock().map_err(|_| anyhow!("the sampler thread's environment is unusable: an earlier job panicked with it"))?;
            let (environment, tokenizer) = &mut *side;
            let (generation, outcomes) = rules.run(decoding, decoder, tokenizer, &sampling, environment, &prompts, seed, first_id)?;
            Ok((generation, Box::new(outcomes)))
        };
        policy.play_ahead(scales, Box::new(play))
    }

    /// The [`Outcome`]s a job of [`Episodes::play_ahead`] handed back beside its generation.
    pub(super) fn outcomes(extra: Option<Extra>) -> Result<Vec<Outcome>> {
        let extra = extra.context("internal error: episodes sampled ahead came back without their ends")?;
        extra.downcast::<Vec<Outcome>>().map(|outcomes| *outcomes).map_err(|_| anyhow!("internal error: episodes sampled ahead came back with something else than their ends"))
    }

    /// Scores played episodes (`generation`, with their `outcomes`) of `prompts`: the
    /// environment's ends ([`RewardModel::score_episodes`], the protocol knobs drawn from
    /// `seed`) and the host's per-episode metrics.
    pub(super) fn score(rewards: &RewardModel, tokenizer: &Tokenizer, prompts: &[Prompt], generation: &Generation, outcomes: &[Outcome], seed: u64) -> Result<(Vec<Sample>, ScoredBatch)> {
        ensure!(outcomes.len() == generation.rows.len(), "internal error: {} episode ends for {} episodes", outcomes.len(), generation.rows.len());
        let samples = samples_from_rows(prompts, &generation.rows, tokenizer)?;
        let ends: Vec<EpisodeEnd> = outcomes.iter().map(Outcome::end).collect();
        let mut scored = rewards.score_episodes(&samples, &ends, seed)?;
        scored.metrics.extend(episode_metrics(outcomes));
        Ok((samples, scored))
    }
}

impl Rules {
    /// Runs one episode per prompt in `environment` with `decoder` decoding as `decoding` says.
    #[allow(clippy::too_many_arguments)]
    fn run(&self, decoding: Decoder, decoder: &DecodeModel, tokenizer: &Tokenizer, sampling: &SamplingParams, environment: &mut Plugin, prompts: &[Prompt], seed: u64, first_id: u64) -> Result<(Generation, Vec<Outcome>)> {
        let episodes: Vec<EpisodePrompt> = prompts
            .iter()
            .map(|prompt| {
                let env_prompt = self.starts.get(&prompt.text).context("internal error: a prompt the environment did not write started an episode")?;
                Ok(EpisodePrompt { env_prompt, prompt, ids: tokenizer.encode(&prompt.text)? })
            })
            .collect::<Result<_>>()?;
        let params = SamplingParams { max_new_tokens: self.turn_tokens, kept_sets: false, ..*sampling };
        let observations = match &self.template {
            None => Observations::PlainText,
            Some(template) => Observations::Chat { template, conversations: prompts.iter().map(conversation_of).collect::<Result<_>>()? },
        };
        let batch = run_episodes(decoding, decoder, tokenizer, environment, &episodes, observations, &params, seed, &self.bounds, first_id)?;
        let outcomes = Outcome::of(&batch);
        Ok((batch.generation, outcomes))
    }
}

/// The host's per-episode metrics ([`TURNS`] and the others), one value per episode.
fn episode_metrics(outcomes: &[Outcome]) -> Vec<(String, Vec<f64>)> {
    let bound = |which: EpisodeBound| outcomes.iter().map(|o| f64::from(u8::from(o.bounded == Some(which)))).collect();
    vec![
        (TURNS.to_string(), outcomes.iter().map(|o| o.turns as f64).collect()),
        (OBSERVATION_TOKENS.to_string(), outcomes.iter().map(|o| o.observation_tokens as f64).collect()),
        (ENDED_BY_TURN_BOUND.to_string(), bound(EpisodeBound::Turns)),
        (ENDED_BY_TOKEN_BOUND.to_string(), bound(EpisodeBound::Tokens)),
    ]
}
