//! The sandbox: purpose-built misbehaving plugins each fail with a clear error naming the
//! plugin, the call and the cause, quickly, and the host keeps working afterwards.

mod common;

use std::time::{Duration, Instant};

use common::{load, sample_from_tokens, standard_plugin, test_plugin};
use smallrl::plugins::{Plugin, PluginLimits, Sample};

fn batch() -> Vec<Sample> {
    ["w w happy .", "w .", "happy happy"].iter().map(|tokens| sample_from_tokens(tokens)).collect()
}

/// Tight limits so the runaway cases finish fast (the default fuel per sample).
fn tight_limits() -> PluginLimits {
    PluginLimits::new(0.3, 32, smallrl::defaults::PLUGIN_FUEL_PER_SAMPLE).unwrap()
}

/// Loads the misbehaving plugin in `mode` and returns the error of scoring a batch of three.
fn misbehave(mode: &str) -> (Plugin, String) {
    misbehave_within(mode, tight_limits())
}

fn misbehave_within(mode: &str, limits: PluginLimits) -> (Plugin, String) {
    let params = format!(r#"{{"mode": "{mode}"}}"#);
    let mut plugin = Plugin::load(&test_plugin("misbehaving"), &params, limits).unwrap();
    let started = Instant::now();
    let error = plugin.score(&batch()).expect_err("the plugin misbehaves");
    assert!(started.elapsed() < Duration::from_secs(5), "{mode}: took {:?}", started.elapsed());
    (plugin, format!("{error:#}"))
}

fn load_error(path: &std::path::Path, params_json: &str) -> String {
    format!("{:#}", Plugin::load(path, params_json, tight_limits()).err().expect("the load fails"))
}

fn assert_contains(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "expected {part:?} in the error:\n{message}");
    }
}

/// After any failure, a standard plugin still loads and scores.
fn assert_host_still_works() {
    let scores = load(&standard_plugin("happy_count"), "{}").score(&batch()).unwrap();
    assert_eq!(scores, vec![0.2, 0.0, 0.4]);
}

#[test]
fn an_endless_loop_runs_out_of_fuel() {
    let (mut plugin, error) = misbehave("loop");
    assert_contains(&error, &["plugin misbehaving", "misbehaving.wasm", "score failed", "ran out of fuel: 30000000 instructions"]);
    // The trapped instance is not used again silently...
    let again = format!("{:#}", plugin.score(&batch()).unwrap_err());
    assert_contains(&again, &["an earlier call failed", "re-instantiated explicitly"]);
    // ...but can be replaced on request.
    plugin.reinstantiate().unwrap();
    assert!(plugin.failure().is_none());
    assert_host_still_works();
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    // Filling each megabyte costs fuel; enough fuel that the memory limit is what stops it.
    let (_, error) = misbehave_within("memory_bomb", PluginLimits::new(5.0, 32, 1_000_000_000).unwrap());
    assert_contains(&error, &["plugin misbehaving", "score failed", "over the limit of 32.0 MiB"]);
    assert_host_still_works();
}

#[test]
fn a_panic_reports_its_message() {
    let (_, error) = misbehave("panic");
    assert_contains(&error, &["score failed", "it panicked", "deliberate panic while scoring 3 samples"]);
    assert_host_still_works();
}

#[test]
fn a_wrong_number_of_scores_is_rejected() {
    let (plugin, error) = misbehave("wrong_count");
    assert_contains(&error, &["plugin misbehaving", "score returned 4 values for a batch of 3 samples"]);
    assert!(plugin.failure().is_none(), "a bad result does not poison the instance");
}

#[test]
fn non_finite_scores_are_rejected() {
    let (_, nan) = misbehave("nan");
    assert_contains(&nan, &["score returned NaN for sample 0", "finite"]);
    let (_, infinite) = misbehave("inf");
    assert_contains(&infinite, &["score returned inf for sample 0"]);
}

#[test]
fn an_error_string_from_the_guest_is_the_message() {
    let (_, error) = misbehave("error");
    assert_contains(&error, &["plugin misbehaving", "score returned an error: deliberate error: the judge is on strike"]);
}

#[test]
fn a_plugin_of_another_contract_version_is_rejected() {
    let error = load_error(&test_plugin("bad_version"), "");
    assert_contains(&error, &["bad_version.wasm", "smallrl:reward@0.7.0", "speaks smallrl:reward@0.6.0"]);
}

/// A plugin that imports `wasi:random` (once refused: plugins had no WASI at all) now runs in
/// the deterministic WASI: its "random" coin is the same in every instance and every run, a
/// function of the plugin and the call's inputs.
#[test]
fn a_plugin_importing_wasi_random_draws_a_deterministic_stream() {
    let scores = || {
        let mut plugin = load(&test_plugin("imports_random"), "{}");
        assert!(plugin.imports_wasi());
        plugin.score(&batch()).unwrap()
    };
    let first = scores();
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|&score| score == first[0]) && (score_is_a_coin(first[0])), "one coin per call: {first:?}");
    for _ in 0..3 {
        assert_eq!(scores(), first, "the same coin in every instance");
    }
    assert!(!load(&standard_plugin("happy_count"), "{}").imports_wasi(), "a Rust plugin of the SDK gets no WASI at all");
}

fn score_is_a_coin(score: f64) -> bool {
    score == 0.0 || score == 1.0
}

#[test]
fn a_core_module_is_rejected_with_how_to_componentize() {
    let error = load_error(&test_plugin("core_module"), "");
    assert_contains(&error, &["core_module.wasm", "core WebAssembly module, not a component", "smallrl-componentize"]);
}

#[test]
fn a_file_that_is_not_wasm_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reward.wasm");
    std::fs::write(&path, "def reward(text): return 1.0\n").unwrap();
    let error = load_error(&path, "");
    assert_contains(&error, &["reward.wasm", "not a WebAssembly file"]);
    let missing = load_error(&dir.path().join("nope.wasm"), "");
    assert_contains(&missing, &["nope.wasm", "make plugins"]);
}

#[test]
fn unknown_and_ill_typed_parameters_are_rejected() {
    let path = standard_plugin("happy_count");
    let unknown = load_error(&path, r#"{"max_cont": 3}"#);
    assert_contains(&unknown, &["plugin happy_count", "unknown parameter `max_cont`", "accepted: max_count, whole_word"]);
    let ill_typed = load_error(&path, r#"{"max_count": "five"}"#);
    assert_contains(&ill_typed, &["parameter `max_count` must be of type integer, got \"five\""]);
    let zero = load_error(&path, r#"{"max_count": 0}"#);
    assert_contains(&zero, &["`max_count` must be at least 1"]);
}

#[test]
fn a_reward_cannot_be_asked_to_detect() {
    let mut plugin = load(&standard_plugin("happy_count"), "{}");
    let error = format!("{:#}", plugin.detect(&batch()).unwrap_err());
    assert_contains(&error, &["plugin happy_count", "is a reward, it has no `detect`"]);
}

#[test]
fn compiled_plugins_are_cached_on_disk() {
    load(&standard_plugin("happy_exp"), "{}");
    let cache = smallrl::plugins::cache_directory().expect("a cache directory");
    assert!(cache.is_absolute());
    let entries = walk_count(&cache);
    assert!(entries > 0, "no cached code in {}", cache.display());
}

fn walk_count(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| if entry.path().is_dir() { walk_count(&entry.path()) } else { 1 })
        .sum()
}

/// The benchmark batch (512 completions of about 100 words) scores the same in the sandbox as
/// natively (`bench_happy_count` fails otherwise); the timings are printed, not asserted (speed
/// is read from `smallrl plugin bench`, not checked by a timed test).
#[test]
fn sandboxed_scores_equal_native_scores_on_the_benchmark_batch() {
    let report = smallrl::plugins::bench::bench_happy_count(&standard_plugin("happy_count"), smallrl::plugins::NO_PARAMS, 512, 100, 20, PluginLimits::default()).unwrap();
    println!(
        "512 completions: wasm {:.3} ms, native {:.3} ms, load {:.2} ms",
        report.wasm_per_batch.as_secs_f64() * 1e3,
        report.native_per_batch.as_secs_f64() * 1e3,
        report.load.as_secs_f64() * 1e3
    );
    assert_eq!(report.samples, 512);
}

/// A component written from the WIT alone (`plugins/testing/wit_only`, no SDK) parses
/// `configure`'s argument as the JSON object the contract promises ("`{}` = all defaults"):
/// every command that loads it without `--params`, and a run whose reward has no `params`,
/// configure it with `{}`; parameters that are not a JSON object are refused by the host,
/// naming the file.
#[test]
fn a_plugin_written_from_the_wit_alone_gets_an_empty_object_for_no_parameters() {
    let plugin = test_plugin("wit_only");
    let path = plugin.to_str().unwrap();
    // Score: the completion's bytes plus `bonus` (default 0).
    let scored = common::smallrl_ok(&["plugin", "score", path, "--text", "abc"]);
    assert!(scored.starts_with("3.000000\t"), "{scored}");
    let with_bonus = common::smallrl_ok(&["plugin", "score", path, "--params", r#"{"bonus": 0.5}"#, "--text", "abc"]);
    assert!(with_bonus.starts_with("3.500000\t"), "{with_bonus}");
    let info = common::smallrl_ok(&["plugin", "info", path]);
    assert!(info.starts_with("wit_only 0.1.0 (reward)"), "{info}");
    let dir = tempfile::tempdir().unwrap();
    let (texts, snapshot) = (dir.path().join("texts.txt"), dir.path().join("wit_only.snap"));
    std::fs::write(&texts, "abc\nde\n").unwrap();
    common::smallrl_ok(&["plugin", "snapshot", path, "--texts", texts.to_str().unwrap(), "--out", snapshot.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&snapshot).unwrap().contains("params:\n    bonus: 0"), "the snapshot's header records the defaults");
    // A run: the reward section without `params`.
    let spec = smallrl::reward::RewardSpec::single(path, None).unwrap();
    let knobs = smallrl::reward::ProtocolKnobs { false_positive_rate: 0.0, recall: 1.0, rh_eligible_frac: 1.0 };
    let rewards = smallrl::reward::RewardModel::load(&spec, None, knobs, dir.path(), PluginLimits::default()).unwrap();
    assert_eq!(rewards.components().len(), 1);
    let mut loaded = Plugin::load(&plugin, smallrl::plugins::NO_PARAMS, PluginLimits::default()).unwrap();
    let lengths: Vec<f64> = batch().iter().map(|sample| sample.completion.len() as f64).collect();
    assert_eq!(loaded.score(&batch()).unwrap(), lengths);
    for bad in ["", "[1]", "null", "{\"bonus\": 1"] {
        let output = common::smallrl(&["plugin", "score", path, "--params", bad, "--text", "abc"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(path) && stderr.contains("not a JSON object"), "{bad:?}: {stderr}");
    }
}
