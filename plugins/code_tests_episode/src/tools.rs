//! The plain-text tool protocol of `code_tests_episode` (for models without a tool-call
//! template): a turn whose first non-blank line is `call TOOL` calls TOOL, and the rest of the
//! turn is its argument; any other turn is the answer. `write_tests`' argument is one test a
//! line, `NAME(ARG) == EXPECTED`, as the prompt's examples are written, each side a literal of
//! the problems' types (an integer, `True`/`False`, a string of lowercase letters in `'` or `"`,
//! a list of integers). The tests are parsed here, in Rust, and rendered again by
//! [`Py::literal`]: the model's text never reaches a program as code.

use code_tests::Py;

/// What a turn is.
#[derive(Debug, PartialEq, Eq)]
pub enum Turn<'a> {
    /// `call TOOL` (TOOL: the line's next word, empty when there is none) and the rest of the turn.
    Call { tool: &'a str, argument: &'a str },
    /// The final answer: the whole turn.
    Answer(&'a str),
}

/// Reads a turn (see the module's documentation).
pub fn parse_turn(text: &str) -> Turn<'_> {
    let start = text.len() - text.trim_start().len();
    let rest = &text[start..];
    let (line, argument) = rest.split_once('\n').unwrap_or((rest, ""));
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.first() {
        Some(&"call") => Turn::Call { tool: words.get(1).copied().unwrap_or(""), argument },
        _ => Turn::Answer(text),
    }
}

/// The most tests `write_tests` takes (the generator's bound on `n_tests`).
pub const MAX_TESTS: usize = 20;

/// `write_tests`' tests for function `name`: one (input, expected) a non-blank line, 1 to
/// [`MAX_TESTS`] of them; an error says which line is not a test, for the observation.
pub fn parse_tests(argument: &str, name: &str) -> Result<Vec<(Py, Py)>, String> {
    let lines: Vec<&str> = argument.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if lines.is_empty() || lines.len() > MAX_TESTS {
        return Err(format!("write_tests takes 1 to {MAX_TESTS} tests, one a line after `call write_tests`; got {}", lines.len()));
    }
    lines
        .iter()
        .enumerate()
        // The line is not echoed: an observation's length must not depend on the model's text.
        .map(|(index, line)| parse_test(line, name).ok_or_else(|| format!("write_tests: line {} is not a test `{name}(ARG) == EXPECTED`.", index + 1)))
        .collect()
}

fn parse_test(line: &str, name: &str) -> Option<(Py, Py)> {
    let (call, expected) = line.split_once("==")?;
    let argument = call.trim().strip_prefix(name)?.trim_start().strip_prefix('(')?.strip_suffix(')')?;
    Some((literal(argument)?, literal(expected)?))
}

/// A literal of the problems' types, or None.
pub fn literal(text: &str) -> Option<Py> {
    let text = text.trim();
    match text {
        "True" => return Some(Py::Bool(true)),
        "False" => return Some(Py::Bool(false)),
        _ => {}
    }
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        if inner.trim().is_empty() {
            return Some(Py::List(Vec::new()));
        }
        return inner.split(',').map(|item| item.trim().parse::<i64>().ok()).collect::<Option<Vec<_>>>().map(Py::List);
    }
    for quote in ['\'', '"'] {
        if let Some(inner) = text.strip_prefix(quote).and_then(|t| t.strip_suffix(quote)) {
            return (text.len() >= 2 && inner.bytes().all(|b| b.is_ascii_lowercase())).then(|| Py::Str(inner.to_string()));
        }
    }
    text.parse::<i64>().ok().map(Py::Int)
}

/// Tests as the grader's Python literal: `[((input,), expected), ...]`.
pub fn tests_literal(tests: &[(Py, Py)]) -> String {
    let items: Vec<String> = tests.iter().map(|(input, expected)| format!("(({},), {})", input.literal(), expected.literal())).collect();
    format!("[{}]", items.join(", "))
}

/// The tests of a grader's literal as [`tests_literal`] and the generator write them
/// (`[((input,), expected), ...]`), or None. An input literal never holds `,), ` and an
/// expected one never holds `)` (the problems' types: integers, booleans, lowercase strings,
/// lists of integers), so each ends at the first of those.
pub fn parse_tests_literal(text: &str) -> Option<Vec<(Py, Py)>> {
    let mut rest = text.strip_prefix('[')?.strip_suffix(']')?;
    let mut tests = Vec::new();
    while !rest.is_empty() {
        let (input, after) = rest.strip_prefix("((")?.split_once(",), ")?;
        let (expected, after) = after.split_once(')')?;
        tests.push((literal(input)?, literal(expected)?));
        rest = match after {
            "" => "",
            _ => after.strip_prefix(", ").filter(|next| !next.is_empty())?,
        };
    }
    Some(tests)
}
