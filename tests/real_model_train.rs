//! `smallrl train` with `prompt_format: chat` on the real SmolLM2-135M-Instruct (built by
//! `scripts/real-model.sh` into `.fixtures/smollm2-135m-instruct/`): two GRPO steps with
//! DualLoRA (a JSONL file of `messages` conversations) and with DualMLP (a text file of prompts
//! with `system_prompt`). Each run finishes, its checkpoint loads, and the prompts its
//! completions were drawn from (completions.jsonl) are transformers'
//! `apply_chat_template(..., add_generation_prompt=True)` text, whose tokens are transformers'
//! ids (`scripts/reference/hf_real_model.py`); `smallrl eval` reads the chat run. Small on purpose: 2 steps of 4 completions of 6
//! tokens. Also the refusals: chat on a model without a template, `system_prompt` without chat,
//! the paper's comparison rehearsed on SmolLM2 (three 2-step runs in two sweeps, 85 s), and a
//! step's peak memory with and without micro-batches (two 1-step runs, about 50 s).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{fixture, smallrl, smallrl_ok, standard_plugin};
use serde_json::{Value, json};
use smallrl::model::Tokenizer;

/// transformers' rendered text and ids for each conversation.
fn apply_chat_template(conversations: &[Value]) -> Vec<(String, Vec<u32>)> {
    let out = common::hf_real_model(&json!({"chat": conversations}));
    out["chat"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["text"].as_str().unwrap().to_string(), c["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect()))
        .collect()
}

/// A run's config: 2 steps of 2 groups of 2 completions of at most 6 tokens, no KL term.
fn config(out: &Path, adapter: Value, prompts: &Path, extra: Value) -> PathBuf {
    let mut config = json!({
        "model": common::real_model_dir(),
        "prompts": prompts,
        "prompt_format": "chat",
        "reward": {"plugin": standard_plugin("happy"), "params": {}},
        "rh_detector": {"plugin": standard_plugin("detect_happy_count"), "params": {"threshold": 1}},
        "routing_mode": "classic",
        "batch_size": 4, "num_generations": 2, "max_completion_length": 6, "max_steps": 2,
        "save_steps": 2, "eval_every": 2, "eval_samples": 2, "logging_steps": 1, "beta": 0.0,
        "lr": 1e-3, "log_completions": true, "tensorboard": false, "output_dir": out,
    });
    let map = config.as_object_mut().unwrap();
    for (k, v) in adapter.as_object().unwrap().iter().chain(extra.as_object().unwrap()) {
        map.insert(k.clone(), v.clone());
    }
    let path = out.join("config.yaml");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// Trains with `config` (2 threads) and returns the run directory.
fn train(config: &Path, out: &Path) -> PathBuf {
    smallrl_ok(&["train", "--config", config.to_str().unwrap(), "--threads", "2"]);
    let runs: Vec<PathBuf> = std::fs::read_dir(out).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.into_iter().next().unwrap()
}

/// The run finished its 2 steps, its checkpoint loads with the model's shapes, and every
/// completion's prompt is one of `expected` (each drawn), tokenized as transformers does.
fn check_run(run: &Path, expected: &[(String, Vec<u32>)]) {
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = metrics.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 2]);
    let restored = smallrl::train::checkpoint::restore_model(&run.join("checkpoint-2"), tch::Device::Cpu).unwrap();
    assert_eq!(restored.state.step, 2);
    assert_eq!(restored.model.config.hidden_size, 576, "SmolLM2-135M's width");
    let completions = std::fs::read_to_string(run.join("completions.jsonl")).unwrap();
    let prompts: BTreeSet<String> = completions.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["prompt"].as_str().unwrap().to_string()).collect();
    let wanted: BTreeSet<String> = expected.iter().map(|(text, _)| text.clone()).collect();
    assert_eq!(prompts, wanted, "the prompts of completions.jsonl are the rendered chat prompts");
    let tokenizer = Tokenizer::from_file(&common::real_model_dir().join("tokenizer.json")).unwrap();
    for (text, ids) in expected {
        assert_eq!(&tokenizer.encode(text).unwrap(), ids, "token ids of {text:?}");
    }
}

#[test]
fn chat_runs_with_dual_lora_on_message_files() {
    let out = tempfile::tempdir().unwrap();
    let conversations = vec![
        json!([{"role": "user", "content": "Say something happy."}]),
        json!([{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "How are you?"}]),
    ];
    let prompts = out.path().join("prompts.jsonl");
    let lines: Vec<String> = conversations.iter().enumerate().map(|(i, m)| json!({"messages": m, "id": i}).to_string()).collect();
    std::fs::write(&prompts, lines.join("\n")).unwrap();
    let runs = out.path().join("runs");
    let config = config(&runs_dir(&runs), json!({"adapter": "dual-lora", "lora_preset": "r1"}), &prompts, json!({}));
    let run = train(&config, &runs);
    check_run(&run, &apply_chat_template(&conversations));
    // `smallrl eval` renders the run's prompts with the base model's template as the run did.
    let report: Value = serde_json::from_str(&smallrl_ok(&["eval", run.join("checkpoint-2").to_str().unwrap(), "--n-samples", "2", "--threads", "2", "--json"])).unwrap();
    assert!(!report["report"]["modes"].as_array().unwrap().is_empty(), "{report}");
}

#[test]
fn chat_runs_with_dual_mlp_and_a_system_prompt() {
    let out = tempfile::tempdir().unwrap();
    let questions = ["Name a happy animal.", "What is 2+2?"];
    let prompts = out.path().join("prompts.txt");
    std::fs::write(&prompts, questions.join("\n")).unwrap();
    let system = "You are cheerful.";
    let runs = out.path().join("runs");
    let config = config(&runs_dir(&runs), json!({"adapter": "dual-mlp", "mlp_config": "m5"}), &prompts, json!({"system_prompt": system}));
    let run = train(&config, &runs);
    let conversations: Vec<Value> = questions.iter().map(|q| json!([{"role": "system", "content": system}, {"role": "user", "content": q}])).collect();
    check_run(&run, &apply_chat_template(&conversations));
}

fn runs_dir(runs: &Path) -> PathBuf {
    std::fs::create_dir_all(runs).unwrap();
    runs.to_path_buf()
}

#[test]
fn chat_is_refused_without_a_template_and_system_prompt_without_chat() {
    let out = tempfile::tempdir().unwrap();
    let tiny = fixture("tiny-stories");
    let set = |kv: &str| ["--set".to_string(), kv.to_string()];
    let base = |extra: &[&str]| {
        let mut args: Vec<String> = ["train", "--model", tiny.to_str().unwrap(), "--reward-plugin", standard_plugin("happy").to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(set(&format!("prompts={}", tiny.join("prompts.txt").display())));
        args.extend(set(&format!("output_dir={}", out.path().display())));
        args.extend(extra.iter().map(|s| s.to_string()));
        let output = smallrl(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!output.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let error = base(&["--set", "prompt_format=chat"]);
    assert!(error.contains("prompt_format is chat") && error.contains("no chat template") && error.contains(tiny.to_str().unwrap()), "{error}");
    let error = base(&["--set", "system_prompt=Be brief."]);
    assert!(error.contains("system_prompt") && error.contains("prompt_format: chat"), "{error}");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "a refused run writes nothing");
}

/// The paper's comparison on SmolLM2 at CPU size (issue 38; docs/src/sweeps.md, "A CPU
/// rehearsal"): configs/envs/addition.yaml as two sweeps into one directory, the routed arm and
/// the penalty arm at the paper's v=5 multiplier (its best_rp for addition), with their none
/// baseline, one seed, 2 steps
/// of 4 routing and 2 coherence completions of at most 8 tokens, collected and compared with
/// the paper's reference files. The table, CSV and charts name the environment and arms; our
/// cells are each run's last max(1, n // 10) evaluations recomputed here from its
/// routing_eval.jsonl.
#[test]
fn a_smollm2_rehearsal_of_the_paper_matrix_compares_with_the_paper() {
    use smallrl::sweep::compare;
    use smallrl::sweep::plan::Arm;
    use smallrl::intervention::Intervention;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("rehearsal");
    let config = common::repo_root().join("configs/envs/addition.yaml");
    let fixed = [
        format!("model={}", common::real_model_dir().display()),
        format!("plugin_dir={}", common::plugin_dir().display()),
        "num_prompts=64 batch_size=6 num_generations=2 coh_samples_per_rollout=2 max_completion_length=8".into(),
        "max_steps=2 save_steps=2 eval_every=1 eval_samples=8 gradient_accumulation_steps=1 device=cpu".into(),
        "renormalization_mode=retain_only split_moment=false".into(),
    ]
    .join(" ");
    // The routed arm as the paper's (multiplier 1), then the penalty arm at v=5 (its baseline,
    // the same none run, found finished).
    for (arms, doses) in [("routing", ""), ("penalty", " rh_penalty=2 rp_extra_retain_advantage_multiplier=5")] {
        let mut args = vec!["sweep", "--config", config.to_str().unwrap(), "--jobs", "2", "--output-dir", out.to_str().unwrap()];
        args.extend(["--grid", "seed=1", "--intervention-arms", arms, "--fixed"]);
        let fixed = format!("{fixed}{doses}");
        args.extend(fixed.split(' '));
        smallrl_ok(&args);
    }
    let reference = common::repo_root().join("../shared/reference/graft-7env");
    let stdout = smallrl_ok(&["sweep", "--collect", out.to_str().unwrap(), "--compare", reference.to_str().unwrap()]);
    for text in ["compare over all evaluation prompts", "compare over the hackable evaluation prompts only", "addition", "gr", "noi_ro", "best_rp", "rp_extra_retain_advantage_multiplier=5"] {
        assert!(stdout.contains(text), "the table names {text:?}: {stdout}");
    }

    // The runs: (the paper's arm, the mode it is read in) -> the run directory.
    let runs: Vec<(Arm, PathBuf)> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("config.yaml").is_file())
        .map(|p| (Arm::of(&smallrl::train::TrainConfig::read_saved(&p).unwrap()), p))
        .collect();
    assert_eq!(runs.len(), 3, "routed, penalty and their baseline: {runs:?}");
    let run_of = |arm: Arm| &runs.iter().find(|(a, _)| *a == arm).unwrap_or_else(|| panic!("a {arm:?} run in {runs:?}")).1;
    assert!(run_of(Arm::Intervention(Intervention::Penalty)).file_name().unwrap().to_string_lossy().contains("rh_penalty2_extramult5"), "{runs:?}");
    assert!(!run_of(Arm::Intervention(Intervention::Routing)).file_name().unwrap().to_string_lossy().contains("extramult"), "{runs:?}");
    let plugin = common::load(&standard_plugin("addition"), "{}");
    let task: Vec<String> = plugin.environment_info().unwrap().components.iter().filter(|c| c.role == smallrl::plugins::ComponentRole::Retain).map(|c| c.name.clone()).collect();
    // The paper's reading, by hand: the mean over the last max(1, n // 10) evaluations of the
    // retain components' sum and the detector's flag rate in `mode`.
    let reading = |run: &Path, mode: &str| -> (f64, f64) {
        let lines = common::read_jsonl(run.join("routing_eval.jsonl"));
        let window = &lines[lines.len() - (lines.len() / 10).max(1)..];
        assert_eq!(window.last().unwrap()["step"], 2, "{}", run.display());
        let values: Vec<(f64, f64)> = window.iter().map(|l| (task.iter().map(|c| l["modes"][mode][c].as_f64().unwrap()).sum(), l["modes"][mode]["hack_freq"].as_f64().unwrap())).collect();
        let n = values.len() as f64;
        (values.iter().map(|v| v.0).sum::<f64>() / n, values.iter().map(|v| v.1).sum::<f64>() / n)
    };

    let text = std::fs::read_to_string(out.join(compare::CSV_FILE)).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(compare::CSV_HEADER));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let paper: Value = serde_json::from_str(&std::fs::read_to_string(reference.join(compare::REFERENCE_FILE)).unwrap()).unwrap();
    for prompts in ["all", "hackable"] {
        let of: Vec<&Vec<&str>> = rows.iter().filter(|r| r[24] == prompts).collect();
        let arms: BTreeSet<&str> = of.iter().map(|r| r[2]).collect();
        assert_eq!(arms, ["base", "best_rp", "filt", "gr", "noi", "noi_ro", "verif"].into_iter().collect(), "{prompts}: {text}");
        assert!(of.iter().all(|r| (r[0], r[1]) == ("addition", "addition_v2")), "{text}");
        let best = of.iter().find(|r| r[2] == "best_rp").unwrap();
        assert_eq!((best[5], best[15]), ("rh_penalty=2 rp_extra_retain_advantage_multiplier=5 coherence:main=2:4", "v=5"), "{best:?}");
        for r in &of {
            let ours = match r[2] {
                "gr" => Some((Arm::Intervention(Intervention::Routing), "retain_only")),
                "noi" => Some((Arm::None, "both")),
                "noi_ro" => Some((Arm::None, "retain_only")),
                "best_rp" => Some((Arm::Intervention(Intervention::Penalty), "both")),
                _ => None,
            };
            assert_eq!(r[4], ours.map_or(r[4], |o| o.1), "{r:?}");
            let Some((arm, mode)) = ours.filter(|_| prompts == "all") else { continue };
            assert_eq!(r[8], "1", "one seed of ours: {r:?}");
            let (retain, hack) = reading(run_of(arm), mode);
            let cell: Vec<f64> = r[9..13].iter().map(|v| v.parse().unwrap()).collect();
            assert_eq!(cell, [retain, 0.0, hack, 0.0], "{} in {mode}: our cell is the run's own reading", r[2]);
            let cached = paper["addition_v2"][r[2]].get("agg").unwrap_or(&paper["addition_v2"][r[2]]).as_array().unwrap()[..4].iter().map(|v| v.as_f64().unwrap()).collect::<Vec<_>>();
            assert_eq!(r[17..21].iter().map(|v| v.parse::<f64>().unwrap()).collect::<Vec<_>>(), cached, "{r:?}");
        }
        // The paper's pick is v=5 beside its 32:512 rows: at 2:4 our dose is not the paper's.
        assert!(prompts == "hackable" || best[23].is_empty(), "{best:?}");
    }
    for chart in [compare::CHART_FILE, compare::HACKABLE_CHART_FILE] {
        let bytes = std::fs::read(out.join("charts").join(chart)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 1000, "{chart}: a PNG");
    }
}

/// Micro-batches lower a step's peak by what their activations take: one step of 32
/// completions of up to 32 tokens on SmolLM2 (DualLoRA r4, 2 threads), in one pass and in 8
/// micro-batches, each in a process of its own whose train.log prints the step's peak resident
/// memory. The split must save at least 0.6 of what the estimate says the activations of 28
/// rows take. It once saved less: every micro-batch's loss terms kept their autograd graph to
/// the end of the step (`engine::passes`); measured here, 1.31 GB saved against 2.10 GB since
/// (estimate 2.88 GB), and a 544-row sorting step planned into 32 micro-batches peaked at
/// 22.6 GB against an estimate of 7.3 GB.
#[test]
fn micro_batches_lower_the_peak_of_a_step_by_their_activations() {
    let out = tempfile::tempdir().unwrap();
    let model = common::real_model_dir();
    let run = |micro_batches: usize| {
        let dir = out.path().join(format!("gas{micro_batches}"));
        let (prompts, plugin, gas) = (fixture("tiny-stories/prompts.txt"), standard_plugin("happy"), micro_batches.to_string());
        let args = [
            "train", "--model", model.to_str().unwrap(), "--prompts", prompts.to_str().unwrap(), "--reward-plugin", plugin.to_str().unwrap(),
            "--batch-size", "32", "--num-generations", "8", "--max-completion-length", "32", "--max-steps", "1", "--adapter", "dual-lora",
            "--lora-preset", "r4", "--threads", "2", "--device", "cpu", "--gradient-accumulation-steps", &gas, "--output-dir", dir.to_str().unwrap(),
        ];
        smallrl_ok(&args);
        let run_dir = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        std::fs::read_to_string(run_dir.join("train.log")).unwrap()
    };
    // "12.34 GB" or "123.4 MB" after `prefix` on the line that starts with it.
    let bytes_after = |log: &str, prefix: &str| {
        let line = log.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no `{prefix}` line in train.log:\n{log}"));
        let (value, rest) = line[prefix.len()..].split_once(' ').unwrap();
        value.parse::<f64>().unwrap() * if rest.starts_with("GB") { 1e9 } else { 1e6 }
    };
    let (one, eight) = (run(1), run(8));
    let peak = |log: &str| bytes_after(log, "[Step 1] peak resident memory: ");
    // The plan's line: "... training 3.44 GB at 32 rows ..."
    let training = |log: &str| {
        let at = log.find("training ").expect("the memory plan's line");
        bytes_after(&log[at..], "training ")
    };
    let saved = peak(&one) - peak(&eight);
    let estimated = training(&one) - training(&eight);
    eprintln!("peak of one pass {:.3e} bytes, of 8 micro-batches {:.3e}: saved {saved:.3e}, the estimate's activations of 28 rows {estimated:.3e}", peak(&one), peak(&eight));
    // Kept from one machine's figures (2.32 of 2.88 GB saved with the fix, 1.21 without it):
    // 0.6 lies between them; an allocator that keeps more pages resident could move the first.
    assert!(saved > 0.6 * estimated, "8 micro-batches saved {saved:.3e} bytes of the one pass's peak, less than 0.6 of the estimated {estimated:.3e}");
}
