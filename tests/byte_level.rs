//! What plugins receive per token for a byte-level BPE vocabulary (the real SmolLM2 tokenizer,
//! whose vocabulary strings spell a space `Ġ` and bytes as characters): each token's piece of
//! the decoded completion, so the pieces joined are the completion transformers decodes and a
//! token's byte range maps onto it. Reference: transformers' decoding of every prefix of the ids
//! (a token's piece is what its prefix adds; a prefix that ends inside a multi-byte character
//! adds nothing until the token completing it). A WordPiece vocabulary keeps its `##` strings.

mod common;

use std::path::PathBuf;

use common::{fixture, python, standard_plugin};
use serde_json::Value;
use smallrl::model::tokenizer::Tokenizer;
use smallrl::reward::{Prompt, sample_from_ids};

const TEXTS: [&str; 4] = [
    "The cat sat on the mat. It was very happy!",
    "Café au lait 😀 costs €3, naïve façade.",
    "  two spaces\nand a newline\ttab",
    "日本語のテキスト。",
];

fn tokenizer_dir() -> PathBuf {
    common::real_model_dir()
}

/// transformers' ids, full decoding and per-token pieces (from prefix decodings) of each text,
/// computed once for the binary's tests.
fn reference() -> &'static [Value] {
    static REFERENCE: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    REFERENCE.get_or_init(transformers_pieces)
}

fn transformers_pieces() -> Vec<Value> {
    let script = r#"
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
out = []
for text in json.loads(sys.argv[2]):
    ids = tok.encode(text, add_special_tokens=False)
    pieces, done = [], ""
    for i in range(len(ids)):
        prefix = tok.decode(ids[: i + 1], skip_special_tokens=True)
        if prefix.endswith("\ufffd") and i + 1 < len(ids):
            pieces.append("")
            continue
        pieces.append(prefix[len(done):])
        done = prefix
    out.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=True), "pieces": pieces})
print(json.dumps(out))
"#;
    let output = std::process::Command::new(python())
        .args(["-c", script])
        .arg(tokenizer_dir())
        .arg(serde_json::to_string(&TEXTS).unwrap())
        .output()
        .unwrap();
    assert!(output.status.success(), "transformers failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

#[test]
fn byte_level_tokens_are_their_pieces_of_the_decoded_completion() {
    let tokenizer = Tokenizer::from_file(&tokenizer_dir().join("tokenizer.json")).unwrap();
    let mut split_character = false;
    for (text, expected) in TEXTS.iter().zip(reference()) {
        let ids: Vec<u32> = expected["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(tokenizer.encode(text).unwrap(), ids, "{text:?}: ids as transformers encodes");
        let pieces = tokenizer.completion_pieces(&ids, &tokenizer.decode(&ids).unwrap()).unwrap();
        assert_eq!(pieces, strings(&expected["pieces"]), "{text:?}: each token's piece");
        let sample = sample_from_ids(&Prompt::plain("p"), ids.clone(), false, &tokenizer).unwrap();
        assert_eq!(sample.completion, expected["text"].as_str().unwrap(), "{text:?}: the completion as transformers decodes it");
        assert_eq!(sample.completion_tokens.concat(), sample.completion, "{text:?}: the pieces joined are the completion");
        split_character |= pieces.iter().any(String::is_empty);
        // A completion cut inside a character: the last token carries the replacement character.
        if let Some(cut) = (1..ids.len()).find(|&n| tokenizer.decode(&ids[..n]).unwrap().ends_with('\u{fffd}')) {
            let cut_pieces = tokenizer.completion_pieces(&ids[..cut], &tokenizer.decode(&ids[..cut]).unwrap()).unwrap();
            assert_eq!(cut_pieces.concat(), tokenizer.decode(&ids[..cut]).unwrap(), "{text:?} cut after {cut} tokens");
        }
    }
    assert!(split_character, "some text splits a character over tokens (the case the pieces must handle)");
}

/// A token-level plugin on a byte-level sample: `sentence_length` counts the tokens of each
/// sentence ended by a `.`, `?` or `!` token, here from transformers' pieces by hand.
#[test]
fn a_token_level_plugin_counts_byte_level_tokens() {
    let tokenizer = Tokenizer::from_file(&tokenizer_dir().join("tokenizer.json")).unwrap();
    let expected = &reference()[0];
    let pieces = strings(&expected["pieces"]);
    let mut lengths = Vec::new();
    let mut current = 0;
    for piece in &pieces {
        if matches!(piece.as_str(), "." | "?" | "!") {
            lengths.push(current);
            current = 0;
        } else {
            current += 1;
        }
    }
    assert_eq!(lengths.len(), 2, "two sentences in {pieces:?}");
    let target = lengths[0] as i64;
    let by_hand = lengths.iter().map(|&l| (1.0 - 0.2 * (target - l as i64).abs() as f64).max(0.0)).sum::<f64>() / lengths.len() as f64;
    let ids = tokenizer.encode(TEXTS[0]).unwrap();
    let sample = sample_from_ids(&Prompt::plain("p"), ids, true, &tokenizer).unwrap();
    let mut plugin = common::load(&standard_plugin("sentence_length"), &format!(r#"{{"target": {target}, "smooth": true}}"#));
    let scores = plugin.score(&[sample]).unwrap();
    assert!((scores[0] - by_hand).abs() < 1e-12, "sentence_length {} vs {by_hand} by hand (lengths {lengths:?})", scores[0]);
}

/// The SimpleStories WordPiece tokenizer keeps its vocabulary strings (`##` pieces).
#[test]
fn wordpiece_tokens_keep_their_vocabulary_strings() {
    let tokenizer = Tokenizer::from_file(&fixture("simplestories-4096.json")).unwrap();
    let ids = tokenizer.encode("the unhappiest cat").unwrap();
    assert_eq!(tokenizer.completion_pieces(&ids, &tokenizer.decode(&ids).unwrap()).unwrap(), tokenizer.token_strings(&ids).unwrap());
    assert!(tokenizer.token_strings(&ids).unwrap().iter().any(|t| t.starts_with("##")), "a word split into ## pieces");
}
