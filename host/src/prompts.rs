//! Prompt sources: a text file with one prompt per line (offline use and custom tasks).

use std::path::Path;

use anyhow::{Context, Result, ensure};

/// Reads one prompt per line; blank lines are skipped, surrounding whitespace trimmed.
pub fn read_prompt_file(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read prompt file {}", path.display()))?;
    let prompts: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
    ensure!(!prompts.is_empty(), "prompt file {} has no prompts", path.display());
    Ok(prompts)
}
