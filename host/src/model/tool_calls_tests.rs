use super::*;

const TOOLS: &[&str] = &["guess", "run_tests"];

fn call(name: &str, arguments: &str) -> Result<ToolCall, Malformed> {
    Ok(ToolCall { name: name.into(), arguments: OrderedJson::parse(arguments).unwrap() })
}

fn malformed(block: usize, problem: &str) -> Result<ToolCall, Malformed> {
    Err(Malformed { block, problem: problem.into() })
}

#[test]
fn ordered_json_keeps_keys_as_written_and_a_repeated_key_as_python_does() {
    let json = OrderedJson::parse(r#"{"z": 1, "a": {"y": [2.5, null, true], "b": "é"}, "z": 3}"#).unwrap();
    let OrderedJson::Object(entries) = &json else { panic!("{json:?}") };
    let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    // json.loads('{"z": 1, "a": 0, "z": 3}') == {"z": 3, "a": 0}: first place, last value.
    assert_eq!(keys, ["z", "a"]);
    assert_eq!(json.get("z"), Some(&OrderedJson::Number(3.into())));
    let value = json.get("a").unwrap().to_value();
    let keys: Vec<String> = value.try_iter().unwrap().map(|k| k.to_string()).collect();
    assert_eq!(keys, ["y", "b"], "the template's map enumerates the keys in order");
    assert_eq!(value.get_attr("b").unwrap().as_str(), Some("é"));
}

#[test]
fn a_turn_without_blocks_is_all_content() {
    let turn = parse_tool_calls("I think it is 42.", TOOLS);
    assert_eq!(turn, ParsedTurn { content: "I think it is 42.".into(), calls: vec![] });
}

#[test]
fn well_formed_calls_are_read_in_order_with_their_arguments_as_written() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"guess\", \"arguments\": {\"value\": 7, \"note\": \"mid\"}}\n</tool_call>\n<tool_call>\n{\"arguments\": {}, \"name\": \"run_tests\"}\n</tool_call>";
    let turn = parse_tool_calls(text, TOOLS);
    assert_eq!(turn.content, "Let me check.");
    assert_eq!(turn.calls, vec![call("guess", r#"{"value": 7, "note": "mid"}"#), call("run_tests", "{}")]);
    let Ok(first) = &turn.calls[0] else { unreachable!() };
    let OrderedJson::Object(arguments) = &first.arguments else { unreachable!() };
    assert_eq!(arguments.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["value", "note"]);
    // A block over several lines, and no text before it.
    let turn = parse_tool_calls("<tool_call>{\"name\": \"guess\",\n \"arguments\": {\"value\": 3}}</tool_call>", TOOLS);
    assert_eq!(turn, ParsedTurn { content: String::new(), calls: vec![call("guess", r#"{"value": 3}"#)] });
}

#[test]
fn malformed_blocks_say_what_is_wrong_in_their_place() {
    let blocks = [
        ("{\"name\": \"guess\", \"arguments\": {\"value\": 7}", "its text is not JSON (EOF while parsing an object at line 1 column 43)"),
        ("[\"guess\"]", "its JSON is not an object"),
        ("{\"arguments\": {\"value\": 7}}", "it has no \"name\""),
        ("{\"name\": 7, \"arguments\": {}}", "its \"name\" is not a string"),
        ("{\"name\": \"peek\", \"arguments\": {}}", "there is no tool \"peek\" (the tools are \"guess\", \"run_tests\")"),
        ("{\"name\": \"guess\"}", "it has no \"arguments\" object"),
        ("{\"name\": \"guess\", \"arguments\": \"{\\\"value\\\": 7}\"}", "its \"arguments\" is not a JSON object"),
        ("{\"name\": \"guess\", \"arguments\": {}, \"id\": 1}", "its object has the key \"id\"; a call has only \"name\" and \"arguments\""),
    ];
    for (body, problem) in blocks {
        let text = format!("<tool_call>\n{{\"name\": \"guess\", \"arguments\": {{\"value\": 1}}}}\n</tool_call>\n<tool_call>\n{body}\n</tool_call>");
        let turn = parse_tool_calls(&text, TOOLS);
        assert_eq!(turn.calls, vec![call("guess", r#"{"value": 1}"#), malformed(2, problem)], "{body}");
    }
    // A block the turn's end cut off (a stop string, or max_new_tokens) is the last block.
    let turn = parse_tool_calls("ok\n<tool_call>\n{\"name\": \"guess\", \"argu", TOOLS);
    assert_eq!(turn, ParsedTurn { content: "ok".into(), calls: vec![malformed(1, "<tool_call> is not closed by </tool_call>")] });
}

#[test]
fn a_malformed_block_becomes_an_observation_that_shows_the_format() {
    let observation = Malformed { block: 2, problem: "it has no \"name\"".into() }.observation();
    assert_eq!(
        observation,
        "error: tool call 2 was not run: it has no \"name\". Write each call as <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
    );
}

/// The compact text keeps the keys as written (what an environment receives as a call's
/// arguments), checked against a hand-written text.
#[test]
fn ordered_json_writes_its_keys_in_order() {
    let json = OrderedJson::parse(r#"{"z": [1, 2.5, null], "a": {"y": "q\"x", "b": true}}"#).unwrap();
    assert_eq!(json.to_json(), r#"{"z":[1,2.5,null],"a":{"y":"q\"x","b":true}}"#);
}
