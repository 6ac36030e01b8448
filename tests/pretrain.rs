//! Pre-training (issue 7): the synthetic corpus (determinism, statistics), the trained
//! WordPiece tokenizer against the real SimpleStories tokenizer, random initialisation, packed
//! batches against unpacked documents, and a short `smallrl pretrain` run whose held-out loss
//! falls and whose model directory transformers loads with the same logits.

mod common;

use std::path::Path;
use std::process::Command;

use common::{fixture, max_abs_diff, one_thread, python, repo_root};
use smallrl::corpus;
use smallrl::model::{self, LlamaConfig};
use smallrl::pretrain::{data, init};
use tch::{Device, Kind, Tensor};
use tokenizers::{NormalizedString, Normalizer, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer};

// ---------------------------------------------------------------- corpus

#[test]
fn corpus_is_deterministic_for_a_seed() {
    let a = corpus::generate(300, 7);
    assert_eq!(a, corpus::generate(300, 7), "same seed, same stories");
    assert_eq!(a[..100], corpus::generate(100, 7)[..], "a shorter corpus is a prefix of a longer one");
    let b = corpus::generate(300, 8);
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert!(same < 3, "seeds 7 and 8 share {same} of 300 stories");
}

/// Sentences end with `.`, `!` or `?` (optionally closing a quote) before a space or the end.
fn sentences(story: &str) -> Vec<&str> {
    let bytes = story.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    for i in 0..bytes.len() {
        let at_end_of_sentence = matches!(bytes[i], b'.' | b'!' | b'?' | b'"')
            && (i + 1 == bytes.len() || bytes[i + 1] == b' ')
            && (bytes[i] != b'"' || (i > 0 && matches!(bytes[i - 1], b'.' | b'!' | b'?')));
        if at_end_of_sentence {
            out.push(story[start..=i].trim());
            start = i + 1;
        }
    }
    assert!(story[start..].trim().is_empty(), "text after the last sentence: {story:?}");
    out
}

/// Words: whitespace-separated pieces with at least one letter.
fn word_count(sentence: &str) -> usize {
    sentence.split_whitespace().filter(|w| w.chars().any(char::is_alphabetic)).count()
}

fn happy_count(story: &str) -> usize {
    story.split(|c: char| !c.is_alphabetic()).filter(|w| *w == "happy").count()
}

#[test]
fn corpus_statistics_match_the_specification() {
    let stories = corpus::generate(3000, 2024);
    let mut happy_stories = 0;
    for story in &stories {
        assert!(!story.contains('\n') && !story.chars().any(char::is_uppercase), "one lowercase line: {story:?}");
        let sentences = sentences(story);
        assert!((4..=8).contains(&sentences.len()), "{} sentences: {story:?}", sentences.len());
        for sentence in sentences {
            let words = word_count(sentence);
            assert!((4..=15).contains(&words), "{words} words in {sentence:?}");
        }
        let words: Vec<&str> = story.split_whitespace().collect();
        for pair in words.windows(2) {
            let vowel_after_a = pair[0] == "a" && pair[1].starts_with(['a', 'e', 'i', 'o', 'u']);
            assert!(!vowel_after_a, "\"a {}\" in {story:?}", pair[1]);
        }
        match happy_count(story) {
            0 => assert!(!story.contains("happ"), "a story without \"happy\" still has a form of it: {story:?}"),
            1 | 2 => happy_stories += 1,
            n => panic!("{n} times \"happy\" in {story:?}"),
        }
    }
    // Binomial(3000, 1/3): standard deviation 0.0086; 4 of them is 0.035.
    let fraction = happy_stories as f64 / stories.len() as f64;
    assert!((fraction - 1.0 / 3.0).abs() < 0.035, "happy in {fraction:.3} of the stories");
    let distinct: std::collections::HashSet<_> = stories.iter().collect();
    assert!(distinct.len() as f64 > 0.99 * stories.len() as f64, "only {} distinct stories of 3000", distinct.len());
}

// ---------------------------------------------------------------- tokenizer

fn trained_tokenizer(dir: &Path) -> (Tokenizer, smallrl::model::wordpiece::Trained) {
    let trained = smallrl::model::wordpiece::train(&corpus::generate(2000, 3), 4096).unwrap();
    let path = dir.join("tokenizer.json");
    trained.save(&path).unwrap();
    (Tokenizer::from_file(&path).unwrap(), trained)
}

fn simplestories() -> Tokenizer {
    Tokenizer::from_file(fixture("simplestories-4096.json")).unwrap()
}

#[test]
fn trained_tokenizer_has_the_simplestories_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    trained_tokenizer(dir.path());
    let ours: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("tokenizer.json")).unwrap()).unwrap();
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("simplestories-4096.json")).unwrap()).unwrap();
    for section in ["normalizer", "pre_tokenizer", "post_processor", "decoder", "added_tokens"] {
        assert_eq!(ours[section], reference[section], "section {section} differs from simplestories-4096.json");
    }
    for key in ["type", "unk_token", "continuing_subword_prefix", "max_input_chars_per_word"] {
        assert_eq!(ours["model"][key], reference["model"][key], "model.{key} differs");
    }
}

/// The normalised, pre-tokenised words of `text`.
fn words(tokenizer: &Tokenizer, text: &str) -> Vec<String> {
    let mut normalized = NormalizedString::from(text);
    tokenizer.get_normalizer().unwrap().normalize(&mut normalized).unwrap();
    let mut pre = PreTokenizedString::from(normalized.get());
    tokenizer.get_pre_tokenizer().unwrap().pre_tokenize(&mut pre).unwrap();
    pre.get_splits(OffsetReferential::Original, OffsetType::Byte).into_iter().map(|(s, _, _)| s.to_string()).collect()
}

const SAMPLES: &[&str] = &[
    "Once upon a time, Tom found 12 shiny stones!",
    "The CAT said: \"Hi... it's 3:45 now?\" and ran-away.",
    "``Quoted'' words & (brackets) cost $10.50; ok",
    "unbelievably Zoë's café",
];

#[test]
fn trained_tokenizer_behaves_like_the_simplestories_one() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, trained) = trained_tokenizer(dir.path());
    let reference = simplestories();
    assert!(trained.vocab_size < 4096 && trained.size_note().contains("fewer than the 4096"), "{}", trained.size_note());
    for tokenizer in [&ours, &reference] {
        assert_eq!(tokenizer.token_to_id("[UNK]"), Some(0));
        assert_eq!(tokenizer.token_to_id("[EOS]"), Some(1));
        assert_eq!(tokenizer.get_vocab_size(true), tokenizer.get_vocab(true).len());
    }
    for text in SAMPLES {
        assert_eq!(words(&ours, text), words(&reference, text), "pre-tokenisation of {text:?}");
        for tokenizer in [&ours, &reference] {
            let plain = tokenizer.encode(*text, false).unwrap().get_ids().to_vec();
            let special = tokenizer.encode(*text, true).unwrap().get_ids().to_vec();
            assert_eq!(special[..special.len() - 1], plain[..], "with special tokens: the same ids, no BOS");
            assert_eq!(special.last(), Some(&1), "[EOS] appended with special tokens");
            assert_ne!(plain.last(), Some(&1), "no [EOS] without special tokens");
        }
    }
    assert_eq!(words(&ours, "12 apples"), ["1", "2", "apples"], "single digits");
}

#[test]
fn trained_tokenizer_decodes_word_pieces_into_words() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, _) = trained_tokenizer(dir.path());
    let text = "the unbelievably grumpy walrus was very happy.";
    let encoding = ours.encode(text, true).unwrap();
    assert!(encoding.get_tokens().iter().any(|t| t.starts_with("##")), "words outside the corpus are split: {:?}", encoding.get_tokens());
    assert!(!encoding.get_ids().contains(&0), "lowercase ASCII never becomes [UNK]");
    assert_eq!(ours.decode(encoding.get_ids(), true).unwrap(), text);
    let reference = simplestories();
    assert_eq!(reference.decode(reference.encode(text, true).unwrap().get_ids(), true).unwrap(), text);
}

// ---------------------------------------------------------------- model initialisation and packing

#[test]
fn the_architecture_is_simplestories_1_25m() {
    let reference = LlamaConfig::from_file(&fixture("tiny-random/config.json")).unwrap();
    let ours = LlamaConfig::architecture("simplestories-1.25m", reference.vocab_size).unwrap();
    assert_eq!(ours, reference);
    one_thread();
    let model = init::random_model(ours, 0.02, 5, Device::Cpu).unwrap();
    let parameters: i64 = model.base_tensors().iter().map(|(_, t)| t.numel() as i64).sum();
    assert_eq!(parameters, 1_245_824, "the fixture README's parameter count");
    assert!(LlamaConfig::architecture("gpt-2", 100).is_err());
}

#[test]
fn random_initialisation_is_seeded_normal_with_unit_norms() {
    one_thread();
    let config = LlamaConfig::architecture("simplestories-1.25m", 500).unwrap();
    let a = init::random_model(config.clone(), 0.02, 11, Device::Cpu).unwrap();
    let b = init::random_model(config.clone(), 0.02, 11, Device::Cpu).unwrap();
    let c = init::random_model(config, 0.02, 12, Device::Cpu).unwrap();
    for ((name, x), ((_, y), (_, z))) in a.base_tensors().into_iter().zip(b.base_tensors().into_iter().zip(c.base_tensors())) {
        assert!(x.equal(y), "{name}: same seed, same values");
        if x.dim() == 1 {
            assert!(x.eq(1.0).all().int64_value(&[]) == 1, "{name}: RMSNorm weights start at 1");
        } else {
            assert!(!x.equal(z), "{name}: another seed, other values");
            let (mean, std) = (x.mean(Kind::Double).double_value(&[]), x.std(true).double_value(&[]));
            assert!(mean.abs() < 2e-3 && (std - 0.02).abs() < 1e-3, "{name}: mean {mean}, std {std}");
        }
    }
}

#[test]
fn packed_rows_compute_what_each_document_alone_computes() {
    one_thread();
    let config = LlamaConfig::architecture("simplestories-1.25m", 300).unwrap();
    let model = init::random_model(config, 0.02, 3, Device::Cpu).unwrap();
    let docs: Vec<Vec<i64>> = vec![vec![5, 6, 7, 1], vec![9, 10, 11, 12, 13, 1], vec![20, 21, 1]];
    let refs: Vec<&[i64]> = docs.iter().map(Vec::as_slice).collect();
    let rows = data::pack(&refs, 12);
    assert_eq!(rows.len(), 2, "4 + 6 tokens fit a row of 12, the third document starts the next");
    let batch = data::batch(&rows, 12, 1, Device::Cpu);
    let expected_targets: Vec<i64> = vec![6, 7, 1, -100, 10, 11, 12, 13, 1, -100, -100, -100];
    assert_eq!(Vec::<i64>::try_from(batch.targets.get(0)).unwrap(), expected_targets, "[EOS] is each document's last target");
    assert_eq!(batch.target_tokens, 3 + 5 + 2);
    let _guard = tch::no_grad_guard();
    let packed = model.logits(&model.forward_masked(&batch.input_ids, &batch.positions, &batch.mask, &[]));
    let mut offset = 0;
    for (row, doc) in [(0, &docs[0]), (0, &docs[1]), (1, &docs[2])] {
        let ids = Tensor::from_slice(doc).unsqueeze(0);
        let alone = model.logits(&model.forward(&ids, &ids.ones_like(), &[])).squeeze_dim(0);
        let start = if row == 0 { offset } else { 0 };
        let diff = max_abs_diff(&packed.get(row).narrow(0, start, doc.len() as i64), &alone);
        assert!(diff < 1e-5, "document of {} tokens differs by {diff} when packed", doc.len());
        offset += doc.len() as i64;
    }
}

// ---------------------------------------------------------------- smallrl pretrain

fn smallrl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_smallrl"))
}

fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    common::read_jsonl(dir.join("metrics.jsonl"))
}

/// Measured here (1 thread, 10-14 s): held-out loss 6.77 (ln 858, a uniform guess) -> 3.23 at
/// step 40 -> 2.16 at step 80; the test asks for a drop of at least 3 nats.
const SHORT_RUN: &[&str] = &[
    "pretrain",
    "--corpus", "synthetic", "--corpus-stories", "1500", "--heldout-docs", "100", "--max-steps", "80",
    "--batch-size", "8", "--warmup-steps", "10", "--eval-steps", "40", "--save-steps", "40", "--threads", "1", "--device", "cpu",
];

#[test]
fn a_short_pretrain_run_lowers_the_heldout_loss_and_exports_a_transformers_model() {
    let out = tempfile::tempdir().unwrap();
    let run_dir = out.path().join("run");
    let output = smallrl().args(SHORT_RUN).arg("--output-dir").arg(&run_dir).output().unwrap();
    assert!(output.status.success(), "pretrain failed: {}", String::from_utf8_lossy(&output.stderr));
    let lines = metrics(&run_dir);
    assert_eq!(lines.len(), 81, "one line for the start and one per step");
    let heldout: Vec<f64> = lines.iter().filter_map(|l| l["heldout_loss"].as_f64()).collect();
    assert_eq!(heldout.len(), 3, "held-out loss at steps 0, 40 and 80");
    let vocab = LlamaConfig::from_file(&run_dir.join("model/config.json")).unwrap().vocab_size;
    assert!((heldout[0] - (vocab as f64).ln()).abs() < 0.1, "a fresh model guesses uniformly: {} vs ln {vocab}", heldout[0]);
    assert!(heldout[2] < heldout[0] - 3.0, "held-out loss {} -> {}", heldout[0], heldout[2]);
    assert!(run_dir.join("checkpoint-40/optimizer.safetensors").exists() && run_dir.join("checkpoint-80/trainer_state.json").exists());
    check_transformers_logits(&run_dir.join("model"));
}

/// The exported directory in transformers (scripts/reference/hf_logits.py) against smallrl.
fn check_transformers_logits(model_dir: &Path) {
    one_thread();
    let loaded = model::load(model_dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
    let ids: Vec<i64> = loaded.tokenizer.encode("once upon a time, a girl named anna saw a tiny owl.").unwrap().into_iter().map(i64::from).collect();
    let scratch = tempfile::tempdir().unwrap();
    let ids_path = scratch.path().join("ids.json");
    std::fs::write(&ids_path, serde_json::to_string(&ids).unwrap()).unwrap();
    let out = scratch.path().join("logits.safetensors");
    let status = Command::new(python())
        .current_dir(repo_root())
        .args(["scripts/reference/hf_logits.py", model_dir.to_str().unwrap(), ids_path.to_str().unwrap(), out.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success(), "hf_logits.py failed");
    let reference = model::weights::read_safetensors(&out).unwrap().remove("logits").unwrap();
    let ids = Tensor::from_slice(&ids).unsqueeze(0);
    let ours = tch::no_grad(|| loaded.model.logits(&loaded.model.forward(&ids, &ids.ones_like(), &[]))).squeeze_dim(0);
    let diff = max_abs_diff(&ours, &reference);
    assert!(diff < 1e-4, "exported model: max |logits - transformers| = {diff}");
}

// ---------------------------------------------------------------- bad input

fn pretrain_error(args: &[&str]) -> String {
    let out = tempfile::tempdir().unwrap();
    let output = smallrl()
        .arg("pretrain")
        .args(args)
        .args(["--max-steps", "1", "--threads", "1", "--device", "cpu", "--output-dir"])
        .arg(out.path().join("run"))
        .output()
        .unwrap();
    assert!(!output.status.success(), "pretrain {args:?} should fail");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bad_inputs_are_errors_that_name_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("docs.jsonl");
    std::fs::write(&jsonl, "{\"text\": \"a story.\"}\n{\"story\": \"no text field\"}\n").unwrap();
    let error = pretrain_error(&["--data", jsonl.to_str().unwrap()]);
    assert!(error.contains("docs.jsonl line 2") && error.contains("\"text\""), "{error}");
    let missing = dir.path().join("missing.txt");
    let error = pretrain_error(&["--data", missing.to_str().unwrap()]);
    assert!(error.contains("missing.txt"), "{error}");
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, corpus::generate(50, 1).join("\n")).unwrap();
    let error = pretrain_error(&["--data", corpus.to_str().unwrap(), "--heldout-docs", "5", "--tokenizer", "/nonexistent/tokenizer.json"]);
    assert!(error.contains("/nonexistent/tokenizer.json"), "{error}");
    let error = pretrain_error(&["--data", corpus.to_str().unwrap(), "--heldout-docs", "5", "--init", "/nonexistent/model"]);
    assert!(error.contains("/nonexistent/model"), "{error}");
    let bad_config = dir.path().join("config.json");
    std::fs::write(&bad_config, "{\"vocab_size\": 900, \"rope_scaling\": {\"type\": \"linear\"}}").unwrap();
    let error = pretrain_error(&["--data", corpus.to_str().unwrap(), "--heldout-docs", "5", "--config", bad_config.to_str().unwrap()]);
    assert!(error.contains("config.json"), "{error}");
    let checkpoint = dir.path().join("checkpoint-3");
    std::fs::create_dir(&checkpoint).unwrap();
    std::fs::write(checkpoint.join("trainer_state.json"), "{not json").unwrap();
    let error = pretrain_error(&["--data", corpus.to_str().unwrap(), "--heldout-docs", "5", "--init", checkpoint.to_str().unwrap()]);
    assert!(error.contains("checkpoint-3/trainer_state.json"), "{error}");
    let error = pretrain_error(&["--corpus", "synthetic", "--adapter", "lora"]);
    assert!(error.contains("--init PATH"), "{error}");
    let error = pretrain_error(&["--data", corpus.to_str().unwrap(), "--heldout-docs", "50"]);
    assert!(error.contains("50 documents"), "{error}");
    // A non-empty output directory is never written into.
    let output = smallrl().args(["pretrain", "--corpus", "synthetic", "--output-dir"]).arg(dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("is not empty"), "{stderr}");
}

#[test]
fn dual_lora_pretraining_from_a_model_directory_lowers_its_heldout_loss() {
    let out = tempfile::tempdir().unwrap();
    let corpus_file = out.path().join("corpus.txt");
    std::fs::write(&corpus_file, corpus::generate(400, 9).join("\n")).unwrap();
    let run_dir = out.path().join("run");
    let output = smallrl()
        .args(["pretrain", "--init", fixture("tiny-stories").to_str().unwrap(), "--adapter", "dual-lora", "--lora-preset", "r4"])
        .args(["--data", corpus_file.to_str().unwrap(), "--heldout-docs", "50", "--max-steps", "20", "--batch-size", "4"])
        .args(["--warmup-steps", "2", "--eval-steps", "20", "--threads", "1", "--device", "cpu", "--output-dir"])
        .arg(&run_dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "pretrain failed: {}", String::from_utf8_lossy(&output.stderr));
    let heldout: Vec<f64> = metrics(&run_dir).iter().filter_map(|l| l["heldout_loss"].as_f64()).collect();
    assert!(heldout[1] < heldout[0] - 0.1, "held-out loss {} -> {}", heldout[0], heldout[1]);
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("checkpoint-20/trainer_state.json")).unwrap()).unwrap();
    assert_eq!(state["adapters"]["kind"], "dual-lora");
    assert!(run_dir.join("checkpoint-20/adapters.safetensors").exists());
    // The exported model has the adapters merged: its weights differ from the base's.
    let base = model::weights::read_safetensors(&fixture("tiny-stories/model.safetensors")).unwrap();
    let merged = model::weights::read_safetensors(&run_dir.join("model/model.safetensors")).unwrap();
    let name = "model.layers.0.self_attn.q_proj.weight";
    assert!(max_abs_diff(&base[name], &merged[name]) > 0.0, "{name} unchanged by the adapters");
}

#[test]
fn the_corpus_command_writes_stories_and_openings() {
    let dir = tempfile::tempdir().unwrap();
    let (stories, openings) = (dir.path().join("stories.txt"), dir.path().join("openings.txt"));
    for (path, extra) in [(&stories, vec![]), (&openings, vec!["--opening-words", "4"])] {
        let status = smallrl().args(["corpus", "--stories", "30", "--seed", "5", "--out"]).arg(path).args(extra).status().unwrap();
        assert!(status.success());
    }
    let expected = corpus::generate(30, 5);
    assert_eq!(std::fs::read_to_string(&stories).unwrap().lines().collect::<Vec<_>>(), expected);
    for (opening, story) in std::fs::read_to_string(&openings).unwrap().lines().zip(&expected) {
        assert_eq!(opening.split_whitespace().count(), 4);
        assert!(story.starts_with(opening), "{opening:?} does not open {story:?}");
    }
}
