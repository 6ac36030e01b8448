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
//! `replay_rollouts` replays recorded episodes through the environment ([`Episodes::replay`],
//! `episode::replay_episodes`). What does not run episodes yet is refused by name before the
//! run directory is written ([`refuse_unsupported`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde::{Deserialize, Serialize};

use super::TrainConfig;
use super::policy::{Policy, SampleRequest};
use super::prompts::{PromptRender, conversation_of};
use crate::engine::Extra;
use crate::episode::{CallCounts, EpisodeBatch, EpisodeBound, EpisodePrompt, Observations, replay_episodes, run_episodes};
use crate::model::chat::ChatTemplate;
use crate::model::Tokenizer;
use crate::model::config::LlamaConfig;
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
/// Where the host parses the turns for calls (the episode's tools shown by a template with a
/// tool-call format, `episode::CallCounts`): the `<tool_call>` blocks per episode that call a
/// declared tool, and the malformed ones. Absent where it does not: in a plain-text run the
/// environment alone reads the calls (its own metrics count them), and a 0 would read as "no
/// calls".
pub const TOOL_CALLS: &str = "episodes/tool_calls";
pub const MALFORMED_CALLS: &str = "episodes/malformed_calls";

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
    /// The `<tool_call>` blocks the host parsed in its turns (None: it parsed none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<CallCounts>,
    /// The prompt as the model was given it, where its tools changed it (None: `Prompt::text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_text: Option<String>,
}

impl Outcome {
    fn of(batch: &EpisodeBatch) -> Vec<Outcome> {
        let outcome = |i: usize| {
            let EpisodeEnd { components, metrics, monitor, ground_truth } = batch.ends[i].clone();
            let (calls, prompt_text) = (batch.calls[i], batch.prompt_texts[i].clone());
            Outcome { components, metrics, monitor, ground_truth, turns: batch.turns[i], observation_tokens: batch.observation_tokens[i], bounded: batch.bounded[i], calls, prompt_text }
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
    /// Each sample's `prompt` is the text the model was given: where the episode's tools were
    /// rendered into it, that rendering (`EpisodeBatch::prompt_texts`), so `completions.jsonl`,
    /// train.log and the evaluations' samples show what the model saw and trained on.
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
    ensure!(
        !(cfg.sampling_truncates() && cfg.sampling_replay == crate::grpo::SamplingReplay::KeptSets),
        "environment {environment} runs multi-turn episodes, which this run cannot yet: sampling_replay kept_sets with top_k or top_p: kept sets are not recorded across turns; use sampling_replay: trl_1_16"
    );
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

    /// One episode per prompt (in order; a group's prompt repeated) from the policy, by
    /// `requests` (`Policy::sample_requests`: the routed rows at their adapter scales, then any
    /// coherence rows with the forget adapter off, each from its own seed, as single-turn rows
    /// are sampled), episodes numbered on from `first_id`; then scored as one batch, the
    /// protocol knobs drawn from `score_seed`, as a single-turn batch's routed and coherence
    /// rows are.
    ///
    /// In a pack the episodes are decoded with the run's own decoder, never stacked with the
    /// other runs' (a turn waits on the run's environment, and the runs' turns and episode
    /// ends differ), so a packed run's episodes are its solo run's token for token; its scoring
    /// and training passes stack as any run's.
    pub(super) fn play(&self, policy: &mut Policy, rewards: &mut RewardModel, prompts: &[Prompt], requests: &[SampleRequest], score_seed: u64, first_id: u64) -> Result<Played> {
        let unscored = self.play_unscored(policy, rewards, prompts, requests, first_id)?;
        let scoring = Instant::now();
        let (samples, scored) = Self::score(rewards, policy.tokenizer(), prompts, &unscored.generation, &unscored.outcomes, score_seed)?;
        let score_seconds = scoring.elapsed().as_secs_f64();
        Ok(Played { generation: unscored.generation, samples, scored, generate_seconds: unscored.seconds, score_seconds, fingerprint: Some(unscored.fingerprint) })
    }

    /// [`Episodes::play`] of every prompt at adapter `scales`, sampled and scored from `seeds`:
    /// the run's evaluations.
    pub(super) fn play_at(&self, policy: &mut Policy, rewards: &mut RewardModel, prompts: &[Prompt], scales: &[f64], seeds: (u64, u64), first_id: u64) -> Result<Played> {
        let prompt_ids = prompts.iter().map(|prompt| policy.tokenizer().encode(&prompt.text)).collect::<Result<_>>()?;
        let request = SampleRequest { scales: scales.to_vec(), prompt_ids, seed: seeds.0 };
        self.play(policy, rewards, prompts, &[request], seeds.1, first_id)
    }

    /// [`Episodes::play`] before scoring, on the run's own instance of the environment (a chunk
    /// sampled ahead that the step samples itself is played here): each request's rows by the
    /// decoder folded at its scales (its refresh is part of sampling), the parts joined.
    pub(super) fn play_unscored(&self, policy: &mut Policy, rewards: &mut RewardModel, prompts: &[Prompt], requests: &[SampleRequest], first_id: u64) -> Result<Unscored> {
        let started = Instant::now();
        let (mut parts, mut outcomes, mut fingerprint) = (Vec::with_capacity(requests.len()), Vec::with_capacity(prompts.len()), None);
        for (request, rows) in requests.iter().zip(request_rows(requests, prompts.len())?) {
            let (decoder, weights, tokenizer, sampling) = policy.episode_sampler(&request.scales)?;
            let environment = rewards.episode_environment().context("internal error: episodes without an episode environment")?;
            let (generation, played) = self.rules.run(default_decoder(decoder), decoder, tokenizer, sampling, environment, &prompts[rows.clone()], request.seed, first_id + rows.start as u64)?;
            parts.push(generation);
            outcomes.extend(played);
            fingerprint = fingerprint.or(Some(weights));
        }
        let fingerprint = fingerprint.context("internal error: an episode batch without a sampler request")?;
        Ok(Unscored { generation: policy.joined(parts), outcomes, seconds: started.elapsed().as_secs_f64(), fingerprint })
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

    /// Posts a chunk's episodes (`prompts`, by `requests` as [`Episodes::play`]'s) to the run's
    /// sampler thread, one job per request, played there from the policy's weights as they are
    /// now with the thread's instance of the environment; returns the weights' fingerprint. The
    /// thread hands back each job's generation and its episodes' [`Outcome`]s
    /// ([`Episodes::outcomes`]), in the order posted.
    pub(super) fn play_ahead(&self, policy: &mut Policy, prompts: &[Prompt], requests: &[SampleRequest], first_id: u64) -> Result<f64> {
        let mut fingerprint = None;
        for (request, rows) in requests.iter().zip(request_rows(requests, prompts.len())?) {
            let side = self.ahead.clone().context("internal error: episodes played ahead without the sampler thread's environment")?;
            let (rules, prompts, sampling) = (self.rules.clone(), prompts[rows.clone()].to_vec(), *policy.sampling());
            let (seed, first_id) = (request.seed, first_id + rows.start as u64);
            let play = move |decoding: Decoder, decoder: &DecodeModel| -> Result<(Generation, Extra)> {
                let mut side = side.lock().map_err(|_| anyhow!("the sampler thread's environment is unusable: an earlier job panicked with it"))?;
                let (environment, tokenizer) = &mut *side;
                let (generation, outcomes) = rules.run(decoding, decoder, tokenizer, &sampling, environment, &prompts, seed, first_id)?;
                Ok((generation, Box::new(outcomes)))
            };
            let weights = policy.play_ahead(&request.scales, Box::new(play))?;
            fingerprint = fingerprint.or(Some(weights));
        }
        fingerprint.context("internal error: a chunk of episodes without a sampler request")
    }

    /// The episodes of `prompts` replayed from the `recorded` rollout (`replay_rollouts`; see
    /// `episode::replay_episodes`) in the run's environment, episode ids from `first_id`, then
    /// scored as [`Episodes::play`] scores them, the protocol knobs drawn from `score_seed`;
    /// nothing is sampled.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn replay(&self, config: &LlamaConfig, tokenizer: &Tokenizer, rewards: &mut RewardModel, prompts: &[Prompt], recorded: &Generation, score_seed: u64, first_id: u64) -> Result<Played> {
        let environment = rewards.episode_environment().context("internal error: episodes without an episode environment")?;
        let (generation, outcomes) = self.rules.replay(config, tokenizer, environment, prompts, recorded, first_id)?;
        let scoring = Instant::now();
        let (samples, scored) = Self::score(rewards, tokenizer, prompts, &generation, &outcomes, score_seed)?;
        Ok(Played { generation, samples, scored, generate_seconds: 0.0, score_seconds: scoring.elapsed().as_secs_f64(), fingerprint: None })
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
        let samples = samples_from_rows(&shown_prompts(prompts, outcomes), &generation.rows, tokenizer)?;
        let ends: Vec<EpisodeEnd> = outcomes.iter().map(Outcome::end).collect();
        let mut scored = rewards.score_episodes(&samples, &ends, seed)?;
        scored.metrics.extend(episode_metrics(outcomes)?);
        Ok((samples, scored))
    }
}

impl Rules {
    /// Runs one episode per prompt in `environment` with `decoder` decoding as `decoding` says.
    #[allow(clippy::too_many_arguments)]
    fn run(&self, decoding: Decoder, decoder: &DecodeModel, tokenizer: &Tokenizer, sampling: &SamplingParams, environment: &mut Plugin, prompts: &[Prompt], seed: u64, first_id: u64) -> Result<(Generation, Vec<Outcome>)> {
        let episodes = self.episode_prompts(tokenizer, prompts)?;
        let params = SamplingParams { max_new_tokens: self.turn_tokens, kept_sets: false, ..*sampling };
        let batch = run_episodes(decoding, decoder, tokenizer, environment, &episodes, self.observations(prompts)?, &params, seed, &self.bounds, first_id)?;
        let outcomes = Outcome::of(&batch);
        Ok((batch.generation, outcomes))
    }

    /// Replays one recorded episode per prompt in `environment` (`episode::replay_episodes`).
    fn replay(&self, config: &LlamaConfig, tokenizer: &Tokenizer, environment: &mut Plugin, prompts: &[Prompt], recorded: &Generation, first_id: u64) -> Result<(Generation, Vec<Outcome>)> {
        let episodes = self.episode_prompts(tokenizer, prompts)?;
        let batch = replay_episodes(config, tokenizer, environment, &episodes, self.observations(prompts)?, recorded, self.turn_tokens, &self.bounds, first_id)?;
        let outcomes = Outcome::of(&batch);
        Ok((batch.generation, outcomes))
    }

    /// Each prompt with the environment's prompt it was rendered from, and its token ids.
    fn episode_prompts<'p>(&'p self, tokenizer: &Tokenizer, prompts: &'p [Prompt]) -> Result<Vec<EpisodePrompt<'p>>> {
        let episode = |prompt: &'p Prompt| {
            let env_prompt = self.starts.get(&prompt.text).context("internal error: a prompt the environment did not write started an episode")?;
            Ok(EpisodePrompt { env_prompt, prompt, ids: tokenizer.encode(&prompt.text)? })
        };
        prompts.iter().map(episode).collect()
    }

    /// How `prompts`' observations are written: through the chat template in a chat run.
    fn observations(&self, prompts: &[Prompt]) -> Result<Observations<'_>> {
        Ok(match &self.template {
            None => Observations::PlainText,
            Some(template) => Observations::Chat { template, conversations: prompts.iter().map(conversation_of).collect::<Result<_>>()? },
        })
    }
}

/// The rows of `prompts` each of `requests` plays, in order (checked to cover the `rows`).
fn request_rows(requests: &[SampleRequest], rows: usize) -> Result<Vec<std::ops::Range<usize>>> {
    let mut start = 0;
    let ranges: Vec<_> = requests
        .iter()
        .map(|request| {
            let range = start..start + request.prompt_ids.len();
            start = range.end;
            range
        })
        .collect();
    ensure!(start == rows && !requests.is_empty(), "internal error: sampler requests for {start} episodes of {rows} prompts");
    Ok(ranges)
}

/// The host's per-episode metrics ([`TURNS`] and the others), one value per episode; the call
/// counts ([`TOOL_CALLS`], [`MALFORMED_CALLS`]) where the host parsed every episode's turns.
fn episode_metrics(outcomes: &[Outcome]) -> Result<Vec<(String, Vec<f64>)>> {
    let bound = |which: EpisodeBound| outcomes.iter().map(|o| f64::from(u8::from(o.bounded == Some(which)))).collect();
    let mut metrics = vec![
        (TURNS.to_string(), outcomes.iter().map(|o| o.turns as f64).collect()),
        (OBSERVATION_TOKENS.to_string(), outcomes.iter().map(|o| o.observation_tokens as f64).collect()),
        (ENDED_BY_TURN_BOUND.to_string(), bound(EpisodeBound::Turns)),
        (ENDED_BY_TOKEN_BOUND.to_string(), bound(EpisodeBound::Tokens)),
    ];
    let parsed: Option<Vec<CallCounts>> = outcomes.iter().map(|o| o.calls).collect();
    match parsed {
        Some(counts) => {
            metrics.push((TOOL_CALLS.to_string(), counts.iter().map(|c| c.calls as f64).collect()));
            metrics.push((MALFORMED_CALLS.to_string(), counts.iter().map(|c| c.malformed as f64).collect()));
        }
        None => {
            // A mean over some episodes would not say over which; a 0 for the others would read
            // as "no calls", where the environment read their turns as text.
            let shown = outcomes.iter().filter(|o| o.calls.is_some()).count();
            ensure!(
                shown == 0,
                "{shown} of the batch's {} episodes declared tools and the others none: the host counts tool calls ({TOOL_CALLS}) only where the template shows every episode tools (declare at least one tool on every episode, or none)",
                outcomes.len()
            );
        }
    }
    Ok(metrics)
}

/// The prompts as the model was given them: `prompts[i]` with its text replaced by the
/// episode's rendering with its tools where they changed it (its metadata kept).
fn shown_prompts(prompts: &[Prompt], outcomes: &[Outcome]) -> Vec<Prompt> {
    prompts.iter().zip(outcomes).map(|(prompt, outcome)| Prompt { text: outcome.prompt_text.clone().unwrap_or_else(|| prompt.text.clone()), metadata: prompt.metadata.clone() }).collect()
}
