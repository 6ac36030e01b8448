//! TensorBoard event files, written directly: TFRecord framing (length, masked CRC32C of the
//! length, the record, masked CRC32C of the record) around `tensorflow.Event` protocol buffers,
//! encoded by hand for the few fields used (`event.proto`, `summary.proto`, `tensor.proto`).
//! No TensorBoard writer crate is both maintained and small, and the format is a page long.
//!
//! Each record is written with one `write_all` and flushed, so a crash leaves whole records
//! (TensorBoard's reader stops quietly at a truncated last one).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};

/// The version string TensorBoard expects in an event file's first record.
const FILE_VERSION: &str = "brain.Event:2";
/// `tensorflow.DataType.DT_STRING`.
const DT_STRING: u64 = 7;
/// `tensorflow.SessionLog.SessionStatus.START`: TensorBoard drops the events of later steps
/// that an earlier process wrote (a resumed run rewrites them).
const SESSION_START: u64 = 1;

pub struct EventWriter {
    file: File,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir` (`events.out.tfevents.<unix time>.smallrl.<pid>.<n>`, the name
    /// pattern TensorBoard looks for; `n` counts the files of this process, so two writers in
    /// one second never collide), starting with the file-version record.
    pub fn create(dir: &Path) -> Result<Self> {
        static FILES_CREATED: AtomicU64 = AtomicU64::new(0);
        let (seconds, pid) = (wall_time() as u64, std::process::id());
        let number = FILES_CREATED.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("events.out.tfevents.{seconds}.smallrl.{pid}.{number}"));
        let file = File::create_new(&path).with_context(|| format!("cannot create the TensorBoard event file {}", path.display()))?;
        let mut writer = Self { file, path };
        writer.write_event(0, &string_field(3, FILE_VERSION))?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Scalars of one step, one event each (float32, as TensorBoard stores them).
    pub fn scalars<'a>(&mut self, step: u64, scalars: impl IntoIterator<Item = (&'a str, f64)>) -> Result<()> {
        for (tag, value) in scalars {
            let mut summary_value = string_field(1, tag);
            summary_value.extend(float_field(2, value as f32));
            self.write_summary(step, &summary_value)?;
        }
        Ok(())
    }

    /// A text summary (shown by TensorBoard's Text tab; rendered as Markdown).
    pub fn text(&mut self, tag: &str, step: u64, text: &str) -> Result<()> {
        let mut shape = Vec::new();
        shape.extend(message_field(2, &varint_field(1, 1))); // dim { size: 1 }
        let mut tensor = varint_field(1, DT_STRING);
        tensor.extend(message_field(2, &shape));
        tensor.extend(bytes_field(8, text.as_bytes())); // string_val
        let plugin_data = string_field(1, "text");
        let metadata = message_field(1, &plugin_data);
        let mut summary_value = string_field(1, tag);
        summary_value.extend(message_field(9, &metadata));
        summary_value.extend(message_field(8, &tensor));
        self.write_summary(step, &summary_value)
    }

    /// Marks a restart at `step`: TensorBoard discards what earlier files logged from that
    /// step on, so a resumed run's curves do not show the interrupted tail twice.
    pub fn restart_at(&mut self, step: u64) -> Result<()> {
        let session_log = varint_field(1, SESSION_START);
        self.write_event(step, &message_field(7, &session_log))
    }

    fn write_summary(&mut self, step: u64, summary_value: &[u8]) -> Result<()> {
        let summary = message_field(1, summary_value);
        self.write_event(step, &message_field(5, &summary))
    }

    /// An `Event` with wall time, step and `what` (already encoded) as one TFRecord.
    fn write_event(&mut self, step: u64, what: &[u8]) -> Result<()> {
        let mut event = fixed64_field(1, wall_time().to_bits());
        event.extend(varint_field(2, step));
        event.extend_from_slice(what);
        self.file
            .write_all(&tfrecord(&event))
            .and_then(|_| self.file.flush())
            .with_context(|| format!("cannot write {}", self.path.display()))
    }
}

fn wall_time() -> f64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.expect("the clock is after 1970").as_secs_f64()
}

/// TFRecord framing: u64 length, masked CRC32C of the length bytes, data, masked CRC32C of the data.
fn tfrecord(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut record = Vec::with_capacity(data.len() + 16);
    record.extend_from_slice(&length);
    record.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
    record.extend_from_slice(data);
    record.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    record
}

/// TFRecord's mask: a CRC of data that contains CRCs is weak, so the stored value is rotated
/// and offset.
fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

// Protocol buffer wire format: a key (field number << 3 | wire type), then the value.

fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn key(field: u32, wire_type: u8) -> Vec<u8> {
    let mut out = Vec::new();
    varint(u64::from(field) << 3 | u64::from(wire_type), &mut out);
    out
}

fn varint_field(field: u32, value: u64) -> Vec<u8> {
    let mut out = key(field, 0);
    varint(value, &mut out);
    out
}

fn fixed64_field(field: u32, bits: u64) -> Vec<u8> {
    let mut out = key(field, 1);
    out.extend_from_slice(&bits.to_le_bytes());
    out
}

fn float_field(field: u32, value: f32) -> Vec<u8> {
    let mut out = key(field, 5);
    out.extend_from_slice(&value.to_le_bytes());
    out
}

fn bytes_field(field: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = key(field, 2);
    varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

fn string_field(field: u32, text: &str) -> Vec<u8> {
    bytes_field(field, text.as_bytes())
}

fn message_field(field: u32, message: &[u8]) -> Vec<u8> {
    bytes_field(field, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_castagnoli() {
        // CRC-32C's catalogue check value (CRC-32/IEEE would give 0xcbf43926); the masking is
        // checked by TensorBoard's own reader in tests/train/.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn varints_follow_the_protobuf_encoding() {
        // 300 = 0b1_0010_1100 -> [0xac, 0x02] (the protobuf documentation's example).
        let mut out = Vec::new();
        varint(300, &mut out);
        assert_eq!(out, [0xac, 0x02]);
    }
}
