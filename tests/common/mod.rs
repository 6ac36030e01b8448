//! Helpers shared by the integration tests: where the repository, the shared fixtures and the
//! built plugins are, a fixed libtorch thread count (oversubscribed threads on 2 cores are many
//! times slower), and samples built from text the way the trainer builds them.
#![allow(dead_code)]

pub mod add_k;
pub mod guess_number;

use std::path::{Path, PathBuf};
use std::sync::Once;

use smallrl::model::tokenizer::Tokenizer;
use smallrl::plugins::{Plugin, PluginLimits};
use smallrl::reward::Sample;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host/ has a parent").to_path_buf()
}

/// `../shared/fixtures/<name>` relative to the repository root; panics with a clear message if
/// the fixtures are missing, never skips.
pub fn fixture(name: &str) -> PathBuf {
    let path = repo_root().join("../shared/fixtures").join(name);
    assert!(path.exists(), "test fixture {} is missing (tests need ../shared/fixtures)", path.display());
    path
}

pub fn one_thread() {
    static INIT: Once = Once::new();
    INIT.call_once(|| tch::set_num_threads(1));
}

/// Largest absolute difference between two tensors of the same shape (on any devices).
pub fn max_abs_diff(a: &tch::Tensor, b: &tch::Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shapes differ");
    let on_cpu = |t: &tch::Tensor| t.to_device(tch::Device::Cpu).to_kind(tch::Kind::Double);
    (on_cpu(a) - on_cpu(b)).abs().max().double_value(&[])
}

/// What a failing numeric bound prints beside its figures, so that a failure on another machine
/// is diagnosed from the log alone: the processor, the kernels libtorch dispatched to on it and
/// the code path MKL chose (its verbose banner, from the project's torch). Float32 results
/// differ in their last bits between processors exactly by these.
pub fn machine_note() -> String {
    static NOTE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NOTE.get_or_init(|| {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let processor = cpuinfo.lines().find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()));
        let probe = "import torch; print('torch CPU capability', torch.backends.cpu.get_cpu_capability()); torch.randn(64, 64) @ torch.randn(64, 64)";
        let output = std::process::Command::new(python()).args(["-c", probe]).env("MKL_VERBOSE", "1").output();
        let torch = match output {
            Ok(out) => String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("torch CPU") || (l.starts_with("MKL_VERBOSE") && !l.contains("GEMM"))).collect::<Vec<_>>().join("; "),
            Err(e) => format!("(could not run the probe: {e})"),
        };
        format!("\n  machine: processor {}; {torch}", processor.as_deref().unwrap_or("unknown"))
    })
    .clone()
}

/// The first CUDA device, for a test marked `#[ignore = "needs a CUDA device: ..."]`: such a
/// test runs only when asked for (`--include-ignored`, as `scripts/gpu-check.sh` does), and
/// then fails loudly without a device rather than passing having checked nothing.
pub fn cuda_device() -> tch::Device {
    assert!(tch::Cuda::is_available(), "this test needs a CUDA device (it is #[ignore]d by default; scripts/gpu-check.sh runs it on a GPU)");
    tch::Device::Cuda(0)
}

/// The project's Python (the venv made by `make setup`), for reference scripts.
pub fn python() -> PathBuf {
    let python = repo_root().join(".venv/bin/python");
    assert!(python.exists(), "{} is missing: run `make setup`", python.display());
    python
}

pub fn plugin_dir() -> PathBuf {
    repo_root().join("plugins")
}

/// A built standard plugin; missing means the plugins were not built (never skipped).
pub fn standard_plugin(file_stem: &str) -> PathBuf {
    existing(plugin_dir().join(format!("{file_stem}.wasm")))
}

/// A built test-only plugin from `target/test-plugins/`.
pub fn test_plugin(file_stem: &str) -> PathBuf {
    existing(repo_root().join("target/test-plugins").join(format!("{file_stem}.wasm")))
}

fn existing(path: PathBuf) -> PathBuf {
    assert!(path.exists(), "{} is missing: run `make plugins` first", path.display());
    path
}

pub fn load(path: &Path, params_json: &str) -> Plugin {
    Plugin::load(path, params_json, PluginLimits::default())
        .unwrap_or_else(|error| panic!("cannot load {}: {error:#}", path.display()))
}

/// The real SimpleStories tokenizer from the shared fixtures (next to the repository).
pub fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(&fixture("simplestories-4096.json")).expect("the SimpleStories tokenizer loads")
}

pub fn sample(tokenizer: &Tokenizer, completion: &str) -> Sample {
    smallrl::reward::sample_from_text(&smallrl::reward::Prompt::plain("once upon a time"), completion, tokenizer).expect("tokenizes")
}

/// A sample whose tokens are given directly (the worked examples use `w` for any word).
pub fn sample_from_tokens(tokens: &str) -> Sample {
    let completion_tokens: Vec<String> = tokens.split_whitespace().map(str::to_string).collect();
    Sample {
        prompt: String::new(),
        completion: completion_tokens.join(" "),
        completion_ids: vec![0; completion_tokens.len()],
        completion_tokens,
        ended_with_eos: true,
        metadata: None,
    }
}

/// Runs the built `smallrl` binary with `args` (no backtraces in its error output).
pub fn smallrl(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_smallrl")).args(args).env_remove("RUST_BACKTRACE").output().expect("smallrl runs")
}

/// [`smallrl`] that must succeed; its stdout.
pub fn smallrl_ok(args: &[&str]) -> String {
    let output = smallrl(args);
    assert!(output.status.success(), "smallrl {args:?} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `smallrl train --config CONFIG_FILE` killed (SIGKILL) as soon as `run/checkpoint` exists,
/// wherever the run then is; panics if the run ends first.
pub fn train_killed_at_checkpoint(config_file: &Path, run: &Path, checkpoint: &str) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_smallrl")).args(["train", "--config", config_file.to_str().unwrap()]).stdout(std::process::Stdio::null()).spawn().unwrap();
    while !run.join(checkpoint).is_dir() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before {checkpoint}");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The lines of a JSON-lines file (metrics.jsonl, completions.jsonl, routing_eval.jsonl, ...).
pub fn read_jsonl(path: impl AsRef<Path>) -> Vec<serde_json::Value> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: {e}: {line}", path.display()))).collect()
}

/// Each completions.jsonl line's reward is its `task` component plus, where its prompt is
/// hackable (the host's gate), its `forget` component; each in [0, 1].
pub fn assert_forget_paid_where_hackable(lines: &[serde_json::Value], task: &str, forget: &str) {
    for line in lines {
        let (task, forget) = (line[format!("rewards/{task}")].as_f64().unwrap(), line[format!("rewards/{forget}")].as_f64().unwrap());
        let want = task + if line["hackable"] == true { forget } else { 0.0 };
        assert!((line["reward"].as_f64().unwrap() - want).abs() < 1e-12, "{line}");
        assert!((0.0..=1.0).contains(&task) && (0.0..=1.0).contains(&forget), "{line}");
    }
}

/// The one run directory `smallrl train` wrote into `output_dir`.
pub fn only_run(output_dir: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(output_dir).unwrap().map(|entry| entry.unwrap().path()).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.into_iter().next().unwrap()
}

/// The tests' small, fast training run on the pre-trained `tiny-stories` fixture: 8 completions
/// per step in groups of 4, 24 tokens, 4 steps (checkpoints and evaluations every 2), DualLoRA
/// r4, one thread on the CPU, rewarded by `reward_plugin`.
pub fn tiny_stories_run(output_dir: &Path, reward_plugin: &Path, name: &str) -> serde_json::Map<String, serde_json::Value> {
    let value = serde_json::json!({
        "model": fixture("tiny-stories"),
        "prompts": fixture("tiny-stories/prompts.txt"),
        "reward": {"plugin": reward_plugin, "params": {}},
        "batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 24,
        "max_steps": 4,
        "save_steps": 2,
        "eval_every": 2,
        "eval_samples": 4,
        "logging_steps": 1,
        "adapter": "dual-lora",
        "lora_preset": "r4",
        "lr": 1e-3,
        "output_dir": output_dir,
        "threads": 1,
        "device": "cpu",
        "name": name,
    });
    let serde_json::Value::Object(map) = value else { unreachable!() };
    map
}

/// A sweep's `--fixed` keys for tiny routed DualLoRA runs on `tiny-stories` (the detector flags
/// any "happy", so routing has samples to route): 8 completions, 24 tokens, 4 steps.
pub fn tiny_sweep_fixed() -> Vec<String> {
    let model = fixture("tiny-stories");
    vec![
        format!("model={}", model.display()),
        format!("prompts={}", model.join("prompts.txt").display()),
        format!("plugin_dir={}", plugin_dir().display()),
        "rh_detector={plugin: happy_count, params: {threshold: 1}}".into(),
        "batch_size=8".into(),
        "num_generations=4".into(),
        "max_completion_length=24".into(),
        "max_steps=4".into(),
        "save_steps=4".into(),
        "eval_every=2".into(),
        "eval_samples=4".into(),
        "lora_preset=r4".into(),
        "device=cpu".into(),
    ]
}

/// The real SmolLM2-135M-Instruct directory that `make setup` builds from PyPI
/// (`scripts/real-model.sh`); missing means the set-up did not run (never skipped).
pub fn real_model_dir() -> PathBuf {
    let dir = repo_root().join(".fixtures/smollm2-135m-instruct");
    assert!(
        dir.join(".smallrl-built").exists(),
        "{} is missing: run `make setup` (or `bash scripts/real-model.sh`) to build it from PyPI",
        dir.display()
    );
    dir
}

/// `scripts/reference/hf_real_model.py` on the real model: transformers' answers to `request`
/// (scores, greedy decodings, rendered chats: see the script).
pub fn hf_real_model(request: &serde_json::Value) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let (request_path, out) = (dir.path().join("request.json"), dir.path().join("out.json"));
    std::fs::write(&request_path, request.to_string()).unwrap();
    let status = std::process::Command::new(python())
        .arg(repo_root().join("scripts/reference/hf_real_model.py"))
        .args([real_model_dir().as_os_str(), request_path.as_os_str(), out.as_os_str()])
        .status()
        .unwrap();
    assert!(status.success(), "hf_real_model.py failed");
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

/// TRL's group advantages in float64: `(r - mean) / (std + 1e-4)` per group of `g`, the
/// standard deviation unbiased.
pub fn group_advantages(rewards: &[f64], g: usize) -> Vec<f64> {
    rewards
        .chunks(g)
        .flat_map(|group| {
            let mean = group.iter().sum::<f64>() / g as f64;
            let std = (group.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (g - 1) as f64).sqrt();
            group.iter().map(move |r| (r - mean) / (std + 1e-4)).collect::<Vec<f64>>()
        })
        .collect()
}

/// tiny-stories with 2% relative Gaussian noise on every weight, written as an HF directory
/// (a policy whose KL to the fixture is not zero, for the tests against TRL).
pub fn perturbed_policy(dir: &Path) -> smallrl::model::LoadedModel {
    use tch::{Device, Kind};
    let load = |dir: &Path| smallrl::model::load(dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
    let base = load(&fixture("tiny-stories"));
    tch::manual_seed(7);
    tch::no_grad(|| {
        for (_, tensor) in base.model.base_tensors() {
            let noise = tensor.randn_like() * 0.02 * tensor.abs().mean(Kind::Float);
            tensor.shallow_clone().copy_(&(tensor + noise));
        }
    });
    smallrl::model::export::save_hf_dir(&base.model, &[], &base.files.tokenizer, dir).unwrap();
    load(dir)
}

/// `plugins/python/<module>.py` built once per test binary into target/python-plugins/.
pub fn built_python(module: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<std::sync::Mutex<std::collections::BTreeMap<String, PathBuf>>> = std::sync::OnceLock::new();
    let mut done = BUILT.get_or_init(Default::default).lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(path) = done.get(module) {
        return path.clone();
    }
    let source = repo_root().join("plugins/python").join(format!("{module}.py"));
    let stem = Path::new(module).file_name().unwrap().to_string_lossy().into_owned();
    let output = repo_root().join("target/python-plugins").join(format!("{stem}.wasm"));
    std::fs::create_dir_all(output.parent().unwrap()).unwrap();
    smallrl_ok(&["plugin", "build", source.to_str().unwrap(), "-o", output.to_str().unwrap()]);
    done.insert(module.to_string(), output.clone());
    output
}

/// A run's metrics.jsonl less its timings (which no run repeats).
pub fn metrics_without_timings(run: &Path) -> Vec<serde_json::Value> {
    read_jsonl(run.join("metrics.jsonl"))
        .into_iter()
        .map(|mut line| {
            line.as_object_mut().unwrap().retain(|key, _| !key.starts_with("timing/") && key != "step_time" && key != "seconds");
            line
        })
        .collect()
}

/// Trains `config` (resumed from `resume_from`, stopped after `stop_at` steps); the run directory.
pub fn train(config: serde_json::Map<String, serde_json::Value>, resume_from: Option<&Path>, stop_at: Option<usize>) -> PathBuf {
    one_thread();
    let config = smallrl::train::TrainConfig::resolve(None, config).unwrap();
    smallrl::train::Trainer::new(config, resume_from).unwrap().train(stop_at).unwrap().run_dir
}
