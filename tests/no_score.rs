//! "No score" (contract 0.5, issue 45 item 2): a reward may leave a sample without a score, as a
//! TRL reward function returns `None`; a plugin built against the frozen 0.4 contract (a score
//! for every sample, programs through 0.4's import) loads and scores exactly as before.

mod common;

use common::{load, sample_from_tokens, smallrl_ok, test_plugin};
use smallrl::reward::{PluginLimits, ProtocolKnobs, RewardModel, RewardSpec, Sample};

fn samples(completions: &[&str]) -> Vec<Sample> {
    completions
        .iter()
        .map(|completion| {
            let mut sample = sample_from_tokens("x");
            sample.completion = completion.to_string();
            sample
        })
        .collect()
}

/// plugins/testing/legacy_v0_4, built against wit/0.4.0: the count of "happy" plus 10 when the
/// completion runs to its end as a Python program (through 0.4's `programs` import), by hand.
#[test]
fn a_reward_built_against_contract_0_4_loads_and_scores_as_before() {
    let mut plugin = load(&test_plugin("legacy_v0_4"), "{}");
    assert_eq!(plugin.contract_version(), "0.4.0");
    assert!(plugin.program_runner().is_some(), "it imports 0.4's program runner");
    let completions = ["print(1)", "happy happy", "x = 'happy'"];
    assert_eq!(plugin.score(&samples(&completions)).unwrap(), [10.0, 2.0, 11.0]);
    assert_eq!(plugin.score_optional(&samples(&completions)).unwrap(), [Some(10.0), Some(2.0), Some(11.0)]);
}

/// plugins/testing/no_score (the Rust SDK's `score_batch_optional`): no score for a completion
/// with "skip", the count of "happy" otherwise; `plugin score` prints `none`; asking for every
/// score names the plugin and the sample.
#[test]
fn a_rust_reward_gives_a_sample_no_score() {
    let path = test_plugin("no_score");
    let mut plugin = load(&path, "{}");
    assert_eq!(plugin.contract_version(), "0.6.0");
    let batch = samples(&["happy happy", "skip happy", "happy"]);
    assert_eq!(plugin.score_optional(&batch).unwrap(), [Some(2.0), None, Some(1.0)]);
    let error = format!("{:#}", plugin.score(&batch).unwrap_err());
    assert!(error.contains("plugin no_score (reward,") && error.contains("score gave sample 1 no score"), "{error}");
    let printed = smallrl_ok(&["plugin", "score", path.to_str().unwrap(), "--text", "happy", "--text", "skip"]);
    assert_eq!(printed.lines().collect::<Vec<_>>(), ["1.000000\thappy", "none\tskip"]);
}

/// A run's rewards refuse a sample without a score (`max_no_score_frac` 0, the default),
/// naming the component, the plugin and the sample; the trainer adds the step
/// ("scoring the completions of step N failed"). Above 0: tests/train/no_score.rs.
#[test]
fn a_runs_rewards_refuse_a_sample_without_a_score_naming_it() {
    let spec = RewardSpec::single(test_plugin("no_score").to_str().unwrap(), None).unwrap();
    let mut rewards = RewardModel::load(&spec, None, ProtocolKnobs { false_positive_rate: 0.0, recall: 1.0, rh_eligible_frac: 1.0 }, &common::plugin_dir(), PluginLimits::default()).unwrap();
    let scored = rewards.score(&samples(&["happy", "happy happy"]), 1).unwrap();
    assert_eq!(scored.reward, [1.0, 2.0]);
    let error = format!("{:#}", rewards.score(&samples(&["happy", "a", "skip"]), 1).unwrap_err());
    assert!(error.contains("reward component `no_score` failed") && error.contains("gave sample 2 no score"), "{error}");
}

/// `plugin score` counts the samples without a score (on stderr, beside their `none` lines);
/// `plugin bench` times a reward that gives some samples none, compares the others with the
/// native happy_count and counts them, at `--path` and through `--config` alike.
#[test]
fn plugin_score_and_bench_count_the_samples_without_a_score() {
    let path = test_plugin("no_score");
    let output = common::smallrl(&["plugin", "score", path.to_str().unwrap(), "--text", "happy", "--text", "skip", "--text", "happy skip"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout.lines().collect::<Vec<_>>(), ["1.000000\thappy", "none\tskip", "none\thappy skip"]);
    assert!(stderr.contains("no score: 2 of 3 samples"), "{stderr}");
    let bench = ["plugin", "bench", "--path", path.to_str().unwrap(), "--samples", "8", "--words", "20", "--iterations", "1"];
    let printed = smallrl_ok(&[&bench[..], &["--params", r#"{"none_at": ["0", "3", "5"], "score": "happy_count"}"#]].concat());
    assert!(printed.contains("no score: 3 of 8 samples (contract 0.5's none") && printed.contains("wasm fuel"), "{printed}");
    let all_scored = smallrl_ok(&[&bench[..], &["--params", r#"{"score": "happy_count"}"#]].concat());
    assert!(!all_scored.contains("no score") && all_scored.contains("wasm fuel"), "every sample scored: nothing to count");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("no_score.yaml");
    std::fs::write(&config, format!("reward:\n  plugin: {}\n  params: {{none_at: ['1', '2']}}\n", path.display())).unwrap();
    let happy_count = common::standard_plugin("happy_count");
    let printed = smallrl_ok(&["plugin", "bench", "--path", happy_count.to_str().unwrap(), "--samples", "8", "--words", "20", "--iterations", "2", "--config", config.to_str().unwrap()]);
    assert!(printed.contains("RewardModel::score of") && printed.contains("no score: 2 of 8 samples"), "{printed}");
}
