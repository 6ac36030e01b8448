//! The samples `smallrl plugin score`, `snapshot` and `bench` read: texts (one completion per
//! line) or JSONL lines of prompt, completion, end and metadata, tokenized by the run's
//! tokenizer or split into words without one.

use std::io::BufRead;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::model::tokenizer::Tokenizer;
use crate::plugins::Sample;

/// The texts of a snapshot: JSONL samples for `.jsonl`, otherwise one completion per
/// non-empty line.
pub(super) fn read_texts(path: &Path, tokenizer: Option<&Tokenizer>) -> Result<Vec<Sample>> {
    if path.extension().is_some_and(|extension| extension == "jsonl") {
        return read_samples(path, tokenizer);
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read texts file {}", path.display()))?;
    let lines = text.lines().filter(|line| !line.trim().is_empty());
    lines.map(|line| completion_only(line, tokenizer)).collect()
}

/// A sample of a completion alone (no prompt, ended with EOS).
pub(super) fn completion_only(text: &str, tokenizer: Option<&Tokenizer>) -> Result<Sample> {
    sample_from(SampleLine { prompt: String::new(), completion: text.to_string(), ended_with_eos: true, metadata: None }, tokenizer)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SampleLine {
    #[serde(default)]
    prompt: String,
    completion: String,
    #[serde(default = "default_ended_with_eos")]
    ended_with_eos: bool,
    /// The prompt's metadata columns (as a JSONL prompt file's extra columns).
    #[serde(default)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

fn default_ended_with_eos() -> bool {
    true
}

pub(super) fn read_samples(path: &Path, tokenizer: Option<&Tokenizer>) -> Result<Vec<Sample>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut samples = Vec::new();
    for (index, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: SampleLine = serde_json::from_str(&line).with_context(|| {
            format!("{}:{}: expected {{\"prompt\": .., \"completion\": .., \"ended_with_eos\": .., \"metadata\": {{..}}}}", path.display(), index + 1)
        })?;
        samples.push(sample_from(parsed, tokenizer).with_context(|| format!("{}:{}", path.display(), index + 1))?);
    }
    Ok(samples)
}

fn sample_from(line: SampleLine, tokenizer: Option<&Tokenizer>) -> Result<Sample> {
    let metadata = crate::train::prompts::metadata_from_columns(line.metadata.unwrap_or_default())?;
    let prompt = crate::reward::Prompt { text: line.prompt, metadata };
    let mut sample = match tokenizer {
        Some(tokenizer) => crate::reward::sample_from_text(&prompt, &line.completion, tokenizer)?,
        None => {
            let tokens = words_and_punctuation(&line.completion);
            Sample {
                prompt: prompt.text,
                completion: line.completion.clone(),
                completion_ids: vec![0; tokens.len()],
                completion_tokens: tokens,
                ended_with_eos: true,
                metadata: prompt.metadata,
            }
        }
    };
    sample.ended_with_eos = line.ended_with_eos;
    Ok(sample)
}

/// Tokens without a tokenizer: whitespace-separated words with each punctuation mark apart
/// (what the SimpleStories pre-tokenizer does before WordPiece).
fn words_and_punctuation(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    for word in text.split_whitespace() {
        let mut current = String::new();
        for character in word.chars() {
            if character.is_ascii_punctuation() {
                tokens.extend((!current.is_empty()).then(|| std::mem::take(&mut current)));
                tokens.push(character.to_string());
            } else {
                current.push(character);
            }
        }
        tokens.extend((!current.is_empty()).then_some(current));
    }
    tokens
}
