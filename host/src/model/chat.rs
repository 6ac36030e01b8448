//! Chat templates as transformers renders them: the model's Jinja template (`chat_template.jinja`
//! beside the weights, else `tokenizer_config.json`'s `chat_template`) rendered with minijinja
//! in the HF dialect: blocks trimmed and left-stripped as transformers' `trim_blocks` and
//! `lstrip_blocks`, `raise_exception`, `tojson`, loop controls, Python string methods
//! (`.strip()`, `.startswith()`, ... through minijinja-contrib's pycompat), and the tokenizer's
//! special tokens (`bos_token`, `eos_token`, ...) in the context. The rendered text is then
//! tokenized without adding special tokens, as `apply_chat_template(..., tokenize=True)` does.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use minijinja::{Environment, Error, ErrorKind, context};
use serde::Serialize;
use serde_json::Value;

use super::hub::ModelFiles;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self { role: role.to_string(), content: content.to_string() }
    }
}

/// A model's chat template and the special tokens its context offers.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    /// Where the template was read from, for messages.
    origin: PathBuf,
    /// `bos_token`, `eos_token`, `unk_token`, `pad_token` of tokenizer_config.json (strings).
    special_tokens: serde_json::Map<String, Value>,
}

impl ChatTemplate {
    /// The template of a model: `chat_template.jinja`, else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of `{name, template}` of which `default` is used).
    pub fn for_model(files: &ModelFiles) -> Result<Self> {
        let special_tokens = match &files.tokenizer_config {
            Some(path) => special_tokens(&read_json(path)?),
            None => serde_json::Map::new(),
        };
        if let Some(path) = &files.chat_template {
            let source = std::fs::read_to_string(path).with_context(|| format!("cannot read chat template {}", path.display()))?;
            return Ok(Self { source, origin: path.clone(), special_tokens });
        }
        let path = files.tokenizer_config.as_ref().with_context(|| {
            format!("model {} has no chat template (neither chat_template.jinja nor tokenizer_config.json); use raw prompts", files.source)
        })?;
        let source = match read_json(path)?.get("chat_template") {
            Some(Value::String(source)) => source.clone(),
            Some(Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template")?.as_str())
                .with_context(|| format!("{}: chat_template is a list without a \"default\" template", path.display()))?
                .to_string(),
            Some(other) => bail!("{}: chat_template = {other} is neither a template nor a list of named templates", path.display()),
            None => bail!("model {} has no chat template ({} has no chat_template, and there is no chat_template.jinja); use raw prompts", files.source, path.display()),
        };
        Ok(Self { source, origin: path.clone(), special_tokens })
    }

    /// A template given as text (tests, and templates from elsewhere).
    pub fn from_source(source: &str, special_tokens: serde_json::Map<String, Value>) -> Self {
        Self { source: source.to_string(), origin: PathBuf::from("<inline template>"), special_tokens }
    }

    /// The prompt text for `messages`; with `add_generation_prompt`, ending where the assistant's
    /// reply begins.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template("chat", &self.source)
            .map_err(|e| anyhow!("chat template {} does not parse: {e:#}", self.origin.display()))?;
        let template = env.get_template("chat").expect("added above");
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            ..minijinja::Value::from_serialize(&self.special_tokens)
        };
        template.render(ctx).map_err(|e| anyhow!("chat template {} fails on these messages: {e:#}", self.origin.display()))
    }

    /// One user message (after `system`, if given) with the generation prompt: what `--chat`
    /// does with a prompt.
    pub fn user_prompt(&self, system: Option<&str>, user: &str) -> Result<String> {
        let mut messages = Vec::new();
        if let Some(system) = system {
            messages.push(Message::new("system", system));
        }
        messages.push(Message::new("user", user));
        self.render(&messages, true)
    }
}

fn read_json(path: &Path) -> Result<serde_json::Map<String, Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a JSON object", path.display()))
}

/// The special tokens transformers puts in a template's context, as strings (an added-token
/// object `{"content": ...}` gives its content).
fn special_tokens(config: &serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"]
        .into_iter()
        .filter_map(|name| {
            let token = match config.get(name)? {
                Value::String(s) => s.clone(),
                Value::Object(o) => o.get("content")?.as_str()?.to_string(),
                _ => return None,
            };
            Some((name.to_string(), Value::String(token)))
        })
        .collect()
}
