//! Prompts from the SimpleStories dataset through the HF cache (offline), on a miniature
//! dataset written by `scripts/reference/simplestories_parquet.py`, whose expected prompts are
//! computed with HF `tokenizers` independently of smallrl.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{fixture, python, repo_root, standard_plugin};

fn make_dataset(home: &Path) -> serde_json::Value {
    let status = std::process::Command::new(python())
        .current_dir(repo_root())
        .args(["scripts/reference/simplestories_parquet.py", home.to_str().unwrap(), fixture("simplestories-4096.json").to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success(), "simplestories_parquet.py failed");
    serde_json::from_str(&std::fs::read_to_string(home.join("expected.json")).unwrap()).unwrap()
}

#[test]
fn training_uses_dataset_prompts_from_the_hf_cache() {
    let home = tempfile::tempdir().unwrap();
    let expected = make_dataset(home.path());
    let expected_train: BTreeSet<String> = expected["train"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    let expected_test: BTreeSet<String> = expected["test"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    let out = tempfile::tempdir().unwrap();
    let smallrl = || {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"));
        command.env("HF_HOME", home.path()).env("HF_HUB_OFFLINE", "1");
        command
    };
    let run = |num_prompts: usize| {
        smallrl()
            .args(["train", "--model", fixture("tiny-stories").to_str().unwrap()])
            .args(["--reward-plugin", standard_plugin("happy").to_str().unwrap()])
            .args(["--max-steps", "1", "--batch-size", "4", "--num-generations", "2", "--max-completion-length", "8"])
            .args(["--eval-samples", "3", "--threads", "1", "--device", "cpu"])
            .args(["--set", &format!("num_prompts={num_prompts}")])
            .args(["--output-dir", out.path().join(num_prompts.to_string()).to_str().unwrap()])
            .output()
            .unwrap()
    };
    let output = run(50);
    assert!(output.status.success(), "train failed: {}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("| 50 prompts, 3 eval prompts |"), "{stdout}");
    let sample = stdout.lines().find_map(|l| l.strip_prefix("[Sample @ step 1] ")).unwrap();
    let prompt = sample.split(" ||| ").next().unwrap();
    assert!(expected_train.contains(prompt), "{prompt:?} is not a first-8-token prompt of the train split");
    // Evaluation prompts come from the test split.
    let checkpoint = std::fs::read_dir(out.path().join("50")).unwrap().next().unwrap().unwrap().path().join("checkpoint-1");
    let eval = smallrl().args(["eval", checkpoint.to_str().unwrap(), "--n-samples", "3", "--json", "--threads", "1"]).output().unwrap();
    assert!(eval.status.success(), "eval failed: {}", String::from_utf8_lossy(&eval.stderr));
    let report: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    for sample in report["report"]["modes"][0]["samples"].as_array().unwrap() {
        let prompt = sample[0].as_str().unwrap();
        assert!(expected_test.contains(prompt), "evaluation prompt {prompt:?} is not from the test split");
    }

    // Asking for more distinct prompts than the split has is an error, not a silent shortfall.
    let too_many = run(expected_train.len() + 1);
    assert!(!too_many.status.success());
    let error = String::from_utf8_lossy(&too_many.stderr);
    assert!(error.contains(&format!("only {} distinct prompts", expected_train.len())), "{error}");
}

#[test]
fn dataset_prompts_are_the_first_tokens_of_every_story() {
    let home = tempfile::tempdir().unwrap();
    let expected = make_dataset(home.path());
    let tokenizer = smallrl::model::Tokenizer::from_file(&fixture("simplestories-4096.json")).unwrap();
    let data = home.path().join("hub/datasets--SimpleStories--SimpleStories/snapshots/0123456789abcdef0123456789abcdef01234567/data");
    for split in ["train", "test"] {
        let want: BTreeSet<String> = expected[split].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
        let openings = smallrl::dataset::read_story_openings(&[data.join(format!("{split}-00000-of-00001.parquet"))], 8).unwrap();
        let got = smallrl::dataset::prompts_from_stories(&openings, &tokenizer, 8, want.len(), want.len(), 7).unwrap();
        assert_eq!(got.len(), want.len(), "{split}: duplicates must be removed");
        assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want, "{split}: prompts differ from HF tokenizers'");
    }
}
