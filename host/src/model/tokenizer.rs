//! The HF `tokenizers` tokenizer with the SimpleStories conventions made explicit: prompts are
//! encoded without special tokens (the post-processor would append `[EOS]`), there is no BOS
//! and no PAD, and generation stops at the model's EOS id.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, ensure};

#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| anyhow!("cannot load tokenizer {}: {e}", path.display()))?;
        Ok(Self { inner, path: path.to_owned() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encodes text without special tokens: what every prompt and scored text goes through.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| anyhow!("tokenizer {} cannot encode {text:?}: {e}", self.path.display()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Encodes a training document with special tokens: the post-processor appends `[EOS]`,
    /// which must come out as `eos_id` (the document's last target).
    pub fn encode_document(&self, text: &str, eos_id: u32) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, true)
            .map_err(|e| anyhow!("tokenizer {} cannot encode {text:?}: {e}", self.path.display()))?;
        let ids = encoding.get_ids().to_vec();
        ensure!(
            ids.last() == Some(&eos_id),
            "tokenizer {} does not append the end-of-sequence token {eos_id} to documents (its post-processor must add [EOS])",
            self.path.display()
        );
        Ok(ids)
    }

    /// Decodes ids to text with special tokens skipped (what rewards see).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| anyhow!("tokenizer {} cannot decode {ids:?}: {e}", self.path.display()))
    }

    /// The vocabulary string of each id (`##` pieces kept), for token-level rewards and display.
    pub fn token_strings(&self, ids: &[u32]) -> Result<Vec<String>> {
        ids.iter()
            .map(|&id| {
                self.inner.id_to_token(id).with_context(|| {
                    format!("token id {id} is not in tokenizer {}", self.path.display())
                })
            })
            .collect()
    }

    /// Each token's piece of the completion text, as plugins receive them
    /// (`completion-tokens-joined` and its byte offsets), so a token's range maps onto the text.
    /// A WordPiece vocabulary keeps its vocabulary strings (`##` pieces, what plugins have always
    /// received; the SimpleStories tokenizer lowercases and re-spaces, so no mapping onto the
    /// decoded text exists there). Any other vocabulary (byte-level BPE, whose vocabulary strings
    /// spell a space `Ġ` and bytes as characters) gets the text each token adds to the decoding
    /// (tokenizers' `DecodeStream`): the pieces concatenated are exactly [`Self::decode`]'s text;
    /// a token that ends inside a multi-byte character, or a skipped special token, has an empty
    /// piece and the token completing the character carries it.
    /// `text` is [`Self::decode`]'s of `ids` (the caller has it already).
    pub fn completion_pieces(&self, ids: &[u32], text: &str) -> Result<Vec<String>> {
        if matches!(self.inner.get_model(), tokenizers::ModelWrapper::WordPiece(_)) {
            return self.token_strings(ids);
        }
        let mut stream = self.inner.decode_stream(true);
        let mut pieces = Vec::with_capacity(ids.len());
        for &id in ids {
            let piece = stream.step(id).map_err(|e| anyhow!("tokenizer {} cannot decode token {id} of {ids:?} incrementally: {e}", self.path.display()))?;
            pieces.push(piece.unwrap_or_default());
        }
        let joined = pieces.concat();
        // A completion cut inside a character decodes to U+FFFD there: the last token carries it.
        let rest = text.strip_prefix(joined.as_str()).with_context(|| {
            format!("tokenizer {}: the tokens' pieces {joined:?} are not the start of the decoded completion {text:?}", self.path.display())
        })?;
        match pieces.last_mut() {
            Some(last) => last.push_str(rest),
            None => ensure!(rest.is_empty(), "no tokens decode to {rest:?}"),
        }
        Ok(pieces)
    }

    /// Checks that `eos_id` (read from the model's config.json) names a special token of this
    /// tokenizer, so a mismatched tokenizer/model pair fails at load instead of never stopping.
    pub fn check_eos(&self, eos_id: u32) -> Result<()> {
        let token = self.inner.id_to_token(eos_id).with_context(|| {
            format!("eos_token_id {eos_id} is not in tokenizer {}", self.path.display())
        })?;
        let is_special = self
            .inner
            .get_added_tokens_decoder()
            .get(&eos_id)
            .is_some_and(|added| added.special);
        ensure!(
            is_special,
            "eos_token_id {eos_id} is {token:?} in tokenizer {}, which is not a special token",
            self.path.display()
        );
        Ok(())
    }
}
