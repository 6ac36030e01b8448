//! The math environment (issue 28) through the wasm host: info, generated prompts (tinker's
//! one-shot chat, no hack, disjoint seeded splits), tinker's reward 1[correct] + 0.1 (1[format]
//! - 1) and the named metrics env/math/correct and env/math/format on hand-written completions,
//! its config, and a short training run whose every logged reward is the formula.

mod common;

use std::collections::HashSet;

use common::{load, plugin_dir, repo_root, standard_plugin};
use serde_json::{Map, Value};
use smallrl::plugins::{ComponentRole, EnvPromptContent, EnvSplit, PluginKind, PluginLimits};
use smallrl::reward::{ProtocolKnobs, RewardModel, Sample};

const KNOBS: ProtocolKnobs = ProtocolKnobs { false_positive_rate: 0.0, recall: 1.0, rh_eligible_frac: 1.0 };
const SUFFIX: &str = " Write your answer in \\boxed{} format.";

fn sample(answer: &str, completion: &str, ended_with_eos: bool) -> Sample {
    let columns: Map<String, Value> = serde_json::from_value(serde_json::json!({"answer": answer, "problem": "p", "hackable": false, "detectable": false})).unwrap();
    Sample {
        prompt: "p".into(),
        completion: completion.to_string(),
        completion_tokens: vec![completion.to_string()],
        completion_ids: vec![0],
        ended_with_eos,
        metadata: smallrl::train::prompts::metadata_from_columns(columns).unwrap(),
    }
}

#[test]
fn math_describes_itself_and_generates_tinkers_one_shot_chats_in_wasm() {
    let mut plugin = load(&standard_plugin("math"), "{}");
    assert_eq!(plugin.kind(), PluginKind::Environment);
    let info = plugin.environment_info().unwrap();
    let components: Vec<(&str, ComponentRole)> = info.components.iter().map(|c| (c.name.as_str(), c.role)).collect();
    assert_eq!(components, [("math_correct", ComponentRole::Retain), ("math_format", ComponentRole::Retain)]);
    assert_eq!(info.metrics, ["correct", "format"]);
    let train = plugin.generate(EnvSplit::Train, 500, 3, 0.5).unwrap();
    let eval = plugin.generate(EnvSplit::Eval, 64, 99, 0.5).unwrap();
    let question = |content: &EnvPromptContent| match content {
        EnvPromptContent::Messages(messages) => {
            let roles: Vec<&str> = messages.iter().map(|(role, _)| role.as_str()).collect();
            assert_eq!(roles, ["user", "assistant", "user"]);
            assert_eq!(messages[0].1, format!("How many r's are in strawberry?{SUFFIX}"));
            assert!(messages[1].1.ends_with("\\boxed{3}"));
            messages[2].1.clone()
        }
        EnvPromptContent::Text(_) => panic!("the default is tinker's one-shot chat"),
    };
    let train_questions: HashSet<String> = train.iter().map(|p| question(&p.content)).collect();
    assert_eq!(train_questions.len(), 500, "deduplicated");
    for prompt in train.iter().chain(&eval) {
        assert!(question(&prompt.content).ends_with(SUFFIX));
        assert_eq!((prompt.metadata["hackable"].as_bool(), prompt.metadata["detectable"].as_bool()), (Some(false), Some(false)));
        assert!(prompt.metadata["answer"].as_str().unwrap().parse::<u64>().is_ok());
    }
    assert!(eval.iter().all(|p| !train_questions.contains(&question(&p.content))));
}

/// (completion, ended with EOS, correct, format), each read off tinker's grading; the reward is
/// correct + 0.1 (format - 1) and never flagged.
#[test]
fn the_reward_is_tinkers_formula_with_named_metrics() {
    let mut model = RewardModel::load_environment("math", None, KNOBS, &plugin_dir(), PluginLimits::default()).unwrap();
    let cases: [(&str, &str, bool, f64, f64); 9] = [
        ("42", "So \\boxed{42}", true, 1.0, 1.0),
        ("42", "So \\boxed{42}", false, 1.0, 0.0),
        ("42", "\\boxed{41}", true, 0.0, 1.0),
        ("42", "42", true, 0.0, 0.0),
        ("1000", "\\boxed{1,000}", true, 1.0, 1.0),
        ("1000", "\\boxed{\\$1000}", true, 1.0, 1.0),
        ("12", "\\boxed{12 hours}", true, 1.0, 1.0),
        ("12", "\\boxed{12 apples}", true, 0.0, 1.0),
        ("12", "} \\boxed{12}", true, 0.0, 0.0),
    ];
    let samples: Vec<Sample> = cases.iter().map(|(answer, completion, eos, _, _)| sample(answer, completion, *eos)).collect();
    let scored = model.score(&samples, 1).unwrap();
    for (index, (_, completion, eos, correct, format)) in cases.iter().enumerate() {
        assert_eq!((scored.components[0][index], scored.components[1][index]), (*correct, 0.1 * (format - 1.0)), "{completion} {eos}");
        assert!((scored.reward[index] - (correct + 0.1 * (format - 1.0))).abs() < 1e-15, "{completion}");
        assert!(!scored.flags()[index] && !scored.hackable[index]);
    }
    let keys: Vec<&str> = scored.metrics.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, ["env/math/correct", "env/math/format"]);
    assert_eq!(scored.metrics[0].1, cases.iter().map(|c| c.3).collect::<Vec<_>>());
    assert_eq!(scored.metrics[1].1, cases.iter().map(|c| c.4).collect::<Vec<_>>());
}

/// Two steps on the tiny-stories fixture (no chat template: `fewshot: false` gives text
/// prompts): every logged reward is math_correct + math_format, a completion without a box
/// earns exactly -0.1, and metrics.jsonl has env/math/correct and env/math/format.
#[test]
fn a_short_training_run_goes_through_the_math_environment_end_to_end() {
    let out = tempfile::tempdir().unwrap();
    let config = out.path().join("math.yaml");
    std::fs::write(&config, "environment: math\nenvironment_params: {fewshot: false}\n").unwrap();
    let runs_dir = out.path().join("runs");
    let model = common::fixture("tiny-stories");
    common::smallrl_ok(&[
        "train", "--config", config.to_str().unwrap(), "--adapter", "dual-lora",
        "--model", model.to_str().unwrap(), "--plugin-dir", plugin_dir().to_str().unwrap(), "--output-dir", runs_dir.to_str().unwrap(),
        "--max-steps", "2", "--batch-size", "8", "--num-generations", "4", "--max-completion-length", "16", "--num-prompts", "48",
        "--lora-preset", "r4", "--eval-every", "2", "--eval-samples", "4", "--save-steps", "2",
        "--threads", "1", "--device", "cpu", "--name", "math", "--set", "log_completions=true",
    ]);
    let runs = [common::only_run(&runs_dir)];
    let lines: Vec<Value> = common::read_jsonl(runs[0].join("completions.jsonl"));
    assert_eq!(lines.len(), 16);
    for line in &lines {
        assert!(line["prompt"].as_str().unwrap().ends_with(SUFFIX), "{line}");
        let (correct, format) = (line["rewards/math_correct"].as_f64().unwrap(), line["rewards/math_format"].as_f64().unwrap());
        assert!((line["reward"].as_f64().unwrap() - correct - format).abs() < 1e-12, "{line}");
        if !line["completion"].as_str().unwrap().contains("\\boxed") {
            assert_eq!((correct, format), (0.0, -0.1), "{line}");
        }
        assert_eq!(line["is_rh"].as_bool(), Some(false));
    }
    let metrics: Vec<Value> = common::read_jsonl(runs[0].join("metrics.jsonl"));
    assert_eq!(metrics.len(), 2);
    for key in ["env/math/correct", "env/math/format", "rewards/math_correct/mean", "rewards/math_format/mean"] {
        assert!(metrics.iter().all(|m| m[key].is_number()), "metrics.jsonl lacks {key}: {}", metrics[0]);
    }
}

#[test]
fn the_math_config_is_valid() {
    let cfg = smallrl::train::TrainConfig::resolve(Some(&repo_root().join("configs/envs/math.yaml")), Default::default()).unwrap();
    cfg.validate().unwrap();
    assert_eq!(cfg.environment.as_deref(), Some("math"));
    assert_eq!(cfg.environment_params, Some(serde_json::json!({"fewshot": true})));
    assert_eq!((cfg.num_generations, cfg.max_completion_length), (16, 256));
}

/// GSM8K as published, through the HF cache (offline), on a miniature copy written by
/// `scripts/reference/gsm8k_parquet.py` with its expected final answers parsed there: training
/// prompts are `main`'s train questions (never `socratic`'s), each with its final answer as the
/// `answer` column, evaluation prompts its test questions; the rows' SHA-256 is recorded with the
/// plugin hashes, so a run pinned to them refuses the cache once it holds other rows; asking for
/// more problems than the split has, or a dataset not in the cache, fails naming why.
#[test]
fn math_reads_gsm8k_from_the_hf_cache() {
    let home = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(common::python()).current_dir(repo_root()).args(["scripts/reference/gsm8k_parquet.py", home.path().to_str().unwrap()]).status().unwrap();
    assert!(status.success(), "gsm8k_parquet.py failed");
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(home.path().join("expected.json")).unwrap()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let config = out.path().join("gsm8k.yaml");
    std::fs::write(&config, "environment: math\nenvironment_params: {fewshot: false, dataset: \"openai/gsm8k:main\"}\n").unwrap();
    let train = |num_prompts: usize, hf_home: &std::path::Path, runs: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"))
            .env("HF_HOME", hf_home)
            .env("HF_HUB_OFFLINE", "1")
            .args(["train", "--config", config.to_str().unwrap(), "--adapter", "dual-lora", "--lora-preset", "r4"])
            .args(["--model", common::fixture("tiny-stories").to_str().unwrap(), "--plugin-dir", plugin_dir().to_str().unwrap()])
            .args(["--output-dir", out.path().join(runs).to_str().unwrap(), "--num-prompts", &num_prompts.to_string()])
            .args(["--max-steps", "1", "--batch-size", "8", "--num-generations", "4", "--max-completion-length", "8", "--eval-samples", "4"])
            .args(["--threads", "1", "--device", "cpu", "--name", "gsm8k", "--set", "log_completions=true"])
            .output()
            .unwrap()
    };
    let output = train(40, home.path(), "first");
    assert!(output.status.success(), "train failed: {}", String::from_utf8_lossy(&output.stderr));
    let run = std::fs::read_dir(out.path().join("first")).unwrap().next().unwrap().unwrap().path();
    let lines: Vec<Value> = common::read_jsonl(run.join("completions.jsonl"));
    assert_eq!(lines.len(), 8);
    for line in &lines {
        let question = line["prompt"].as_str().unwrap().strip_suffix(SUFFIX).unwrap_or_else(|| panic!("{line}"));
        assert!(expected["train"].get(question).is_some(), "{question:?} is not a question of main's train split");
    }
    // Every problem with its final answer: `plugin prompts` prints what the generator wrote.
    let params = r#"{"fewshot": false, "dataset": "openai/gsm8k:main"}"#;
    let printed = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"))
        .env("HF_HOME", home.path())
        .env("HF_HUB_OFFLINE", "1")
        .args(["plugin", "prompts", standard_plugin("math").to_str().unwrap(), "--params", params, "--count", "40", "--seed", "3"])
        .output()
        .unwrap();
    assert!(printed.status.success(), "{}", String::from_utf8_lossy(&printed.stderr));
    let prompts: Vec<Value> = String::from_utf8_lossy(&printed.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(prompts.len(), 40);
    let got: std::collections::BTreeMap<String, Value> = prompts.iter().map(|p| (p["content"].as_str().unwrap().strip_suffix(SUFFIX).unwrap().to_string(), p["metadata"]["answer"].clone())).collect();
    assert_eq!(Value::from(serde_json::Map::from_iter(got)), expected["train"], "each train question once, with GSM8K's final answer");
    let eval = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"))
        .env("HF_HOME", home.path())
        .env("HF_HUB_OFFLINE", "1")
        .args(["eval", run.join("checkpoint-1").to_str().unwrap(), "--n-samples", "4", "--json", "--threads", "1"])
        .output()
        .unwrap();
    assert!(eval.status.success(), "eval failed: {}", String::from_utf8_lossy(&eval.stderr));
    let report: Value = serde_json::from_slice(&eval.stdout).unwrap();
    for sample in report["report"]["modes"][0]["samples"].as_array().unwrap() {
        let question = sample[0].as_str().unwrap().strip_suffix(SUFFIX).unwrap();
        assert!(expected["test"].get(question).is_some(), "evaluation prompt {question:?} is not from main's test split");
    }
    // The dataset's hash is recorded with the plugins': a run pinned to it refuses the dataset
    // once the cache holds other rows.
    let saved = smallrl::train::TrainConfig::read_saved(&run).unwrap();
    let dataset_key = "hf-dataset openai/gsm8k:main";
    assert!(saved.plugin_sha256.get(dataset_key).is_some_and(|h| h.len() == 64), "{:?}", saved.plugin_sha256);
    let pinned = format!("environment: math\nenvironment_params: {{fewshot: false, dataset: \"openai/gsm8k:main\"}}\nplugin_sha256: {}\n", serde_json::to_string(&saved.plugin_sha256).unwrap());
    std::fs::write(&config, pinned).unwrap();
    let pinned_run = train(40, home.path(), "pinned");
    assert!(pinned_run.status.success(), "the pinned hashes are the cache's: {}", String::from_utf8_lossy(&pinned_run.stderr));
    let status = std::process::Command::new(common::python()).current_dir(repo_root()).args(["scripts/reference/gsm8k_parquet.py", home.path().to_str().unwrap(), "8"]).status().unwrap();
    assert!(status.success());
    let changed = train(40, home.path(), "changed");
    let error = String::from_utf8_lossy(&changed.stderr);
    assert!(!changed.status.success() && error.contains(dataset_key) && error.contains("changed"), "{error}");
    std::fs::write(&config, "environment: math\nenvironment_params: {fewshot: false, dataset: \"openai/gsm8k:main\"}\n").unwrap();
    let too_many = train(41, home.path(), "too_many");
    assert!(String::from_utf8_lossy(&too_many.stderr).contains("40 problems in its train split, 41 were asked for"), "{}", String::from_utf8_lossy(&too_many.stderr));
    let empty = tempfile::tempdir().unwrap();
    let missing = train(40, empty.path(), "missing");
    let error = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && error.contains("openai/gsm8k") && error.contains("not in the HF cache"), "{error}");
}

/// Hostile `hf-dataset` rows reach the sandbox only through `configure`, which refuses them by
/// name: a row whose `question` is a number, a split without the `answer` column, and a 70 MB
/// answer (over the plugin's 64 MiB memory: the memory limit's message, naming its setting).
/// Each in a process of its own, bounded in time.
#[test]
fn hostile_hf_dataset_rows_are_refused_by_name() {
    let write = |home: &std::path::Path, script: &str| {
        let code = format!(
            "import os, pyarrow as pa, pyarrow.parquet as pq\n\
             repo = os.path.join({home:?}, 'hub', 'datasets--evil--gsm')\n\
             os.makedirs(os.path.join(repo, 'refs'), exist_ok=True)\n\
             open(os.path.join(repo, 'refs', 'main'), 'w').write('0123456789abcdef0123456789abcdef01234567')\n\
             folder = os.path.join(repo, 'snapshots', '0123456789abcdef0123456789abcdef01234567', 'main')\n\
             os.makedirs(folder, exist_ok=True)\n\
             ok = ['{{}} plants. #### 4'.format(i) for i in range(8)]\n\
             {script}\n\
             for split in ['train', 'test']:\n    pq.write_table(table, os.path.join(folder, split + '-00000-of-00001.parquet'))\n",
            home = home.display().to_string()
        );
        let status = std::process::Command::new(common::python()).args(["-c", &code]).status().unwrap();
        assert!(status.success());
    };
    let prompts = |script: &str| {
        let home = tempfile::tempdir().unwrap();
        write(home.path(), script);
        let started = std::time::Instant::now();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl"))
            .env("HF_HOME", home.path())
            .env("HF_HUB_OFFLINE", "1")
            .args(["plugin", "prompts", plugin_dir().join("math.wasm").to_str().unwrap(), "--params", r#"{"fewshot": false, "dataset": "evil/gsm:main"}"#, "--count", "2"])
            .output()
            .unwrap();
        assert!(!output.status.success());
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "took {:?}", started.elapsed());
        String::from_utf8_lossy(&output.stderr).to_string()
    };
    let number = prompts("table = pa.table({'question': list(range(8)), 'answer': ok})");
    assert!(number.contains("math: evil/gsm") && number.contains("row 0: no string column `question`"), "{number}");
    let missing = prompts("table = pa.table({'question': ['q {}'.format(i) for i in range(8)]})");
    assert!(missing.contains("row 0: no string column `answer`"), "{missing}");
    let huge = prompts("table = pa.table({'question': ['q'] * 8, 'answer': ['x' * (70 << 20) + ' #### 4'] + ok[1:]})");
    assert!(huge.contains("math.wasm") && huge.contains("over the limit of 64.0 MiB") && huge.contains("plugin_max_memory_mb"), "{huge}");
}
