//! Training a WordPiece tokenizer with the SimpleStories recipe (the pipeline of
//! `simplestories-4096.json`, rebuilt here piece by piece with the `tokenizers` crate):
//! lowercase normalizer (plus the two quote replacements), whitespace + isolated punctuation +
//! single-digit pre-tokenizers, WordPiece with the `##` continuing-subword prefix and decoder,
//! `[UNK]` = 0 and `[EOS]` = 1, and a post-processor that appends `[EOS]` only when special
//! tokens are added. No BOS, no PAD.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Result, anyhow, ensure};
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainerBuilder};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::{Lowercase, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::punctuation::Punctuation;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

pub const UNK: &str = "[UNK]";
pub const EOS: &str = "[EOS]";
pub const EOS_ID: u32 = 1;
const SUBWORD_PREFIX: &str = "##";

/// A trained tokenizer and how large it came out.
pub struct Trained {
    pub tokenizer: Tokenizer,
    pub vocab_size: usize,
    pub requested_vocab_size: usize,
}

impl Trained {
    /// An explicit note when the corpus ran out of merges before `requested_vocab_size`
    /// (a small synthetic corpus has only a few hundred distinct words).
    pub fn size_note(&self) -> String {
        if self.vocab_size < self.requested_vocab_size {
            format!(
                "the trained tokenizer has {} tokens, fewer than the {} asked for: every word of the corpus is already \
                 a single token; the model's vocab_size follows the tokenizer",
                self.vocab_size, self.requested_vocab_size
            )
        } else {
            format!("the trained tokenizer has {} tokens", self.vocab_size)
        }
    }

    /// Writes `tokenizer.json` atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = self.tokenizer.to_string(true).map_err(|e| anyhow!("cannot serialise the tokenizer: {e}"))?;
        crate::fsutil::write_atomic(path, json.as_bytes())
    }
}

/// Trains a WordPiece tokenizer of at most `vocab_size` tokens on `texts`.
pub fn train(texts: &[String], vocab_size: usize) -> Result<Trained> {
    ensure!(vocab_size > 2, "a tokenizer vocabulary needs more than the 2 special tokens (asked {vocab_size})");
    ensure!(!texts.is_empty(), "no text to train a tokenizer on");
    let mut tokenizer = untrained()?;
    let mut trainer = TrainerWrapper::WordPieceTrainer(
        WordPieceTrainerBuilder::new()
            .vocab_size(vocab_size)
            .special_tokens(vec![AddedToken::from(UNK, true), AddedToken::from(EOS, true)])
            .initial_alphabet(ascii_alphabet())
            .continuing_subword_prefix(SUBWORD_PREFIX.into())
            .show_progress(false)
            .build(),
    );
    tokenizer.train(&mut trainer, texts.iter()).map_err(|e| anyhow!("tokenizer training failed: {e}"))?;
    check_special_ids(&tokenizer)?;
    let vocab_size_out = tokenizer.get_vocab_size(true);
    Ok(Trained { tokenizer, vocab_size: vocab_size_out, requested_vocab_size: vocab_size })
}

/// The SimpleStories pipeline around an empty WordPiece model.
fn untrained() -> Result<Tokenizer> {
    let model = WordPiece::builder()
        .unk_token(UNK.into())
        .continuing_subword_prefix(SUBWORD_PREFIX.into())
        .build()
        .map_err(|e| anyhow!("cannot build a WordPiece model: {e}"))?;
    let mut tokenizer = Tokenizer::new(model);
    let replace = |from: &str| Replace::new(from, "\"").map_err(|e| anyhow!("bad normalizer pattern {from:?}: {e}"));
    tokenizer.with_normalizer(Some(NormalizerSequence::new(vec![Lowercase.into(), replace("``")?.into(), replace("''")?.into()])));
    tokenizer.with_pre_tokenizer(Some(PreTokenizerSequence::new(vec![
        Whitespace.into(),
        Punctuation::new(SplitDelimiterBehavior::Isolated).into(),
        Digits::new(true).into(),
    ])));
    tokenizer.with_decoder(Some(WordPieceDecoder::new(SUBWORD_PREFIX.into(), true)));
    let eos_appended = TemplateProcessing::builder()
        .try_single(format!("$A:0 {EOS}:0"))
        .and_then(|b| b.try_pair("$A:0 $B:1"))
        .map_err(|e| anyhow!("bad post-processor template: {e}"))?
        .special_tokens(vec![(EOS, EOS_ID)])
        .build()
        .map_err(|e| anyhow!("cannot build the post-processor: {e}"))?;
    tokenizer.with_post_processor(Some(eos_appended));
    Ok(tokenizer)
}

/// Printable ASCII without upper case (the normalizer lowercases): digits and punctuation are
/// in the vocabulary even when the corpus has none, so they never become `[UNK]`.
fn ascii_alphabet() -> HashSet<char> {
    ('!'..='~').filter(|c| !c.is_ascii_uppercase()).collect()
}

fn check_special_ids(tokenizer: &Tokenizer) -> Result<()> {
    for (token, id) in [(UNK, 0), (EOS, EOS_ID)] {
        ensure!(tokenizer.token_to_id(token) == Some(id), "the trained tokenizer gives {token} id {:?}, expected {id}", tokenizer.token_to_id(token));
    }
    Ok(())
}
