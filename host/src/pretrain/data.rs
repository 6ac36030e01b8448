//! Pre-training data: documents from a text file, a JSONL file, the SimpleStories dataset or the
//! synthetic corpus; the held-out split; and packing into fixed-length rows.
//!
//! Packing: whole documents (each ending with `[EOS]`) are placed one after another into rows
//! of `block_size` tokens; a document that does not fit starts the next row, and the rest of a
//! row is padding. Each document restarts at position 0 and attends only to itself (a
//! block-diagonal causal mask), so training sees exactly what sampling sees: a story from its
//! start. Targets are the next token of the same document; the `[EOS]` is the last target of
//! each document; padding and the position after `[EOS]` have no target.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use tch::{Device, Kind, Tensor};

use crate::model::Tokenizer;
use crate::rng::{SplitMix64, derive};

/// Ignored by the loss.
pub const NO_TARGET: i64 = -100;

/// Where the documents come from.
pub enum Source<'a> {
    /// One document per non-empty line.
    TextFile(&'a Path),
    /// One JSON object per non-empty line, the document in `field`.
    JsonlFile(&'a Path, &'a str),
    /// The `story` column of the SimpleStories dataset's train split (HF Hub / cache).
    SimpleStories,
    /// `stories` stories of the synthetic corpus for `seed`.
    Synthetic { stories: usize, seed: u64 },
}

pub fn read_documents(source: &Source) -> Result<Vec<String>> {
    let documents = match source {
        Source::TextFile(path) => read_lines(path)?.into_iter().map(|(_, line)| line).collect(),
        Source::JsonlFile(path, field) => read_jsonl(path, field)?,
        Source::SimpleStories => {
            let files = crate::dataset::split_files(crate::dataset::SIMPLESTORIES, "train")?;
            crate::dataset::read_stories(&files)?
        }
        Source::Synthetic { stories, seed } => crate::corpus::generate(*stories, *seed),
    };
    ensure!(!documents.is_empty(), "the training data has no documents");
    Ok(documents)
}

/// Non-empty lines with their 1-based line numbers.
fn read_lines(path: &Path) -> Result<Vec<(usize, String)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read training data {}", path.display()))?;
    let lines: Vec<(usize, String)> =
        text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).map(|(i, l)| (i + 1, l.trim().to_string())).collect();
    ensure!(!lines.is_empty(), "{} has no documents (every line is empty)", path.display());
    Ok(lines)
}

fn read_jsonl(path: &Path, field: &str) -> Result<Vec<String>> {
    read_lines(path)?
        .into_iter()
        .map(|(number, line)| {
            let value: serde_json::Value =
                serde_json::from_str(&line).with_context(|| format!("{} line {number} is not JSON", path.display()))?;
            match value.get(field) {
                Some(serde_json::Value::String(text)) => Ok(text.clone()),
                Some(other) => bail!("{} line {number}: field {field:?} is not a string but {other}", path.display()),
                None => bail!("{} line {number} has no field {field:?} (choose it with --text-field)", path.display()),
            }
        })
        .collect()
}

/// Splits documents into (training, held-out) after a shuffle seeded by `seed`.
pub fn split_heldout(mut documents: Vec<String>, heldout: usize, seed: u64) -> Result<(Vec<String>, Vec<String>)> {
    ensure!(
        heldout < documents.len(),
        "{} documents cannot spare {heldout} held-out documents and still train (lower --heldout-docs)",
        documents.len()
    );
    SplitMix64::new(derive(seed, "heldout-split", 0)).shuffle(&mut documents);
    let training = documents.split_off(heldout);
    Ok((training, documents))
}

/// Token ids of every document, each ending with `[EOS]`; documents longer than `block_size`
/// are cut to it (they lose their `[EOS]`) and counted.
pub struct Tokenized {
    pub documents: Vec<Vec<i64>>,
    pub truncated: usize,
    pub tokens: usize,
}

pub fn tokenize(documents: &[String], tokenizer: &Tokenizer, eos_id: u32, block_size: usize) -> Result<Tokenized> {
    let mut out = Tokenized { documents: Vec::with_capacity(documents.len()), truncated: 0, tokens: 0 };
    for text in documents {
        let mut ids: Vec<i64> = tokenizer.encode_document(text, eos_id)?.into_iter().map(i64::from).collect();
        if ids.len() > block_size {
            ids.truncate(block_size);
            out.truncated += 1;
        }
        out.tokens += ids.len();
        out.documents.push(ids);
    }
    Ok(out)
}

/// One packed row: token ids, position of each token within its document, and which document
/// (by index within the row; padding is `-1`) each token belongs to.
#[derive(Clone)]
pub struct Row {
    ids: Vec<i64>,
    positions: Vec<i64>,
    documents: Vec<i64>,
}

impl Row {
    fn new() -> Self {
        Self { ids: Vec::new(), positions: Vec::new(), documents: Vec::new() }
    }

    fn push(&mut self, document: &[i64]) {
        let index = self.documents.last().map_or(0, |&d| d + 1);
        self.ids.extend_from_slice(document);
        self.positions.extend(0..document.len() as i64);
        self.documents.extend(std::iter::repeat_n(index, document.len()));
    }

    /// Next token of the same document, or [`NO_TARGET`].
    fn targets(&self) -> Vec<i64> {
        (0..self.ids.len())
            .map(|t| match self.documents.get(t + 1) {
                Some(&next) if next == self.documents[t] => self.ids[t + 1],
                _ => NO_TARGET,
            })
            .collect()
    }

    /// Pads to `len` tokens with `pad` (no target, a document of its own).
    fn padded(&self, len: usize, pad: i64) -> (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>) {
        let fill = len - self.ids.len();
        let extend = |v: &[i64], value: i64| v.iter().copied().chain(std::iter::repeat_n(value, fill)).collect::<Vec<_>>();
        (extend(&self.ids, pad), extend(&self.targets(), NO_TARGET), extend(&self.positions, 0), extend(&self.documents, -1))
    }
}

/// Packs documents in order into rows of at most `block_size` tokens.
pub fn pack(documents: &[&[i64]], block_size: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut row = Row::new();
    for document in documents {
        assert!(document.len() <= block_size, "documents are cut to block_size before packing");
        if row.ids.len() + document.len() > block_size {
            rows.push(std::mem::replace(&mut row, Row::new()));
        }
        row.push(document);
    }
    if !row.ids.is_empty() {
        rows.push(row);
    }
    rows
}

/// A batch on the device: `input_ids`, `targets`, `positions` and the attention mask.
pub struct PackedBatch {
    pub input_ids: Tensor,
    pub targets: Tensor,
    pub positions: Tensor,
    pub mask: Tensor,
    /// Tokens with a target (what the loss averages over).
    pub target_tokens: i64,
}

pub fn batch(rows: &[Row], block_size: usize, pad: i64, device: Device) -> PackedBatch {
    let (mut ids, mut targets, mut positions, mut documents) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for row in rows {
        let (i, t, p, d) = row.padded(block_size, pad);
        ids.extend(i);
        targets.extend(t);
        positions.extend(p);
        documents.extend(d);
    }
    let shape = [rows.len() as i64, block_size as i64];
    let tensor = |v: &[i64]| Tensor::from_slice(v).view(shape).to_device(device);
    let target_tokens = targets.iter().filter(|&&t| t != NO_TARGET).count() as i64;
    let mask = crate::model::llama::document_mask(&tensor(&documents));
    PackedBatch { input_ids: tensor(&ids), targets: tensor(&targets).to_kind(Kind::Int64), positions: tensor(&positions), mask, target_tokens }
}

/// The training rows of every epoch, one after another: epoch `e` packs the documents in the
/// order of a shuffle seeded by `(seed, e)`. Batch `k` is rows `k * batch_size ..`.
pub struct RowStream<'a> {
    documents: &'a [Vec<i64>],
    block_size: usize,
    seed: u64,
    epoch: u64,
    rows: std::vec::IntoIter<Row>,
}

impl<'a> RowStream<'a> {
    pub fn new(documents: &'a [Vec<i64>], block_size: usize, seed: u64) -> Self {
        Self { documents, block_size, seed, epoch: 0, rows: Vec::new().into_iter() }
    }

    /// Epochs started so far.
    pub fn epochs(&self) -> u64 {
        self.epoch
    }

    pub fn take_rows(&mut self, n: usize) -> Vec<Row> {
        (0..n).map(|_| self.next_row()).collect()
    }

    fn next_row(&mut self) -> Row {
        loop {
            if let Some(row) = self.rows.next() {
                return row;
            }
            let mut order: Vec<&[i64]> = self.documents.iter().map(Vec::as_slice).collect();
            SplitMix64::new(derive(self.seed, "epoch-order", self.epoch)).shuffle(&mut order);
            self.rows = pack(&order, self.block_size).into_iter();
            self.epoch += 1;
        }
    }
}
