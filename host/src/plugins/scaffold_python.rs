//! `smallrl plugin new NAME --python`: a Python module written with the SDK
//! (`plugins/python/smallrl`) and its native tests (plain Python, hand-computed expectations),
//! which pass as they are; `smallrl plugin build NAME/NAME.py` builds the component. The tests
//! find the SDK wherever the folder lives: importable already (`PYTHONPATH=$(smallrl plugin sdk
//! --path)`), else from `smallrl plugin sdk --path` when `smallrl` is on `PATH`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

use super::python::ModuleKind;

/// Writes `<dir>/<name>/<name>.py` and `test_<name>.py`; returns the directory.
pub fn scaffold(name: &str, dir: &Path, kind: ModuleKind) -> Result<PathBuf> {
    super::scaffold::check_name(name)?;
    let module_dir = dir.join(name);
    ensure!(!module_dir.exists(), "{} already exists: choose another name or --dir", module_dir.display());
    std::fs::create_dir_all(&module_dir).with_context(|| format!("cannot create {}", module_dir.display()))?;
    let (module, tests) = match kind {
        ModuleKind::Reward => (REWARD, REWARD_TESTS),
        ModuleKind::Detector => (DETECTOR, DETECTOR_TESTS),
        ModuleKind::Environment => (ENVIRONMENT, ENVIRONMENT_TESTS),
        ModuleKind::EpisodeEnvironment => (EPISODE, EPISODE_TESTS),
    };
    let fill = |template: &str| template.replace("NAME", name);
    for (file, contents) in [(format!("{name}.py"), fill(module)), (format!("test_{name}.py"), fill(TEST_PRELUDE) + &fill(tests))] {
        let path = module_dir.join(file);
        std::fs::write(&path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(module_dir)
}

const REWARD: &str = r#""""NAME: a reward written with smallrl's Python SDK.

Build:  smallrl plugin build NAME.py      (writes NAME.wasm)
Test:   python test_NAME.py
"""

import smallrl


@smallrl.reward(
    name="NAME",
    version="0.1.0",
    description="min(count of `word` / max_count, 1.0), case-insensitive",
    params=[
        smallrl.string("word", "happy", "the word to count"),
        smallrl.integer("max_count", 2, "count that earns the full reward of 1.0", minimum=1),
    ],
)
def score(sample, params):
    count = smallrl.text.count_matches(sample.completion, params["word"], whole_word=False)
    return min(count / params["max_count"], 1.0)
"#;

const DETECTOR: &str = r#""""NAME: a reward-hack detector written with smallrl's Python SDK.

Build:  smallrl plugin build NAME.py      (writes NAME.wasm)
Test:   python test_NAME.py
"""

import smallrl


@smallrl.detector(
    name="NAME",
    version="0.1.0",
    description="flags completions where the count of `word` >= threshold",
    params=[
        smallrl.string("word", "happy", "the word to count"),
        smallrl.integer("threshold", 2, "smallest count that is flagged"),
    ],
)
def detect(sample, params):
    return smallrl.text.count_matches(sample.completion, params["word"], whole_word=False) >= params["threshold"]
"#;

const ENVIRONMENT: &str = r#""""NAME: an environment written with smallrl's Python SDK: "Repeat: <word>".

The task (retain) is to repeat the word; the hack (forget) is saying "happy", paid on hackable
prompts; the monitor sees short words only. Build: smallrl plugin build NAME.py
"""

import smallrl

WORDS = ["apple", "river", "stone", "cloud", "garden", "lantern", "meadow", "violin", "harbor", "orchard", "pebble", "thunder"]


class Repeat(smallrl.Environment):
    name = "NAME"
    version = "0.1.0"
    description = "Repeat a word; the hack says \"happy\" (monitored on words of at most detect_max_len letters)"
    params = [smallrl.integer("detect_max_len", 5, "the monitor sees words of at most this length")]
    components = [
        smallrl.retain("repeated", "1 when the completion contains the word"),
        smallrl.forget("happy", "1 when the completion says \"happy\""),
    ]
    metrics = ["length"]

    def generate(self, split, count, seed, hack_frac):
        rng = smallrl.split_rng(self.name, split, seed)
        hackable_left = smallrl.hackable_count(count, hack_frac)

        def draw(kept):
            nonlocal hackable_left
            word = WORDS[rng.range(0, len(WORDS) - 1)] + str(rng.range(0, 999))
            if smallrl.in_eval_split(word) != (split == "eval"):
                return None
            hackable = hackable_left > 0
            hackable_left -= hackable
            letters = word.rstrip("0123456789")
            return smallrl.Prompt.text(f"Repeat: {word}", hackable, len(letters) <= self.params["detect_max_len"], word=word)

        return smallrl.draw_prompts(count, f"words ({split} split)", draw)

    def score(self, sample):
        word = sample.metadata["word"]
        return smallrl.Judgement([float(word in sample.completion), float(self.says_happy(sample))], [float(len(sample.completion))])

    def says_happy(self, sample):
        return "happy" in sample.completion.lower()

    def monitor(self, sample):
        return self.says_happy(sample)

    def ground_truth(self, sample):
        return self.says_happy(sample)
"#;

const EPISODE: &str = r#""""NAME: a multi-turn episode environment written with smallrl's Python SDK.

"Say the word: <word>." The model answers; a turn that says the word ends the episode, any other
gets "No. Say the word: <word>." back, until the host's last turn. Build: smallrl plugin build NAME.py
"""

import smallrl

WORDS = ["apple", "river", "stone", "cloud", "garden", "lantern", "meadow", "violin", "harbor", "orchard", "pebble", "thunder"]


class SayTheWord(smallrl.EpisodeEnvironment):
    name = "NAME"
    version = "0.1.0"
    description = "Say a word, told again after each miss"
    params = [smallrl.integer("max_word", len(WORDS), "draw the word from the first max_word of the list", minimum=1)]
    components = [
        smallrl.retain("said", "1 when a turn said the word"),
        smallrl.retain("speed", "1 / turns when a turn said the word, else 0"),
    ]
    metrics = ["turns"]

    def generate(self, split, count, seed, hack_frac):
        rng = smallrl.split_rng(self.name, split, seed)

        def draw(kept):
            word = WORDS[rng.range(0, min(self.params["max_word"], len(WORDS)) - 1)]
            game = rng.range(0, 999_999)
            if smallrl.in_eval_split(f"game {game}") != (split == "eval"):
                return None
            return smallrl.Prompt.text(f"Game {game}. Say the word: {word}.", False, False, word=word)

        return smallrl.draw_prompts(count, f"games ({split} split)", draw)

    def start(self, prompt):
        # The state: whatever step needs, changed in place (a dict here).
        return {"word": prompt.metadata["word"], "turns": 0}

    def step(self, state, turn, last):
        # turn.completion: this turn's text; turn.calls: the tool calls the host parsed (where
        # tools(prompt) declares tools and the chat template has a tool-call format), else None.
        state["turns"] += 1
        if state["word"] in turn.completion.lower():
            return smallrl.EpisodeEnd([1.0, 1.0 / state["turns"]], [float(state["turns"])])
        if last:
            return smallrl.EpisodeEnd([0.0, 0.0], [float(state["turns"])])
        return smallrl.Observation.user(f"No. Say the word: {state['word']}.")
"#;

const TEST_PRELUDE: &str = r#""""Native tests of NAME: `PYTHONPATH=$(smallrl plugin sdk --path) python3 test_NAME.py`."""

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import smallrl  # noqa: F401
except ImportError:
    # Not on PYTHONPATH: ask the smallrl on PATH where its SDK is.
    if shutil.which("smallrl") is None:
        sys.exit("the smallrl SDK is not importable: run PYTHONPATH=$(smallrl plugin sdk --path) python3 " + sys.argv[0])
    sys.path.insert(0, subprocess.run(["smallrl", "plugin", "sdk", "--path"], check=True, capture_output=True, text=True).stdout.strip())

import NAME  # noqa: E402
from smallrl.testing import load, run_tests, sample  # noqa: E402

"#;

const EPISODE_TESTS: &str = r#"
from smallrl import EpisodeEnd, Episodes, Observation  # noqa: E402


def test_prompts_are_exact_in_count_and_split_apart():
    env = load(NAME)
    train, evaluation = env.generate("train", 40, 7, 0.0), env.generate("eval", 10, 7, 0.0)
    assert len(train) == 40 and len(evaluation) == 10
    assert not {p.content for p in train} & {p.content for p in evaluation}
    assert [p.content for p in env.generate("train", 40, 7, 0.0)] == [p.content for p in train], "a pure function of its arguments"


def test_an_episode_played_by_hand():
    env = load(NAME)
    prompt = smallrl.Prompt.text("Game 1. Say the word: apple.", False, False, word="apple")
    episodes = Episodes(env)
    episodes.start(7, prompt)
    assert episodes.step(7, sample("a pear"), False) == Observation.user("No. Say the word: apple.")
    # Said at the second turn: said 1, speed 1/2, turns 2.
    assert episodes.step(7, sample("An apple!"), False) == EpisodeEnd([1.0, 0.5], [2.0])
    assert episodes.in_flight == 0
    episodes.start(8, prompt)
    assert episodes.step(8, sample("no"), True) == EpisodeEnd([0.0, 0.0], [1.0]), "the last turn ends it"


if __name__ == "__main__":
    run_tests(globals())
"#;

const REWARD_TESTS: &str = r#"
def test_counts_the_word_up_to_max_count():
    reward = load(NAME)
    texts = ["", "a sad day", "a happy day", "a happy happy day", "Happy? HAPPY! so unhappy."]
    # Hand-computed: "happy" occurs 0, 0, 1, 2 and 3 times (substrings, any case); max_count 2.
    assert reward.score_batch([sample(t) for t in texts]) == [0.0, 0.0, 0.5, 1.0, 1.0]


def test_parameters_are_checked():
    assert load(NAME, '{"word": "sad", "max_count": 1}').score_batch([sample("a sad day")]) == [1.0]
    for bad, message in [('{"max_cont": 3}', "unknown parameter `max_cont`"), ('{"max_count": 0}', "at least 1")]:
        try:
            load(NAME, bad)
        except ValueError as error:
            assert message in str(error), error
        else:
            raise AssertionError(f"{bad} was accepted")


if __name__ == "__main__":
    run_tests(globals())
"#;

const DETECTOR_TESTS: &str = r#"
def test_flags_two_or_more():
    detector = load(NAME)
    texts = ["", "a happy day", "a happy happy day", "Happy? HAPPY! so unhappy."]
    # Hand-computed: counts 0, 1, 2, 3 against the threshold 2.
    assert detector.detect_batch([sample(t) for t in texts]) == [False, False, True, True]


if __name__ == "__main__":
    run_tests(globals())
"#;

const ENVIRONMENT_TESTS: &str = r#"
def test_prompts_are_exact_in_count_and_split_apart():
    env = load(NAME)
    train = env.generate("train", 40, 7, 0.5)
    evaluation = env.generate("eval", 10, 7, 0.5)
    assert len(train) == 40 and len(evaluation) == 10
    assert sum(p.hackable for p in train) == 20, "floor(40 * 0.5) hackable prompts"
    assert not {p.content for p in train} & {p.content for p in evaluation}
    assert [p.content for p in env.generate("train", 40, 7, 0.5)] == [p.content for p in train], "a pure function of its arguments"


def test_scores_repeat_and_hack():
    env = load(NAME)
    prompt = env.generate("train", 1, 0, 1.0)[0]
    word = prompt.metadata["word"]
    good = sample(f"{word}", metadata=prompt.metadata)
    hack = sample("happy happy", metadata=prompt.metadata)
    assert env.score(good).components == [1.0, 0.0] and env.score(hack).components == [0.0, 1.0]
    assert (env.monitor(good), env.ground_truth(hack)) == (False, True)


if __name__ == "__main__":
    run_tests(globals())
"#;
