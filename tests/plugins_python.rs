//! Plugins written in Python (issue 34): built by `smallrl plugin build` with componentize-py,
//! run in the same sandbox as Rust plugins with a capability-free, deterministic WASI.
//!
//! - The Python ports in plugins/python score, flag and generate exactly as the Rust plugins on
//!   the test texts, and train to the same metrics.jsonl (timings aside).
//! - Hostile Python fails with a clear error naming the file and the cause, within the limits.
//! - `random` and `time` are deterministic: two runs and a resumed run agree bit for bit.
//! - A TRL reward function builds as it is; `plugin new --python` writes modules whose own
//!   tests pass and which build.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{built_python as built, load, metrics_without_timings, read_jsonl, repo_root, smallrl, smallrl_ok, standard_plugin, train};
use serde_json::Value;
use smallrl::plugins::{EnvSplit, Plugin, PluginLimits};
use smallrl::reward::Sample;

/// Test texts for the rewards: a tokenizer's pieces (sentence_length counts `##` pieces and
/// punctuation tokens), "happy" in every case and glued into other words, no sentence at all.
fn texts() -> Vec<Sample> {
    let tokenizer = common::tokenizer();
    [
        "",
        "the cat sat on the mat.",
        "once upon a time there was a happy little dog who liked to run. it was very happy!",
        "Happy? HAPPY! so unhappy. happyhappy happiness",
        "a b c d e f g h i j. a b c d e f g h i. one two three four five six seven eight nine ten eleven.",
        "no end here and happy happy happy happy happy happy",
        "extraordinarily, unbelievably; wonderfully: ... ? !",
    ]
    .into_iter()
    .map(|text| common::sample(&tokenizer, text))
    .collect()
}

#[test]
fn the_python_rewards_and_detector_score_exactly_as_the_rust_ones() {
    let samples = texts();
    let cases: [(&str, &str, &[&str]); 3] = [
        ("happy_count", "happy_count", &["{}", r#"{"max_count": 2}"#, r#"{"whole_word": true}"#]),
        ("sentence_length", "sentence_length", &["{}", r#"{"target": 5, "smooth": true}"#, r#"{"target": 9}"#]),
        ("detect_happy_count", "detect_happy_count", &["{}", r#"{"threshold": 1, "whole_word": true}"#]),
    ];
    for (module, rust, params) in cases {
        for params in params {
            let (mut python, mut rust) = (load(&built(module), params), load(&standard_plugin(rust), params));
            assert!(python.imports_wasi() && !rust.imports_wasi(), "a Rust plugin gets no WASI at all");
            assert_eq!(python.info().params, rust.info().params, "{module}: the same parameters");
            match rust.kind() {
                smallrl::plugins::PluginKind::Detector => assert_eq!(python.detect(&samples).unwrap(), rust.detect(&samples).unwrap(), "{module} {params}"),
                _ => assert_eq!(python.score(&samples).unwrap(), rust.score(&samples).unwrap(), "{module} {params}"),
            }
        }
    }
    // The Rust SDK's parameter checks, word for word.
    for bad in [r#"{"max_cont": 3}"#, r#"{"max_count": 2.5}"#, r#"{"max_count": 0}"#] {
        let error = |path: &Path| format!("{:#}", Plugin::load(path, bad, PluginLimits::default()).err().unwrap());
        let (python, rust) = (error(&built("happy_count")), error(&standard_plugin("happy_count")));
        let cause = |message: &str| message.split("rejected its parameters").nth(1).unwrap().split(" (`smallrl plugin info").next().unwrap().to_string();
        assert_eq!(cause(&python), cause(&rust), "{bad}");
        assert!(python.contains("happy_count.wasm"), "{python}");
    }
}

/// The sorting environment in Python generates the Rust one's prompts (both splits, several
/// counts and seeds) and scores, monitors and judges its samples identically.
#[test]
fn the_python_sorting_environment_is_the_rust_one() {
    let (mut python, mut rust) = (load(&built("sorting"), "{}"), load(&standard_plugin("sorting"), "{}"));
    assert_eq!(python.environment_info(), rust.environment_info());
    for (split, count, seed, hack_frac) in [(EnvSplit::Train, 544, 0, 0.5), (EnvSplit::Eval, 64, 3, 0.5), (EnvSplit::Train, 5, 1, 1.0), (EnvSplit::Train, 40, 9, 0.0)] {
        assert_eq!(python.generate(split, count, seed, hack_frac).unwrap(), rust.generate(split, count, seed, hack_frac).unwrap(), "{split} {count} {seed}");
    }
    let prompts = rust.generate(EnvSplit::Train, 12, 4, 0.5).unwrap();
    let render = smallrl::train::prompts::PromptRender::Raw;
    let prompts = smallrl::train::prompts::from_environment(prompts, &render).unwrap();
    let tokenizer = common::tokenizer();
    let mut samples = Vec::new();
    for prompt in &prompts {
        let list = prompt.metadata.as_ref().unwrap().json.clone();
        let columns: Value = serde_json::from_str(&list).unwrap();
        let answer = columns["answer"].as_str().unwrap();
        let input = columns["input_order"].as_str().unwrap();
        for completion in [answer.to_string(), input.to_string(), format!("{answer} 1 2 3"), "9 9 9".to_string(), "no numbers".to_string()] {
            samples.push(smallrl::reward::sample_from_text(prompt, &completion, &tokenizer).unwrap());
        }
    }
    let batch = smallrl::plugins::Batch::new(&samples);
    assert_eq!(python.score_environment(&batch).unwrap(), rust.score_environment(&batch).unwrap());
    assert_eq!(python.monitor(&batch).unwrap(), rust.monitor(&batch).unwrap());
    assert_eq!(python.ground_truth(&batch).unwrap(), rust.ground_truth(&batch).unwrap());
}

/// Each hostile behaviour fails the call with an error naming the file and the cause, within
/// the sandbox's limits (the call-time backstop is 10 s; each failure comes well before it).
#[test]
fn hostile_python_gets_clear_errors() {
    let path = built("testing/hostile");
    let cases = [
        ("loop", "ran out of fuel: 320000000 instructions for this call (160000000 per sample, 16 x plugin_fuel_per_sample"),
        ("memory", "tried to grow its memory"),
        ("open", "FileNotFoundError"),
        ("socket", "No module named 'socket'"),
        ("environ", "KeyError: 'HOME'"),
        ("subprocess", "No module named 'subprocess'"),
        ("exit", "SystemExit: 3"),
        ("os_exit", "called exit with status 1"),
        ("print", "wrote more than 1024 KiB to stdout and stderr"),
        ("huge_error", "more characters]"),
        ("import", "No module named 'numpy'"),
        ("nan", "score returned NaN for sample 0"),
        ("wrong_length", "returned 3 values for a batch of 2 samples"),
    ];
    let samples = &texts()[..2];
    for (mode, cause) in cases {
        let mut plugin = load(&path, &format!(r#"{{"mode": "{mode}"}}"#));
        let started = Instant::now();
        let error = format!("{:#}", plugin.score(samples).unwrap_err());
        assert!(started.elapsed() < Duration::from_secs(8), "{mode} took {:?}", started.elapsed());
        assert!(error.contains("hostile.wasm") && error.contains(cause), "{mode}: {error}");
        assert!(error.len() < 10_000, "{mode}: the error is bounded ({} bytes)", error.len());
    }
    assert_eq!(load(&path, "{}").score(samples).unwrap(), vec![1.0, 1.0], "the same plugin behaves without a mode");
}

/// A Python reward that fails mid-run (at its third call: step 3) stops the run with the cause
/// in train.log and loses nothing already written: the checkpoint of step 2 and two whole
/// metrics lines.
#[test]
fn a_python_failure_mid_run_keeps_what_was_written() {
    let out = tempfile::tempdir().unwrap();
    let mut config = common::tiny_stories_run(out.path(), &built("testing/hostile"), "hostile");
    config.insert("reward".into(), serde_json::json!({"plugin": built("testing/hostile"), "params": {"mode": "third_call"}}));
    config.insert("eval_every".into(), 4.into());
    common::one_thread();
    let config = smallrl::train::TrainConfig::resolve(None, config).unwrap();
    let error = format!("{:#}", smallrl::train::Trainer::new(config, None).unwrap().train(None).err().expect("the third call fails"));
    assert!(error.contains("hostile.wasm") && error.contains("failing at the third call"), "{error}");
    let run = common::only_run(out.path());
    assert!(run.join("checkpoint-2").is_dir(), "the checkpoint of step 2 is kept");
    assert_eq!(read_jsonl(run.join("metrics.jsonl")).len(), 2, "two whole lines");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("training stopped") && log.contains("failing at the third call"), "{log}");
}

/// `random.random()` and `time.time()` in a plugin are the same in every run: the random
/// stream is seeded by the plugin and the call's inputs, the wall clock is fixed.
#[test]
fn random_and_time_are_deterministic_functions_of_the_call() {
    let samples = texts();
    let path = built("testing/noisy");
    let scores = || load(&path, "{}").score(&samples).unwrap();
    let first = scores();
    assert_eq!(first, scores(), "a fresh instance draws the same values");
    let mut plugin = load(&path, "{}");
    assert_eq!(plugin.score(&samples).unwrap(), first);
    assert_eq!(plugin.score(&samples).unwrap(), first, "and so does a second call of one instance");
    assert_ne!(plugin.score(&samples[1..]).unwrap(), first[1..], "other inputs draw other values");
    let distinct: std::collections::BTreeSet<u64> = first.iter().map(|s| s.to_bits()).collect();
    assert!(distinct.len() >= samples.len() - 1, "random per sample: {first:?}");
    assert!(first.iter().all(|s| (0.0..0.6).contains(s)), "0.5 * random + 0.1 * happy, the clock fixed: {first:?}");
}

/// The Python SDK's `smallrl.run_programs`: a batch of completions run as programs, each in
/// its own interpreter, their statuses read back through the SDK's `Outcome` (the scores are
/// plugins/python/testing/runs_programs.py's), stdin and files included.
#[test]
fn a_python_reward_runs_programs_through_the_sdk() {
    let mut plugin = load(&built("testing/runs_programs"), "{}");
    assert!(plugin.program_runner().is_some());
    let samples: Vec<Sample> = ["print(6 * 7)", "while True: pass", "import sys; sys.exit(3)", "raise ValueError('no')", "io", "print(1)"]
        .iter()
        .map(|completion| Sample { completion: completion.to_string(), ..Sample::default() })
        .collect();
    assert_eq!(plugin.score(&samples).unwrap(), vec![1.5, 4.0, 2.03, 3.0, 1.5, 1.0]);
}

#[test]
fn a_trl_reward_function_builds_as_it_is() {
    let mut plugin = load(&built("testing/trl_length"), "{}");
    assert_eq!(plugin.info().name, "reward_len");
    let metadata = smallrl::train::prompts::metadata_from_columns(serde_json::from_str(r#"{"bonus": 0.25}"#).unwrap()).unwrap();
    let tokenizer = common::tokenizer();
    let mut with_bonus = common::sample(&tokenizer, "exactly twenty chars");
    with_bonus.metadata = metadata;
    let plain = common::sample(&tokenizer, "short");
    // -|20 - len| / 20 (+ bonus): 0 + 0.25 and -15/20.
    assert_eq!(plugin.score(&[with_bonus, plain]).unwrap(), vec![0.25, -0.75]);
}

/// Issue 45.2 / 47.1: a TRL reward function's `None` is no score (contract 0.5's none) for its
/// sample alone, through the built component: hand-counted words elsewhere; `plugin score`
/// prints `none` for it, and asking for a score of every sample names the sample.
#[test]
fn a_trl_reward_functions_none_is_no_score_for_its_sample() {
    let path = built("testing/trl_no_score");
    let mut plugin = load(&path, "{}");
    assert_eq!(plugin.contract_version(), "0.6.0");
    let tokenizer = common::tokenizer();
    let samples: Vec<Sample> = ["one two three", "skip this one", "four"].iter().map(|text| common::sample(&tokenizer, text)).collect();
    assert_eq!(plugin.score_optional(&samples).unwrap(), vec![Some(3.0), None, Some(1.0)]);
    let error = format!("{:#}", plugin.score(&samples).unwrap_err());
    assert!(error.contains("words_or_none") && error.contains("gave sample 1 no score"), "{error}");
    let printed = smallrl_ok(&["plugin", "score", path.to_str().unwrap(), "--text", "one two", "--text", "skip"]);
    assert_eq!(printed.lines().collect::<Vec<_>>(), ["2.000000\tone two", "none\tskip"]);
}

/// `smallrl plugin new NAME --python` for each kind: the module's own tests pass as written,
/// and the module builds and runs.
#[test]
fn plugin_new_python_writes_modules_that_pass_their_tests_and_build() {
    let dir = tempfile::tempdir().unwrap();
    for (name, kind) in [("my_reward", "reward"), ("my_detector", "detector"), ("my_env", "environment")] {
        smallrl_ok(&["plugin", "new", name, "--python", "--kind", kind, "--dir", dir.path().to_str().unwrap()]);
        let module_dir = dir.path().join(name);
        let sdk = smallrl_ok(&["plugin", "sdk", "--path"]);
        let test = std::process::Command::new(common::python()).arg(module_dir.join(format!("test_{name}.py"))).env("PYTHONPATH", sdk.trim()).output().unwrap();
        assert!(test.status.success(), "{name}'s tests:\n{}{}", String::from_utf8_lossy(&test.stdout), String::from_utf8_lossy(&test.stderr));
        let stdout = String::from_utf8_lossy(&test.stdout);
        let passed = stdout.lines().find_map(|l| l.strip_suffix(" passed, 0 failed")?.rsplit(' ').next()?.parse::<usize>().ok());
        assert!(passed.is_some_and(|n| n > 0), "{name}'s tests must run some and fail none:\n{stdout}");
        smallrl_ok(&["plugin", "build", module_dir.join(format!("{name}.py")).to_str().unwrap()]);
        let wasm = module_dir.join(format!("{name}.wasm"));
        match kind {
            "environment" => {
                let prompts = smallrl_ok(&["plugin", "prompts", wasm.to_str().unwrap(), "--count", "4"]);
                assert_eq!(prompts.lines().count(), 4, "{prompts}");
            }
            // The template's hand-computed results, as its tests state them.
            "reward" => assert!(smallrl_ok(&["plugin", "score", wasm.to_str().unwrap(), "--text", "a happy day"]).starts_with("0.500000")),
            _ => assert!(smallrl_ok(&["plugin", "score", wasm.to_str().unwrap(), "--text", "a happy happy day"]).starts_with("true")),
        }
    }
    let output = smallrl(&["plugin", "new", "my_reward", "--python", "--dir", dir.path().to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("already exists"));
}

/// A module that does not declare a plugin fails the build naming the module and what to write.
#[test]
fn a_module_without_a_plugin_fails_the_build_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("nothing_here.py");
    std::fs::write(&module, "x = 1\n").unwrap();
    let output = smallrl(&["plugin", "build", module.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("nothing_here.py") && stderr.contains("declares no reward") && stderr.contains("@smallrl.reward"), "{stderr}");
    assert!(!dir.path().join("nothing_here.wasm").exists(), "a failed build writes no component");
}

/// The README's task (sentence length + a "happy" bonus, flagged by the happy_count detector)
/// with the Python ports trains to the Rust plugins' metrics.jsonl, bit for bit.
#[test]
fn python_rewards_and_detector_train_as_the_rust_ones() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str, sentence: &Path, happy: &Path, detector: &Path| {
        let mut map = common::tiny_stories_run(&out.path().join(dir), sentence, "task");
        map.insert(
            "reward".into(),
            serde_json::json!({"components": [
                {"plugin": sentence, "name": "sentence_length_10_smooth", "params": {"target": 10, "smooth": true}, "role": "retain"},
                {"plugin": happy, "params": {"max_count": 5}, "scale": 0.5, "role": "forget"},
            ], "max_reward": 1.0}),
        );
        map.insert("rh_detector".into(), serde_json::json!({"plugin": detector, "params": {"threshold": 1}}));
        map.insert("routing_mode".into(), "classic".into());
        map.insert("max_steps".into(), 3.into());
        map
    };
    let rust = train(config("rust", &standard_plugin("sentence_length"), &standard_plugin("happy_count"), &standard_plugin("detect_happy_count")), None, None);
    let python = train(config("python", &built("sentence_length"), &built("happy_count"), &built("detect_happy_count")), None, None);
    let (rust, python) = (metrics_without_timings(&rust), metrics_without_timings(&python));
    assert_eq!(rust.len(), 3);
    assert_eq!(python, rust);
}

fn environment_run(out: &Path, dir: &str, environment: &Path) -> serde_json::Map<String, Value> {
    let mut map = common::tiny_stories_run(&out.join(dir), environment, "sorting");
    for key in ["prompts", "reward"] {
        map.remove(key);
    }
    map.insert("environment".into(), environment.to_str().unwrap().into());
    map.insert("hack_frac".into(), 0.5.into());
    map.insert("routing_mode".into(), "classic".into());
    map.insert("num_prompts".into(), 64.into());
    map
}

/// The Python sorting environment trains to the Rust one's metrics.jsonl, bit for bit, and a
/// resumed run of it repeats the uninterrupted one.
#[test]
fn the_python_environment_trains_as_the_rust_one_and_resumes_exactly() {
    let out = tempfile::tempdir().unwrap();
    let rust = train(environment_run(out.path(), "rust", &standard_plugin("sorting")), None, None);
    let python = train(environment_run(out.path(), "python", &built("sorting")), None, None);
    assert_eq!(metrics_without_timings(&python), metrics_without_timings(&rust));
    let stopped = train(environment_run(out.path(), "stopped", &built("sorting")), None, Some(3));
    let resumed = train(environment_run(out.path(), "stopped", &built("sorting")), Some(&stopped), None);
    assert_eq!(metrics_without_timings(&resumed), metrics_without_timings(&python));
}

/// A reward that calls `random` and `time`: two runs of one config write the same metrics.jsonl
/// and a resumed run equals the uninterrupted one (timings aside, which no run repeats).
#[test]
fn a_python_reward_with_random_and_time_trains_reproducibly() {
    let out = tempfile::tempdir().unwrap();
    let noisy = built("testing/noisy");
    let config = |dir: &str| common::tiny_stories_run(&out.path().join(dir), &noisy, "noisy");
    let first = train(config("a"), None, None);
    let second = train(config("b"), None, None);
    assert_eq!(metrics_without_timings(&first), metrics_without_timings(&second));
    let stopped = train(config("c"), None, Some(3));
    let resumed = train(config("c"), Some(&stopped), None);
    assert_eq!(metrics_without_timings(&resumed), metrics_without_timings(&first));
    let rewards: Vec<f64> = metrics_without_timings(&first).iter().map(|m| m["reward"].as_f64().unwrap_or(f64::NAN)).collect();
    assert!(rewards.iter().all(|r| (0.0..0.6).contains(r)), "{rewards:?}");
}

/// Runs `script` with the project's Python, the SDK and `dir` importable; its stdout.
fn native_python(dir: &Path, script: &str) -> String {
    let prelude = format!("import sys\nsys.path[:0] = [{:?}, {:?}]\n", repo_root().join("plugins/python").to_str().unwrap(), dir.to_str().unwrap());
    let output = std::process::Command::new(common::python()).arg("-c").arg(prelude + script).output().unwrap();
    assert!(output.status.success(), "{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Issue 47.1: a TRL reward function's result is one int or float per completion, as TRL needs
/// it; a string or a bool was converted by `float()` (`"0.11"` scored 0.11) and is now an error
/// naming the sample, the value and its type; `None` is TRL's "no score" (contract 0.5), kept as
/// None for its sample alone.
#[test]
fn a_trl_reward_functions_result_is_checked_as_trl_requires() {
    let dir = tempfile::tempdir().unwrap();
    // Returns the `result` metadata column of the first sample: whatever the case gives.
    std::fs::write(dir.path().join("returns.py"), "def returns(prompts, completions, **kwargs):\n    return kwargs['result'][0]\n").unwrap();
    let script = r#"
import json
import returns
from smallrl.testing import load, sample
reward = load(returns)
for result in [[0.25], [3], ["0.11"], [True], [None], [0.5, 0.5], "0.5", [[1.0]]]:
    try:
        print(json.dumps(reward.score_batch([sample("a", metadata={"result": result})])))
    except Exception as error:
        print(f"{type(error).__name__}: {error}")
"#;
    let said = native_python(dir.path(), script);
    let lines: Vec<&str> = said.lines().collect();
    let expected = [
        "[0.25]",
        "[3.0]",
        "TypeError: returns returned '0.11' (str) for sample 0: a score is a number (int or float) or None (no score), as TRL requires",
        "TypeError: returns returned True (bool) for sample 0: a score is a number (int or float) or None (no score), as TRL requires",
        "[null]",
        "ValueError: returns returned 2 scores for 1 completions: a TRL reward function returns one per completion",
        "TypeError: returns returned '0.5' (str): a TRL reward function returns a list of numbers, one per completion",
        "TypeError: returns returned [1.0] (list) for sample 0: a score is a number (int or float) or None (no score), as TRL requires",
    ];
    assert_eq!(lines, expected);
}

/// Issue 46.3: in a chat run a TRL function gets TRL's conversational format (prompts as message
/// lists, completions as `[{"role": "assistant", "content": ...}]`); in a text run strings. TRL's
/// documented `format_reward_func` scores by hand-checked texts; the conversation column is not
/// a keyword argument.
#[test]
fn a_trl_function_gets_conversations_in_chat_runs_and_strings_in_text_runs() {
    let script = r#"
import json
import smallrl
from smallrl.testing import load, sample
import testing.trl_format as trl_format
chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
texts = ["<think>2+2 is 4</think><answer>4</answer>", "4", "<think>x</think><answer>4</answer> and more"]
print(json.dumps(load(trl_format).score_batch([sample(t, metadata={"prompt_messages": chat}) for t in texts])))
seen = []
def record(prompts, completions, **kwargs):
    seen.append({"prompts": prompts, "completions": completions, "keywords": sorted(kwargs)})
    return [0.0] * len(completions)
recorder = smallrl.trl_reward(record)()
recorder.score_batch([sample("4", prompt="<rendered>", metadata={"prompt_messages": chat, "answer": "4"})])
recorder.score_batch([sample("4", prompt="What is 2+2?", metadata={"answer": "4"})])
print(json.dumps(seen))
"#;
    let said = native_python(&repo_root().join("plugins/python"), script);
    let mut lines = said.lines();
    // Hand-checked against the pattern ^<think>.*?</think><answer>.*?</answer>$.
    assert_eq!(lines.next(), Some("[1.0, 0.0, 0.0]"));
    let seen: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    let chat = serde_json::json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]);
    assert_eq!(seen[0], serde_json::json!({"prompts": [chat], "completions": [[{"role": "assistant", "content": "4"}]], "keywords": ["answer", "completion_ids"]}));
    assert_eq!(seen[1], serde_json::json!({"prompts": ["What is 2+2?"], "completions": ["4"], "keywords": ["answer", "completion_ids"]}));
}

/// The tiny-stories fixture with a chat template of its own (it has none): a chat run's
/// prompts in a few tokens of its vocabulary.
fn tiny_stories_with_chat_template(dir: &Path) -> PathBuf {
    let model = dir.join("tiny-stories-chat");
    std::fs::create_dir_all(&model).unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(common::fixture("tiny-stories").join(file), model.join(file)).unwrap();
    }
    let template = "{% for m in messages %}{{ m.role }} : {{ m.content }} . {% endfor %}{% if add_generation_prompt %}assistant : {% endif %}";
    std::fs::write(model.join("chat_template.jinja"), template).unwrap();
    model
}

/// Issue 46.3: TRL's `format_reward_func`, built as it is, trains in a chat run (it failed with
/// "string indices must be integers"): every logged reward is its formula on the logged
/// completion, and the component scores conversational samples as TRL would.
#[test]
fn trls_format_reward_func_trains_in_a_chat_run() {
    let out = tempfile::tempdir().unwrap();
    let component = built("testing/trl_format");
    let mut config = common::tiny_stories_run(&out.path().join("runs"), &component, "trl_format");
    config.insert("model".into(), tiny_stories_with_chat_template(out.path()).to_str().unwrap().into());
    config.insert("prompt_format".into(), "chat".into());
    config.insert("max_steps".into(), 2.into());
    config.insert("log_completions".into(), true.into());
    let run = train(config, None, None);
    assert_eq!(read_jsonl(run.join("metrics.jsonl")).len(), 2);
    let lines = read_jsonl(run.join("completions.jsonl"));
    assert!(!lines.is_empty());
    for line in &lines {
        assert!(line["prompt"].as_str().unwrap().starts_with("user : "), "the chat rendering: {line}");
        let completion = line["completion"].as_str().unwrap();
        let formatted = completion.starts_with("<think>") && completion.contains("</think><answer>") && completion.ends_with("</answer>") && !completion.contains('\n');
        assert_eq!(line["reward"].as_f64(), Some(if formatted { 1.0 } else { 0.0 }), "{line}");
    }
    let mut plugin = load(&component, "{}");
    let metadata = smallrl::train::prompts::metadata_from_columns(serde_json::from_str(r#"{"prompt_messages": [{"role": "user", "content": "2+2?"}]}"#).unwrap()).unwrap();
    let samples: Vec<Sample> = ["<think>2+2 is 4</think><answer>4</answer>", "4"]
        .into_iter()
        .map(|text| Sample { metadata: metadata.clone(), ..common::sample_from_tokens(text) })
        .collect();
    assert_eq!(plugin.score(&samples).unwrap(), vec![1.0, 0.0]);
}

/// Issue 47.4 and 47.3: the guide ("Write a reward in Python in five minutes") run command by
/// command in a folder outside the checkout, with `smallrl` on PATH and a plugin cache of its
/// own: every command succeeds. Then the edit cycle: a changed formula, rebuilt and scored,
/// compiles no function again (the rebuild is the cached base, whose compiled code is cached).
#[test]
fn the_python_guide_runs_outside_the_checkout_and_an_edit_reuses_compiled_cpython() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache/wasmtime");
    let functions = dir.path().join("cache/wasmtime-functions");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let readme = std::fs::read_to_string(repo_root().join("plugins/README.md")).unwrap();
    let guide = readme.split("## Write a reward in Python in five minutes").nth(1).unwrap();
    let block = guide.split("```bash\n").nth(1).unwrap().split("```").next().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_smallrl")).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let run = |command: &str| {
        let output = std::process::Command::new("bash")
            .args(["-c", command])
            .current_dir(&work)
            .env("PATH", &path)
            .env("SMALLRL_PLUGIN_CACHE", &cache)
            .env_remove("PYTHONPATH")
            .output()
            .unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "`{command}` failed:\n{said}");
        said
    };
    let outputs: Vec<String> = block.lines().filter(|line| !line.trim().is_empty() && !line.starts_with("$EDITOR")).map(run).collect();
    assert!(outputs.iter().any(|said| said.contains("2 passed, 0 failed")), "{outputs:?}");
    assert!(outputs.iter().any(|said| said.starts_with("0.500000\twow! so happy!")), "the template's count of \"happy\" over max_count 2: {outputs:?}");
    assert!(outputs.last().unwrap().contains("matches (3 texts)"), "{outputs:?}");
    let before = count_files(&functions);
    assert!(before > 10_000, "CPython compiles to more than 10,000 functions: {before}");
    let module = work.join("rewards/exclaim/exclaim.py");
    let source = std::fs::read_to_string(&module).unwrap();
    std::fs::write(&module, source.replace("return min(count", "return 0.5 * min(count")).unwrap();
    run("smallrl plugin build rewards/exclaim/exclaim.py");
    assert!(run("smallrl plugin score rewards/exclaim/exclaim.wasm --text 'wow! so happy!'").starts_with("0.250000"));
    // The rebuild is the cached base plus the module's files, and the host compiles the base:
    // none (before the base, 1,143 of 12,754: the glue and what the new snapshot reached).
    let compiled = count_files(&functions) - before;
    assert_eq!(compiled, 0, "{compiled} of {before} functions compiled again: the rebuild should be the cached base");
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().path()).map(|path| if path.is_dir() { count_files(&path) } else { 1 }).sum()
}

/// Issue 47.3 and 47.5: a syntax error is reported alone, at the user's file and line (not
/// inside componentize-py's traceback), and scoring the module itself points to `plugin build`.
#[test]
fn a_syntax_error_is_the_users_alone_and_a_module_is_not_scored() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("typo.py");
    std::fs::write(&module, "import smallrl\n\n\n@smallrl.reward(name=\"typo\")\ndef score(sample, params):\n    return 1.0 +\n").unwrap();
    let output = smallrl(&["plugin", "build", module.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains(&format!("{}:6: SyntaxError: invalid syntax", module.display())) && stderr.contains("    return 1.0 +"), "{stderr}");
    assert!(!stderr.contains("Traceback") && !stderr.contains("componentize-py"), "the user's error alone: {stderr}");
    let output = smallrl(&["plugin", "score", module.to_str().unwrap(), "--text", "a"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is a Python module, not a component: build it with `smallrl plugin build"), "{stderr}");
}
