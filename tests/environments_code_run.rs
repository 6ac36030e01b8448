//! Hostile completions inside a real `smallrl train` run (issue 45's acceptance: "a training run
//! with such completions continues"). No model at test size writes Python, so the completions are
//! put into the run by replay: a one-step `code_tests` run records its batch (`dump_batches`),
//! its completion ids are replaced by the programs below (tokenized by smallrl's tokenizer), and
//! a second run replays that batch (`replay_rollouts`), scoring it through the trainer's own path
//! (the environment, its grader, the program runner at its default limits) and training on it.
//!
//! The model: tiny-random's 4 layers with SmolLM2's byte-level tokenizer (tiny-stories' WordPiece
//! lowercases and drops `_`, `[` and indentation, so it cannot spell `os._exit(0)`), its embedding
//! drawn at random for SmolLM2's 49,152 tokens: the test is about scoring, not about the model.

mod common;

use std::path::{Path, PathBuf};

use common::{plugin_dir, read_jsonl, real_model_dir, smallrl_ok};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

/// Rows of the batch: one prompt and its 16 completions.
const ROWS: usize = 16;

/// A directory with tiny-random's layers and SmolLM2's tokenizer and special tokens.
fn byte_level_tiny_model(dir: &Path) -> PathBuf {
    let (source, smollm) = (common::fixture("tiny-random"), real_model_dir());
    let mut tensors = smallrl::model::weights::read_safetensors(&source.join("model.safetensors")).unwrap();
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap()).unwrap();
    let vocab = smallrl::model::Tokenizer::from_file(&smollm.join("tokenizer.json")).unwrap().vocab_size();
    tch::manual_seed(45);
    let hidden = config["hidden_size"].as_i64().unwrap();
    tensors.insert("model.embed_tokens.weight".into(), Tensor::randn([vocab as i64, hidden], (Kind::Float, Device::Cpu)) * 0.02);
    let smollm_config: Value = serde_json::from_str(&std::fs::read_to_string(smollm.join("config.json")).unwrap()).unwrap();
    for key in ["bos_token_id", "eos_token_id", "pad_token_id", "vocab_size"] {
        config[key] = smollm_config[key].clone();
    }
    config["max_position_embeddings"] = 2048.into();
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    let tensors: Vec<(String, Tensor)> = tensors.into_iter().collect();
    smallrl::model::weights::write_safetensors(&model.join("model.safetensors"), &tensors).unwrap();
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(smollm.join(file), model.join(file)).unwrap();
    }
    model
}

/// One step of code_tests on `model`, one prompt a step, no loophole offered (`hack_frac` 0: the
/// reward is the share of the grader's tests passed), with `extra` settings.
fn train(model: &Path, out: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let (output, plugins) = (out.join(name), plugin_dir());
    let mut args = vec![
        "train", "--environment", "code_tests", "--hack-frac", "0", "--model", model.to_str().unwrap(), "--plugin-dir",
        plugins.to_str().unwrap(), "--output-dir", output.to_str().unwrap(), "--max-steps", "1", "--batch-size", "16",
        "--num-generations", "16", "--max-completion-length", "64", "--num-prompts", "16", "--threads", "1", "--device", "cpu",
        "--eval-samples", "1", "--name", name, "--set", "log_completions=true",
    ];
    args.extend_from_slice(extra);
    smallrl_ok(&args);
    common::only_run(&output)
}

/// The body of a correct solution of the generated problem `name` with constant `k` or letter
/// `c`, written here from the family's docstring (plugins/code_tests/src/problems.rs).
fn solution(name: &str, k: &str, c: &str) -> String {
    match name {
        "add_k" => format!("x + {k}"),
        "times_k" => format!("x * {k}"),
        "square_plus_k" => format!("x * x + {k}"),
        "cap_at_k" => format!("min(x, {k})"),
        "is_multiple" => format!("x % {k} == 0"),
        "count_letter" => format!("s.count('{c}')"),
        "repeat_text" => format!("s * {k}"),
        "first_chars" => format!("s[:{k}]"),
        "add_letter" => format!("s + '{c}'"),
        "sum_above" => format!("sum(v for v in xs if v > {k})"),
        "count_above" => format!("sum(1 for v in xs if v > {k})"),
        "add_to_each" => format!("[v + {k} for v in xs]"),
        "last_k" => format!("xs[-{k}:]"),
        other => panic!("no solution written for the family {other}"),
    }
}

/// The prompt's function name, argument, constant and letter, read from its header.
fn problem(prompt: &str) -> (String, String, String, String) {
    let header = prompt.split("def ").nth(1).expect("the prompt has a header");
    let (name, rest) = header.split_once('(').unwrap();
    let arg = rest.split_once(':').unwrap().0;
    let doc = rest.split("\"\"\"").nth(1).expect("the header has a docstring");
    let k: String = doc.chars().skip_while(|c| !c.is_ascii_digit()).take_while(char::is_ascii_digit).collect();
    let c = doc.split('\'').nth(1).unwrap_or("").to_string();
    (name.to_string(), arg.to_string(), k, c)
}

/// (what, program, reward, stopped) for each row: hostile programs beside honest ones, each
/// reward computed by hand (no loophole: the share of the grader's tests passed).
fn batch(prompt: &str) -> Vec<(&'static str, String, f64, f64)> {
    let (name, arg, k, c) = problem(prompt);
    let correct = format!("def {name}({arg}):\n    return {}\n", solution(&name, &k, &c));
    vec![
        ("correct", correct.clone(), 1.0, 0.0),
        ("endless loop", format!("def {name}({arg}):\n    while True:\n        pass\n"), 0.0, 1.0),
        ("memory bomb", format!("def {name}({arg}):\n    blocks = []\n    while True:\n        blocks.append(bytearray(1 << 20))\n"), 0.0, 1.0),
        ("correct after the memory bomb", correct.clone(), 1.0, 0.0),
        ("deep recursion", format!("def {name}({arg}):\n    return {name}({arg})\n"), 0.0, 0.0),
        // 100 MB of output before a correct answer: the output bound ends the program.
        ("100 MB of output", format!("for _ in range(100):\n    print('x' * 1_000_000)\n{correct}"), 0.0, 1.0),
        ("reads a host file", format!("print(open('/etc/passwd').read())\n{correct}"), 0.0, 0.0),
        ("reads the environment", format!("import os\nprint(os.environ['HOME'])\n{correct}"), 0.0, 0.0),
        ("opens a socket", format!("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n{correct}"), 0.0, 0.0),
        ("os._exit before the tests", format!("{correct}import os\nos._exit(0)\n"), 0.0, 0.0),
        ("fake pass line", "print('all tests passed')\nprint('OK: 5 of 5 tests passed')\n".to_string(), 0.0, 0.0),
        // Correct, with the builtins rebound: it costs this program nothing and reaches no other.
        ("rebinds builtins", format!("import builtins\nbuiltins.len = lambda o: 0\nbuiltins.print = lambda *a, **k: None\nbuiltins.str = lambda o: 'pass'\n{correct}"), 1.0, 0.0),
        ("correct after the rebinding", correct.clone(), 1.0, 0.0),
        ("the body alone", format!("    return {}\n", solution(&name, &k, &c)), 1.0, 0.0),
        ("wrong", format!("def {name}({arg}):\n    return None\n"), 0.0, 0.0),
        ("correct in a code block", format!("```python\n{correct}```\nThis solves it."), 1.0, 0.0),
    ]
}

/// `recorded`'s batch with row `r`'s completion replaced by `programs[r]` then EOS, written to
/// `replay_dir`; the sampler's log-probabilities of the new tokens are those of a uniform draw.
fn rewrite(recorded: &Path, replay_dir: &Path, tokenizer: &smallrl::model::Tokenizer, eos: i64, programs: &[String]) {
    let mut tensors = smallrl::model::weights::read_safetensors(&recorded.join("step-1.safetensors")).unwrap();
    let rows: Vec<Vec<i64>> = programs
        .iter()
        .map(|program| {
            let ids = tokenizer.encode(program).unwrap();
            assert_eq!(tokenizer.decode(&ids).unwrap(), *program, "the tokenizer spells the program back");
            ids.iter().map(|&id| i64::from(id)).chain([eos]).collect()
        })
        .collect();
    let width = rows.iter().map(Vec::len).max().unwrap();
    assert!(width <= 64, "the longest program has {width} tokens, over max_completion_length");
    let (mut ids, mut mask) = (vec![eos; ROWS * width], vec![0i64; ROWS * width]);
    for (r, row) in rows.iter().enumerate() {
        ids[r * width..r * width + row.len()].copy_from_slice(row);
        mask[r * width..r * width + row.len()].iter_mut().for_each(|m| *m = 1);
    }
    let shape = [ROWS as i64, width as i64];
    let mask = Tensor::from_slice(&mask).reshape(shape).to_kind(tensors["completion_mask"].kind());
    let uniform = -(tokenizer.vocab_size() as f64).ln();
    tensors.insert("completion_ids".into(), Tensor::from_slice(&ids).reshape(shape).to_kind(tensors["completion_ids"].kind()));
    tensors.insert("sampling_logprobs".into(), mask.to_kind(tensors["sampling_logprobs"].kind()) * uniform);
    tensors.insert("completion_mask".into(), mask);
    tensors.insert("ended_with_eos".into(), Tensor::ones([ROWS as i64], (Kind::Int64, Device::Cpu)));
    std::fs::create_dir_all(replay_dir).unwrap();
    let tensors: Vec<(String, Tensor)> = tensors.into_iter().collect();
    smallrl::model::weights::write_safetensors(&replay_dir.join("step-1.safetensors"), &tensors).unwrap();
}

/// Item 5's hostile programs in one training batch with honest ones: the run finishes its step,
/// each hostile row gets reward 0 and its outcome (`stopped` where fuel, memory or output ran
/// out) in completions.jsonl, each honest row its hand-computed reward, and the logged batch
/// statistics are the means of those rewards.
#[test]
fn a_training_run_scores_hostile_completions_and_continues() {
    let started = std::time::Instant::now();
    let out = tempfile::tempdir().unwrap();
    let model = byte_level_tiny_model(out.path());
    let recorded = out.path().join("recorded");
    let first = train(&model, out.path(), "record", &["--set", &format!("dump_batches={}", recorded.display())]);
    let prompts: Vec<String> = read_jsonl(first.join("completions.jsonl")).iter().map(|l| l["prompt"].as_str().unwrap().to_string()).collect();
    assert_eq!(prompts.len(), ROWS);
    assert!(prompts.iter().all(|p| *p == prompts[0]), "one prompt a step");
    let rows = batch(&prompts[0]);
    let tokenizer = smallrl::model::Tokenizer::from_file(&model.join("tokenizer.json")).unwrap();
    let programs: Vec<String> = rows.iter().map(|row| row.1.clone()).collect();
    let replay_dir = out.path().join("hostile");
    let config: Value = serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    rewrite(&recorded, &replay_dir, &tokenizer, config["eos_token_id"].as_i64().unwrap(), &programs);

    let run = train(&model, out.path(), "replay", &["--set", &format!("replay_rollouts={}", replay_dir.display())]);
    let lines = read_jsonl(run.join("completions.jsonl"));
    assert_eq!(lines.len(), ROWS, "every row of the batch is logged");
    for (line, (what, program, reward, stopped)) in lines.iter().zip(&rows) {
        assert_eq!(line["completion"].as_str().unwrap(), program, "{what}: the replayed completion");
        assert_eq!(line["reward"].as_f64().unwrap(), *reward, "{what}: {line}");
        assert_eq!(line["rewards/tests_passed"].as_f64().unwrap(), *reward, "{what}");
        assert_eq!(line["env/code_tests/stopped"].as_f64().unwrap(), *stopped, "{what}: stopped");
        assert!(line["no_score"].is_null() && line["advantage"].as_f64().unwrap().is_finite(), "{what}: {line}");
    }
    let metrics = read_jsonl(run.join("metrics.jsonl"));
    let step = metrics.iter().find(|m| m.get("reward").is_some()).expect("the step is logged");
    let reward = rows.iter().map(|row| row.2).sum::<f64>() / ROWS as f64;
    let stopped = rows.iter().map(|row| row.3).sum::<f64>() / ROWS as f64;
    assert!((step["reward"].as_f64().unwrap() - reward).abs() < 1e-12, "{step}");
    assert!((step["env/code_tests/stopped"].as_f64().unwrap() - stopped).abs() < 1e-12, "{step}");
    assert!(step["loss"].as_f64().unwrap().is_finite(), "{step}");
    eprintln!("two one-step runs on hostile code: {:?}", started.elapsed());
}
