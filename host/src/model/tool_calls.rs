//! Tool calls as a model with a tool-call chat template writes them (issue 48): Qwen2.5's and
//! Qwen3's `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks, and the JSON
//! they carry kept in the order it was written.
//!
//! Order matters because transformers renders a tool's schema and a call's arguments with
//! `json.dumps` over Python dicts, which keep their keys as written, while this crate's
//! `serde_json::Value` sorts them (serde_json is built without `preserve_order`: that feature
//! would reorder every JSON file the host writes and rebuild wasmtime, tokenizers and parquet).
//! [`OrderedJson`] is parsed from the text itself and becomes a minijinja map that enumerates its
//! keys in that order, which the chat template's `tojson` then writes.
//!
//! [`parse_tool_calls`] reads an assistant turn as TRL 1.16's Qwen3 response schema does
//! (`trl/chat_template_utils.py`, `qwen3_schema`): the content is the text before the first
//! `<tool_call>` (one newline before it dropped), each `<tool_call>...</tool_call>` block is one
//! JSON object `{"name", "arguments"}`, its text trimmed. Unlike that schema's regex, a block may
//! span lines (the JSON is read by a JSON parser, not by `.+?`). A block that is not a call of
//! a declared tool is a [`Malformed`] entry in its place, whose [`Malformed::observation`] tells
//! the model what was wrong: the model's mistake is an observation, never an error of the run.

use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value with object keys in the order the text wrote them (a repeated key keeps its
/// first place and its last value, as Python's `json.loads`).
#[derive(Debug, Clone, PartialEq)]
pub enum OrderedJson {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<OrderedJson>),
    Object(Vec<(String, OrderedJson)>),
}

impl OrderedJson {
    /// `text` parsed as one JSON value.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The value of `key` in an object (None for other kinds or a missing key).
    pub fn get(&self, key: &str) -> Option<&OrderedJson> {
        match self {
            OrderedJson::Object(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            OrderedJson::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as compact JSON text, object keys in their order.
    pub fn to_json(&self) -> String {
        let quoted = |s: &str| serde_json::Value::from(s).to_string();
        match self {
            OrderedJson::Null => "null".into(),
            OrderedJson::Bool(b) => b.to_string(),
            OrderedJson::Number(n) => n.to_string(),
            OrderedJson::String(s) => quoted(s),
            OrderedJson::Array(items) => format!("[{}]", items.iter().map(OrderedJson::to_json).collect::<Vec<_>>().join(",")),
            OrderedJson::Object(entries) => format!("{{{}}}", entries.iter().map(|(k, v)| format!("{}:{}", quoted(k), v.to_json())).collect::<Vec<_>>().join(",")),
        }
    }

    /// The value as a template sees it: objects are maps enumerating their keys in order.
    pub fn to_value(&self) -> Value {
        match self {
            OrderedJson::Null => Value::from(()),
            OrderedJson::Bool(b) => Value::from(*b),
            OrderedJson::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Value::from(i),
                (None, Some(u)) => Value::from(u),
                _ => Value::from(n.as_f64().expect("a JSON number is an integer or a float")),
            },
            OrderedJson::String(s) => Value::from(s.as_str()),
            OrderedJson::Array(items) => Value::from(items.iter().map(OrderedJson::to_value).collect::<Vec<_>>()),
            OrderedJson::Object(entries) => ordered_map(entries.iter().map(|(k, v)| (k.clone(), v.to_value())).collect()),
        }
    }
}

/// A minijinja map over `entries` that enumerates its keys in their order (minijinja's own
/// maps are sorted without its `preserve_order` feature).
pub fn ordered_map(entries: Vec<(String, Value)>) -> Value {
    Value::from_object(OrderedMap(entries))
}

#[derive(Debug)]
struct OrderedMap(Vec<(String, Value)>);

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let key = key.as_str()?;
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.iter().map(|(k, _)| Value::from(k.as_str())).collect())
    }
}

impl<'de> Deserialize<'de> for OrderedJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = OrderedJson;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Number(n.into()))
    }
    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<OrderedJson, E> {
        serde_json::Number::from_f64(n).map(OrderedJson::Number).ok_or_else(|| E::custom("a JSON number must be finite"))
    }
    fn visit_str<E>(self, s: &str) -> Result<OrderedJson, E> {
        Ok(OrderedJson::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<OrderedJson, E> {
        Ok(OrderedJson::String(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OrderedJson, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(OrderedJson::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedJson, A::Error> {
        let mut entries: Vec<(String, OrderedJson)> = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, OrderedJson>()? {
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
        }
        Ok(OrderedJson::Object(entries))
    }
}

/// One call of a tool: its name and its arguments (a JSON object, keys as the model wrote them).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: OrderedJson,
}

impl ToolCall {
    /// The call as transformers' messages carry it: `{"type": "function", "function": {"name",
    /// "arguments"}}` (Qwen's templates read `tool_call.function` when it is there).
    pub fn to_value(&self) -> Value {
        let function = ordered_map(vec![("name".into(), Value::from(self.name.as_str())), ("arguments".into(), self.arguments.to_value())]);
        ordered_map(vec![("type".into(), Value::from("function")), ("function".into(), function)])
    }
}

/// A `<tool_call>` block that is not a call of a declared tool: which block (1-based, in the
/// turn's order) and what is wrong with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Malformed {
    pub block: usize,
    pub problem: String,
}

impl Malformed {
    /// The observation the model reads for this block (in the `tool` role).
    pub fn observation(&self) -> String {
        format!(
            "error: tool call {} was not run: {}. Write each call as <tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
            self.block, self.problem
        )
    }
}

/// An assistant turn read for tool calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedTurn {
    /// The text before the first `<tool_call>` (the whole turn without one), one newline right
    /// before the block dropped.
    pub content: String,
    /// Each block in order: a call, or why it is not one.
    pub calls: Vec<Result<ToolCall, Malformed>>,
}

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// The tool calls of `completion` (an assistant turn without its stop token), checked against
/// the names of the declared `tools`.
pub fn parse_tool_calls(completion: &str, tools: &[&str]) -> ParsedTurn {
    let Some(first) = completion.find(OPEN) else {
        return ParsedTurn { content: completion.to_string(), calls: Vec::new() };
    };
    let before = &completion[..first];
    let content = before.strip_suffix('\n').unwrap_or(before).to_string();
    let mut calls = Vec::new();
    let mut rest = &completion[first..];
    while let Some(start) = rest.find(OPEN) {
        let block = calls.len() + 1;
        let body = &rest[start + OPEN.len()..];
        let Some(end) = body.find(CLOSE) else {
            calls.push(Err(Malformed { block, problem: format!("{OPEN} is not closed by {CLOSE}") }));
            break;
        };
        calls.push(read_call(body[..end].trim(), tools).map_err(|problem| Malformed { block, problem }));
        rest = &body[end + CLOSE.len()..];
    }
    ParsedTurn { content, calls }
}

/// One block's text as a call of one of `tools`, or what is wrong with it.
fn read_call(text: &str, tools: &[&str]) -> Result<ToolCall, String> {
    let json = OrderedJson::parse(text).map_err(|e| format!("its text is not JSON ({e})"))?;
    let OrderedJson::Object(entries) = &json else {
        return Err("its JSON is not an object".into());
    };
    if let Some((key, _)) = entries.iter().find(|(k, _)| k != "name" && k != "arguments") {
        return Err(format!("its object has the key {key:?}; a call has only \"name\" and \"arguments\""));
    }
    let name = json.get("name").ok_or("it has no \"name\"")?.as_str().ok_or("its \"name\" is not a string")?;
    if !tools.contains(&name) {
        return Err(format!("there is no tool {name:?} (the tools are {})", tools.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ")));
    }
    let arguments = json.get("arguments").ok_or("it has no \"arguments\" object")?;
    if !matches!(arguments, OrderedJson::Object(_)) {
        return Err("its \"arguments\" is not a JSON object".into());
    }
    Ok(ToolCall { name: name.to_string(), arguments: arguments.clone() })
}

#[cfg(test)]
#[path = "tool_calls_tests.rs"]
mod tests;
