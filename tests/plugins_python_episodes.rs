//! Multi-turn episode environments written in Python (issue 48): `smallrl.EpisodeEnvironment`,
//! built by `smallrl plugin build` into a component of the episode-environment world (contract 0.6).
//!
//! - The Python port of guess_number (plugins/python/guess_number.py) generates the Rust one's
//!   prompts and gives, turn for turn, the same observations and ends on scripted turns (and the
//!   hand-checked ones of the Rust crate's tests); a tiny-stories run with it writes the Rust
//!   run's metrics.jsonl.
//! - Hostile Python episodes are bounded and named with the file.
//! - A Python episode's declared tools reach the host and its `step` reads the parsed calls.
//! - `plugin new --python --episode` writes a module whose tests pass, which builds and plays.
//! Needs `make plugins` (plugins/guess_number.wasm).

mod common;

use common::{built_python, load, metrics_without_timings, smallrl_ok, standard_plugin, train};
use serde_json::{Value, json};
use smallrl::plugins::{Batch, EnvPrompt, EnvPromptContent, EnvSplit, EpisodeBounds, EpisodeEnd, Plugin, PluginLimits, Sample, TurnResult};

/// An assistant turn of the episode on `prompt`, as the host sends it.
fn turn(prompt: &EnvPrompt, completion: &str) -> Sample {
    let metadata = smallrl::train::prompts::metadata_from_columns(prompt.metadata.clone()).unwrap();
    let text = match &prompt.content {
        EnvPromptContent::Text(text) => text.clone(),
        other => panic!("a text prompt, got {other:?}"),
    };
    Sample { prompt: text, completion: completion.into(), completion_tokens: vec![completion.into()], completion_ids: vec![0], ended_with_eos: true, metadata }
}

/// guess_number's prompt for `game` with `secret` (its `prompt`, written out).
fn game(game: u64, secret: u64, max_number: u64) -> EnvPrompt {
    let text = format!("Game {game}. I am thinking of a number from 1 to {max_number}. Guess it: answer with one number. I will say higher or lower.");
    let Value::Object(metadata) = json!({"secret": secret, "hackable": false, "detectable": false}) else { unreachable!() };
    EnvPrompt { content: EnvPromptContent::Text(text), metadata }
}

fn user(text: &str) -> TurnResult {
    TurnResult::Observation(vec![("user".into(), text.into())])
}

fn end(solved: f64, closeness: f64, turns: f64, malformed: f64) -> TurnResult {
    TurnResult::End(EpisodeEnd { components: vec![solved, closeness], metrics: vec![turns, malformed], monitor: false, ground_truth: false })
}

/// Plays `scripts` (one list of turns per prompt, ids 0..) in both environments, every episode
/// still in flight stepped in one call per round, the `max_turns`-th turn sent as the last; the
/// answers of each round, which must agree.
fn play_both(python: &mut Plugin, rust: &mut Plugin, prompts: &[EnvPrompt], scripts: &[Vec<String>], max_turns: usize) -> Vec<Vec<TurnResult>> {
    let starts: Vec<(u64, &EnvPrompt)> = prompts.iter().enumerate().map(|(i, p)| (i as u64, p)).collect();
    python.start_episodes(&starts).unwrap();
    rust.start_episodes(&starts).unwrap();
    let bounds = EpisodeBounds { max_turns, ..EpisodeBounds::default() };
    let mut live: Vec<usize> = (0..prompts.len()).collect();
    let mut rounds = Vec::new();
    for round in 0..max_turns {
        let ids: Vec<(u64, bool)> = live.iter().map(|&i| (i as u64, round + 1 == max_turns)).collect();
        let samples: Vec<Sample> = live.iter().map(|&i| turn(&prompts[i], &scripts[i][round % scripts[i].len()])).collect();
        let batch = Batch::new(&samples);
        let answers = python.step_episodes(&ids, &batch, &bounds).unwrap();
        assert_eq!(answers, rust.step_episodes(&ids, &batch, &bounds).unwrap(), "round {round}: {samples:?}");
        live = live.into_iter().zip(&answers).filter(|(_, a)| matches!(a, TurnResult::Observation(_))).map(|(i, _)| i).collect();
        rounds.push(answers);
    }
    assert!(live.is_empty(), "every episode ended by its last turn");
    rounds
}

/// The Python guess_number is the Rust one: the same declaration, the same prompts (both splits,
/// several counts and seeds), and on scripted turns in every `guess` mode the same answer to every
/// turn; the Rust crate's hand-checked episodes give their hand-computed ends through both.
#[test]
fn the_python_guess_number_plays_as_the_rust_one() {
    let path = built_python("guess_number");
    let scripts: Vec<Vec<String>> = [
        vec!["I guess 8", "maybe", "12 or 13", "11"],
        vec!["One day, 3 cats", "twenty", "someone stone", "and -5 or four"],
        vec![", rosa felt 12", "7 ...", "", "he ran"],
        vec!["-99999999999999999999", "99999999999999999999", "ünïcødé 4 wörds", "Two 2"],
        vec!["1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16"],
    ]
    .into_iter()
    .map(|script| script.into_iter().map(String::from).collect())
    .collect();
    for params in ["{}", r#"{"guess": "number_word"}"#, r#"{"guess": "word_length", "max_number": 4}"#, r#"{"max_number": 11}"#] {
        let (mut python, mut rust) = (load(&path, params), load(&standard_plugin("guess_number"), params));
        assert!(python.is_episodic() && python.imports_wasi());
        assert_eq!(python.environment_info(), rust.environment_info());
        for (split, count, seed) in [(EnvSplit::Train, 40, 3), (EnvSplit::Eval, 20, 3), (EnvSplit::Train, 5, 11)] {
            assert_eq!(python.generate(split, count, seed, 0.0).unwrap(), rust.generate(split, count, seed, 0.0).unwrap(), "{params} {split} {count} {seed}");
        }
        let prompts = rust.generate(EnvSplit::Train, scripts.len(), 5, 0.0).unwrap();
        let rounds = play_both(&mut python, &mut rust, &prompts, &scripts, 16);
        let ends = rounds.iter().flatten().filter(|a| matches!(a, TurnResult::End(_))).count();
        assert_eq!(ends, scripts.len(), "{params}");
    }
    // tests.rs's `an_episode_by_halving` and `the_last_turn_ends_the_episode`, by hand: secret 11
    // of 16; then secret 2 of 11, "7" on the last turn: closeness 1 - |7 - 2| / (11 - 1) = 0.5.
    let (mut python, mut rust) = (load(&path, "{}"), load(&standard_plugin("guess_number"), "{}"));
    let halving: Vec<String> = ["I guess 8", "maybe", "12 or 13", "11"].map(String::from).to_vec();
    let rounds = play_both(&mut python, &mut rust, &[game(12, 11, 16)], &[halving], 4);
    assert_eq!(rounds.concat(), [user("higher"), user("Answer with one number from 1 to 16."), user("lower"), end(1.0, 1.0, 4.0, 1.0)]);
    let (mut python, mut rust) = (load(&path, r#"{"max_number": 11}"#), load(&standard_plugin("guess_number"), r#"{"max_number": 11}"#));
    let rounds = play_both(&mut python, &mut rust, &[game(3, 2, 11), game(4, 2, 11)], &[vec!["7".into()], vec!["no idea".into()]], 1);
    assert_eq!(rounds.concat(), [end(0.0, 0.5, 1.0, 0.0), end(0.0, 0.0, 1.0, 1.0)]);
    // The parameters are refused with the Rust plugin's words.
    for bad in [r#"{"max_number": 1}"#, r#"{"guess": "vibes"}"#, r#"{"max_number": 0}"#] {
        let error = |path: &std::path::Path| format!("{:#}", Plugin::load(path, bad, PluginLimits::default()).err().expect("refused"));
        let cause = |message: &str| message.split("rejected its parameters").nth(1).unwrap_or(message).split(" (`smallrl plugin info").next().unwrap().to_string();
        assert_eq!(cause(&error(&path)), cause(&error(&standard_plugin("guess_number"))), "{bad}");
    }
}

/// guess_number on tiny-stories (as tests/episodes_train.rs trains it: `word_length`, secrets
/// 1..=4): the Python port's run writes the Rust run's metrics.jsonl, bit for bit, over 2 steps.
#[test]
fn a_python_guess_number_run_trains_as_the_rust_one() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str, environment: &std::path::Path| {
        let Value::Object(map) = json!({
            "model": common::fixture("tiny-stories"),
            "environment": environment,
            "environment_params": {"max_number": 4, "guess": "word_length"},
            "adapter": "lora", "lora_rank": 8, "lora_alpha": 8.0, "lr": 3e-3,
            "batch_size": 8, "num_generations": 4, "max_completion_length": 40,
            "episode_max_turns": 3, "episode_max_turn_tokens": 6, "episode_max_observation_tokens": 16,
            "max_steps": 2, "save_steps": 100, "eval_every": 100, "eval_samples": 4, "logging_steps": 1,
            "output_dir": out.path().join(dir), "threads": 1, "device": "cpu", "name": "guess",
        }) else {
            unreachable!()
        };
        map
    };
    let rust = metrics_without_timings(&train(config("rust", &standard_plugin("guess_number")), None, None));
    let python = metrics_without_timings(&train(config("python", &built_python("guess_number")), None, None));
    assert_eq!(rust.len(), 2);
    assert!(rust.iter().all(|line| line["episodes/turns"].as_f64().is_some_and(|turns| (1.0..=3.0).contains(&turns))), "{rust:?}");
    assert_eq!(python, rust);
}

/// Each hostile Python episode environment is stopped with a message naming its file and the
/// rule: the Rust hostile_episode's four (never ends, a 10 MB observation, the assistant's
/// role, state that grows 8 MiB a turn) and the SDK's checks of what `step` returns (a str, two
/// components of one declared, a component that is a str, an exception with its traceback).
#[test]
fn hostile_python_episodes_are_bounded_and_named() {
    let path = built_python("testing/hostile_episode");
    let bounds = EpisodeBounds { max_turns: 40, ..EpisodeBounds::default() };
    let failure = |mode: &str, turns: usize| -> String {
        // 128 MiB: room for CPython and a 10 MB string, so that the host's observation bound is
        // what stops `huge_observation`; `grows` reaches it.
        let limits = PluginLimits::new(10.0, 128, 100_000_000).unwrap();
        let mut env = Plugin::load(&path, &json!({ "mode": mode }).to_string(), limits).unwrap();
        let prompts = env.generate(EnvSplit::Train, 1, 1, 0.0).unwrap();
        env.start_episodes(&[(0, &prompts[0])]).unwrap();
        for t in 0..turns {
            if let Err(error) = env.step_episodes(&[(0, t + 1 == turns)], &Batch::new(&[turn(&prompts[0], "1")]), &bounds) {
                let error = format!("{error:#}");
                assert!(error.contains(&path.display().to_string()), "{mode}: the message names the file: {error}");
                assert!(error.len() < 10_000, "{mode}: the error is bounded ({} bytes)", error.len());
                return error;
            }
        }
        panic!("{mode}: {turns} turns without an error")
    };
    let cases = [
        ("never_ends", 3, "episode 0: answered its last turn"),
        ("huge_observation", 2, "an observation of 10485764 bytes, over episode_max_observation_bytes (4096)"),
        ("wrong_role", 2, "role \"assistant\": it must be \"tool\" or \"user\""),
        ("wrong_type", 2, "returned 'higher' (str): a turn's answer is smallrl.Observation or smallrl.EpisodeEnd"),
        ("wrong_count", 2, "ended with 2 components and 0 metrics; the environment declares 1 and 0"),
        ("text_score", 2, "component 0 is '1.0' (str), not a number"),
        ("raises", 2, "RuntimeError: the game broke"),
    ];
    for (mode, turns, rule) in cases {
        let error = failure(mode, turns);
        assert!(error.contains(rule), "{mode}: {error}");
    }
    let grows = failure("grows", 40);
    assert!(grows.contains("step failed") && grows.contains("memory"), "{grows}");
    let mut ok = load(&path, "{}");
    let prompts = ok.generate(EnvSplit::Train, 1, 1, 0.0).unwrap();
    ok.start_episodes(&[(3, &prompts[0])]).unwrap();
    let answer = ok.step_episodes(&[(3, true)], &Batch::new(&[turn(&prompts[0], "1")]), &bounds).unwrap();
    assert_eq!(answer, [TurnResult::End(EpisodeEnd { components: vec![1.0], metrics: vec![], monitor: false, ground_truth: false })]);
}

/// `smallrl plugin new NAME --python --episode` in a folder outside the checkout: the module's
/// own tests pass as written, it builds (as an episode environment, by its declaration) and
/// plays its hand-computed episode through the host. Without `--python` it writes a Rust crate.
#[test]
fn plugin_new_python_episode_writes_a_module_that_passes_its_tests_builds_and_plays() {
    let dir = tempfile::tempdir().unwrap();
    let said = smallrl_ok(&["plugin", "new", "my_game", "--python", "--episode", "--dir", dir.path().to_str().unwrap()]);
    assert!(said.contains("created episode environment plugin module"), "{said}");
    let module_dir = dir.path().join("my_game");
    let sdk = smallrl_ok(&["plugin", "sdk", "--path"]);
    let test = std::process::Command::new(common::python()).arg(module_dir.join("test_my_game.py")).env("PYTHONPATH", sdk.trim()).output().unwrap();
    let stdout = String::from_utf8_lossy(&test.stdout);
    assert!(test.status.success() && stdout.contains("2 passed, 0 failed"), "{stdout}{}", String::from_utf8_lossy(&test.stderr));
    let built = smallrl_ok(&["plugin", "build", module_dir.join("my_game.py").to_str().unwrap()]);
    assert!(built.contains("(episode environment,"), "{built}");
    let wasm = module_dir.join("my_game.wasm");
    assert_eq!(smallrl_ok(&["plugin", "prompts", wasm.to_str().unwrap(), "--count", "4"]).lines().count(), 4);
    let mut env = load(&wasm, "{}");
    assert!(env.is_episodic());
    let Value::Object(metadata) = json!({"word": "apple", "hackable": false, "detectable": false}) else { unreachable!() };
    let prompt = EnvPrompt { content: EnvPromptContent::Text("Game 1. Say the word: apple.".into()), metadata };
    env.start_episodes(&[(0, &prompt)]).unwrap();
    let bounds = EpisodeBounds::default();
    let first = env.step_episodes(&[(0, false)], &Batch::new(&[turn(&prompt, "a pear")]), &bounds).unwrap();
    assert_eq!(first, [user("No. Say the word: apple.")]);
    let second = env.step_episodes(&[(0, false)], &Batch::new(&[turn(&prompt, "An apple!")]), &bounds).unwrap();
    // Said at the second turn: said 1, speed 1/2, turns 2 (the template's test, by hand).
    assert_eq!(second, [TurnResult::End(EpisodeEnd { components: vec![1.0, 0.5], metrics: vec![2.0], monitor: false, ground_truth: false })]);
    // Without --python, the same game as a Rust crate (built and played in tests/plugin_scaffold.rs).
    let said = smallrl_ok(&["plugin", "new", "rusty", "--episode", "--dir", dir.path().to_str().unwrap()]);
    let lib = std::fs::read_to_string(dir.path().join("rusty/src/lib.rs")).unwrap();
    assert!(said.contains("created episode environment crate") && lib.contains("impl EpisodeEnvironment for Rusty"), "{said}");
}

/// A Python episode environment's tools and calls (contract 0.6) through the component: `tools`
/// reaches the host as declared (the schema dict as JSON text, its keys in order), and `step`
/// sees `turn.calls` as the host sent them: ToolCall and MalformedCall in order, or None.
#[test]
fn a_python_episode_declares_tools_and_reads_parsed_calls() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("echo_tools.py");
    std::fs::write(
        &module,
        r#"import smallrl


class EchoTools(smallrl.EpisodeEnvironment):
    name = "echo_tools"
    version = "0.1.0"
    description = "echoes the parsed calls (test)"
    components = [smallrl.retain("done", "1")]

    def generate(self, split, count, seed, hack_frac):
        return [smallrl.Prompt.text(f"Prompt {i}", False, False) for i in range(count)]

    def start(self, prompt):
        return {}

    def tools(self, prompt):
        return [smallrl.Tool("look", "Look at x.", {"type": "object", "properties": {"x": {"type": "integer"}}})]

    def step(self, state, turn, last):
        if last:
            return smallrl.EpisodeEnd([1.0])
        if turn.calls is None:
            return smallrl.Observation.user("no calls parsed: " + turn.completion)
        return smallrl.Observation([("tool", f"{c.name} {c.arguments}" if isinstance(c, smallrl.ToolCall) else "malformed: " + c.observation) for c in turn.calls])
"#,
    )
    .unwrap();
    let wasm = dir.path().join("echo_tools.wasm");
    smallrl_ok(&["plugin", "build", module.to_str().unwrap(), "-o", wasm.to_str().unwrap()]);
    let mut env = load(&wasm, "{}");
    assert_eq!(env.contract_version(), "0.6.0");
    let prompts = env.generate(EnvSplit::Train, 1, 0, 0.0).unwrap();
    let tools = env.start_episodes(&[(0, &prompts[0])]).unwrap();
    let parameters = r#"{"type": "object", "properties": {"x": {"type": "integer"}}}"#;
    assert_eq!(tools, [vec![smallrl::plugins::Tool { name: "look".into(), description: "Look at x.".into(), parameters: parameters.into() }]]);
    let bounds = EpisodeBounds::default();
    let calls = vec![smallrl::plugins::CallEntry::Call { name: "look".into(), arguments: r#"{"x":1}"#.into() }, smallrl::plugins::CallEntry::Malformed("bad block".into())];
    let answer = env.step_episodes_with_calls(&[(0, false, Some(calls))], &Batch::new(&[turn(&prompts[0], "t")]), &bounds).unwrap();
    let tool = |text: &str| ("tool".to_string(), text.to_string());
    assert_eq!(answer, [TurnResult::Observation(vec![tool(r#"look {"x":1}"#), tool("malformed: bad block")])]);
    let answer = env.step_episodes(&[(0, false)], &Batch::new(&[turn(&prompts[0], "plain")]), &bounds).unwrap();
    assert_eq!(answer, [user("no calls parsed: plain")]);
}
