//! What a plugin returns is untrusted: strings are bounded and cleaned before they reach a
//! terminal or a log, `info()` is checked against the contract's rules at load (the field is
//! named), an initial memory over the limit is reported as such, and every limit is a setting.
//! The plugins are `plugins/testing/hostile` (one Cargo feature per behaviour),
//! `plugins/testing/misbehaving` and `plugins/testing/hostile_env` (its `judge` build calls the
//! host's judge: every call is counted against the call's judge budget), built by `make plugins`.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{sample_from_tokens, test_plugin};
use smallrl::plugins::text::MAX_SHOWN_BYTES;
use smallrl::plugins::judge::{Judge, JudgeItem};
use smallrl::plugins::{Batch, EnvSplit, Plugin, PluginLimits, Sample};

/// Room for the host's own words around one bounded plugin string.
const MAX_MESSAGE_BYTES: usize = MAX_SHOWN_BYTES + 1024;

fn batch() -> Vec<Sample> {
    ["w w happy .", "w ."].iter().map(|tokens| sample_from_tokens(tokens)).collect()
}

/// Building 20 MiB strings takes more fuel than a text reward needs; fuel is not under test.
fn roomy_limits() -> PluginLimits {
    PluginLimits::new(30.0, 256, 10_000_000_000).unwrap()
}

fn load_error(name: &str, limits: PluginLimits) -> String {
    let plugin = Plugin::load(&test_plugin(name), "{}", limits);
    format!("{:#}", plugin.err().unwrap_or_else(|| panic!("{name} must be refused at load")))
}

/// Bounded, cut with a note, and free of terminal control characters.
fn assert_safe(message: &str, cut: bool) {
    assert!(message.len() <= MAX_MESSAGE_BYTES, "{} bytes reached the user", message.len());
    assert_eq!(message.contains("more bytes cut"), cut, "{}", &message[..message.len().min(300)]);
    assert!(!message.chars().any(smallrl::plugins::text::is_unsafe_control), "control characters reached the user");
}

#[test]
fn a_huge_error_from_score_is_cut_and_cleaned() {
    let mut plugin = Plugin::load(&test_plugin("hostile_huge_error"), "{}", roomy_limits()).unwrap();
    let error = format!("{:#}", plugin.score(&batch()).unwrap_err());
    assert!(error.contains("plugin hostile") && error.contains("score returned an error: \u{FFFD}[2J"), "{}", &error[..300]);
    assert_safe(&error, true);
}

#[test]
fn a_huge_error_from_configure_is_cut_and_cleaned() {
    let plugin = Plugin::load(&test_plugin("hostile_huge_error"), r#"{"reject": true}"#, roomy_limits());
    let error = format!("{:#}", plugin.err().expect("configure rejects"));
    assert!(error.contains("rejected its parameters"), "{}", &error[..300]);
    assert_safe(&error, true);
}

#[test]
fn a_huge_name_is_refused_and_not_repeated() {
    let error = load_error("hostile_huge_name", roomy_limits());
    assert!(error.contains("info() breaks the plugin contract") && error.contains("`name` is \"nnnn"), "{}", &error[..300]);
    assert!(error.contains(&format!("({} bytes)", 20 << 20)), "the real size is stated");
    assert_safe(&error, true);
}

#[test]
fn control_characters_in_a_name_are_refused_and_not_printed() {
    let error = load_error("hostile_control_name", roomy_limits());
    assert!(error.contains("`name` is \"evil\u{FFFD}[2J"), "{error}");
    assert_safe(&error, false);
}

#[test]
fn info_that_breaks_the_contract_is_refused_naming_the_field() {
    let bad_type = load_error("hostile_bad_type", roomy_limits());
    assert!(bad_type.contains("`params[0].type-name` is \"banana\": it must be one of number, integer"), "{bad_type}");
    let bad_version = load_error("hostile_bad_semver", roomy_limits());
    assert!(bad_version.contains("`version` is \"latest\": it must be a semantic version"), "{bad_version}");
}

#[test]
fn plugin_info_prints_a_huge_description_bounded_and_clean() {
    let output = smallrl_command(&["plugin", "info", test_plugin("hostile_huge_description").to_str().unwrap(), "--plugin-fuel-per-sample", "10000000000"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(printed.starts_with("hostile 0.1.0 (reward)"), "{}", &printed[..200]);
    assert_safe(&printed, true);
}

#[test]
fn a_big_initial_memory_is_named_with_the_setting_that_raises_it() {
    let error = load_error("hostile_big_memory", PluginLimits::default());
    // 100 MiB of static array plus the stack and data: just over 100 MiB.
    assert!(error.contains("asks for 10") && error.contains("MiB of memory when it starts, over the limit of 64.0 MiB"), "{error}");
    assert!(error.contains("plugin_max_memory_mb") && !error.contains("does not implement"), "{error}");
    let output = smallrl_command(&["plugin", "info", test_plugin("hostile_big_memory").to_str().unwrap(), "--plugin-max-memory-mb", "256"]);
    assert!(output.status.success(), "a higher limit admits it: {}", String::from_utf8_lossy(&output.stderr));
}

/// Fuel is deterministic: an endless loop stops after exactly the configured budget, so the
/// error (and whether a reward fits) is the same on every machine.
#[test]
fn an_endless_loop_runs_out_of_the_configured_fuel() {
    let limits = PluginLimits::new(60.0, 64, 2_000_000).unwrap();
    let mut plugin = Plugin::load(&test_plugin("misbehaving"), r#"{"mode": "loop"}"#, limits).unwrap();
    let error = format!("{:#}", plugin.score(&batch()).unwrap_err());
    assert!(error.contains("ran out of fuel: 4000000 instructions for this call (2000000 per sample)"), "{error}");
    assert!(error.contains("plugin_fuel_per_sample"), "{error}");
    // The same through the command line's flag.
    let path = test_plugin("misbehaving");
    let args = ["plugin", "score", path.to_str().unwrap(), "--params", r#"{"mode": "loop"}"#, "--text", "a", "--plugin-fuel-per-sample", "1000"];
    let output = smallrl_command(&args);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("ran out of fuel: 1000 instructions"), "{}", String::from_utf8_lossy(&output.stderr));
}

/// The wall-clock backstop: with fuel out of the way, a loop stops at the configured time plus
/// a margin for a loaded machine (the limit is 0.3 s; the margin is 3 s).
#[test]
fn an_endless_loop_stops_at_the_configured_call_time() {
    let limits = PluginLimits::new(0.3, 64, u64::MAX / 4).unwrap();
    let mut plugin = Plugin::load(&test_plugin("misbehaving"), r#"{"mode": "loop"}"#, limits).unwrap();
    let started = Instant::now();
    let error = format!("{:#}", plugin.score(&batch()).unwrap_err());
    let elapsed = started.elapsed();
    assert!(error.contains("call-time limit of 300ms") && error.contains("plugin_max_call_seconds"), "{error}");
    assert!(elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(3300), "stopped after {elapsed:?}");
}

#[test]
fn limits_outside_their_range_are_refused() {
    assert!(format!("{:#}", PluginLimits::new(0.0, 64, 1).unwrap_err()).contains("plugin_max_call_seconds"));
    assert!(format!("{:#}", PluginLimits::new(1.0, 5000, 1).unwrap_err()).contains("plugin_max_memory_mb"));
    assert!(format!("{:#}", PluginLimits::new(1.0, 64, 0).unwrap_err()).contains("plugin_fuel_per_sample"));
}

fn smallrl_command(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_smallrl")).args(args).current_dir(common::repo_root()).output().expect("smallrl runs")
}

/// A stand-in judge that counts its calls and items and charges `tokens_per_item` a item.
struct CountingJudge {
    calls: Arc<Mutex<(usize, usize)>>,
    tokens_per_item: u64,
}

impl Judge for CountingJudge {
    fn judge(&mut self, items: &[JudgeItem]) -> Result<Vec<f64>, String> {
        let mut calls = self.calls.lock().unwrap();
        *calls = (calls.0 + 1, calls.1 + items.len());
        Ok(vec![0.5; items.len()])
    }

    fn describe(&self) -> String {
        "counting judge".into()
    }

    fn judge_counted(&mut self, items: &[JudgeItem], charge: &mut dyn FnMut(u64) -> Result<(), String>) -> Result<Vec<f64>, String> {
        charge(self.tokens_per_item * items.len() as u64)?;
        self.judge(items)
    }
}

/// `hostile_env_judge` in `mode` with a counting judge attached; the judge's (calls, items).
fn judged_env(mode: &str, limits: PluginLimits, tokens_per_item: u64) -> (Plugin, Arc<Mutex<(usize, usize)>>) {
    let mut plugin = Plugin::load(&test_plugin("hostile_env_judge"), &format!(r#"{{"mode": "{mode}"}}"#), limits).unwrap();
    assert!(plugin.imports_judge());
    let calls = Arc::new(Mutex::new((0, 0)));
    plugin.set_judge(Arc::new(Mutex::new(CountingJudge { calls: calls.clone(), tokens_per_item })));
    (plugin, calls)
}

fn env_samples(count: usize) -> Vec<Sample> {
    (0..count).map(|i| Sample { prompt: format!("train {i}"), completion: "ok".into(), ..Sample::default() }).collect()
}

/// The budget's error for the `call`-th judge call of a plugin call over `samples` samples.
fn over_budget(call: usize, what: &str, used: u64, per_sample: u64, samples: u64) -> String {
    format!(
        "its judge call {call} asked for judge {what} beyond this call's budget: {used} {what} so far, over the budget of {} ({per_sample} per sample for {samples} samples)",
        per_sample * samples
    )
}

/// Items are counted, not timed: a loop of one-item judge calls from `score` over 3 samples
/// (default budget: 4 items a sample, 12 in all) stops at its 13th call, before the judge runs
/// it, with the same error every time, naming the plugin file and the key that raises it.
#[test]
fn a_loop_of_judge_calls_stops_at_the_same_call_every_time() {
    let samples = env_samples(3);
    let started = Instant::now();
    for _ in 0..2 {
        let (mut plugin, calls) = judged_env("judge_loop", PluginLimits::default(), 1);
        let error = format!("{:#}", plugin.score_environment(&Batch::new(&samples)).unwrap_err());
        assert!(error.contains("hostile_env_judge.wasm") && error.contains("score failed"), "{error}");
        assert!(error.contains(&over_budget(13, "items", 13, 4, 3)), "{error}");
        assert!(error.contains("raise `plugin_judge_items_per_sample` in the run config or pass --plugin-judge-items-per-sample"), "{error}");
        assert!(!error.contains("wasm backtrace"), "{error}");
        assert_eq!(*calls.lock().unwrap(), (12, 12), "the judge ran the 12 calls within the budget");
    }
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

/// One call with the most items a call may carry (65,536; building them takes more fuel than
/// the default) is over the budget of 2 samples (8 items) and is refused before the judge sees
/// any of them.
#[test]
fn one_judge_call_of_the_most_items_is_refused_before_the_judge_runs() {
    let (mut plugin, calls) = judged_env("judge_max_items", roomy_limits(), 1);
    let started = Instant::now();
    let error = format!("{:#}", plugin.score_environment(&Batch::new(&env_samples(2))).unwrap_err());
    assert!(error.contains(&over_budget(1, "items", 65_536, 4, 2)) && error.contains("hostile_env_judge.wasm"), "{error}");
    assert_eq!(*calls.lock().unwrap(), (0, 0));
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

/// Tokens are counted before the judge's model runs: 3 samples of one item at 300 tokens each
/// are 900 tokens, within the default (1,024 a sample) and over 250 a sample (750).
#[test]
fn judge_tokens_are_counted_against_their_own_budget() {
    let samples = env_samples(3);
    let (mut plugin, calls) = judged_env("judge_ok", PluginLimits::default(), 300);
    let scores = plugin.score_environment(&Batch::new(&samples)).unwrap();
    assert_eq!(scores.components[0], [Some(0.5), Some(0.5), Some(0.5)]);
    assert_eq!(*calls.lock().unwrap(), (1, 3));
    let tight = PluginLimits::default().with_judge_budget(4, 250).unwrap();
    let (mut plugin, calls) = judged_env("judge_ok", tight, 300);
    let error = format!("{:#}", plugin.score_environment(&Batch::new(&samples)).unwrap_err());
    assert!(error.contains(&over_budget(1, "tokens", 900, 250, 3)), "{error}");
    assert!(error.contains("`plugin_judge_tokens_per_sample`") && error.contains("--plugin-judge-tokens-per-sample"), "{error}");
    assert_eq!(*calls.lock().unwrap(), (0, 0));
    assert!(format!("{:#}", PluginLimits::default().with_judge_budget(0, 1).unwrap_err()).contains("plugin_judge_items_per_sample"));
    assert!(format!("{:#}", PluginLimits::default().with_judge_budget(1, 0).unwrap_err()).contains("plugin_judge_tokens_per_sample"));
}

/// `generate`, `monitor` and `ground-truth` may call the judge too: each under the budget of
/// its own call (generate of 2 prompts: 8 items; monitor and ground truth of 2 samples: 8).
#[test]
fn the_judge_called_from_generate_monitor_and_ground_truth_is_bounded() {
    let started = Instant::now();
    let (mut plugin, _) = judged_env("judge_generate", PluginLimits::default(), 1);
    let error = format!("{:#}", plugin.generate(EnvSplit::Train, 2, 1, 0.5).unwrap_err());
    assert!(error.contains("generate failed") && error.contains(&over_budget(9, "items", 9, 4, 2)), "{error}");
    let samples = env_samples(2);
    for (mode, call) in [("judge_monitor", "monitor"), ("judge_ground_truth", "ground-truth")] {
        let (mut plugin, calls) = judged_env(mode, PluginLimits::default(), 1);
        let batch = Batch::new(&samples);
        let error = format!("{:#}", if call == "monitor" { plugin.monitor(&batch) } else { plugin.ground_truth(&batch) }.unwrap_err());
        assert!(error.contains(&format!("{call} failed")) && error.contains(&over_budget(9, "items", 9, 4, 2)), "{mode}: {error}");
        assert_eq!(*calls.lock().unwrap(), (8, 8));
    }
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

/// The wall-clock backstop covers the whole call, the judge's time included: a judge slower
/// than the limit ends the call, and the error says how long the judge took.
#[test]
fn the_judges_time_counts_in_the_call_time_limit() {
    struct SlowJudge;
    impl Judge for SlowJudge {
        fn judge(&mut self, items: &[JudgeItem]) -> Result<Vec<f64>, String> {
            std::thread::sleep(Duration::from_millis(600));
            Ok(vec![1.0; items.len()])
        }
        fn describe(&self) -> String {
            "slow judge".into()
        }
    }
    let limits = PluginLimits::new(0.2, 64, smallrl::defaults::PLUGIN_FUEL_PER_SAMPLE).unwrap();
    let mut plugin = Plugin::load(&test_plugin("hostile_env_judge"), r#"{"mode": "judge_ok"}"#, limits).unwrap();
    plugin.set_judge(Arc::new(Mutex::new(SlowJudge)));
    let started = Instant::now();
    let error = format!("{:#}", plugin.score_environment(&Batch::new(&env_samples(1))).unwrap_err());
    assert!(error.contains("call-time limit of 200ms, which counts the judge's time: its 1 judge calls took"), "{error}");
    assert!(error.contains("plugin_max_call_seconds"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
}

/// Set in a child process of [`a_40_mib_judge_item_is_refused_before_tokenizing`]: the mode it
/// runs hostile_env_judge in.
const CHILD_MODE: &str = "SMALLRL_TEST_JUDGE_CHILD_MODE";

/// A judge item bigger than the judge's context can hold (tiny-stories: 512 tokens x 32 bytes =
/// 16,384 bytes) is refused before the template is filled or anything tokenized: 40 MiB costs
/// the process less than 200 MB of peak resident memory over a normal judged call (each
/// measured in a child process of its own; before the bound, 40 MiB aborted the process).
#[test]
fn a_40_mib_judge_item_is_refused_before_tokenizing() {
    if let Ok(mode) = std::env::var(CHILD_MODE) {
        return judge_in_child(&mode);
    }
    let run = |mode: &str| {
        let started = Instant::now();
        let output = Command::new(std::env::current_exe().unwrap())
            .args(["a_40_mib_judge_item_is_refused_before_tokenizing", "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD_MODE, mode)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(output.status.success(), "{mode}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        let peak_kb: u64 = stdout.split("peak_kb=").nth(1).and_then(|rest| rest.split_whitespace().next()).and_then(|n| n.parse().ok()).expect("peak_kb");
        (peak_kb, stdout, started.elapsed())
    };
    let (normal_kb, normal, _) = run("judge_ok");
    assert!(normal.contains("outcome=ok"), "{normal}");
    let (huge_kb, huge, took) = run(&format!("judge_bytes:{}", 40 << 20));
    assert!(huge.contains(&format!("judge item 0 has {} bytes, over the 16384 bytes any item of judge", (40 << 20) + 4)), "{huge}");
    assert!(huge.contains("hostile_env_judge.wasm"), "{huge}");
    assert!(huge_kb < normal_kb + 200_000, "peak {huge_kb} kB with a 40 MiB item, {normal_kb} kB without");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// The child's side: one judged `score` of one sample with the tiny-stories judge, then its
/// outcome and peak resident memory (VmHWM) on stdout.
fn judge_in_child(mode: &str) {
    let config = serde_json::json!({"model": common::fixture("tiny-stories"), "template": "Rate the text: {text}", "mode": "answer_logprobs"});
    let judge = smallrl::judge::ModelJudge::load(&serde_json::from_value(config).unwrap(), tch::Device::Cpu).unwrap();
    let mut plugin = Plugin::load(&test_plugin("hostile_env_judge"), &format!(r#"{{"mode": "{mode}"}}"#), roomy_limits()).unwrap();
    plugin.set_judge(Arc::new(Mutex::new(judge)));
    let outcome = match plugin.score_environment(&Batch::new(&env_samples(1))) {
        Ok(_) => "ok".to_string(),
        Err(error) => format!("{error:#}"),
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let peak = status.lines().find_map(|line| line.strip_prefix("VmHWM:")).unwrap().trim().trim_end_matches(" kB").to_string();
    println!("outcome={outcome}\npeak_kb={peak}");
}

/// hostile_env_judge in `mode` over `samples` samples with a real judge (`config`), under a
/// judge token budget of `tokens_per_sample`: the call's error, or "ok".
fn with_model_judge(config: serde_json::Value, mode: &str, samples: usize, tokens_per_sample: u64) -> String {
    let judge = smallrl::judge::ModelJudge::load(&serde_json::from_value(config).unwrap(), tch::Device::Cpu).unwrap();
    let limits = roomy_limits().with_judge_budget(smallrl::defaults::PLUGIN_JUDGE_ITEMS_PER_SAMPLE, tokens_per_sample).unwrap();
    let mut plugin = Plugin::load(&test_plugin("hostile_env_judge"), &format!(r#"{{"mode": "{mode}"}}"#), limits).unwrap();
    plugin.set_judge(Arc::new(Mutex::new(judge)));
    match plugin.score_environment(&Batch::new(&env_samples(samples))) {
        Ok(_) => "ok".into(),
        Err(error) => format!("{error:#}"),
    }
}

/// The real judge in both modes: a sample's tokens are its prompt's plus, in parse_integer,
/// the 4 it may generate (answer_logprobs generates none), so a budget one token short of that
/// is refused before the model runs; a loop of calls stops at the items budget (2 samples: the
/// 9th call).
#[test]
fn the_model_judge_is_bounded_in_both_modes() {
    common::one_thread();
    let started = Instant::now();
    let model = common::fixture("tiny-stories");
    let tokenizer = smallrl::model::Tokenizer::from_file(&model.join("tokenizer.json")).unwrap();
    let prompt_tokens = tokenizer.encode("Rate the text: ok").unwrap().len() as u64;
    for (mode, generated) in [("parse_integer", 4), ("answer_logprobs", 0)] {
        let config = serde_json::json!({"model": model, "template": "Rate the text: {text}", "mode": mode});
        let needs = prompt_tokens + generated;
        assert_eq!(with_model_judge(config.clone(), "judge_ok", 1, needs), "ok", "{mode}");
        let error = with_model_judge(config.clone(), "judge_ok", 1, needs - 1);
        assert!(error.contains(&over_budget(1, "tokens", needs, needs - 1, 1)), "{mode}: {error}");
        let error = with_model_judge(config, "judge_loop", 2, 1024);
        assert!(error.contains(&over_budget(9, "items", 9, 4, 2)), "{mode}: {error}");
    }
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
}

/// A chat judge (SmolLM2, its chat template): the tokens counted are those of the rendered
/// chat prompt (plus 4 generated), and an item over its bound (8192 tokens x 32 bytes) is
/// refused before anything is tokenized.
#[test]
fn a_chat_judge_counts_its_rendered_prompt_and_bounds_its_items() {
    common::one_thread();
    let started = Instant::now();
    let model = common::real_model_dir();
    let config = serde_json::json!({"model": model, "template": "Rate the text: {text}", "mode": "parse_integer"});
    let judge = smallrl::judge::ModelJudge::load(&serde_json::from_value(config.clone()).unwrap(), tch::Device::Cpu).unwrap();
    let rendered = judge.prompt(&vec![("text".to_string(), "ok".to_string())]).unwrap();
    assert!(rendered.contains("<|im_start|>user\nRate the text: ok"), "{rendered}");
    let tokenizer = smallrl::model::Tokenizer::from_file(&model.join("tokenizer.json")).unwrap();
    let needs = tokenizer.encode(&rendered).unwrap().len() as u64 + 4;
    let error = with_model_judge(config.clone(), "judge_ok", 1, needs - 1);
    assert!(error.contains(&over_budget(1, "tokens", needs, needs - 1, 1)), "{error}");
    let error = with_model_judge(config, "judge_bytes:300000", 1, 1024);
    assert!(error.contains("judge item 0 has 300004 bytes, over the 262144 bytes any item of judge"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(120), "took {:?}", started.elapsed());
}
