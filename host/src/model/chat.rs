//! Chat templates as transformers renders them: the model's Jinja template (`chat_template.jinja`
//! beside the weights, else `tokenizer_config.json`'s `chat_template`) rendered with minijinja
//! in the HF dialect: blocks trimmed and left-stripped as transformers' `trim_blocks` and
//! `lstrip_blocks`, `raise_exception`, loop controls, Python string methods (`.strip()`,
//! `.startswith()`, ... through minijinja-contrib's pycompat), `tojson` as Python's
//! `json.dumps(ensure_ascii=False)` writes it (transformers' filter; minijinja's own escapes HTML
//! characters and spaces items differently), `strftime_now` (the local time through C's
//! `strftime`, as Python's `datetime.now().strftime`; Llama 3's templates date their system
//! prompt with it), `tools` (the declared tools' schemas, keys as written: [`OrderedJson`]) or
//! none, `documents` as none, and the tokenizer's special tokens (`bos_token`, `eos_token`, ...)
//! in the context. A message is a map of `role`, `content` and, for an assistant turn that
//! called tools, `tool_calls` (`[{"type": "function", "function": {"name", "arguments"}}]`, as
//! transformers' messages carry them); a message's keys enumerate in that order, as the
//! dicts transformers' users write (a template that writes a whole message with `tojson` lists
//! `role` first; `tests/real_model.rs`'s `tojson` template holds it). The rendered text is
//! then tokenized without adding special tokens, as `apply_chat_template(..., tokenize=True)`
//! does.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, context};
use serde_json::Value;

use super::hub::ModelFiles;
use super::tool_calls::{OrderedJson, ToolCall};

crate::choice::choice! {
    /// How a prompt's text becomes the model's input (`prompt_format` of `smallrl train`).
    pub enum PromptFormat ("prompt_format") {
        /// The text as it is, tokenized without special tokens.
        Raw = "raw",
        /// One user message (after the system prompt, if any) rendered by the model's chat
        /// template with the generation prompt, as `apply_chat_template(...,
        /// add_generation_prompt=True)`.
        Chat = "chat",
    }
}

/// One chat message: `tool_calls` are an assistant turn's calls (empty: the key is absent).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self { role: role.to_string(), content: content.to_string(), tool_calls: Vec::new() }
    }

    /// The message as the template sees it (see the module documentation).
    fn to_value(&self) -> minijinja::Value {
        let mut entries = vec![("role".to_string(), minijinja::Value::from(self.role.as_str())), ("content".to_string(), minijinja::Value::from(self.content.as_str()))];
        if !self.tool_calls.is_empty() {
            entries.push(("tool_calls".to_string(), self.tool_calls.iter().map(ToolCall::to_value).collect()));
        }
        super::tool_calls::ordered_map(entries)
    }
}

/// A model's chat template (parsed once) and the special tokens its context offers.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    /// The template as `chat`, with HF's dialect: trimmed blocks, Python's string methods,
    /// `raise_exception`, transformers' `tojson`, `strftime_now`.
    env: Environment<'static>,
    /// Where the template was read from, for messages.
    origin: PathBuf,
    /// `bos_token`, `eos_token`, `unk_token`, `pad_token` of tokenizer_config.json (strings).
    special_tokens: serde_json::Map<String, Value>,
}

impl ChatTemplate {
    /// The template of a model: `chat_template.jinja`, else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of `{name, template}` of which `default` is used).
    pub fn for_model(files: &ModelFiles) -> Result<Self> {
        let tokenizer_config = files.tokenizer_config.as_ref().map(|path| read_json(path)).transpose()?;
        let special_tokens = tokenizer_config.as_ref().map(special_tokens).unwrap_or_default();
        if let Some(path) = &files.chat_template {
            let source = std::fs::read_to_string(path).with_context(|| format!("cannot read chat template {}", path.display()))?;
            return Self::parsed(source, path.clone(), special_tokens);
        }
        let path = files.tokenizer_config.as_ref().with_context(|| {
            format!("model {} has no chat template (neither chat_template.jinja nor tokenizer_config.json); use raw prompts", files.source)
        })?;
        let source = match tokenizer_config.as_ref().and_then(|config| config.get("chat_template")) {
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
        Self::parsed(source, path.clone(), special_tokens)
    }

    /// A template given as text (tests, and templates from elsewhere).
    pub fn from_source(source: &str, special_tokens: serde_json::Map<String, Value>) -> Result<Self> {
        Self::parsed(source.to_string(), PathBuf::from("<inline template>"), special_tokens)
    }

    /// `source` parsed into an environment with HF's dialect, or why it does not parse.
    fn parsed(source: String, origin: PathBuf, special_tokens: serde_json::Map<String, Value>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_filter("tojson", tojson);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source).map_err(|e| anyhow!("chat template {} does not parse: {e:#}", origin.display()))?;
        Ok(Self { env, origin, special_tokens })
    }

    /// The prompt text for `messages`; with `add_generation_prompt`, ending where the assistant's
    /// reply begins.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`Self::render`] with the schemas of the tools the model may call, as
    /// `apply_chat_template(..., tools=tools)` renders them (None: no tools, `tools is none`).
    pub fn render_with_tools(&self, messages: &[Message], tools: Option<&[OrderedJson]>, add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template("chat").expect("parsed when made");
        let messages: Vec<minijinja::Value> = messages.iter().map(Message::to_value).collect();
        let tools = match tools {
            Some(tools) => minijinja::Value::from(tools.iter().map(OrderedJson::to_value).collect::<Vec<_>>()),
            None => minijinja::Value::from(()),
        };
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            // transformers passes these as None when not given (`tools is none` holds).
            tools => tools,
            documents => (),
            ..minijinja::Value::from_serialize(&self.special_tokens)
        };
        template.render(ctx).map_err(|e| anyhow!("chat template {} fails on these messages: {e:#}", self.origin.display()))
    }

    /// Whether the template has a tool-call format (Qwen2.5's and Qwen3's do; SmolLM2's ignores
    /// `tools`): one user message rendered with a probe tool shows the tool's schema and the
    /// `<tool_call>` tag. Without one, episodes use the plain-text protocol (`crate::episode`).
    pub fn has_tool_call_format(&self) -> Result<bool> {
        let schema = r#"{"type": "function", "function": {"name": "smallrl_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}}}"#;
        let probe = OrderedJson::parse(schema).expect("the probe schema is JSON");
        let text = self.render_with_tools(&[Message::new("user", "probe")], Some(&[probe]), true)?;
        Ok(text.contains(schema) && text.contains(super::tool_calls::OPEN))
    }

    /// The text an episode appends after an assistant turn for its `observation` (messages in
    /// the `tool` or `user` role), as the template writes it: from just after the turn's stop
    /// token (`stop_text`, which the model sampled) through the next generation prompt.
    /// `history` is the conversation the turn answered (rendered with the generation prompt,
    /// it is the text the model was given), `turn` the model's text and `tools` the declared
    /// tools (None: none, as `apply_chat_template` without `tools=`). A `stop_text` of "" (a turn
    /// cut before its stop token) gives the template's end-of-turn text first. The template must write
    /// that text and the turn as they were sampled once the observation follows (Qwen3's does
    /// for `tool` observations; a `user` one moves its "last query", which drops the reasoning
    /// of the turns before it): otherwise this is an error, as the tokens already sampled are
    /// not the template's.
    pub fn observation_text(&self, history: &[Message], turn: &str, observation: &[Message], tools: Option<&[OrderedJson]>, stop_text: &str) -> Result<String> {
        let sampled = format!("{}{turn}{stop_text}", self.render_with_tools(history, tools, true)?);
        let mut conversation = history.to_vec();
        conversation.push(Message::new("assistant", turn));
        conversation.extend_from_slice(observation);
        let after = self.render_with_tools(&conversation, tools, true)?;
        let rest = after.strip_prefix(sampled.as_str()).with_context(|| {
            format!("chat template {} does not write the conversation and the turn as they were sampled once an observation follows, so the observation cannot follow them", self.origin.display())
        })?;
        Ok(rest.to_string())
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

/// transformers' `tojson` filter: `json.dumps(value, ensure_ascii=False, indent=indent,
/// sort_keys=sort_keys)`: items separated by `", "` (`","` and newlines with an indent), keys in
/// the order the value has them.
fn tojson(value: &minijinja::Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(value, indent, sort_keys.unwrap_or(false), 0, &mut out)?;
    Ok(out)
}

fn write_json(value: &minijinja::Value, indent: Option<usize>, sort_keys: bool, level: usize, out: &mut String) -> Result<(), Error> {
    let json_err = |e: serde_json::Error| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}"));
    // Opens a container's items (newline and deeper indent) or separates them.
    let separate = |out: &mut String, first: bool, level: usize| match indent {
        Some(n) => {
            out.push_str(if first { "\n" } else { ",\n" });
            out.push_str(&" ".repeat(n * level));
        }
        None if !first => out.push_str(", "),
        None => {}
    };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number | ValueKind::String => out.push_str(&serde_json::to_string(value).map_err(json_err)?),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<minijinja::Value> = value.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separate(out, i == 0, level + 1);
                write_json(item, indent, sort_keys, level + 1, out)?;
            }
            if !items.is_empty() && indent.is_some() {
                separate(out, true, level);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<minijinja::Value> = value.try_iter()?.collect();
            if sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                separate(out, i == 0, level + 1);
                let name = key.as_str().map(str::to_string).unwrap_or_else(|| key.to_string());
                out.push_str(&serde_json::to_string(&name).map_err(json_err)?);
                out.push_str(": ");
                write_json(&value.get_item(key)?, indent, sort_keys, level + 1, out)?;
            }
            if !keys.is_empty() && indent.is_some() {
                separate(out, true, level);
            }
            out.push('}');
        }
        other => return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: cannot write a {other} as JSON"))),
    }
    Ok(())
}

/// transformers' `strftime_now(format)`: the local time now, formatted by C's `strftime` (which
/// Python's `strftime` calls too).
fn strftime_now(format: String) -> Result<String, Error> {
    let invalid = |what: &str| Error::new(ErrorKind::InvalidOperation, format!("strftime_now({format:?}): {what}"));
    let c_format = std::ffi::CString::new(format.as_str()).map_err(|_| invalid("the format contains a NUL byte"))?;
    let mut buf = vec![0u8; 256 + 8 * format.len()];
    // SAFETY: `tm` is written by localtime_r before strftime reads it; strftime writes at most
    // `buf.len()` bytes into `buf` and returns how many (0 when they do not fit).
    let written = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return Err(invalid("the local time is not available"));
        }
        libc::strftime(buf.as_mut_ptr().cast(), buf.len(), c_format.as_ptr(), &tm)
    };
    if written == 0 && !format.is_empty() {
        return Err(invalid("the formatted time does not fit (or is empty)"));
    }
    buf.truncate(written);
    String::from_utf8(buf).map_err(|_| invalid("the formatted time is not UTF-8"))
}
