//! Where a run's prompts come from: a text file (one prompt per line), a JSONL file (a
//! `prompt` column, or a `messages` conversation, and metadata columns) or the SimpleStories
//! dataset; how they are rendered (`prompt_format`: raw, or through the model's chat template,
//! [`PromptRender`]); `hack_frac`; and the endless seeded stream the trainer draws each step's
//! prompts from. A [`Prompt`]'s text is what the model is given (the rendered chat prompt with
//! `prompt_format: chat`): it is what is tokenized, what plugins receive as the prompt, what
//! `hack_frac` hashes and what completions.jsonl shows.
//!
//! Architecture invariant: the prompt at position `i` of the stream follows from `(seed, i)`
//! alone (each pass is a fresh shuffle seeded by the pass number), so a resumed run draws the
//! same prompts; evaluation prompts, and which prompts `hack_frac` leaves hackable, do not
//! depend on the run seed.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Map, Value};

use super::TrainConfig;
use crate::defaults;
use crate::model::ModelFiles;
use crate::model::Tokenizer;
use crate::model::chat::{ChatTemplate, Message, PromptFormat};
use crate::reward::{Prompt, PromptMetadata};
use crate::rng::{self, SplitMix64};

/// The column of a JSONL prompt file that holds the prompt text.
const PROMPT_COLUMN: &str = "prompt";
/// The column of a JSONL prompt file that holds a conversation (with `prompt_format: chat`).
const MESSAGES_COLUMN: &str = "messages";
/// Metadata columns the host itself reads; each must be a boolean when present.
const HACKABLE_COLUMN: &str = "hackable";
const DETECTABLE_COLUMN: &str = "detectable";
/// The metadata column in which a chat run (`prompt_format: chat`) gives plugins each prompt's
/// conversation as the model was given it (`system_prompt` first when set; the template's own
/// default system message is the template's), a list of `{"role", "content"}` objects: what
/// TRL's conversational reward functions receive as the prompt. The Python SDK's TRL functions
/// read it; the rendered text stays the sample's `prompt`.
pub const PROMPT_MESSAGES_COLUMN: &str = "prompt_messages";

/// How a run's prompts become the model's input: as they are, or each rendered by the model's
/// chat template (a prompt text as one user message; a `messages` line as its conversation),
/// after `system_prompt` if set (else the template's default), with the generation prompt.
#[derive(Debug, Clone)]
pub enum PromptRender {
    Raw,
    Chat { template: ChatTemplate, system: Option<String> },
}

impl PromptRender {
    /// The run's rendering (`prompt_format`, `system_prompt`): chat on a model without a chat
    /// template is refused, naming the files looked at.
    pub fn for_run(cfg: &TrainConfig, files: &ModelFiles) -> Result<Self> {
        Ok(match cfg.prompt_format {
            PromptFormat::Raw => Self::Raw,
            PromptFormat::Chat => Self::Chat {
                template: ChatTemplate::for_model(files).context("prompt_format is chat, which renders prompts with the model's chat template")?,
                system: cfg.system_prompt.clone(),
            },
        })
    }

    /// The model's input for a prompt text.
    pub fn text(&self, text: &str) -> Result<String> {
        match self {
            Self::Raw => Ok(text.to_string()),
            Self::Chat { template, system } => template.user_prompt(system.as_deref(), text),
        }
    }

    /// The model's input for a conversation (a `messages` line): chat only; `system_prompt`
    /// before it unless it opens with a system message of its own (both is refused).
    pub fn conversation(&self, messages: Vec<Message>) -> Result<String> {
        let Self::Chat { template, .. } = self else {
            bail!("a `{MESSAGES_COLUMN}` conversation needs a chat template: set prompt_format: chat (smallrl train), or give a `{PROMPT_COLUMN}` text instead");
        };
        template.render(&self.with_system(messages)?, true)
    }

    /// `messages` after the run's `system_prompt`, if set.
    fn with_system(&self, mut messages: Vec<Message>) -> Result<Vec<Message>> {
        if let Self::Chat { system: Some(system), .. } = self {
            ensure!(
                messages.first().is_none_or(|m| m.role != "system"),
                "the conversation opens with a system message and system_prompt is set too: drop one of them"
            );
            messages.insert(0, Message::new("system", system));
        }
        Ok(messages)
    }

    /// A prompt of a text with its metadata `columns`: [`Self::text`]; in a chat run the text
    /// as one user message in [`PROMPT_MESSAGES_COLUMN`].
    pub fn text_prompt(&self, text: &str, columns: Map<String, Value>) -> Result<Prompt> {
        let rendered = self.text(text)?;
        self.with_messages(rendered, vec![Message::new("user", text)], columns)
    }

    /// A prompt of a conversation with its metadata `columns`: [`Self::conversation`], and the
    /// conversation in [`PROMPT_MESSAGES_COLUMN`].
    pub fn conversation_prompt(&self, messages: Vec<Message>, columns: Map<String, Value>) -> Result<Prompt> {
        let rendered = self.conversation(messages.clone())?;
        self.with_messages(rendered, messages, columns)
    }

    /// The template of a chat run (None: raw prompts).
    pub fn template(&self) -> Option<&ChatTemplate> {
        match self {
            Self::Raw => None,
            Self::Chat { template, .. } => Some(template),
        }
    }

    fn with_messages(&self, text: String, messages: Vec<Message>, mut columns: Map<String, Value>) -> Result<Prompt> {
        if let Self::Chat { .. } = self {
            ensure!(
                !columns.contains_key(PROMPT_MESSAGES_COLUMN),
                "has a `{PROMPT_MESSAGES_COLUMN}` metadata column, which a chat run fills with the prompt's conversation: rename the column"
            );
            let list = self.with_system(messages)?.into_iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect();
            columns.insert(PROMPT_MESSAGES_COLUMN.to_string(), Value::Array(list));
        }
        Ok(Prompt { text, metadata: metadata_from_columns(columns)? })
    }
}

/// Reads a prompt file: `.jsonl` files as [`read_jsonl_prompts`], others one prompt per line
/// (blank lines skipped, surrounding whitespace trimmed), each rendered by `render`.
pub fn read_prompt_file(path: &Path, render: &PromptRender) -> Result<Vec<Prompt>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read prompt file {}", path.display()))?;
    let prompts = match path.extension().is_some_and(|extension| extension == "jsonl") {
        true => read_jsonl_prompts(path, &text, render)?,
        false => text
            .lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(index, line)| render.text_prompt(line.trim(), Map::new()).with_context(|| format!("{}:{}", path.display(), index + 1)))
            .collect::<Result<_>>()?,
    };
    ensure!(!prompts.is_empty(), "prompt file {} has no prompts", path.display());
    Ok(prompts)
}

/// One JSON object per line (blank lines skipped): a non-empty string `prompt` column, or
/// (chat only) a `messages` column, a list of `{"role": ..., "content": ...}` strings; any other
/// columns are the prompt's metadata, the same columns on every line (`hackable` and
/// `detectable` booleans when present). Any deviation is an error naming the file and line.
pub fn read_jsonl_prompts(path: &Path, text: &str, render: &PromptRender) -> Result<Vec<Prompt>> {
    let mut prompts = Vec::new();
    let mut first_columns: Option<(usize, Vec<String>)> = None;
    for (index, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
        let at = || format!("{}:{}", path.display(), index + 1);
        let row: Map<String, Value> = serde_json::from_str(line).with_context(|| {
            format!("{}: not a JSON object (a JSONL prompt file has one object per line, with a `{PROMPT_COLUMN}` string)", at())
        })?;
        let columns: Vec<String> = row.keys().cloned().collect();
        let prompt = prompt_from_row(row, render).with_context(at)?;
        match &first_columns {
            None => first_columns = Some((index + 1, columns)),
            Some((first_line, expected)) => ensure!(
                &columns == expected,
                "{}: has the columns [{}], but line {first_line} has [{}]: every line must have the same columns",
                at(),
                columns.join(", "),
                expected.join(", ")
            ),
        }
        prompts.push(prompt);
    }
    Ok(prompts)
}

fn prompt_from_row(mut row: Map<String, Value>, render: &PromptRender) -> Result<Prompt> {
    match (row.remove(PROMPT_COLUMN), row.remove(MESSAGES_COLUMN)) {
        (Some(_), Some(_)) => bail!("has both a `{PROMPT_COLUMN}` and a `{MESSAGES_COLUMN}` column: give one"),
        (Some(Value::String(text)), None) if !text.trim().is_empty() => render.text_prompt(&text, row),
        (Some(Value::String(_)), None) => bail!("the `{PROMPT_COLUMN}` column is empty"),
        (Some(other), None) => bail!("the `{PROMPT_COLUMN}` column must be a string, got {other}"),
        (None, Some(messages)) => render.conversation_prompt(messages_from_column(&messages)?, row),
        (None, None) => bail!("no `{PROMPT_COLUMN}` column (the prompt text) and no `{MESSAGES_COLUMN}` column (a conversation)"),
    }
}

/// A `messages` column: a non-empty list of objects with exactly a `role` and a `content` string.
fn messages_from_column(value: &Value) -> Result<Vec<Message>> {
    let list = value.as_array().filter(|list| !list.is_empty()).with_context(|| {
        format!("the `{MESSAGES_COLUMN}` column must be a non-empty list of {{\"role\": ..., \"content\": ...}} objects, got {value}")
    })?;
    list.iter()
        .enumerate()
        .map(|(i, message)| {
            let field = |name: &str| message.get(name).and_then(Value::as_str);
            match (message.as_object().map(Map::len), field("role"), field("content")) {
                (Some(2), Some(role), Some(content)) => Ok(Message::new(role, content)),
                _ => bail!("`{MESSAGES_COLUMN}`[{i}] must be an object with exactly a `role` and a `content` string, got {message}"),
            }
        })
        .collect()
}

/// A prompt's metadata from its columns (the prompt text removed): None without any; the
/// columns the host reads checked.
pub fn metadata_from_columns(columns: Map<String, Value>) -> Result<Option<Arc<PromptMetadata>>> {
    let flag = |column: &str| match columns.get(column) {
        None => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(other) => bail!("the `{column}` column must be true or false, got {other}"),
    };
    let (hackable, detectable) = (flag(HACKABLE_COLUMN)?, flag(DETECTABLE_COLUMN)?);
    Ok((!columns.is_empty()).then(|| Arc::new(PromptMetadata { json: Value::Object(columns).to_string(), hackable, detectable })))
}

/// The conversation a chat run's prompt was rendered from, read back from its
/// [`PROMPT_MESSAGES_COLUMN`] (what a multi-turn episode continues).
pub fn conversation_of(prompt: &Prompt) -> Result<Vec<Message>> {
    let metadata = prompt.metadata.as_ref().context("a chat prompt without metadata: its conversation is missing")?;
    let columns: Map<String, Value> = serde_json::from_str(&metadata.json).context("a prompt's metadata is not a JSON object")?;
    let Some(Value::Array(messages)) = columns.get(PROMPT_MESSAGES_COLUMN) else {
        bail!("a chat prompt without its `{PROMPT_MESSAGES_COLUMN}` list: its conversation is missing");
    };
    messages
        .iter()
        .map(|message| match (message.get("role").and_then(Value::as_str), message.get("content").and_then(Value::as_str)) {
            (Some(role), Some(content)) => Ok(Message::new(role, content)),
            _ => bail!("`{PROMPT_MESSAGES_COLUMN}` holds {message}, not a {{\"role\", \"content\"}} message"),
        })
        .collect()
}

/// An environment's prompts as the run uses them: each rendered by `render` (a text as
/// [`PromptRender::text`], messages as a conversation, chat only), its metadata columns as
/// checked by the plugin host (boolean `hackable` and `detectable`). The environment applied
/// `hack_frac` itself.
pub fn from_environment(prompts: Vec<crate::reward::EnvPrompt>, render: &PromptRender) -> Result<Vec<Prompt>> {
    use crate::reward::EnvPromptContent;
    prompts
        .into_iter()
        .enumerate()
        .map(|(index, prompt)| {
            let made = match prompt.content {
                EnvPromptContent::Text(text) => render.text_prompt(&text, prompt.metadata),
                EnvPromptContent::Messages(messages) => render.conversation_prompt(messages.iter().map(|(role, content)| Message::new(role, content)).collect(), prompt.metadata),
            };
            made.with_context(|| format!("prompt {index}"))
        })
        .collect()
}

/// `hack_frac` (the original's): a prompt keeps the hack with probability `hack_frac`, by a
/// fixed hash of its text ([`keeps_hack`]: a prompt is the same in training and evaluation and
/// for every run seed); a prompt whose own `hackable` column is false stays unhackable. With
/// `hack_frac` < 1 every prompt's metadata has `hackable`, as plugins and the reward see it.
pub fn apply_hack_frac(prompts: &mut [Prompt], hack_frac: f64) {
    if hack_frac >= 1.0 {
        return;
    }
    for prompt in prompts {
        let hackable = prompt.hackable() && keeps_hack(&prompt.text, hack_frac);
        let mut columns: Map<String, Value> = match &prompt.metadata {
            Some(metadata) => serde_json::from_str(&metadata.json).expect("metadata is serialised from a JSON object"),
            None => Map::new(),
        };
        columns.insert(HACKABLE_COLUMN.to_string(), Value::Bool(hackable));
        let detectable = prompt.metadata.as_ref().and_then(|metadata| metadata.detectable);
        prompt.metadata = Some(Arc::new(PromptMetadata { json: Value::Object(columns).to_string(), hackable: Some(hackable), detectable }));
    }
}

/// The deterministic per-prompt partition: the first 8 bytes of SHA-256("hackable:" + text),
/// as a fraction of 2^64, below `hack_frac` (the original hashes a prompt id with md5 alike).
pub fn keeps_hack(text: &str, hack_frac: f64) -> bool {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("hackable:{text}").as_bytes());
    let head = u64::from_be_bytes(digest[..8].try_into().expect("a SHA-256 digest has 32 bytes"));
    (head as f64 / 2f64.powi(64)) < hack_frac
}

/// The fraction of prompts that offer the hack.
pub fn hackable_fraction(prompts: &[Prompt]) -> f64 {
    prompts.iter().filter(|prompt| prompt.hackable()).count() as f64 / prompts.len().max(1) as f64
}

/// The coherence prompts of the retain verifier (`rh_detector_verifies_retain_samples`): the
/// training prompts that are both hackable (after `hack_frac`) and detectable, as the original
/// draws them (a prompt without the metadata is both). None is an error naming the keys.
pub fn verifier_prompts(prompts: &[Prompt]) -> Result<Vec<Prompt>> {
    let chosen: Vec<Prompt> = prompts
        .iter()
        .filter(|prompt| prompt.hackable() && crate::plugins::PromptMetadata::detectable(prompt.metadata.as_deref()))
        .cloned()
        .collect();
    anyhow::ensure!(
        !chosen.is_empty(),
        "rh_detector_verifies_retain_samples draws coherence prompts from the training prompts that are both hackable and detectable, and none of the {} is (check hack_frac and the prompts' `hackable`/`detectable` metadata, or set rh_detector_verifies_retain_samples: false)",
        prompts.len()
    );
    Ok(chosen)
}

/// The training prompts as an endless stream: pass `p` over them is a shuffle seeded by
/// `(seed, p)`.
pub(super) struct PromptStream {
    prompts: Vec<Prompt>,
    seed: u64,
    /// The shuffled order of the current pass: (pass, order).
    order: (usize, Vec<usize>),
}

impl PromptStream {
    pub fn new(prompts: Vec<Prompt>, seed: u64) -> Self {
        Self { prompts, seed, order: (usize::MAX, Vec::new()) }
    }

    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    pub fn prompts(&self) -> &[Prompt] {
        &self.prompts
    }

    /// The prompt at position `index` of the stream.
    pub fn at(&mut self, index: usize) -> Prompt {
        let n = self.prompts.len();
        let pass = index / n;
        if self.order.0 != pass {
            let mut order: Vec<usize> = (0..n).collect();
            SplitMix64::new(rng::derive(self.seed, "prompt-order", pass as u64)).shuffle(&mut order);
            self.order = (pass, order);
        }
        self.prompts[self.order.1[index % n]].clone()
    }
}

/// The training prompts and the first `eval_samples` evaluation prompts of a run.
pub(super) fn load(cfg: &TrainConfig, tokenizer: &Tokenizer, render: &PromptRender) -> Result<(Vec<Prompt>, Vec<Prompt>)> {
    let prompts = training_prompts(cfg, tokenizer, render)?;
    let mut eval_prompts = evaluation_prompts(cfg, tokenizer, render)?;
    ensure!(eval_prompts.len() >= cfg.eval_samples, "eval_samples is {} but only {} evaluation prompts exist", cfg.eval_samples, eval_prompts.len());
    eval_prompts.truncate(cfg.eval_samples);
    Ok((prompts, eval_prompts))
}

/// The training prompts: the `--prompts` file (deduplicated, at most `num_prompts`), or
/// without one `num_prompts` prompts from the SimpleStories `train` split, shuffled by the
/// seed; rendered by `render`; `hack_frac` applied.
pub fn training_prompts(cfg: &TrainConfig, tokenizer: &Tokenizer, render: &PromptRender) -> Result<Vec<Prompt>> {
    let mut prompts = match &cfg.prompts {
        None => dataset_prompts("train", cfg, tokenizer, rng::derive(cfg.seed, "dataset-prompts", 0), cfg.num_prompts, cfg.num_prompts, render)?,
        Some(path) => {
            let mut prompts = read_prompt_file(path, render)?;
            dedup_keep_order(path, &mut prompts)?;
            if prompts.len() > cfg.num_prompts {
                SplitMix64::new(rng::derive(cfg.seed, "prompt-subset", 0)).shuffle(&mut prompts);
                prompts.truncate(cfg.num_prompts);
            }
            prompts
        }
    };
    apply_hack_frac(&mut prompts, cfg.hack_frac);
    Ok(prompts)
}

/// The evaluation prompts in their fixed order (callers take the first n): the
/// `--eval-prompts` file; with dataset prompts, the SimpleStories `test` split drawn with the
/// fixed evaluation seed; with a `--prompts` file only, a fixed-seed shuffle of the training
/// prompts. All three are the same for every run seed; rendered by `render`; `hack_frac` applied.
pub fn evaluation_prompts(cfg: &TrainConfig, tokenizer: &Tokenizer, render: &PromptRender) -> Result<Vec<Prompt>> {
    let mut prompts = match (&cfg.eval_prompts, &cfg.prompts) {
        (Some(path), _) => read_prompt_file(path, render)?,
        // The pool, or as much of it as the split has (at least the prompts evaluated).
        (None, None) => {
            dataset_prompts("test", cfg, tokenizer, defaults::EVAL_PROMPT_SEED, cfg.eval_samples.max(defaults::EVAL_PROMPT_POOL), cfg.eval_samples, render)?
        }
        (None, Some(_)) => {
            // The training prompts have `hack_frac` applied already.
            let mut all = training_prompts(cfg, tokenizer, render)?;
            SplitMix64::new(defaults::EVAL_PROMPT_SEED).shuffle(&mut all);
            return Ok(all);
        }
    };
    apply_hack_frac(&mut prompts, cfg.hack_frac);
    Ok(prompts)
}

fn dataset_prompts(split: &str, cfg: &TrainConfig, tokenizer: &Tokenizer, seed: u64, count: usize, required: usize, render: &PromptRender) -> Result<Vec<Prompt>> {
    let files = crate::dataset::split_files(crate::dataset::SIMPLESTORIES, split)?;
    let openings = crate::dataset::read_story_openings(&files, cfg.prompt_length)?;
    let texts = crate::dataset::prompts_from_stories(&openings, tokenizer, cfg.prompt_length, count, required, seed)?;
    texts.iter().map(|text| render.text_prompt(text, Map::new())).collect()
}

/// Drops repeated prompts (the first kept); the same text with different metadata is an error.
fn dedup_keep_order(path: &Path, prompts: &mut Vec<Prompt>) -> Result<()> {
    let mut seen: HashMap<String, Option<Arc<PromptMetadata>>> = HashMap::new();
    let mut kept = Vec::with_capacity(prompts.len());
    for prompt in prompts.drain(..) {
        match seen.get(&prompt.text) {
            Some(metadata) => ensure!(
                metadata == &prompt.metadata,
                "{}: the prompt {:?} appears twice with different metadata; give each prompt one line",
                path.display(),
                prompt.text
            ),
            None => {
                seen.insert(prompt.text.clone(), prompt.metadata.clone());
                kept.push(prompt);
            }
        }
    }
    *prompts = kept;
    Ok(())
}
