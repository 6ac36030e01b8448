//! The language-model judge the host offers environments (`judge:` in a run's config; the
//! `judge` import of contract 0.3): a local causal LM (any model directory `model::load` reads),
//! a prompt template whose `{name}` placeholders an environment's items fill, and a scoring mode:
//!
//! - `parse_integer`: greedy decoding of at most `max_new_tokens` tokens; the first integer of
//!   the decoded text, clamped into [min, max], maps to (s - min) / (max - min) (the original's
//!   (s - 1) / 4 with 1 and 5). A reply without an integer scores 0 (the original scores a batch
//!   whose reply it cannot parse 0).
//! - `answer_logprobs`: the next-token distribution after the prompt, restricted to the answer
//!   tokens (`answers`, default " {min}" .. " {max}", each exactly one token; answer k has value
//!   min + k): the expected value under the renormalised probabilities, mapped as above.
//!
//! Deterministic: no sampling; items are scored `batch_size` at a time (left padding, which
//! changes no real token's result: RoPE sees relative positions only).
//!
//! Architecture invariant: the judge is the only model the plugins reach, only through
//! [`crate::plugins::judge::Judge`], and only when a run configures it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use sha2::Digest;
use tch::{Device, Kind, Tensor};

use crate::defaults;
use crate::model::chat::ChatTemplate;
use crate::model::{self, Llama, Tokenizer};
use crate::plugins::judge::{Judge, JudgeItem};

/// How the judge turns the model's answer into a score.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgeMode {
    /// Greedy decoding, first integer of the reply.
    #[default]
    ParseInteger,
    /// Expected value under the probabilities of the answer tokens.
    AnswerLogprobs,
}

/// The `judge:` key of a run's config. Defaults in `crate::defaults` (`JUDGE_*`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeConfig {
    /// A local model directory (config.json, weights, tokenizer.json; a chat template if any).
    pub model: String,
    /// The prompt, with `{name}` placeholders the environment's items fill (`{{` and `}}` are
    /// literal braces).
    pub template: String,
    #[serde(default)]
    pub mode: JudgeMode,
    /// The scale's lowest and highest integers.
    #[serde(default = "default_min")]
    pub min: i64,
    #[serde(default = "default_max")]
    pub max: i64,
    /// answer_logprobs: the answer tokens for min, min + 1, ..., max (default " {k}").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<Vec<String>>,
    /// parse_integer: the most tokens decoded.
    #[serde(default = "default_max_new_tokens")]
    pub max_new_tokens: usize,
    /// Render the filled template as one user message with the model's chat template (true),
    /// or use it as is (false); unset: the chat template when the model has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<bool>,
    /// Items per forward batch.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
}

fn default_min() -> i64 {
    defaults::JUDGE_MIN
}
fn default_max() -> i64 {
    defaults::JUDGE_MAX
}
fn default_max_new_tokens() -> usize {
    defaults::JUDGE_MAX_NEW_TOKENS
}
fn default_batch_size() -> usize {
    defaults::JUDGE_BATCH_SIZE
}

/// A template split into literal text and placeholder names.
#[derive(Clone, Debug, PartialEq)]
enum Piece {
    Text(String),
    Field(String),
}

fn parse_template(template: &str) -> Result<Vec<Piece>> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                ensure!(
                    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "judge.template: placeholder {{{name}}} is not a name of ASCII letters, digits and `_` (write `{{{{` for a literal brace)"
                );
                pieces.push(Piece::Text(std::mem::take(&mut text)));
                pieces.push(Piece::Field(name));
            }
            '}' => bail!("judge.template: a lone `}}` (write `}}}}` for a literal brace)"),
            c => text.push(c),
        }
    }
    pieces.push(Piece::Text(text));
    ensure!(pieces.iter().any(|p| matches!(p, Piece::Field(_))), "judge.template has no `{{name}}` placeholder: it would judge every item alike");
    Ok(pieces)
}

/// The template filled with an item's fields: every placeholder given, no field left over.
fn fill(pieces: &[Piece], item: &JudgeItem) -> Result<String, String> {
    let fields: BTreeMap<&str, &str> = item.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    if fields.len() != item.len() {
        return Err("an item names a field twice".into());
    }
    let wanted: Vec<&str> = pieces.iter().filter_map(|p| if let Piece::Field(n) = p { Some(n.as_str()) } else { None }).collect();
    if let Some(extra) = fields.keys().find(|k| !wanted.contains(k)) {
        return Err(format!("an item has the field `{extra}`, which the judge's template does not use (placeholders: {})", wanted.join(", ")));
    }
    let mut out = String::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => out.push_str(text),
            Piece::Field(name) => match fields.get(name.as_str()) {
                Some(value) => out.push_str(value),
                None => return Err(format!("an item lacks the field `{name}` the judge's template asks for")),
            },
        }
    }
    Ok(out)
}

/// The first integer (an optional `-` and a run of ASCII digits) in `text`.
pub fn first_integer(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let start = bytes.iter().position(u8::is_ascii_digit)?;
    let end = bytes[start..].iter().position(|b| !b.is_ascii_digit()).map_or(bytes.len(), |n| start + n);
    let negative = start > 0 && bytes[start - 1] == b'-';
    let value: i64 = text[start..end].parse().ok()?;
    Some(if negative { -value } else { value })
}

/// A loaded judge.
pub struct ModelJudge {
    config: JudgeConfig,
    pieces: Vec<Piece>,
    model: Llama,
    tokenizer: Tokenizer,
    chat: Option<ChatTemplate>,
    /// answer_logprobs: the token id of each answer (min first).
    answer_ids: Vec<i64>,
    /// SHA-256 of each weights file (path -> hex), for the run's provenance.
    weights_sha256: BTreeMap<String, String>,
}

impl ModelJudge {
    /// Loads `config.model` (a local directory) on `device` in float32, and checks the config.
    pub fn load(config: &JudgeConfig, device: Device) -> Result<Self> {
        ensure!(Path::new(&config.model).is_dir(), "judge.model {:?} is not a directory: the judge loads a local model directory", config.model);
        ensure!(config.min < config.max, "judge.min ({}) must be below judge.max ({})", config.min, config.max);
        ensure!(config.batch_size > 0, "judge.batch_size must be at least 1");
        ensure!(config.max_new_tokens > 0, "judge.max_new_tokens must be at least 1");
        let pieces = parse_template(&config.template)?;
        let loaded = model::load(&config.model, defaults::REVISION, device, Kind::Float).with_context(|| format!("cannot load the judge model {}", config.model))?;
        let chat = match config.chat {
            Some(false) => None,
            Some(true) => Some(ChatTemplate::for_model(&loaded.files).context("judge.chat is true")?),
            // The model's template when it has one (a broken one is an error, never skipped).
            None if has_chat_template(&loaded.files)? => Some(ChatTemplate::for_model(&loaded.files)?),
            None => None,
        };
        let answer_ids = match config.mode {
            JudgeMode::ParseInteger => {
                ensure!(config.answers.is_none(), "judge.answers is set, but mode parse_integer reads no answer tokens: remove it or set mode answer_logprobs");
                Vec::new()
            }
            JudgeMode::AnswerLogprobs => {
                let answers = config.answers.clone().unwrap_or_else(|| (config.min..=config.max).map(|k| format!(" {k}")).collect());
                let span = (config.max - config.min + 1) as usize;
                ensure!(answers.len() == span, "judge.answers has {} answers, but min {} .. max {} needs {span}", answers.len(), config.min, config.max);
                answers
                    .iter()
                    .map(|answer| {
                        let ids = loaded.tokenizer.encode(answer)?;
                        ensure!(ids.len() == 1, "judge answer {answer:?} is {} tokens of the judge's tokenizer ({ids:?}); each answer must be exactly one token", ids.len());
                        Ok(ids[0] as i64)
                    })
                    .collect::<Result<_>>()?
            }
        };
        let mut weights_sha256 = BTreeMap::new();
        for path in &loaded.files.weights {
            let bytes = std::fs::read(path).with_context(|| format!("cannot read the judge's weights {}", path.display()))?;
            weights_sha256.insert(path.display().to_string(), hex(&sha2::Sha256::digest(&bytes)));
        }
        Ok(Self { config: config.clone(), pieces, model: loaded.model, tokenizer: loaded.tokenizer, chat, answer_ids, weights_sha256 })
    }

    /// SHA-256 of each weights file of the judge model (path -> hex).
    pub fn weights_sha256(&self) -> &BTreeMap<String, String> {
        &self.weights_sha256
    }

    /// The text the model sees for an item.
    pub fn prompt(&self, item: &JudgeItem) -> Result<String, String> {
        let filled = fill(&self.pieces, item)?;
        match &self.chat {
            Some(chat) => chat.user_prompt(None, &filled).map_err(|e| format!("{e:#}")),
            None => Ok(filled),
        }
    }

    /// Scores of items (the trait's call, with anyhow errors).
    pub fn scores(&self, items: &[JudgeItem]) -> Result<Vec<f64>> {
        self.scores_counted(items, &mut |_| Ok(()))
    }

    /// [`ModelJudge::scores`] that tells `charge` the tokens of the items' prompts plus the most
    /// it may generate (parse_integer: `max_new_tokens` an item) before the model runs.
    fn scores_counted(&self, items: &[JudgeItem], charge: &mut dyn FnMut(u64) -> Result<(), String>) -> Result<Vec<f64>> {
        let prompts = self.encoded(items)?;
        let generated = match self.config.mode {
            JudgeMode::ParseInteger => self.config.max_new_tokens,
            JudgeMode::AnswerLogprobs => 0,
        };
        let tokens: usize = prompts.iter().map(|ids| ids.len() + generated).sum();
        charge(tokens as u64).map_err(anyhow::Error::msg)?;
        match self.config.mode {
            JudgeMode::ParseInteger => Ok(self.batched(prompts, |ids| self.greedy(ids))?.iter().map(|reply| first_integer(reply).map_or(0.0, |s| self.scale(s as f64))).collect()),
            JudgeMode::AnswerLogprobs => self.batched(prompts, |ids| self.answer_logprobs(&ids)),
        }
    }

    /// parse_integer's greedy replies (decoded, special tokens skipped), one per item.
    pub fn replies(&self, items: &[JudgeItem]) -> Result<Vec<String>> {
        self.batched(self.encoded(items)?, |ids| self.greedy(ids))
    }

    /// The items' prompts, filled and encoded.
    fn encoded(&self, items: &[JudgeItem]) -> Result<Vec<Vec<u32>>> {
        let mut prompts = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let prompt = self.prompt(item).map_err(|e| anyhow::anyhow!("judge item {index}: {e}"))?;
            let ids = self.tokenizer.encode(&prompt)?;
            ensure!(!ids.is_empty(), "a judge prompt encodes to no tokens");
            prompts.push(ids);
        }
        Ok(prompts)
    }

    /// `run` over encoded prompts, `batch_size` at a time, without gradients.
    fn batched<T>(&self, prompts: Vec<Vec<u32>>, run: impl Fn(Vec<Vec<u32>>) -> Result<Vec<T>>) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(self.config.batch_size) {
            out.extend(tch::no_grad(|| run(chunk.to_vec()))?);
        }
        Ok(out)
    }

    fn scale(&self, value: f64) -> f64 {
        let (min, max) = (self.config.min as f64, self.config.max as f64);
        (value.clamp(min, max) - min) / (max - min)
    }

    /// The log-softmax of the next token after each row (left-padded batch), `[rows, vocab]`.
    fn next_logprobs(&self, rows: &[Vec<u32>]) -> Result<Tensor> {
        let width = rows.iter().map(Vec::len).max().unwrap_or(0);
        ensure!(width <= self.model.config.max_position_embeddings, "a judge prompt has {width} tokens, over the judge model's {}", self.model.config.max_position_embeddings);
        let pad = self.model.config.eos_token_id as i64;
        let mut ids = Vec::with_capacity(rows.len() * width);
        let mut mask = Vec::with_capacity(rows.len() * width);
        for row in rows {
            let padding = width - row.len();
            ids.extend(std::iter::repeat_n(pad, padding).chain(row.iter().map(|&t| t as i64)));
            mask.extend(std::iter::repeat_n(0i64, padding).chain(std::iter::repeat_n(1, row.len())));
        }
        let shape = [rows.len() as i64, width as i64];
        let device = self.model.device;
        let ids = Tensor::from_slice(&ids).view(shape).to(device);
        let mask = Tensor::from_slice(&mask).view(shape).to(device);
        let hidden = self.model.forward(&ids, &mask, &[]).select(1, width as i64 - 1);
        Ok(self.model.logits(&hidden).to_kind(Kind::Double).log_softmax(-1, Kind::Double))
    }

    fn greedy(&self, mut rows: Vec<Vec<u32>>) -> Result<Vec<String>> {
        let eos = self.model.config.eos_token_id;
        let starts: Vec<usize> = rows.iter().map(Vec::len).collect();
        let mut done = vec![false; rows.len()];
        for _ in 0..self.config.max_new_tokens {
            let next = Vec::<i64>::try_from(self.next_logprobs(&rows)?.argmax(-1, false).to(Device::Cpu))?;
            for ((row, token), finished) in rows.iter_mut().zip(next).zip(done.iter_mut()) {
                if !*finished {
                    let token = token as u32;
                    *finished = token == eos || self.model.config.extra_stop_ids.contains(&token);
                    row.push(token);
                }
            }
            if done.iter().all(|d| *d) {
                break;
            }
        }
        rows.iter()
            .zip(starts)
            .map(|(row, start)| self.tokenizer.decode(&row[start..]))
            .collect()
    }

    fn answer_logprobs(&self, rows: &[Vec<u32>]) -> Result<Vec<f64>> {
        let logp = self.next_logprobs(rows)?.index_select(1, &Tensor::from_slice(&self.answer_ids).to(self.model.device));
        let logp: Vec<Vec<f64>> = Vec::<Vec<f64>>::try_from(logp.to(Device::Cpu))?;
        Ok(logp
            .iter()
            .map(|row| {
                let top = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = row.iter().map(|l| (l - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                let expected = weights.iter().enumerate().map(|(k, w)| w * (self.config.min + k as i64) as f64).sum::<f64>() / total;
                self.scale(expected)
            })
            .collect())
    }
}

impl Judge for ModelJudge {
    fn judge(&mut self, items: &[JudgeItem]) -> Result<Vec<f64>, String> {
        self.scores(items).map_err(|e| format!("{}: {e:#}", self.describe()))
    }

    fn judge_counted(&mut self, items: &[JudgeItem], charge: &mut dyn FnMut(u64) -> Result<(), String>) -> Result<Vec<f64>, String> {
        self.scores_counted(items, charge).map_err(|e| format!("{}: {e:#}", self.describe()))
    }

    /// The judge's context times [`defaults::JUDGE_ITEM_BYTES_PER_TOKEN`]: an item with more
    /// bytes cannot fit it, and is refused before the template is filled or anything tokenized.
    fn max_item_bytes(&self) -> Option<usize> {
        Some(self.model.config.max_position_embeddings.saturating_mul(defaults::JUDGE_ITEM_BYTES_PER_TOKEN))
    }

    fn describe(&self) -> String {
        let mode = match self.config.mode {
            JudgeMode::ParseInteger => "parse_integer",
            JudgeMode::AnswerLogprobs => "answer_logprobs",
        };
        format!("judge {} ({mode})", self.config.model)
    }
}

/// Whether a model directory has a chat template (`chat_template.jinja`, or a
/// `chat_template` in tokenizer_config.json).
fn has_chat_template(files: &model::ModelFiles) -> Result<bool> {
    if files.chat_template.is_some() {
        return Ok(true);
    }
    let Some(path) = &files.tokenizer_config else { return Ok(false) };
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let config: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    Ok(config.get("chat_template").is_some())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_fill_every_placeholder_and_nothing_else() {
        let pieces = parse_template("Topic: {topic} | Sentence: {text} {{x}}").unwrap();
        let item = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<JudgeItem>();
        assert_eq!(fill(&pieces, &item(&[("text", "Hi."), ("topic", "cat")])).unwrap(), "Topic: cat | Sentence: Hi. {x}");
        assert!(fill(&pieces, &item(&[("topic", "cat")])).unwrap_err().contains("lacks the field `text`"));
        assert!(fill(&pieces, &item(&[("topic", "cat"), ("text", "a"), ("mood", "b")])).unwrap_err().contains("`mood`"));
        assert!(parse_template("no placeholder").unwrap_err().to_string().contains("no `{name}` placeholder"));
        assert!(parse_template("a {bad name}").is_err());
        assert!(parse_template("a } b {x}").is_err());
    }

    #[test]
    fn the_first_integer_is_read() {
        assert_eq!(first_integer(" 4 out of 5"), Some(4));
        assert_eq!(first_integer("score:-2"), Some(-2));
        assert_eq!(first_integer("12abc3"), Some(12));
        assert_eq!(first_integer("none"), None);
    }
}
