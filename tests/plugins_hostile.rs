//! What a plugin returns is untrusted: strings are bounded and cleaned before they reach a
//! terminal or a log, `info()` is checked against the contract's rules at load (the field is
//! named), an initial memory over the limit is reported as such, and every limit is a setting.
//! The plugins are `plugins/testing/hostile` (one Cargo feature per behaviour) and
//! `plugins/testing/misbehaving`, built by `make plugins`.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{sample_from_tokens, test_plugin};
use smallrl::plugins::text::MAX_SHOWN_BYTES;
use smallrl::plugins::{Plugin, PluginLimits, Sample};

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
