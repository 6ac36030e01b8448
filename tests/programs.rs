//! The program runner (contract 0.4's `programs` import, `host/src/plugins/programs.rs`): in
//! one batch, hostile programs each end with their own status while the good programs beside
//! them get their results; nothing one program does reaches another; the same outcomes in two
//! processes; a plugin runs programs through the SDK, and a run records the runner's hash.

mod common;

use common::{load, sample_from_tokens, smallrl_ok, standard_plugin, test_plugin};
use smallrl::plugins::programs::{self, Outcome, Program, ProgramLimits, Status};

/// Limits small enough that the runaway programs end fast (an endless loop costs its fuel).
fn limits() -> ProgramLimits {
    ProgramLimits::new(300_000_000, 64, 4, std::time::Duration::from_secs(60)).unwrap()
}

fn exception(outcome: &Outcome) -> (&str, &str) {
    match &outcome.status {
        Status::Exception { type_name, message } => (type_name, message),
        other => panic!("expected an exception, got {other:?} ({outcome:?})"),
    }
}

/// The hostile programs of issue 45 in one batch with good ones between them.
#[test]
fn each_hostile_program_gets_its_own_status_while_the_good_ones_get_their_results() {
    let batch = [
        /* 0 */ Program::source("def add(a, b):\n    return a + b\nprint(add(40, 2))\n"),
        /* 1 */ Program::source("while True:\n    pass\n"),
        /* 2 */ Program::source("blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 20))\n"),
        /* 3 */ Program::source("def down(n):\n    return down(n + 1)\ndown(0)\n"),
        /* 4 */ Program::source("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)\n"),
        /* 5 */ Program::source("print(open('/etc/passwd').read())\n"),
        /* 6 */ Program::source("import os\nprint(dict(os.environ), os.listdir('.'))\n"),
        /* 7 */ Program::source("import socket\nsocket.create_connection(('127.0.0.1', 80))\n"),
        /* 8 */ Program::source("import os\nprint('bye', flush=True)\nos._exit(3)\n"),
        /* 9 */ Program::source("import builtins\nbuiltins.len = lambda x: -1\nbuiltins.print = lambda *a, **k: None\nimport math\nmath.pi = 3\n"),
        /* 10 */ Program::source("import math\nprint(len([1, 2, 3]), math.pi)\n"),
        /* 11 */ Program::source("print('all tests passed')\nassert 1 + 1 == 3, 'arithmetic'\n"),
        /* 12 */ Program::source("import sys\nsys.exit(0)\n"),
        /* 13 */ Program::source("import sys\nsys.exit('a message')\n"),
        /* 14 */ Program::source("def f(:\n"),
        /* 15 */ Program::source("import sys\nprint(sys.stdin.read().upper(), end='')\n").with_stdin("read me\n"),
        /* 16 */ Program::source("from checks import check\nprint(check(open('data.txt').read()))\n")
            .with_file("checks.py", "def check(text):\n    return text.count('a')\n")
            .with_file("data.txt", "banana"),
        /* 17 */ Program::source("open('new.txt', 'w').write('x')\n").with_file("data.txt", "kept"),
    ];
    let outcomes = programs::run(&batch, limits()).unwrap();
    assert_eq!(outcomes.len(), batch.len());
    let status = |i: usize| &outcomes[i].status;
    // Good programs: their results, whatever ran beside them.
    assert_eq!((status(0), outcomes[0].stdout.as_str()), (&Status::Normal, "42\n"));
    assert_eq!((status(15), outcomes[15].stdout.as_str()), (&Status::Normal, "READ ME\n"));
    assert_eq!((status(16), outcomes[16].stdout.as_str()), (&Status::Normal, "3\n"));
    // Runaways: a status each, never an error of the batch.
    assert_eq!(status(1), &Status::OutOfFuel);
    assert_eq!(status(2), &Status::OutOfMemory);
    assert_eq!(exception(&outcomes[3]).0, "RecursionError");
    assert_eq!(status(4), &Status::OutputOverLimit);
    assert_eq!(outcomes[4].stdout.len(), 4 << 10, "stopped at its limit, its output so far kept");
    // No host file, no environment, no directory but its own (empty: no files), no socket.
    assert_eq!(exception(&outcomes[5]).0, "FileNotFoundError");
    assert_eq!((status(6), outcomes[6].stdout.as_str()), (&Status::Normal, "{} []\n"));
    assert!(matches!(status(7), Status::Exception { .. }), "{:?}", outcomes[7]);
    // os._exit ends the program with status 1 (WASI 0.2 carries no other), its flushed output kept.
    assert_eq!((status(8), outcomes[8].stdout.as_str()), (&Status::Exit(1), "bye\n"));
    // Rebound builtins and modules stay in their program: the next one sees the real ones.
    assert_eq!(status(9), &Status::Normal);
    assert_eq!((status(10), outcomes[10].stdout.as_str()), (&Status::Normal, "3 3.141592653589793\n"));
    // A printed claim is only text: the status says the assertion failed.
    assert_eq!(outcomes[11].stdout, "all tests passed\n");
    assert_eq!(exception(&outcomes[11]), ("AssertionError", "arithmetic"));
    assert!(outcomes[11].stderr.contains("Traceback") && outcomes[11].stderr.contains("AssertionError: arithmetic"), "{}", outcomes[11].stderr);
    assert_eq!(status(12), &Status::Exit(0));
    assert_eq!((status(13), outcomes[13].stderr.as_str()), (&Status::Exit(1), "a message\n"));
    assert_eq!(exception(&outcomes[14]).0, "SyntaxError");
    // The private directory is read-only.
    assert!(matches!(exception(&outcomes[17]).0, "PermissionError" | "OSError"), "{:?}", outcomes[17]);
}

/// A refused request is an error naming the program and the rule; nothing runs.
#[test]
fn bad_file_names_are_refused() {
    for name in ["../escape", "a/b", "", "..", "x\0y"] {
        let error = programs::run(&[Program::source("pass"), Program::source("pass").with_file(name, "")], limits()).unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains("program 1") && message.contains("not a plain file name"), "{name:?}: {message}");
    }
    let twice = Program::source("pass").with_file("a", "1").with_file("a", "2");
    assert!(format!("{:#}", programs::run(&[twice], limits()).unwrap_err()).contains("given twice"));
}

/// What could vary between processes (random numbers, clocks, object ids, string hashes) is
/// the same in two `smallrl plugin programs` processes, and the same as in this one.
#[test]
fn the_same_programs_give_the_same_outcomes_in_two_processes() {
    let sources = [
        "import random, os, time\nprint(random.random(), os.urandom(8).hex(), time.time(), time.monotonic_ns())\n",
        "print(hash('abc'), id(object()) % 1000, {'b', 'a', 'c'})\n",
        "while True:\n    pass\n",
        "raise KeyError('k')\n",
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("programs.json");
    std::fs::write(&file, serde_json::to_string(&sources).unwrap()).unwrap();
    let args = ["plugin", "programs", file.to_str().unwrap(), "--program-fuel", "20000000"];
    let first = smallrl_ok(&args);
    let second = smallrl_ok(&args);
    assert_eq!(first, second);
    let here = programs::run(&sources.map(Program::source), ProgramLimits { fuel: 20_000_000, ..ProgramLimits::default() }).unwrap();
    let expected: String = here.iter().map(|outcome| format!("{}\n", programs::outcome_json(outcome))).collect();
    assert_eq!(first, expected);
    assert!(first.lines().nth(2).unwrap().contains("\"out-of-fuel\""), "{first}");
}

/// A reward built with the Rust SDK runs a batch's completions as programs in one call: each
/// ends its own way (the plugin's scores say how: see plugins/testing/programs), the batch is
/// scored, and the plugin reports the runner it needs (a run records its hash).
#[test]
fn a_plugin_runs_a_batch_of_programs_through_the_sdk() {
    let mut plugin = load(&test_plugin("programs"), "{}");
    assert_eq!(plugin.contract_version(), "0.6.0");
    let completions = ["print(6 * 7)", "while True: pass", "raise ValueError('no')", "import sys; sys.exit(3)", "print(1)"];
    let samples: Vec<_> = completions
        .iter()
        .map(|completion| {
            let mut sample = sample_from_tokens("x");
            sample.completion = completion.to_string();
            sample
        })
        .collect();
    assert_eq!(plugin.score(&samples).unwrap(), [1.5, 4.0, 3.0, 2.03, 1.0]);
    let (path, sha256) = plugin.program_runner().expect("it imports the program runner");
    assert_eq!(sha256, smallrl::plugins::sha256_hex(&std::fs::read(path).unwrap()));
    assert!(load(&standard_plugin("happy_count"), "{}").program_runner().is_none());
}

/// A short training run whose reward runs every completion as a program (tiny-stories writes
/// stories, not Python: each one's status is scored, here a SyntaxError or NameError, 3): the
/// run continues to its end and records the runner's SHA-256 with the plugins' hashes.
#[test]
fn a_run_whose_reward_runs_programs_trains_and_records_the_runner() {
    let out = tempfile::tempdir().unwrap();
    let mut config = common::tiny_stories_run(out.path(), &test_plugin("programs"), "programs");
    config.insert("max_steps".into(), 2.into());
    common::one_thread();
    let config = smallrl::train::TrainConfig::resolve(None, config).unwrap();
    let run = smallrl::train::Trainer::new(config, None).unwrap().train(None).unwrap().run_dir;
    let metrics = common::read_jsonl(run.join("metrics.jsonl"));
    let steps: Vec<&serde_json::Value> = metrics.iter().filter(|line| line.get("reward").is_some()).collect();
    assert_eq!(steps.len(), 2, "{metrics:?}");
    for step in steps {
        let reward = step["reward"].as_f64().unwrap();
        assert!((1.0..=8.5).contains(&reward), "a mean of the statuses' scores: {reward}");
    }
    let recorded = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    let runner = programs::runner().unwrap();
    assert!(recorded.contains(&format!("program runner {}", runner.path().display())) && recorded.contains(runner.sha256()), "{recorded}");
}

/// The runner's instances come from a pool whose slots are reset, not unmapped, between
/// programs (`plugins/runtime.rs`): a program alone in its call reuses the slot the call before
/// it used, and must still find the interpreter as built.
#[test]
fn a_program_in_a_reused_pool_slot_starts_from_a_fresh_interpreter() {
    let dirty = "import builtins, sys, math\nbuiltins.len = lambda x: -1\nmath.pi = 3\nsys.modules['marker'] = 'left behind'\nbuiltins.leftover = bytearray(8 << 20)\n";
    let check = "import builtins, sys, math\nprint(len([1, 2, 3]), math.pi, 'marker' in sys.modules, hasattr(builtins, 'leftover'))\n";
    for round in 0..3 {
        let dirtied = programs::run(&[Program::source(dirty)], limits()).unwrap();
        assert_eq!(dirtied[0].status, Status::Normal, "round {round}: {:?}", dirtied[0]);
        let checked = programs::run(&[Program::source(check)], limits()).unwrap();
        assert_eq!((&checked[0].status, checked[0].stdout.as_str()), (&Status::Normal, "3 3.141592653589793 False False\n"), "round {round}");
    }
}

/// More programs alive at once than the pool has slots (calls from many threads, as packed runs
/// make): each waits for a slot and gets its result; none fails to instantiate.
#[test]
fn more_concurrent_programs_than_pool_slots_each_get_their_result() {
    let calls = programs::PROGRAM_SLOTS as usize + 8;
    let source = "total = 0\nfor i in range(100000):\n    total += i\nprint(total)\n";
    let outcomes: Vec<Vec<Outcome>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..calls).map(|_| scope.spawn(|| programs::run(&[Program::source(source)], limits()).unwrap())).collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    for (call, outcome) in outcomes.iter().enumerate() {
        // 0 + 1 + ... + 99999, by hand: 99999 * 100000 / 2.
        assert_eq!((&outcome[0].status, outcome[0].stdout.as_str()), (&Status::Normal, "4999950000\n"), "call {call}");
    }
}
