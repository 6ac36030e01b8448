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
//! What does not run episodes yet is refused by name before the run directory is written
//! ([`refuse_unsupported`]).

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use super::TrainConfig;
use super::policy::Policy;
use super::prompts::{PromptRender, conversation_of};
use crate::episode::{CallCounts, EpisodeBatch, EpisodeBound, EpisodePrompt, Observations, run_episodes};
use crate::model::chat::ChatTemplate;
use crate::model::Tokenizer;
use crate::model::decode::DecodeModel;
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

/// Refuses what does not run episodes yet, naming each key, so that no part of a run silently
/// samples single turns from an episode environment. Packs run episodes: each run plays its
/// own with its own decoder (never stacked, see [`Episodes::play`]).
pub(super) fn refuse_unsupported(cfg: &TrainConfig, environment: &str) -> Result<()> {
    let refusals = [
        (cfg.samples_ahead(), "max_steps_off_policy, sampling_steps_ahead and stream_minibatches (sampling ahead): episodes are sampled on policy only, for now".to_string()),
        (cfg.replay_rollouts.is_some(), "replay_rollouts: recorded rollouts of episodes are not replayed yet".into()),
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
        Ok(Self { bounds, turn_tokens: cfg.episode_max_turn_tokens, starts, template: render.template().cloned() })
    }

    /// One episode per prompt (in order; a group's prompt repeated) from the policy at adapter
    /// `scales`, each turn drawn from `seed`'s streams; then scored, the protocol knobs drawn
    /// from `score_seed`. Episode ids start at `first_id`.
    ///
    /// In a pack the episodes are decoded with the run's own decoder, never stacked with the
    /// other runs' (a turn waits on the run's environment, and the runs' turns and episode
    /// ends differ), so a packed run's episodes are its solo run's token for token; its scoring
    /// and training passes stack as any run's.
    pub(super) fn play(&self, policy: &mut Policy, rewards: &mut RewardModel, prompts: &[Prompt], scales: &[f64], seeds: (u64, u64), first_id: u64) -> Result<Played> {
        let started = Instant::now();
        let (decoder, fingerprint, tokenizer, sampling) = policy.episode_sampler(scales)?;
        let refreshed = started.elapsed().as_secs_f64();
        let mut played = self.play_on(decoder, tokenizer, sampling, rewards, prompts, seeds, first_id)?;
        played.generate_seconds += refreshed; // the decoder's refresh is part of sampling
        played.fingerprint = Some(fingerprint);
        Ok(played)
    }

    /// [`Episodes::play`] with `decoder` (the policy folded at the batch's adapter scales) and
    /// the run's `sampling` (its training batches' settings; each turn at most
    /// `episode_max_turn_tokens`): `smallrl eval` of a checkpoint plays its episodes here, with
    /// a decoder of its own, as the run's evaluations did.
    #[allow(clippy::too_many_arguments)]
    pub fn play_on(&self, decoder: &DecodeModel, tokenizer: &Tokenizer, sampling: &SamplingParams, rewards: &mut RewardModel, prompts: &[Prompt], seeds: (u64, u64), first_id: u64) -> Result<Played> {
        let started = Instant::now();
        let episodes: Vec<EpisodePrompt> = prompts
            .iter()
            .map(|prompt| {
                let env_prompt = self.starts.get(&prompt.text).context("internal error: a prompt the environment did not write started an episode")?;
                Ok(EpisodePrompt { env_prompt, prompt, ids: tokenizer.encode(&prompt.text)? })
            })
            .collect::<Result<_>>()?;
        let params = SamplingParams { max_new_tokens: self.turn_tokens, kept_sets: false, ..sampling.clone() };
        let environment = rewards.episode_environment().context("internal error: episodes without an episode environment")?;
        let observations = match &self.template {
            None => Observations::PlainText,
            Some(template) => Observations::Chat { template, conversations: prompts.iter().map(conversation_of).collect::<Result<_>>()? },
        };
        let batch = run_episodes(default_decoder(decoder), decoder, tokenizer, environment, &episodes, observations, &params, seeds.0, &self.bounds, first_id)?;
        let generate_seconds = started.elapsed().as_secs_f64();
        let scoring = Instant::now();
        let samples = samples_from_rows(&shown_prompts(prompts, &batch.prompt_texts), &batch.generation.rows, tokenizer)?;
        let mut scored = rewards.score_episodes(&samples, &batch.ends, seeds.1)?;
        scored.metrics.extend(episode_metrics(&batch)?);
        Ok(Played { generation: batch.generation, samples, scored, generate_seconds, score_seconds: scoring.elapsed().as_secs_f64(), fingerprint: None })
    }
}

/// The host's per-episode metrics ([`TURNS`] and the others), one value per episode; the call
/// counts ([`TOOL_CALLS`], [`MALFORMED_CALLS`]) where the host parsed every episode's turns.
fn episode_metrics(batch: &EpisodeBatch) -> Result<Vec<(String, Vec<f64>)>> {
    let bound = |which: EpisodeBound| batch.bounded.iter().map(|b| f64::from(u8::from(*b == Some(which)))).collect();
    let mut metrics = vec![
        (TURNS.to_string(), batch.turns.iter().map(|&t| t as f64).collect()),
        (OBSERVATION_TOKENS.to_string(), batch.observation_tokens.iter().map(|&t| t as f64).collect()),
        (ENDED_BY_TURN_BOUND.to_string(), bound(EpisodeBound::Turns)),
        (ENDED_BY_TOKEN_BOUND.to_string(), bound(EpisodeBound::Tokens)),
    ];
    let parsed: Option<Vec<CallCounts>> = batch.calls.iter().copied().collect();
    match parsed {
        Some(counts) => {
            metrics.push((TOOL_CALLS.to_string(), counts.iter().map(|c| c.calls as f64).collect()));
            metrics.push((MALFORMED_CALLS.to_string(), counts.iter().map(|c| c.malformed as f64).collect()));
        }
        None => {
            // A mean over some episodes would not say over which; a 0 for the others would read
            // as "no calls", where the environment read their turns as text.
            let shown = batch.calls.iter().filter(|c| c.is_some()).count();
            ensure!(
                shown == 0,
                "{shown} of the batch's {} episodes declared tools and the others none: the host counts tool calls ({TOOL_CALLS}) only where the template shows every episode tools (declare at least one tool on every episode, or none)",
                batch.calls.len()
            );
        }
    }
    Ok(metrics)
}

/// The prompts as the model was given them: `prompts[i]` with its text replaced by
/// `prompt_texts[i]` where the episode's tools changed it (its metadata kept).
fn shown_prompts(prompts: &[Prompt], prompt_texts: &[Option<String>]) -> Vec<Prompt> {
    prompts.iter().zip(prompt_texts).map(|(prompt, text)| Prompt { text: text.clone().unwrap_or_else(|| prompt.text.clone()), metadata: prompt.metadata.clone() }).collect()
}
