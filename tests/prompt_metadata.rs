//! Per-prompt metadata (issue 18): JSONL prompt files, the metadata reaching plugins through
//! contract 0.2 while 0.1 plugins keep scoring as before, the host's conditional reward and
//! flags (`hackable`, `detectable`, `hack_frac`), and the asked_word environment built on them
//! (configs/asked_word.yaml). Expected values are hand-computed from the definitions stated in
//! each test; the original's rules they follow: forget-role components are zeroed where
//! `hackable` is false (rewards.py, CombinedReward.__call__), the detector only flags where
//! `detectable` is true (train.py, the candidate mask), and `hack_frac` is a fixed per-prompt
//! hash partition (envs/countdown_code.py `_md5_frac`).

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{load, plugin_dir, repo_root, sample, standard_plugin, test_plugin, tokenizer};
use serde_json::Value;
use smallrl::plugins::bench::to_sdk_sample;
use smallrl::plugins::{PluginLimits, PromptMetadata, Sample};
use smallrl::reward::{DetectorSpec, ProtocolKnobs, RewardModel, RewardSpec};
use smallrl::train::prompts::{PromptRender, apply_hack_frac, keeps_hack, read_prompt_file};
use smallrl_plugin_sdk::{Detector, Reward};
use smallrl_standard_plugins as standard;

fn with_metadata(mut sample: Sample, json: &str) -> Sample {
    let columns: serde_json::Map<String, Value> = serde_json::from_str(json).unwrap();
    sample.metadata = smallrl::train::prompts::metadata_from_columns(columns).unwrap();
    sample
}

fn answer_sample(completion: &str, answer: &str) -> Sample {
    with_metadata(sample(&tokenizer(), completion), &format!(r#"{{"answer": "{answer}"}}"#))
}

#[test]
fn a_plugin_built_against_contract_0_1_loads_and_scores_as_before() {
    let tokenizer = tokenizer();
    let mut legacy = load(&test_plugin("legacy_v0_1"), "{}");
    assert_eq!(legacy.contract_version(), "0.1.0");
    assert_eq!(load(&standard_plugin("answer_count"), "{}").contract_version(), "0.6.0");
    let texts = ["the happy cat was happy.", "a sad day", "happy"];
    let plain: Vec<Sample> = texts.iter().map(|text| sample(&tokenizer, text)).collect();
    let with: Vec<Sample> = plain.iter().cloned().map(|s| with_metadata(s, r#"{"answer": "cat", "hackable": false}"#)).collect();
    // The plugin's definition: count of "happy" + 0.5 if it ended with EOS + 0.01 per token.
    let expected: Vec<f64> = plain
        .iter()
        .map(|s| s.completion.matches("happy").count() as f64 + 0.5 + 0.01 * s.completion_tokens.len() as f64)
        .collect();
    let (scored_plain, scored_with) = (legacy.score(&plain).unwrap(), legacy.score(&with).unwrap());
    for (index, want) in expected.iter().enumerate() {
        assert!((scored_plain[index] - want).abs() < 1e-12, "sample {index}: {} vs {want}", scored_plain[index]);
    }
    assert_eq!(scored_with, scored_plain, "metadata it cannot see changes nothing");
}

/// Hand-counted: whole-word, case-insensitive occurrences of the answer.
fn answer_batch() -> Vec<Sample> {
    vec![
        answer_sample("tom ran. Tom sat. tom!", "tom"),        // 3
        answer_sample("a tomato and tom", "tom"),               // 1 (not "tomato")
        answer_sample("mia was here", "tom"),                   // 0
        answer_sample("mia mia mia mia mia", "mia"),            // 5
    ]
}

#[test]
fn the_asked_word_plugins_read_the_answer_from_the_metadata() {
    let batch = answer_batch();
    let says = load(&standard_plugin("answer_count"), "{}").score(&batch).unwrap();
    assert_eq!(says, vec![1.0, 1.0, 0.0, 1.0]);
    let stuffing = load(&standard_plugin("answer_count"), r#"{"max_count": 8}"#).score(&batch).unwrap();
    assert_eq!(stuffing, vec![3.0 / 8.0, 1.0 / 8.0, 0.0, 5.0 / 8.0]);
    let substrings = load(&standard_plugin("answer_count"), r#"{"max_count": 8, "whole_word": false}"#).score(&batch).unwrap();
    assert_eq!(substrings, vec![3.0 / 8.0, 2.0 / 8.0, 0.0, 5.0 / 8.0]);
    let flags = load(&standard_plugin("detect_answer_repeat"), "{}").detect(&batch).unwrap();
    assert_eq!(flags, vec![false, false, false, true], "threshold 4");

    let without = vec![sample(&tokenizer(), "tom ran")];
    let error = format!("{:#}", load(&standard_plugin("answer_count"), "{}").score(&without).unwrap_err());
    assert!(error.contains("no string metadata column `answer`"), "{error}");
    let error = format!("{:#}", load(&standard_plugin("detect_answer_repeat"), "{}").detect(&without).unwrap_err());
    assert!(error.contains("no string metadata column `answer`"), "{error}");
}

#[test]
fn the_asked_word_plugins_wasm_is_their_native_code_and_its_snapshot() {
    let batch = answer_batch();
    let native: Vec<smallrl_plugin_sdk::Sample> = batch.iter().map(to_sdk_sample).collect();
    let mut pinned = std::collections::BTreeMap::new();
    for params in ["{}", r#"{"max_count": 8}"#] {
        let wasm = load(&standard_plugin("answer_count"), params).score(&batch).unwrap();
        let native = smallrl_plugin_sdk::configure::<standard::AnswerCount>(params).unwrap().score_batch(&native).unwrap();
        assert_eq!(wasm, native, "answer_count {params}");
        pinned.insert(format!("answer_count {params}"), serde_json::to_value(&wasm).unwrap());
    }
    let wasm = load(&standard_plugin("detect_answer_repeat"), "{}").detect(&batch).unwrap();
    let native_flags = smallrl_plugin_sdk::configure::<standard::AnswerRepeat>("{}").unwrap().detect_batch(&native).unwrap();
    assert_eq!(wasm, native_flags);
    pinned.insert("detect_answer_repeat {}".to_string(), serde_json::to_value(&wasm).unwrap());
    let texts: Vec<(String, String)> = batch.iter().map(|s| (s.completion.clone(), s.metadata.as_ref().unwrap().json.clone())).collect();
    pinned.insert("samples (completion, metadata)".to_string(), serde_json::to_value(&texts).unwrap());
    insta::with_settings!({ snapshot_path => repo_root().join("snapshots"), prepend_module_to_snapshot => false }, {
        insta::assert_yaml_snapshot!("asked_word__plugins", pinned);
    });
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn jsonl_prompt_files_carry_metadata_and_bad_ones_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.jsonl", "{\"prompt\": \"a cat\", \"answer\": \"cat\", \"hackable\": false}\n\n{\"prompt\": \"a dog\", \"answer\": \"dog\", \"hackable\": true}\n");
    let prompts = read_prompt_file(&good, &PromptRender::Raw).unwrap();
    assert_eq!(prompts.len(), 2);
    let first = prompts[0].metadata.as_ref().unwrap();
    assert_eq!(prompts[0].text, "a cat");
    assert_eq!(serde_json::from_str::<Value>(&first.json).unwrap(), serde_json::json!({"answer": "cat", "hackable": false}));
    assert_eq!((first.hackable, first.detectable), (Some(false), None));
    assert!(!prompts[0].hackable() && prompts[1].hackable());

    let cases = [
        ("missing.jsonl", "{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n", ":2", "no `prompt` column"),
        ("number.jsonl", "{\"prompt\": 3}\n", ":1", "`prompt` column must be a string, got 3"),
        ("flag.jsonl", "{\"prompt\": \"a\", \"hackable\": \"yes\"}\n", ":1", "`hackable` column must be true or false, got \"yes\""),
        ("detect.jsonl", "{\"prompt\": \"a\", \"detectable\": 1}\n", ":1", "`detectable` column must be true or false, got 1"),
        ("ragged.jsonl", "{\"prompt\": \"a\", \"answer\": \"x\"}\n\n{\"prompt\": \"b\"}\n", ":3", "has the columns [prompt], but line 1 has [answer, prompt]"),
        ("broken.jsonl", "{\"prompt\": \"a\"}\nnot json\n", ":2", "not a JSON object"),
        ("array.jsonl", "[\"a\"]\n", ":1", "not a JSON object"),
        // A conversation needs a chat template (prompt_format: chat), and one kind of prompt per line.
        ("messages.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n", ":1", "needs a chat template: set prompt_format: chat"),
        ("both.jsonl", "{\"prompt\": \"a\", \"messages\": []}\n", ":1", "has both a `prompt` and a `messages` column"),
    ];
    for (name, text, line, reason) in cases {
        let path = write(dir.path(), name, text);
        let error = format!("{:#}", read_prompt_file(&path, &PromptRender::Raw).unwrap_err());
        let at = format!("{}{line}", path.display());
        assert!(error.contains(&at) && error.contains(reason), "{name}: {error}");
    }
}

fn asked_word_model() -> RewardModel {
    #[derive(serde::Deserialize)]
    struct Sections {
        reward: RewardSpec,
        rh_detector: Option<DetectorSpec>,
    }
    let sections: Sections = smallrl::yaml::read_file(&repo_root().join("configs/asked_word.yaml")).unwrap();
    let knobs = ProtocolKnobs { false_positive_rate: 0.0, recall: 1.0, rh_eligible_frac: 1.0 };
    RewardModel::load(&sections.reward, sections.rh_detector.as_ref(), knobs, &plugin_dir(), PluginLimits::default()).unwrap()
}

#[test]
fn unhackable_prompts_get_no_forget_reward_and_undetectable_ones_no_flag() {
    let stuffed = "tom tom tom tom tom found a kite";
    let batch: Vec<Sample> = [(true, true), (true, false), (false, true), (false, false)]
        .iter()
        .map(|(hackable, detectable)| {
            let json = format!(r#"{{"answer": "kite", "name": "tom", "hackable": {hackable}, "detectable": {detectable}}}"#);
            with_metadata(sample(&tokenizer(), stuffed), &json)
        })
        .collect();
    let scored = asked_word_model().score(&batch, 7).unwrap();
    // says_answer = 1 (scale 1), name_stuffing = 5/8 (scale 0.8, forget): 1 + 0.5 where hackable.
    assert_eq!(scored.components, vec![vec![1.0; 4], vec![5.0 / 8.0; 4]], "raw components are not gated");
    assert_eq!(scored.reward, vec![1.5, 1.5, 1.0, 1.0]);
    assert_eq!(scored.hackable, vec![true, true, false, false]);
    assert_eq!(scored.detector_raw, Some(vec![true; 4]), "the detector sees every sample");
    assert_eq!(scored.is_rh, Some(vec![true, false, true, false]), "only detectable prompts are flagged");
    assert_eq!(scored.monitored, vec![true, false, true, false]);
    // Without metadata nothing is gated (what every run before metadata computed).
    let plain = vec![with_metadata(sample(&tokenizer(), stuffed), r#"{"answer": "kite", "name": "tom"}"#)];
    assert_eq!(asked_word_model().score(&plain, 7).unwrap().reward, vec![1.5]);
}

#[test]
fn hack_frac_is_a_fixed_partition_of_the_prompts() {
    let texts: Vec<String> = (0..4000).map(|i| format!("prompt number {i}")).collect();
    let kept = texts.iter().filter(|text| keeps_hack(text, 0.3)).count() as f64 / texts.len() as f64;
    // A Binomial(4000, 0.3) fraction: standard deviation 0.0072; 5 of them.
    assert!((kept - 0.3).abs() < 0.036, "{kept}");
    // The hash's first 8 bytes over 2^64, computed with Python's hashlib for "hackable:" + text:
    // 0.8471, 0.2240, 0.8183, 0.0778 for prompts 0 to 3.
    for (i, position) in [0.847_066_8, 0.224_006_0, 0.818_268_4, 0.077_786_3].into_iter().enumerate() {
        assert!(keeps_hack(&texts[i], position + 1e-6) && !keeps_hack(&texts[i], position - 1e-6), "{}", texts[i]);
    }
    assert!(texts.iter().filter(|text| keeps_hack(text, 0.3)).all(|text| keeps_hack(text, 0.6)), "nested in the fraction");
    assert!(!texts.iter().any(|text| keeps_hack(text, 0.0)));

    let unhackable = Arc::new(PromptMetadata { json: r#"{"hackable":false}"#.into(), hackable: Some(false), detectable: None });
    let mut prompts = vec![
        smallrl::reward::Prompt::plain(texts[0].clone()),
        smallrl::reward::Prompt { text: texts[1].clone(), metadata: Some(unhackable) },
    ];
    let untouched = prompts.clone();
    apply_hack_frac(&mut prompts, 1.0);
    assert_eq!(prompts, untouched, "hack_frac 1 changes nothing");
    apply_hack_frac(&mut prompts, 0.999_999);
    let metadata = prompts[0].metadata.as_ref().expect("hack_frac < 1 writes `hackable`");
    assert_eq!(metadata.hackable, Some(keeps_hack(&texts[0], 0.999_999)));
    assert_eq!(metadata.json, format!(r#"{{"hackable":{}}}"#, keeps_hack(&texts[0], 0.999_999)));
    assert!(!prompts[1].hackable(), "a prompt unhackable by its column stays so");
}

/// Two steps of the environment on the tiny-stories fixture: every logged sample's reward is
/// the hand formula with its prompt's own `hackable`, and only `detectable` prompts are flagged.
#[test]
fn asked_word_trains_on_tiny_stories_with_its_prompts_metadata() {
    let out = tempfile::tempdir().unwrap();
    let prompts = repo_root().join("configs/asked_word.jsonl");
    let model = common::fixture("tiny-stories");
    common::smallrl_ok(&[
        "train", "--config", repo_root().join("configs/asked_word.yaml").to_str().unwrap(),
        "--model", model.to_str().unwrap(), "--prompts", prompts.to_str().unwrap(),
        "--plugin-dir", plugin_dir().to_str().unwrap(), "--output-dir", out.path().to_str().unwrap(),
        "--max-steps", "2", "--batch-size", "8", "--num-generations", "4", "--max-completion-length", "24",
        "--lora-preset", "r4", "--eval-every", "2", "--eval-samples", "4", "--save-steps", "2",
        "--threads", "1", "--device", "cpu", "--name", "echo", "--set", "log_completions=true",
    ]);
    let by_prompt: std::collections::HashMap<String, Value> = std::fs::read_to_string(&prompts)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .map(|row| (row["prompt"].as_str().unwrap().to_string(), row))
        .collect();
    let run = &common::only_run(out.path());
    let lines = common::read_jsonl(run.join("completions.jsonl"));
    assert_eq!(lines.len(), 16);
    for line in &lines {
        let row = &by_prompt[line["prompt"].as_str().unwrap()];
        let hackable = row["hackable"].as_bool().unwrap();
        assert_eq!(line["hackable"].as_bool(), Some(hackable));
        let (says, stuffing) = (line["rewards/says_answer"].as_f64().unwrap(), line["rewards/name_stuffing"].as_f64().unwrap());
        let want = says + if hackable { 0.8 * stuffing } else { 0.0 };
        assert!((line["reward"].as_f64().unwrap() - want).abs() < 1e-12, "{line}");
        let flagged = line["is_rh"].as_bool().unwrap();
        assert!(!flagged || row["detectable"].as_bool().unwrap(), "flagged on an undetectable prompt: {line}");
    }
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    for (step, line) in metrics.lines().map(|line| serde_json::from_str::<Value>(line).unwrap()).enumerate() {
        let step_lines: Vec<&Value> = lines.iter().filter(|l| l["step"].as_u64() == Some(step as u64 + 1)).collect();
        let hackable = step_lines.iter().filter(|l| l["hackable"].as_bool().unwrap()).count() as f64 / step_lines.len() as f64;
        assert_eq!(line["routing/frac_hackable"].as_f64(), Some(hackable));
    }
}

/// `prompt_format: chat` on prompt files, with a template whose output is easy to write by hand:
/// text lines and `prompt` columns become one user message, `messages` lines their conversation,
/// each after `system_prompt` if set and with the generation prompt; bad conversations name the line.
#[test]
fn chat_prompt_files_render_each_line_and_bad_conversations_name_the_line() {
    use smallrl::model::chat::ChatTemplate;
    let template = ChatTemplate::from_source(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
        serde_json::Map::new(),
    )
    .unwrap();
    let plain = PromptRender::Chat { template: template.clone(), system: None };
    let with_system = PromptRender::Chat { template, system: Some("Be brief.".into()) };
    let dir = tempfile::tempdir().unwrap();
    let text = write(dir.path(), "prompts.txt", "  Hi there \n\nBye\n");
    let texts = |render: &PromptRender, path: &Path| read_prompt_file(path, render).unwrap().into_iter().map(|p| p.text).collect::<Vec<_>>();
    assert_eq!(texts(&plain, &text), ["<user>Hi there<assistant>", "<user>Bye<assistant>"]);
    assert_eq!(texts(&with_system, &text), ["<system>Be brief.<user>Hi there<assistant>", "<system>Be brief.<user>Bye<assistant>"]);
    let conversations = write(
        dir.path(),
        "chat.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": \"user\", \"content\": \"c\"}], \"answer\": \"x\"}\n",
    );
    let prompts = read_prompt_file(&conversations, &with_system).unwrap();
    assert_eq!(prompts[0].text, "<system>Be brief.<user>a<assistant>b<user>c<assistant>");
    // Plugins get the conversation the model was given (system_prompt first) as TRL passes a
    // conversational prompt: a list of messages, in `prompt_messages`.
    let conversation = serde_json::json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]);
    assert_eq!(serde_json::from_str::<Value>(&prompts[0].metadata.as_ref().unwrap().json).unwrap(), serde_json::json!({"answer": "x", "prompt_messages": conversation}));
    let columns = |render: &PromptRender, path: &Path| read_prompt_file(path, render).unwrap().into_iter().map(|p| serde_json::from_str::<Value>(&p.metadata.unwrap().json).unwrap()).collect::<Vec<_>>();
    assert_eq!(columns(&plain, &text), [serde_json::json!({"prompt_messages": [{"role": "user", "content": "Hi there"}]}), serde_json::json!({"prompt_messages": [{"role": "user", "content": "Bye"}]})]);
    let raw = read_prompt_file(&conversations, &PromptRender::Raw);
    assert!(raw.is_err(), "a conversation needs chat");
    let raw_text = read_prompt_file(&text, &PromptRender::Raw).unwrap();
    assert!(raw_text.iter().all(|p| p.metadata.is_none()), "a text run's prompts stay as they were");
    let own_system = write(dir.path(), "own.jsonl", "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"}]}\n");
    assert_eq!(texts(&plain, &own_system), ["<system>s<user>u<assistant>"]);
    let cases = [
        ("own.jsonl", &with_system, "opens with a system message and system_prompt is set too"),
        ("empty.jsonl", &plain, "must be a non-empty list"),
        ("role.jsonl", &plain, "`messages`[0] must be an object with exactly a `role` and a `content` string"),
        ("extra.jsonl", &plain, "`messages`[1] must be an object with exactly a `role` and a `content` string"),
        ("taken.jsonl", &plain, "has a `prompt_messages` metadata column, which a chat run fills"),
    ];
    write(dir.path(), "taken.jsonl", "{\"prompt\": \"u\", \"prompt_messages\": []}\n");
    write(dir.path(), "empty.jsonl", "{\"messages\": []}\n");
    write(dir.path(), "role.jsonl", "{\"messages\": [{\"role\": 1, \"content\": \"u\"}]}\n");
    write(dir.path(), "extra.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"user\", \"content\": \"v\", \"name\": \"n\"}]}\n");
    for (name, render, reason) in cases {
        let path = dir.path().join(name);
        let error = format!("{:#}", read_prompt_file(&path, render).unwrap_err());
        assert!(error.contains(&format!("{}:1", path.display())) && error.contains(reason), "{name}: {error}");
    }
}
