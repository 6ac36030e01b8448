//! A run's text outputs: `train.log` (everything printed, one writer), `metrics.jsonl` and
//! `routing_eval.jsonl` (one JSON object per line, flushed as written so a crash loses nothing
//! already reported). On a terminal a progress bar shows the step; elsewhere plain lines.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

pub struct RunLog {
    file: File,
    path: PathBuf,
    progress: Option<ProgressBar>,
}

impl RunLog {
    pub fn open(run_dir: &Path, total_steps: u64) -> Result<Self> {
        let path = run_dir.join("train.log");
        let file = OpenOptions::new().create(true).append(true).open(&path).with_context(|| format!("cannot open {}", path.display()))?;
        let progress = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total_steps);
            bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} steps  {elapsed} < {eta}  {msg}").expect("valid template"));
            bar
        });
        Ok(Self { file, path, progress })
    }

    /// Prints a line (above the progress bar on a terminal) and appends it to train.log.
    pub fn line(&mut self, text: &str) -> Result<()> {
        match &self.progress {
            Some(bar) => bar.println(text),
            None => println!("{text}"),
        }
        writeln!(self.file, "{text}").and_then(|_| self.file.flush()).with_context(|| format!("cannot write {}", self.path.display()))
    }

    pub fn progress(&self, step: u64, message: String) {
        if let Some(bar) = &self.progress {
            bar.set_position(step);
            bar.set_message(message);
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.progress {
            bar.finish_and_clear();
        }
    }
}

/// An append-only JSON-lines file.
pub struct Jsonl {
    path: PathBuf,
}

impl Jsonl {
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    pub fn append(&self, value: &serde_json::Value) -> Result<()> {
        self.append_all(std::iter::once(value))
    }

    /// Appends several lines with one open and one flush (a batch's completions).
    pub fn append_all<'a>(&self, values: impl IntoIterator<Item = &'a serde_json::Value>) -> Result<()> {
        let file = OpenOptions::new().create(true).append(true).open(&self.path).with_context(|| format!("cannot open {}", self.path.display()))?;
        let mut writer = std::io::BufWriter::new(file);
        values
            .into_iter()
            .try_for_each(|value| writeln!(writer, "{value}"))
            .and_then(|_| writer.flush())
            .with_context(|| format!("cannot write {}", self.path.display()))
    }

    /// Every line, parsed; a missing file has none.
    pub fn read(&self) -> Result<Vec<serde_json::Value>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", self.path.display())),
        };
        let lines = text.lines().filter(|l| !l.trim().is_empty()).enumerate();
        lines
            .map(|(i, line)| serde_json::from_str(line).with_context(|| format!("{} line {} is not JSON", self.path.display(), i + 1)))
            .collect()
    }

    /// Keeps only the lines whose `step` is at most `step` (a resumed run rewrites what came
    /// after its checkpoint), atomically and byte for byte as they were written, and returns
    /// the last line kept (read exactly: serde_json's `float_roundtrip`).
    pub fn truncate_after(&self, step: usize) -> Result<Option<serde_json::Value>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", self.path.display())),
        };
        let (mut kept, mut last) = (String::new(), None);
        for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            let value: serde_json::Value = serde_json::from_str(line).with_context(|| format!("{} line {} is not JSON", self.path.display(), i + 1))?;
            let line_step = value["step"].as_u64().with_context(|| format!("{} has a line without a step", self.path.display()))?;
            if line_step as usize <= step {
                kept.push_str(line);
                kept.push('\n');
                last = Some(value);
            }
        }
        crate::fsutil::write_atomic(&self.path, kept.as_bytes())?;
        Ok(last)
    }
}
