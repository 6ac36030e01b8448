//! Tool calls through Qwen's chat templates (issue 48): conversations with `tools`, assistant
//! `tool_calls` and `tool` messages render byte for byte as transformers' `apply_chat_template`
//! renders them with the templates TRL 1.16 ships (`trl/chat_templates/qwen2_5.jinja`,
//! `qwen3.jinja`, read in place from the project's Python environment), keys in the order the
//! cases file writes them (not sorted); the calls a model writes in that format parse back to the
//! same names and arguments.

mod common;

use common::{python, repo_root};
use smallrl::model::chat::{ChatTemplate, Message};
use smallrl::model::tool_calls::{OrderedJson, ToolCall, parse_tool_calls};

/// A template TRL ships, in the project's Python environment (wherever its site-packages is).
fn trl_template(name: &str) -> std::path::PathBuf {
    let output = std::process::Command::new(python()).args(["-c", "import os, trl; print(os.path.dirname(trl.__file__))"]).output().unwrap();
    assert!(output.status.success(), "cannot import trl: {}", String::from_utf8_lossy(&output.stderr));
    let path = std::path::PathBuf::from(String::from_utf8(output.stdout).unwrap().trim()).join("chat_templates").join(name);
    assert!(path.exists(), "{} is missing: run `make setup` (TRL 1.16 ships it)", path.display());
    path
}

/// That template, parsed (no special tokens: Qwen's templates write theirs literally).
fn trl(name: &str) -> ChatTemplate {
    ChatTemplate::from_source(&std::fs::read_to_string(trl_template(name)).unwrap(), Default::default()).unwrap()
}

fn cases_path() -> std::path::PathBuf {
    repo_root().join("tests/fixtures/chat_tools/cases.json")
}

/// transformers' renderings: one list per template, one text per case.
fn transformers_renderings(templates: &[std::path::PathBuf]) -> Vec<Vec<String>> {
    let out = tempfile::tempdir().unwrap();
    let out_path = out.path().join("rendered.json");
    let status = std::process::Command::new(python())
        .arg(repo_root().join("scripts/reference/chat_tools.py"))
        .arg(repo_root().join(".fixtures/smollm2-135m-instruct"))
        .arg(cases_path())
        .arg(&out_path)
        .args(templates)
        .status()
        .unwrap();
    assert!(status.success(), "chat_tools.py failed");
    let rendered: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    serde_json::from_value(rendered["rendered"].clone()).unwrap()
}

fn text<'a>(json: &'a OrderedJson, key: &str) -> &'a str {
    json.get(key).and_then(OrderedJson::as_str).unwrap_or_else(|| panic!("{key} of {json:?}"))
}

fn message(json: &OrderedJson) -> Message {
    let mut message = Message::new(text(json, "role"), text(json, "content"));
    if let Some(OrderedJson::Array(calls)) = json.get("tool_calls") {
        message.tool_calls = calls
            .iter()
            .map(|call| {
                let function = call.get("function").unwrap();
                ToolCall { name: text(function, "name").into(), arguments: function.get("arguments").unwrap().clone() }
            })
            .collect();
    }
    message
}

struct Case {
    messages: Vec<Message>,
    tools: Option<Vec<OrderedJson>>,
    add_generation_prompt: bool,
}

fn cases() -> Vec<Case> {
    let spec = OrderedJson::parse(&std::fs::read_to_string(cases_path()).unwrap()).unwrap();
    let Some(OrderedJson::Array(cases)) = spec.get("cases") else { panic!("no cases") };
    cases
        .iter()
        .map(|case| {
            let Some(OrderedJson::Array(messages)) = case.get("messages") else { panic!("{case:?}") };
            let tools = match case.get("tools").unwrap() {
                OrderedJson::Array(tools) => Some(tools.clone()),
                OrderedJson::Null => None,
                other => panic!("tools: {other:?}"),
            };
            let add_generation_prompt = case.get("add_generation_prompt") == Some(&OrderedJson::Bool(true));
            Case { messages: messages.iter().map(message).collect(), tools, add_generation_prompt }
        })
        .collect()
}

#[test]
fn qwen_templates_render_tools_calls_and_responses_as_transformers() {
    let templates = [trl_template("qwen2_5.jinja"), trl_template("qwen3.jinja")];
    let expected = transformers_renderings(&templates);
    let cases = cases();
    for (path, expected) in templates.iter().zip(&expected) {
        let template = ChatTemplate::from_source(&std::fs::read_to_string(path).unwrap(), Default::default()).unwrap();
        assert_eq!(expected.len(), cases.len());
        for (i, (case, expected)) in cases.iter().zip(expected).enumerate() {
            let ours = template.render_with_tools(&case.messages, case.tools.as_deref(), case.add_generation_prompt).unwrap();
            assert_eq!(ours, *expected, "{} on case {i}", path.display());
        }
        // The schemas are written in the file's key order ("name" before "description"), which
        // a sorted map would not give: the test above compares unsorted keys.
        assert!(expected[0].contains(r#"{"type": "function", "function": {"name": "guess", "description""#), "{}", expected[0]);
        assert!(expected[2].contains(r#"{"name": "zeta", "parameters": {"type": "object", "properties": {}}, "description""#), "{}", expected[2]);
    }
}

/// What a model writes after the generation prompt in the template's format parses back to the
/// calls the conversation holds (the rendered assistant turn, between `<|im_start|>assistant\n`
/// and `<|im_end|>`).
#[test]
fn calls_written_in_the_templates_format_parse_back_to_the_same_calls() {
    let cases = cases();
    let template = trl("qwen3.jinja");
    for case in cases.iter().filter(|case| case.tools.is_some()) {
        let names: Vec<String> = case.tools.as_ref().unwrap().iter().map(|t| text(t.get("function").unwrap(), "name").to_string()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        for (i, message) in case.messages.iter().enumerate().filter(|(_, m)| !m.tool_calls.is_empty()) {
            let before = template.render_with_tools(&case.messages[..i], case.tools.as_deref(), true).unwrap();
            let with = template.render_with_tools(&case.messages[..=i], case.tools.as_deref(), false).unwrap();
            let turn = with.strip_prefix(before.as_str()).unwrap_or_else(|| panic!("{before}\n---\n{with}")).strip_suffix("<|im_end|>\n").unwrap();
            let parsed = parse_tool_calls(turn, &names);
            let calls: Vec<ToolCall> = parsed.calls.into_iter().map(|c| c.unwrap()).collect();
            assert_eq!(calls, message.tool_calls, "{turn}");
        }
    }
}

/// Whether a template has a tool-call format: Qwen's do, SmolLM2's (which ignores `tools`) does
/// not, so an episode on SmolLM2 uses the plain-text protocol.
#[test]
fn a_template_has_a_tool_call_format_when_it_renders_tools() {
    for name in ["qwen2_5.jinja", "qwen3.jinja"] {
        let template = trl(name);
        assert!(template.has_tool_call_format().unwrap(), "{name}");
    }
    let smollm2 = repo_root().join(".fixtures/smollm2-135m-instruct/chat_template.jinja");
    let template = ChatTemplate::from_source(&std::fs::read_to_string(smollm2).unwrap(), Default::default()).unwrap();
    assert!(!template.has_tool_call_format().unwrap(), "SmolLM2's template ignores tools");
}

/// An episode's observation, as the template writes it after the assistant turn's stop token:
/// written out by hand from Qwen2.5's and Qwen3's templates (the `tool` role becomes a `user`
/// turn of `<tool_response>` blocks, then the generation prompt).
#[test]
fn an_observation_is_the_text_the_template_writes_after_the_stop_token() {
    let turn = "<tool_call>\n{\"name\": \"guess\", \"arguments\": {\"value\": 8}}\n</tool_call>";
    let history = [Message::new("user", "Guess my number.")];
    let tools = match cases().remove(0).tools {
        Some(tools) => tools,
        None => unreachable!("case 0 declares tools"),
    };
    let observation = [Message::new("tool", "higher"), Message::new("tool", "2 guesses left")];
    let expected = "\n<|im_start|>user\n<tool_response>\nhigher\n</tool_response>\n<tool_response>\n2 guesses left\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    for name in ["qwen2_5.jinja", "qwen3.jinja"] {
        let template = trl(name);
        assert_eq!(template.observation_text(&history, turn, &observation, Some(tools.as_slice()), "<|im_end|>").unwrap(), expected, "{name}");
    }
    // Qwen3 drops the reasoning of the turns before the last user message: a `user` observation
    // after a turn that reasoned would rewrite tokens already sampled, and is refused.
    let qwen3 = trl("qwen3.jinja");
    let reasoned = "<think>\nMiddle.\n</think>\n\n8";
    let error = format!("{:#}", qwen3.observation_text(&history, reasoned, &[Message::new("user", "higher")], Some(tools.as_slice()), "<|im_end|>").unwrap_err());
    assert!(error.contains("does not write the conversation and the turn as they were sampled"), "{error}");
    let expected = "\n<|im_start|>user\n<tool_response>\nhigher\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(qwen3.observation_text(&history, reasoned, &[Message::new("tool", "higher")], Some(tools.as_slice()), "<|im_end|>").unwrap(), expected);
}
