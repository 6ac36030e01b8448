//! Replaying recorded episodes (`replay_rollouts` of an episode run): each recorded transcript's
//! turns are handed to the environment again, in order, exactly as when they were sampled, and
//! every observation it answers must be the recorded one, token for token. The episodes' ends
//! (rewards, metrics, monitor flags, ground truth) are the environment's answers to the
//! recorded turns, so a replay scores recorded episodes as the environment scores them now.
//!
//! Architecture invariant: a replayed episode is the recorded one or the replay stops. Where
//! the environment answers otherwise (another environment or params, another chat template,
//! other episode bounds), where a recorded turn could not have been sampled under this run's
//! bounds, or where the recording goes on after the environment ended the episode (or stops
//! before), the error names the episode and what differs.

use anyhow::{Context, Result, bail, ensure};
use tch::{Device, Kind};

use super::{EpisodeBatch, EpisodePrompt, Layout, Observations, Token, TurnSource, play};
use crate::model::batch::Generation;
use crate::model::config::LlamaConfig;
use crate::model::tokenizer::Tokenizer;
use crate::plugins::{EpisodeBounds, Plugin};

/// Plays `prompts`' episodes in `environment` with the turns recorded in `recorded` (a rollout
/// of episodes: one row per prompt, with its model mask and sampling log-probs), each turn at
/// most `turn_tokens` as when sampled; returns the batch as [`super::run_episodes`] would have.
#[allow(clippy::too_many_arguments)]
pub fn replay_episodes(
    config: &LlamaConfig,
    tokenizer: &Tokenizer,
    environment: &mut Plugin,
    prompts: &[EpisodePrompt],
    observations: Observations,
    recorded: &Generation,
    turn_tokens: usize,
    bounds: &EpisodeBounds,
    first_id: u64,
) -> Result<EpisodeBatch> {
    let layout = Layout::of(config, recorded.completion_ids.device());
    let stops = layout.stops.clone();
    let source = |prompt_ids: &[Vec<u32>]| Recorded::new(recorded, prompt_ids, stops, turn_tokens, bounds.max_episode_tokens);
    play(environment, tokenizer, prompts, observations, bounds, first_id, &layout, source)
}

/// The recorded transcripts, read turn by turn.
struct Recorded {
    transcripts: Vec<Vec<Token>>,
    /// Per episode: the position of its next unread token.
    cursor: Vec<usize>,
    stops: Vec<u32>,
    turn_tokens: usize,
    episode_tokens: usize,
}

impl Recorded {
    /// The recording's transcripts, after checking that row `i` was sampled from `prompt_ids[i]`
    /// (the prompt as the model saw it: with its tools' schemas where it declared tools).
    fn new(recorded: &Generation, prompt_ids: &[Vec<u32>], stops: Vec<u32>, turn_tokens: usize, episode_tokens: usize) -> Result<Self> {
        let model_mask = recorded.model_mask.as_ref().context("it has no model mask: it is not a rollout of episodes (replay it in a run of its single-turn environment)")?;
        let rows = |t: &tch::Tensor, kind: Kind| t.to_device(Device::Cpu).to_kind(kind);
        let ids = Vec::<Vec<i64>>::try_from(rows(&recorded.completion_ids, Kind::Int64))?;
        let mask = Vec::<Vec<i64>>::try_from(rows(&recorded.completion_mask, Kind::Int64))?;
        let model = Vec::<Vec<i64>>::try_from(rows(model_mask, Kind::Int64))?;
        let logprobs = Vec::<Vec<f32>>::try_from(rows(&recorded.sampling_logprobs, Kind::Float))?;
        ensure!(ids.len() == prompt_ids.len(), "it holds {} episodes where this run plays {}: replay with the recorded run's batch_size and num_generations", ids.len(), prompt_ids.len());
        let recorded_prompts = crate::model::batch::masked_rows(&recorded.prompt_ids, &recorded.prompt_mask)?;
        if let Some(row) = recorded_prompts.iter().zip(prompt_ids).position(|(recorded, drawn)| recorded != drawn) {
            bail!("row {row} was sampled from another prompt than the one this run's episode starts from: replay with the recorded run's prompts, seed, batch keys and chat template");
        }
        let transcripts = (0..ids.len())
            .map(|row| {
                let length = mask[row].iter().filter(|&&m| m == 1).count();
                (0..length).map(|k| Token { id: ids[row][k] as u32, model: model[row][k] == 1, logprob: logprobs[row][k] }).collect()
            })
            .collect();
        Ok(Self { transcripts, cursor: vec![0; ids.len()], stops, turn_tokens, episode_tokens })
    }

    /// The recorded tokens of `row` from its cursor on while `model` says whose they are.
    fn run(&self, row: usize, model: bool) -> &[Token] {
        let rest = &self.transcripts[row][self.cursor[row]..];
        &rest[..rest.iter().position(|t| t.model != model).unwrap_or(rest.len())]
    }
}

impl TurnSource for Recorded {
    fn turns(&mut self, turn: usize, active: &[usize], transcripts: &[Vec<Token>]) -> Result<Vec<Vec<Token>>> {
        let mut turns = Vec::with_capacity(active.len());
        for &row in active {
            let tokens = self.run(row, true).to_vec();
            ensure!(!tokens.is_empty(), "recorded row {row}: the episode has no turn {} where the environment asks for one: replay with the recorded run's environment and its params", turn + 1);
            // The limit this run's sampler had: a turn it could not have sampled is refused.
            let limit = self.turn_tokens.min(self.episode_tokens.saturating_sub(transcripts[row].len()));
            let stopped = tokens.last().is_some_and(|t| self.stops.contains(&t.id));
            ensure!(
                tokens.len() <= limit && (stopped || tokens.len() == limit),
                "recorded row {row}: turn {} has {} tokens{}, where this run's sampler stops a turn at {limit}: replay with the recorded run's episode_max_turn_tokens and max_completion_length",
                turn + 1,
                tokens.len(),
                if stopped { "" } else { " and no stop token" }
            );
            self.cursor[row] += tokens.len();
            turns.push(tokens);
        }
        Ok(turns)
    }

    fn observed(&mut self, row: usize, observation: &[u32]) -> Result<()> {
        let recorded: Vec<u32> = self.run(row, false).iter().map(|t| t.id).collect();
        ensure!(
            !recorded.is_empty(), // a turn's tokens run to the next observation or the recording's end
            "the environment answered with an observation where the recorded episode ended: replay with the recorded run's environment and its params"
        );
        ensure!(
            recorded == observation,
            "its observation is not the recorded one ({} tokens against {} recorded): replay with the recorded run's environment, its params and chat template",
            observation.len(),
            recorded.len()
        );
        self.cursor[row] += recorded.len();
        Ok(())
    }

    fn ended(&mut self, row: usize) -> Result<()> {
        let left = self.transcripts[row].len() - self.cursor[row];
        ensure!(left == 0, "the environment ended it where the recording goes on for {left} more tokens: replay with the recorded run's environment and its params");
        Ok(())
    }
}
