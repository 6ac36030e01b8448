//! Sampling multi-turn episodes (issue 48): the host samples an assistant turn for every
//! episode in flight, hands the turns to the environment (`Plugin::step_episodes`), appends each
//! observation's tokens to its episode and samples the next turn, until every episode has ended.
//!
//! Each turn continues the KV cache the previous turn left (`model::continuation`): the first
//! turn prefills the prompts; every later turn runs only the observation's tokens (and, on the
//! native sampler, the stop token that ended the turn before) at the positions that follow,
//! attending to the cached history, then samples on. Turn `t` draws the `i`-th active episode's
//! tokens from `row_rng(derive(seed, "episode-turn", t), i)`: the tokens `generate` would draw
//! over the prompt plus the transcript as one prompt, up to floating-point summation order
//! (`tests/episodes_cache.rs` holds both to a float64 forward). An episode that ends leaves the
//! batch: its cache is freed (native) or dropped from the batch at the next turn (libtorch).
//!
//! The episode is laid out as one completion (the transcript: model turns and observations in
//! order, each model turn with the stop token it ended with) whose `Generation::model_mask` is
//! 0 on observation tokens: they are in the sequence (the model attends to them) but carry no
//! loss, ratio, KL or entropy term (`grpo::loss_mask`). Sampling log-probabilities are 0 on
//! them.
//!
//! How an observation becomes tokens ([`Observations`]): in a run of raw prompts, the
//! plain-text protocol: each message's content on a line of its own, "\n{content}" per message
//! then "\n" ([`render_observation`]). In a run of chat prompts (`prompt_format: chat`), the
//! model's chat template: the text it writes after the assistant turn for the observation's
//! messages, through the next generation prompt (`ChatTemplate::observation_text` of the
//! episode's conversation so far: the prompt's messages, each turn as sampled, the
//! observations), so the whole sequence is the template's rendering of the conversation, as
//! `apply_chat_template` writes it, wherever the sampled turns are the tokenization of their
//! text. A turn cut by its token limit (no stop token sampled) is closed by the template's own
//! end-of-turn text (`<|im_end|>` for ChatML) at the head of the observation: the
//! conversation's assistant message ends there as the template writes every assistant message,
//! and those tokens are not the model's (model mask 0), as TRL's tool suffix is not. Either
//! text is tokenized without special tokens, and appended as observation tokens.
//!
//! Tools (contract 0.6): an episode may declare tools at its start. In a chat run whose template
//! has a tool-call format (`ChatTemplate::has_tool_call_format`: Qwen's `<tool_call>`), an
//! episode that declares tools gets its prompt rendered again with their schemas
//! (`render_with_tools`, as `apply_chat_template(..., tools=...)` writes it) and tokenized
//! again: those are the prompt tokens the model sees and trains on ([`EpisodeBatch::prompt_texts`]
//! keeps the text); `Prompt::text`, which keys groups, stays the rendering without tools. Each of
//! its turns is parsed for calls (`model::tool_calls::parse_tool_calls`), which the environment
//! receives (`Some`, a malformed block as its observation text), and its observations are
//! rendered with the tools. The assistant turn stays its sampled text in the conversation (not
//! re-rendered as `tool_calls`: the template's JSON spacing is not the model's). Otherwise (a
//! raw-prompt run, a template without the format, an episode without tools) nothing changes: no
//! tools are shown and the turns' calls are None (the environment's plain-text protocol).
//!
//! Bounds: `max_turns` (the last turn is sent with `last`, and the environment must end the
//! episode); `max_episode_tokens` (a turn is cut at what is left of it, and a turn after which
//! fewer than `max_observation_tokens + 1` tokens are left is the last, so an observation always
//! leaves the model room); `max_observation_tokens` (a longer rendered observation is an error
//! naming the plugin; a chat observation counts its whole rendered text, the template's
//! headers and a cut turn's end-of-turn text included); `max_observation_bytes` (checked by
//! `plugins::episodes`, on the messages).

use anyhow::{Context, Result, bail, ensure};
use tch::Tensor;

use crate::model::batch::{CompletionRow, Generation, left_pad};
use crate::model::chat::{ChatTemplate, Message};
use crate::model::continuation::Continuation;
use crate::model::decode::DecodeModel;
use crate::model::generate::{Decoder, SamplingParams};
use crate::model::tokenizer::Tokenizer;
use crate::model::tool_calls::{OrderedJson, parse_tool_calls};
use crate::plugins::{Batch, CallEntry, EnvPrompt, EpisodeBounds, EpisodeEnd, Plugin, Tool, TurnResult};
use crate::reward::{Prompt, sample_from_ids};

mod replay;
pub use replay::replay_episodes;

/// One episode to run: the prompt as the environment wrote it (sent back at start), as the
/// trainer holds it (text and metadata for the turns' samples), and its token ids.
pub struct EpisodePrompt<'a> {
    pub env_prompt: &'a EnvPrompt,
    pub prompt: &'a Prompt,
    pub ids: Vec<u32>,
}

/// A batch of finished episodes.
pub struct EpisodeBatch {
    /// The prompts and transcripts, with `model_mask` (observation tokens 0); row `i`'s
    /// `CompletionRow::ids` is its whole transcript without the final stop token.
    pub generation: Generation,
    /// How each episode ended.
    pub ends: Vec<EpisodeEnd>,
    /// Assistant turns per episode.
    pub turns: Vec<usize>,
    /// Observation tokens per episode.
    pub observation_tokens: Vec<usize>,
    /// Which bound made each episode's final turn its `last` (None: the environment ended the
    /// episode before any bound did).
    pub bounded: Vec<Option<EpisodeBound>>,
    /// The prompt text the model was given where the episode's tools changed it (its tools'
    /// schemas rendered by the chat template); None where it is `Prompt::text`.
    pub prompt_texts: Vec<Option<String>>,
    /// The `<tool_call>` blocks the host parsed in each episode's turns; None where it parsed
    /// none of them (no tools shown: the environment read the turns as text, and only it knows
    /// what they called).
    pub calls: Vec<Option<CallCounts>>,
}

/// The `<tool_call>` blocks of an episode's turns, as the host parsed them for the environment
/// (`turn.calls`): calls of a declared tool, and malformed blocks (`CallEntry::Malformed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CallCounts {
    pub calls: usize,
    pub malformed: usize,
}

impl CallCounts {
    fn add(&mut self, entries: &[CallEntry]) {
        let malformed = entries.iter().filter(|entry| matches!(entry, CallEntry::Malformed(_))).count();
        self.malformed += malformed;
        self.calls += entries.len() - malformed;
    }
}

/// The host's bound that sent an episode's turn as its last: the environment then had to end it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpisodeBound {
    /// `max_turns` (checked first: a turn that is the last by both counts as this).
    Turns,
    /// `max_episode_tokens`: too little of it left for an observation and one more model token.
    Tokens,
}

/// How observations are written into an episode's sequence (see the module documentation).
pub enum Observations<'a> {
    /// The plain-text protocol of raw prompts ([`render_observation`]).
    PlainText,
    /// The model's chat template; `conversations[i]` holds prompt `i`'s messages, whose
    /// rendering with the generation prompt must be that prompt's text (checked).
    Chat { template: &'a ChatTemplate, conversations: Vec<Vec<Message>> },
}

/// One token of a transcript: its id, whether the model sampled it, its sampling log-prob.
#[derive(Clone, Copy)]
struct Token {
    id: u32,
    model: bool,
    logprob: f32,
}

/// The plain-text rendering of an observation's messages (see the module documentation).
pub fn render_observation(messages: &[(String, String)]) -> String {
    let mut text: String = messages.iter().map(|(_, content)| format!("\n{content}")).collect();
    text.push('\n');
    text
}

/// Runs one episode per prompt in `environment` (episode ids `first_id..`), sampling with
/// `decoder` (`generate::default_decoder` is the one `generate` uses) and `params` (its
/// `max_new_tokens` bounds each turn) from per-turn seeds derived from `seed`; observations
/// written as `observations` says.
#[allow(clippy::too_many_arguments)]
pub fn run_episodes(
    decoder: Decoder,
    model: &DecodeModel,
    tokenizer: &Tokenizer,
    environment: &mut Plugin,
    prompts: &[EpisodePrompt],
    observations: Observations,
    params: &SamplingParams,
    seed: u64,
    bounds: &EpisodeBounds,
    first_id: u64,
) -> Result<EpisodeBatch> {
    ensure!(!params.kept_sets, "sampling replay's kept sets are not recorded for episodes: use `sampling_replay: trl_1_16` with an episode environment");
    let layout = Layout::of(model.config(), model.device);
    let sampler = |prompt_ids: &[Vec<u32>]| -> Result<Sampler> {
        let capacities: Vec<usize> = prompt_ids.iter().map(|ids| ids.len() + bounds.max_episode_tokens).collect();
        let cache = Continuation::new(decoder, model, &capacities)?;
        Ok(Sampler { cache, model, pending: prompt_ids.to_vec(), params, seed, bounds })
    };
    play(environment, tokenizer, prompts, observations, bounds, first_id, &layout, sampler)
}

/// Where episodes' turns come from: sampled by the model ([`Sampler`]), or read back from a
/// recorded rollout (`replay::Recorded`). The environment is played the same way for both.
trait TurnSource {
    /// Turn `turn` of each episode in `active` (rows, in order), given the transcripts so far:
    /// its tokens through the stop token it ended with.
    fn turns(&mut self, turn: usize, active: &[usize], transcripts: &[Vec<Token>]) -> Result<Vec<Vec<Token>>>;
    /// `row`'s observation tokens, which follow its last turn.
    fn observed(&mut self, row: usize, observation: &[u32]) -> Result<()>;
    /// The environment ended `row`'s episode.
    fn ended(&mut self, row: usize) -> Result<()>;
}

/// Turns sampled from the model, each continuing its episode's KV cache.
struct Sampler<'a> {
    cache: Continuation,
    model: &'a DecodeModel,
    /// What each episode appends before its next turn: its prompt, then each observation.
    pending: Vec<Vec<u32>>,
    params: &'a SamplingParams,
    seed: u64,
    bounds: &'a EpisodeBounds,
}

impl TurnSource for Sampler<'_> {
    fn turns(&mut self, turn: usize, active: &[usize], transcripts: &[Vec<Token>]) -> Result<Vec<Vec<Token>>> {
        let seed = crate::rng::derive(self.seed, "episode-turn", turn as u64);
        sample_turn(&mut self.cache, self.model, &mut self.pending, transcripts, active, self.params, seed, self.bounds)
    }

    fn observed(&mut self, row: usize, observation: &[u32]) -> Result<()> {
        self.pending[row] = observation.to_vec();
        Ok(())
    }

    fn ended(&mut self, row: usize) -> Result<()> {
        self.cache.release(row);
        Ok(())
    }
}

/// What a batch of episodes is laid out with ([`lay_out`]): the model's EOS (the padding) and
/// stop tokens, and the device of the generation's tensors.
struct Layout {
    eos: u32,
    stops: Vec<u32>,
    device: tch::Device,
}

impl Layout {
    fn of(config: &crate::model::config::LlamaConfig, device: tch::Device) -> Self {
        Self { eos: config.eos_token_id, stops: config.stop_ids(), device }
    }
}

/// Plays one episode per prompt with the turns `source` gives (built from the prompts' token
/// ids, rendered with their tools where the episode declared them): each turn goes to the
/// environment, each observation is written and appended, until every episode has ended.
#[allow(clippy::too_many_arguments)]
fn play<S: TurnSource>(
    environment: &mut Plugin,
    tokenizer: &Tokenizer,
    prompts: &[EpisodePrompt],
    observations: Observations,
    bounds: &EpisodeBounds,
    first_id: u64,
    layout: &Layout,
    source: impl FnOnce(&[Vec<u32>]) -> Result<S>,
) -> Result<EpisodeBatch> {
    ensure!(environment.is_episodic(), "{}: is not an episode environment (it does not implement the episode-environment world)", environment.label());
    ensure!(bounds.max_turns >= 1 && bounds.max_episode_tokens >= 1, "episode_max_turns and the episode's token budget (max_completion_length in a run) must be at least 1");
    ensure!(prompts.iter().all(|p| !p.ids.is_empty()), "empty prompt: every episode's prompt needs at least one token");
    let mut writer = ObservationWriter::new(observations, prompts)?;
    let ids: Vec<u64> = (0..prompts.len() as u64).map(|i| first_id + i).collect();
    let starts: Vec<(u64, &EnvPrompt)> = ids.iter().zip(prompts).map(|(&id, p)| (id, p.env_prompt)).collect();
    let declared = environment.start_episodes(&starts)?;
    let prompt_texts = writer.declare(&declared).with_context(|| format!("{}: the tools its episodes declare", environment.label()))?;
    let prompt_ids: Vec<Vec<u32>> = prompts.iter().zip(&prompt_texts).map(|(p, text)| text.as_ref().map_or_else(|| Ok(p.ids.clone()), |t| tokenizer.encode(t))).collect::<Result<_>>()?;
    let mut source = source(&prompt_ids)?;
    let mut transcripts: Vec<Vec<Token>> = vec![Vec::new(); prompts.len()];
    let mut ends: Vec<Option<EpisodeEnd>> = vec![None; prompts.len()];
    let mut turns = vec![0usize; prompts.len()];
    let mut bounded = vec![None; prompts.len()];
    let mut calls: Vec<Option<CallCounts>> = vec![None; prompts.len()];
    for turn in 0..bounds.max_turns {
        let active: Vec<usize> = (0..prompts.len()).filter(|&i| ends[i].is_none()).collect();
        if active.is_empty() {
            break;
        }
        let sampled = source.turns(turn, &active, &transcripts)?;
        let mut samples = Vec::with_capacity(active.len());
        let mut requests = Vec::with_capacity(active.len());
        let mut stops = Vec::with_capacity(active.len());
        for (&row, tokens) in active.iter().zip(&sampled) {
            let stop = tokens.last().map(|t| t.id).filter(|id| layout.stops.contains(id));
            let ended = stop.is_some();
            stops.push(stop);
            let text_ids: Vec<u32> = tokens[..tokens.len() - usize::from(ended)].iter().map(|t| t.id).collect();
            transcripts[row].extend(tokens);
            turns[row] += 1;
            bounded[row] = if turn + 1 == bounds.max_turns {
                Some(EpisodeBound::Turns)
            } else if transcripts[row].len() + bounds.max_observation_tokens + 1 > bounds.max_episode_tokens {
                Some(EpisodeBound::Tokens)
            } else {
                None
            };
            let last = bounded[row].is_some();
            let sample = sample_from_ids(prompts[row].prompt, text_ids, ended, tokenizer)?;
            let parsed = writer.calls(row, &sample.completion);
            if let Some(entries) = &parsed {
                calls[row].get_or_insert_default().add(entries);
            }
            requests.push((ids[row], last, parsed));
            samples.push(sample);
        }
        let results = environment.step_episodes_with_calls(&requests, &Batch::new(&samples), bounds)?;
        for (k, ((&row, result), (id, _, _))) in active.iter().zip(results).zip(&requests).enumerate() {
            match result {
                TurnResult::End(end) => {
                    ends[row] = Some(end);
                    source.ended(row).with_context(|| format!("{}: episode {id}", environment.label()))?;
                }
                TurnResult::Observation(messages) => {
                    let observation = writer.tokens(tokenizer, row, &samples[k].completion, stops[k], &messages).with_context(|| format!("{}: episode {id}: its observation", environment.label()))?;
                    ensure!(!observation.is_empty(), "{}: episode {id}: its observation renders to no tokens", environment.label());
                    ensure!(
                        observation.len() <= bounds.max_observation_tokens,
                        "{}: episode {id}: returned an observation of {} tokens, over episode_max_observation_tokens ({})",
                        environment.label(),
                        observation.len(),
                        bounds.max_observation_tokens
                    );
                    transcripts[row].extend(observation.iter().map(|&id| Token { id, model: false, logprob: 0.0 }));
                    source.observed(row, &observation).with_context(|| format!("{}: episode {id}", environment.label()))?;
                }
            }
        }
    }
    let ends: Vec<EpisodeEnd> = ends.into_iter().map(|end| end.context("an episode did not end by its last turn (the plugin's answers are checked: a host bug)")).collect::<Result<_>>()?;
    let observation_tokens = transcripts.iter().map(|t| t.iter().filter(|t| !t.model).count()).collect();
    let generation = lay_out(layout, &prompt_ids, &transcripts)?;
    Ok(EpisodeBatch { generation, ends, turns, observation_tokens, bounded, prompt_texts, calls })
}

/// Writes observations as tokens ([`Observations`]), keeping each episode's conversation (and
/// its tools, where the template shows them) in a chat run.
struct ObservationWriter<'a> {
    template: Option<&'a ChatTemplate>,
    conversations: Vec<Vec<Message>>,
    /// Per episode: its tools' schemas and names, where the template has a tool-call format and
    /// it declared tools.
    tools: Vec<Option<(Vec<OrderedJson>, Vec<String>)>>,
}

impl<'a> ObservationWriter<'a> {
    /// Checks that each chat prompt is its conversation as the template renders it: the
    /// observations continue that conversation, so it must be the one the model was given.
    fn new(observations: Observations<'a>, prompts: &[EpisodePrompt]) -> Result<Self> {
        let Observations::Chat { template, conversations } = observations else {
            return Ok(Self { template: None, conversations: Vec::new(), tools: Vec::new() });
        };
        ensure!(conversations.len() == prompts.len(), "{} conversations for {} episodes: a chat run gives one per prompt", conversations.len(), prompts.len());
        for (i, (conversation, prompt)) in conversations.iter().zip(prompts).enumerate() {
            let rendered = template.render(conversation, true)?;
            ensure!(
                rendered == prompt.prompt.text,
                "episode prompt {i} is not its conversation as the chat template renders it ({:?} against the prompt {:?}): its observations would not continue what the model was given",
                crate::plugins::text::shown(&rendered),
                crate::plugins::text::shown(&prompt.prompt.text)
            );
        }
        Ok(Self { template: Some(template), conversations, tools: Vec::new() })
    }

    /// Takes each episode's declared tools: where the template has a tool-call format, an
    /// episode with tools gets its prompt rendered with their schemas (returned; None: the
    /// prompt is unchanged) and its turns parsed for calls.
    fn declare(&mut self, declared: &[Vec<Tool>]) -> Result<Vec<Option<String>>> {
        let template = match self.template {
            Some(template) if template.has_tool_call_format()? => template,
            // A raw run, or a template without a tool-call format: no tools are shown.
            _ => {
                self.tools = vec![None; declared.len()];
                return Ok(vec![None; declared.len()]);
            }
        };
        self.tools = declared.iter().map(|tools| (!tools.is_empty()).then(|| tool_schemas(tools)).transpose()).collect::<Result<_>>()?;
        self.tools
            .iter()
            .zip(&self.conversations)
            .map(|(tools, conversation)| tools.as_ref().map(|(schemas, _)| template.render_with_tools(conversation, Some(schemas), true)).transpose())
            .collect()
    }

    /// The calls of `row`'s turn `text`, where its tools are shown (None: not parsed).
    fn calls(&self, row: usize, text: &str) -> Option<Vec<CallEntry>> {
        let (_, names) = self.tools.get(row)?.as_ref()?;
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let parsed = parse_tool_calls(text, &names);
        let entry = |call: Result<crate::model::tool_calls::ToolCall, crate::model::tool_calls::Malformed>| match call {
            Ok(call) => CallEntry::Call { name: call.name, arguments: call.arguments.to_json() },
            Err(malformed) => CallEntry::Malformed(malformed.observation()),
        };
        Some(parsed.calls.into_iter().map(entry).collect())
    }

    /// The tokens of `row`'s observation `messages` after its turn `turn` (its text, as decoded),
    /// which ended with the stop token `stop` (None: cut by its limit).
    fn tokens(&mut self, tokenizer: &Tokenizer, row: usize, turn: &str, stop: Option<u32>, messages: &[(String, String)]) -> Result<Vec<u32>> {
        let Some(template) = self.template else {
            return tokenizer.encode(&render_observation(messages));
        };
        let observation: Vec<Message> = messages.iter().map(|(role, content)| Message::new(role, content)).collect();
        let stop_text = match stop {
            Some(id) => tokenizer.token_strings(&[id])?.remove(0),
            None => String::new(),
        };
        let tools = self.tools.get(row).and_then(Option::as_ref).map(|(schemas, _)| schemas.as_slice());
        let text = template.observation_text(&self.conversations[row], turn, &observation, tools, &stop_text).with_context(|| match stop {
            Some(_) => format!("after a turn ended by {stop_text:?}"),
            None => "after a turn cut by its token limit".to_string(),
        })?;
        let conversation = &mut self.conversations[row];
        conversation.push(Message::new("assistant", turn));
        conversation.extend(observation);
        tokenizer.encode(&text)
    }
}

/// One turn of every active episode, continued from its cache: its tokens through the stop
/// token it ended with, cut to the episode's token budget.
#[allow(clippy::too_many_arguments)]
fn sample_turn(cache: &mut Continuation, model: &DecodeModel, pending: &mut [Vec<u32>], transcripts: &[Vec<Token>], active: &[usize], params: &SamplingParams, seed: u64, bounds: &EpisodeBounds) -> Result<Vec<Vec<Token>>> {
    let limits: Vec<usize> = active.iter().map(|&row| params.max_new_tokens.min(bounds.max_episode_tokens - transcripts[row].len())).collect();
    let appended: Vec<Vec<u32>> = active.iter().map(|&row| std::mem::take(&mut pending[row])).collect();
    let drawn = cache.continue_rows(model, active, &appended, &limits, params, seed)?;
    Ok(drawn.into_iter().map(|(ids, logprobs)| ids.into_iter().zip(logprobs).map(|(id, logprob)| Token { id, model: true, logprob }).collect()).collect())
}

/// One episode's tools as `apply_chat_template(tools=...)` takes them (`{"type": "function",
/// "function": {name, description, parameters}}`, the schema's keys in the guest's order), and
/// their names.
fn tool_schemas(tools: &[Tool]) -> Result<(Vec<OrderedJson>, Vec<String>)> {
    let schema = |tool: &Tool| -> Result<OrderedJson> {
        let parameters = OrderedJson::parse(&tool.parameters).with_context(|| format!("the parameters of tool {:?} are not JSON", tool.name))?;
        let function = vec![("name".into(), OrderedJson::String(tool.name.clone())), ("description".into(), OrderedJson::String(tool.description.clone())), ("parameters".into(), parameters)];
        Ok(OrderedJson::Object(vec![("type".into(), OrderedJson::String("function".into())), ("function".into(), OrderedJson::Object(function))]))
    };
    Ok((tools.iter().map(schema).collect::<Result<_>>()?, tools.iter().map(|t| t.name.clone()).collect()))
}

/// The episodes as one generation: prompts (`prompt_ids`) left-padded, transcripts
/// right-padded with EOS, the completion mask 1 on every transcript token and the model mask 1
/// on the model's. A row `ended_with_eos` when its last token (its final turn's: an episode
/// ends after a turn) is a stop token; `mask_truncated_completions` masks the others.
fn lay_out(layout: &Layout, prompt_ids: &[Vec<u32>], transcripts: &[Vec<Token>]) -> Result<Generation> {
    let Layout { eos, stops, device } = layout;
    let (prompt_ids, prompt_mask) = left_pad(prompt_ids, i64::from(*eos), *device);
    let width = transcripts.iter().map(Vec::len).max().unwrap_or(0);
    if width == 0 {
        bail!("every episode is empty (no model token was sampled)");
    }
    let (mut ids, mut mask, mut model_mask, mut logprobs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for transcript in transcripts {
        let pad = width - transcript.len();
        ids.extend(transcript.iter().map(|t| i64::from(t.id)).chain(std::iter::repeat_n(i64::from(*eos), pad)));
        mask.extend(std::iter::repeat_n(1i64, transcript.len()).chain(std::iter::repeat_n(0, pad)));
        model_mask.extend(transcript.iter().map(|t| i64::from(t.model)).chain(std::iter::repeat_n(0, pad)));
        logprobs.extend(transcript.iter().map(|t| t.logprob).chain(std::iter::repeat_n(0.0, pad)));
    }
    let shape = [transcripts.len() as i64, width as i64];
    let tensor = |values: &[i64]| Tensor::from_slice(values).view(shape).to(*device);
    let rows = transcripts
        .iter()
        .map(|t| {
            let ended = t.last().is_some_and(|last| last.model && stops.contains(&last.id));
            CompletionRow { ids: t[..t.len() - usize::from(ended)].iter().map(|t| t.id).collect(), ended_with_eos: ended }
        })
        .collect();
    Ok(Generation {
        prompt_ids,
        prompt_mask,
        completion_ids: tensor(&ids),
        completion_mask: tensor(&mask),
        sampling_logprobs: Tensor::from_slice(&logprobs).view(shape).to(*device),
        kept: None,
        model_mask: Some(tensor(&model_mask)),
        rows,
    })
}
