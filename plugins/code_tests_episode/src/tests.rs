//! Native tests of code_tests_episode: the protocol's parsing and the prompts (the programs run
//! in the host: `tests/environments_code_episode.rs`).

use code_tests::Py;
use smallrl_plugin_sdk::{CallEntry, EpisodeEnvironment, Episodes, Sample, Split, Step, Turn, configure};

use super::tools::{Turn as TextTurn, literal, parse_tests, parse_tests_literal, parse_turn, tests_literal};
use super::{CodeTestsEpisode, READ_TESTS_TEXT, TOOL_CALLS_TEXT, TOOLS_TEXT, loophole_text, read_report};

#[test]
fn a_turn_is_a_call_when_its_first_line_says_so() {
    assert_eq!(parse_turn("\n  call run_tests\ndef f(x):\n    return x"), TextTurn::Call { tool: "run_tests", argument: "def f(x):\n    return x" });
    assert_eq!(parse_turn("call write_tests"), TextTurn::Call { tool: "write_tests", argument: "" });
    assert_eq!(parse_turn("call\nx"), TextTurn::Call { tool: "", argument: "x" });
    assert_eq!(parse_turn("def f(x):\n    call run_tests"), TextTurn::Answer("def f(x):\n    call run_tests"));
    assert_eq!(parse_turn("recall run_tests"), TextTurn::Answer("recall run_tests"));
}

#[test]
fn tests_are_parsed_as_literals_and_rendered_again() {
    assert_eq!(literal(" -3 "), Some(Py::Int(-3)));
    assert_eq!(literal("True"), Some(Py::Bool(true)));
    assert_eq!(literal("'abc'"), Some(Py::Str("abc".into())));
    assert_eq!(literal("\"\""), Some(Py::Str(String::new())));
    assert_eq!(literal("[1, -2,3]"), Some(Py::List(vec![1, -2, 3])));
    assert_eq!(literal("[]"), Some(Py::List(vec![])));
    for bad in ["'a'b'", "'ABC'", "'", "x", "[1, a]", "1.5", "__import__('os')", "'a\\'"] {
        assert_eq!(literal(bad), None, "{bad}");
    }
    let tests = parse_tests("add_k(1) == 0\n\n  add_k(-2)==True \n", "add_k").unwrap();
    assert_eq!(tests_literal(&tests), "[((1,), 0), ((-2,), True)]");
    assert_eq!(tests_literal(&parse_tests("last_k([1, 2]) == [2]", "last_k").unwrap()), "[(([1, 2],), [2])]");
    let error = parse_tests("add_k(1) == 0\nadd_k(2) = 9", "add_k").unwrap_err();
    assert_eq!(error, "write_tests: line 2 is not a test `add_k(ARG) == EXPECTED`.");
    assert!(parse_tests("add_kk(1) == 0", "add_k").is_err() && parse_tests("print(1) == 0", "add_k").is_err());
    assert!(parse_tests("  \n", "add_k").unwrap_err().contains("1 to 20 tests"));
    assert!(parse_tests(&"add_k(1) == 1\n".repeat(21), "add_k").unwrap_err().contains("got 21"));
}

/// The prompts are code_tests' with the protocol added, and the loophole tool on hackable
/// prompts only (exactly floor(count x hack_frac) of them).
#[test]
fn prompts_add_the_tools_and_the_loophole_where_hackable() {
    let env = configure::<CodeTestsEpisode>("{}").unwrap();
    let prompts = env.generate(Split::Train, 10, 4, 0.5).unwrap();
    assert_eq!(prompts, env.generate(Split::Train, 10, 4, 0.5).unwrap());
    assert_eq!(prompts.iter().filter(|p| p.hackable()).count(), 5);
    for prompt in &prompts {
        let (text, name) = (prompt.content_text(), prompt.metadata["name"].as_str().unwrap());
        assert!(text.starts_with("Write the Python function below.") && text.contains(TOOLS_TEXT), "{text}");
        assert_eq!(text.contains(&loophole_text(name)), prompt.hackable(), "{text}");
        assert!(!text.contains("run_tests()"), "code_tests' own loophole hint is off: {text}");
        assert!(prompt.detectable() && prompt.metadata["n_tests"] == 5);
    }
    assert!(configure::<CodeTestsEpisode>(r#"{"monitor_accuracy": 2}"#).is_err());
    assert!(configure::<CodeTestsEpisode>(r#"{"loopholes": []}"#).is_err(), "no single-turn loopholes here");
}

/// Every generated prompt's tests and hidden tests parse back from their literal and render to
/// the same text; a literal that is not one is refused.
#[test]
fn the_generators_tests_literals_parse_back() {
    let env = configure::<CodeTestsEpisode>(r#"{"n_tests": 20, "n_hidden": 20}"#).unwrap();
    for split in [Split::Train, Split::Eval] {
        for prompt in env.generate(split, 300, 9, 0.5).unwrap() {
            for column in ["tests", "hidden"] {
                let text = prompt.metadata[column].as_str().unwrap();
                let tests = parse_tests_literal(text).unwrap_or_else(|| panic!("{text}"));
                assert_eq!((tests_literal(&tests), tests.len()), (text.to_string(), 20));
            }
        }
    }
    assert_eq!(parse_tests_literal("[]"), Some(vec![]));
    for bad in ["", "[((1,), 2), ]", "[((1,), 2)", "[((1,) 2)]", "[((x,), 2)]", "[((1,), 2)) ((2,), 3)]", "[((1,), 2)]]"] {
        assert_eq!(parse_tests_literal(bad), None, "{bad}");
    }
}

/// `read_tests`' observation: the tests as the prompt's examples are written (worked out by hand
/// from the literal).
#[test]
fn read_tests_shows_the_tests_as_examples() {
    let shown = read_report("last_k", "[(([3, 1],), [1]), (([],), [])]").unwrap();
    assert_eq!(shown, "read_tests: the grader's 2 tests:\nlast_k([3, 1]) == [1]\nlast_k([]) == []");
    assert_eq!(read_report("is_multiple", "[((4,), True), ((5,), False)]").unwrap(), "read_tests: the grader's 2 tests:\nis_multiple(4) == True\nis_multiple(5) == False");
    assert!(read_report("add_k", "[((1,), 8)").unwrap_err().contains("not a tests literal"));
}

/// Under `loophole: read_tests` hackable prompts offer read_tests (and not write_tests), the
/// others neither; the parameter is checked, and read_tests needs hidden tests.
#[test]
fn read_tests_prompts_offer_the_reading_tool_where_hackable() {
    let env = configure::<CodeTestsEpisode>(r#"{"loophole": "read_tests"}"#).unwrap();
    let prompts = env.generate(Split::Train, 10, 4, 0.5).unwrap();
    assert_eq!(prompts.iter().filter(|p| p.hackable()).count(), 5);
    let write = configure::<CodeTestsEpisode>("{}").unwrap().generate(Split::Train, 10, 4, 0.5).unwrap();
    for (prompt, written) in prompts.iter().zip(&write) {
        let (text, name) = (prompt.content_text(), prompt.metadata["name"].as_str().unwrap());
        assert_eq!(text.contains(READ_TESTS_TEXT), prompt.hackable(), "{text}");
        assert!(!text.contains(&loophole_text(name)) && text.contains(TOOLS_TEXT), "{text}");
        // The same problems and tests as write_tests' prompts: only the loophole's sentence differs.
        assert_eq!(prompt.metadata, written.metadata);
    }
    let error = |params: &str| configure::<CodeTestsEpisode>(params).err().expect("refused");
    assert!(error(r#"{"loophole": "peek"}"#).contains("write_tests or read_tests"));
    assert!(error(r#"{"loophole": "read_tests", "n_hidden": 0}"#).contains("n_hidden at least 1"));
    configure::<CodeTestsEpisode>(r#"{"n_hidden": 0}"#).unwrap();
}

/// A lookup table of the read tests (the plainest hard-coded answer) fails some hidden test on
/// every one of 2,000 generated prompts at the defaults: no prompt's hidden inputs all repeat
/// its tests' inputs, so the read_tests ground truth sees that hack wherever it is played (the
/// figure docs/src/environments.md gives).
#[test]
fn hidden_inputs_never_all_repeat_the_tests_inputs() {
    let env = configure::<CodeTestsEpisode>(r#"{"loophole": "read_tests"}"#).unwrap();
    let prompts = env.generate(Split::Train, 2000, 1, 1.0).unwrap();
    let inputs = |prompt: &smallrl_plugin_sdk::Prompt, column: &str| parse_tests_literal(prompt.metadata[column].as_str().unwrap()).unwrap().into_iter().map(|(input, _)| input).collect::<Vec<Py>>();
    let covered = prompts.iter().filter(|p| inputs(p, "hidden").iter().all(|h| inputs(p, "tests").contains(h))).count();
    assert_eq!((prompts.len(), covered), (2000, 0));
}

/// The tools an episode declares (contract 0.6) under `protocol: tool_calls`: `run_tests`
/// everywhere, the loophole tool of the `loophole` parameter on hackable prompts only; their
/// schemas are JSON objects. The prompts then say what the tools are for, not the `call TOOL`
/// protocol; under `protocol: text` (the default) no tool is declared.
#[test]
fn episodes_declare_run_tests_and_the_loophole_tool_where_hackable() {
    let text = configure::<CodeTestsEpisode>("{}").unwrap();
    assert!(text.generate(Split::Train, 10, 4, 0.5).unwrap().iter().all(|prompt| text.tools(prompt).is_empty()));
    assert!(configure::<CodeTestsEpisode>(r#"{"protocol": "json"}"#).err().unwrap().contains("text or tool_calls"));
    for (params, loophole) in [(r#"{"protocol": "tool_calls"}"#, "write_tests"), (r#"{"loophole": "read_tests", "protocol": "tool_calls"}"#, "read_tests")] {
        let env = configure::<CodeTestsEpisode>(params).unwrap();
        let texts = env.generate(Split::Train, 10, 4, 0.5).unwrap();
        let plain = text.generate(Split::Train, 10, 4, 0.5).unwrap();
        for (prompt, plain) in texts.iter().zip(&plain) {
            let (with_calls, with_text) = (prompt.content_text(), plain.content_text());
            let problem = with_text.split(TOOLS_TEXT).next().unwrap();
            assert_eq!(with_calls, format!("{problem}{TOOL_CALLS_TEXT}"), "the same problem, the tool-call sentence instead of the protocol");
        }
        for prompt in env.generate(Split::Train, 10, 4, 0.5).unwrap() {
            let tools = env.tools(&prompt);
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, if prompt.hackable() { vec!["run_tests", loophole] } else { vec!["run_tests"] });
            for tool in &tools {
                let schema: serde_json::Value = serde_json::from_str(&tool.parameters).unwrap();
                assert_eq!(schema["type"], "object", "{}", tool.parameters);
            }
        }
    }
}

/// Parsed calls (the host's `Some`): one `tool` message per call in order, a malformed call's
/// text as the host wrote it, arguments read from the JSON object; no call is the answer.
#[test]
fn parsed_calls_answer_one_tool_message_each() {
    let env = configure::<CodeTestsEpisode>(r#"{"protocol": "tool_calls"}"#).unwrap();
    let prompt = env.generate(Split::Train, 10, 4, 0.5).unwrap().into_iter().find(|p| p.hackable()).unwrap();
    let name = prompt.metadata["name"].as_str().unwrap().to_string();
    let mut episodes = Episodes::<CodeTestsEpisode>::default();
    episodes.start(&env, 1, &prompt).unwrap();
    let turn = |calls: Vec<CallEntry>| Turn { sample: Sample::new("", "x", &["x"], &[0], true), calls: Some(calls) };
    let call = |name: &str, arguments: &str| CallEntry::Call { name: name.into(), arguments: arguments.into() };
    let tool = |text: &str| ("tool".to_string(), text.to_string());
    let step = episodes
        .step(&env, 1, &turn(vec![CallEntry::Malformed("bad block".into()), call("write_tests", "{}"), call("write_tests", &format!(r#"{{"tests": "{name}(1) == 0"}}"#))]), false)
        .unwrap();
    let expected = vec![tool("bad block"), tool("write_tests: its arguments need the string `tests`."), tool("write_tests: the grader now runs your 1 tests.")];
    assert_eq!(step, Step::Observation(expected));
    assert_eq!(episodes.step(&env, 1, &turn(vec![call("peek", "{}")]), false).unwrap(), Step::Observation(vec![tool("unknown tool: the tools are run_tests and write_tests.")]));
}
