"""smallrl's Python SDK: rewards, detectors and environments as WebAssembly components.

Declare parameters, write the function; `smallrl plugin build FILE.py` turns the module into a
component (componentize-py, CPython inside) that the host runs in the same sandbox as a Rust
plugin: no filesystem, network, environment or arguments, a fixed clock and a random stream
seeded by the plugin and the call's inputs (see plugins/README.md, "Write a reward in Python").

A reward (a decorated function, or a class with ``score(self, sample)``)::

    import smallrl

    @smallrl.reward(name="my_reward", version="0.1.0", description="...",
                    params=[smallrl.integer("max_count", 5, "count that earns 1.0")])
    def score(sample, params):
        return min(sample.completion.count("happy") / params["max_count"], 1.0)

A detector: ``@smallrl.detector(...)`` on ``detect(sample, params) -> bool``. An environment: a
subclass of :class:`Environment`; a multi-turn one (episodes) of :class:`EpisodeEnvironment`. A TRL reward function ``f(prompts, completions, **kwargs)``
builds as it is (see :func:`trl_reward`).

Pure Python, no dependencies: the module `_component` (used only inside the component) binds
these classes to the bindings componentize-py generates.
"""

import json

from .environment import (
    DRAWS_PER_PROMPT,
    SplitMix64,
    draw_prompts,
    fnv1a,
    hackable_count,
    in_eval_split,
    ints,
    split_rng,
)
from .episode import EpisodeEnd, Episodes, MalformedCall, Observation, Tool, ToolCall
from .params import Param, Params, boolean, hf_dataset, integer, number, string, string_list
from . import text

__all__ = [
    "DRAWS_PER_PROMPT", "Detector", "Environment", "EpisodeEnd", "EpisodeEnvironment", "Episodes", "Judgement", "JudgeError", "Param", "Params",
    "Prompt", "Reward", "Sample", "SplitMix64", "boolean", "detector", "draw_prompts", "fnv1a",
    "forget", "hackable_count", "hf_dataset", "in_eval_split", "integer", "ints", "judge",
    "number", "MalformedCall", "Observation", "Tool", "ToolCall", "Turn", "Outcome", "PROMPT_MESSAGES", "Program", "ProgramError", "retain", "reward", "run_programs", "split_rng",
    "string", "string_list", "text", "trl_reward",
]


class Sample:
    """One completion as the host sends it (`sample` in wit/smallrl-reward.wit)."""

    __slots__ = ("prompt", "completion", "completion_ids", "ended_with_eos", "metadata_json", "_joined", "_ends", "_metadata")

    def __init__(self, prompt, completion, tokens_joined, token_ends, completion_ids, ended_with_eos, metadata_json):
        self.prompt = prompt
        self.completion = completion
        self.completion_ids = completion_ids
        self.ended_with_eos = ended_with_eos
        self.metadata_json = metadata_json
        self._joined = tokens_joined
        self._ends = token_ends
        self._metadata = None

    @property
    def tokens(self):
        """The completion's token strings, in order (no end-of-sequence token): for a WordPiece
        vocabulary its vocabulary strings (``##`` pieces kept), else its pieces of the text."""
        joined = self._joined.encode("utf-8")
        starts = [0] + list(self._ends[:-1])
        return [joined[start:end].decode("utf-8", "replace") for start, end in zip(starts, self._ends)]

    @property
    def metadata(self):
        """The prompt's metadata as a dict (empty when the prompt has none)."""
        if self._metadata is None:
            self._metadata = json.loads(self.metadata_json) if self.metadata_json is not None else {}
        return self._metadata



class Turn(Sample):
    """One assistant turn of an episode: a :class:`Sample` of the turn's text, and ``calls``:
    the tool calls the host parsed from it (:class:`ToolCall` and :class:`MalformedCall`, in
    order), or None where it did not parse (see :mod:`smallrl.episode`)."""

    __slots__ = ("calls",)

    def __init__(self, sample, calls=None):
        super().__init__(sample.prompt, sample.completion, sample._joined, sample._ends, sample.completion_ids, sample.ended_with_eos, sample.metadata_json)
        self.calls = calls

class _Declared:
    """What every plugin declares: its name, version, description and parameters."""

    name = None
    version = "0.1.0"
    description = ""
    params = ()

    def configure(self, params):
        """Called once with the checked :class:`Params` (also ``self.params``); raise
        ValueError to refuse them."""


class Reward(_Declared):
    """A reward: ``score(self, sample) -> float`` (one finite number per sample), or ``None``
    for a sample without a score (contract 0.5, a TRL reward function's ``None``: ``plugin
    score`` prints ``none``; a training run stops, naming the plugin, the step and the sample)."""

    def score(self, sample):
        raise NotImplementedError(f"{type(self).__name__} must define score(self, sample)")

    def score_batch(self, samples):
        return [self.score(sample) for sample in samples]


class Detector(_Declared):
    """A reward-hack detector: ``detect(self, sample) -> bool``."""

    def detect(self, sample):
        raise NotImplementedError(f"{type(self).__name__} must define detect(self, sample)")

    def detect_batch(self, samples):
        return [bool(self.detect(sample)) for sample in samples]


def _from_function(base, method, function, name, version, description, params):
    """A plugin class whose `method` calls `function(sample, params)`."""
    if name is None:
        name = function.__name__

    def call(self, sample):
        return function(sample, self.params)

    attributes = {"name": name, "version": version, "description": description or (function.__doc__ or "").strip(), "params": tuple(params), method: call}
    plugin = type(function.__name__, (base,), attributes)
    plugin.__module__ = function.__module__
    return plugin


def reward(name=None, version="0.1.0", description="", params=()):
    """Declares ``score(sample, params) -> float`` as the module's reward."""
    return lambda function: _from_function(Reward, "score", function, name, version, description, params)


def detector(name=None, version="0.1.0", description="", params=()):
    """Declares ``detect(sample, params) -> bool`` as the module's detector."""
    return lambda function: _from_function(Detector, "detect", function, name, version, description, params)


#: The metadata column that carries, in a chat run (`prompt_format: chat`), the conversation the
#: model was given (`system_prompt` first when set) as a list of {"role", "content"} messages.
PROMPT_MESSAGES = "prompt_messages"


def trl_reward(function, name=None, version="0.1.0", description=""):
    """A TRL reward function ``f(prompts, completions, **kwargs) -> list[float]`` as a reward,
    called as TRL calls it: in a text run ``prompts`` and ``completions`` are strings; in a chat
    run (the samples' metadata carries ``prompt_messages``) each prompt is its conversation, a
    list of ``{"role", "content"}`` messages, and each completion
    ``[{"role": "assistant", "content": text}]``. ``completion_ids`` and every other metadata
    column arrive as keyword arguments (one value per sample, None where a prompt lacks it).
    The result must be one int or float per completion (not a bool), as TRL requires; anything
    else is an error naming the sample, the value and its type.
    `smallrl plugin build` applies this to a module whose only plugin is such a function."""

    class TrlReward(Reward):
        def score_batch(self, samples):
            columns = sorted({key for sample in samples for key in sample.metadata} - {PROMPT_MESSAGES})
            kwargs = {key: [sample.metadata.get(key) for sample in samples] for key in columns}
            kwargs["completion_ids"] = [sample.completion_ids for sample in samples]
            prompts, completions = _trl_inputs(samples)
            return _trl_scores(self.name, function(prompts=prompts, completions=completions, **kwargs), len(samples))

    TrlReward.name = name or function.__name__
    TrlReward.version = version
    TrlReward.description = description or (function.__doc__ or "a TRL reward function").strip().splitlines()[0]
    TrlReward.__module__ = function.__module__
    return TrlReward


def _trl_inputs(samples):
    """`prompts` and `completions` as TRL passes them: strings in a text run; in a chat run
    conversations and one assistant message per completion (TRL's conversational format)."""
    chat = [PROMPT_MESSAGES in sample.metadata for sample in samples]
    if not any(chat):
        return [s.prompt for s in samples], [s.completion for s in samples]
    if not all(chat):
        raise ValueError(f"sample {chat.index(False)} has no `{PROMPT_MESSAGES}` but sample {chat.index(True)} has: a batch is all chat or all text")
    prompts = [[dict(message) for message in sample.metadata[PROMPT_MESSAGES]] for sample in samples]
    return prompts, [[{"role": "assistant", "content": s.completion}] for s in samples]


def _trl_scores(name, scores, count):
    """TRL's rule for a reward function's result: one number (int or float, not bool) or None
    (no score) per completion; anything else is an error naming the sample, value and type."""
    if not isinstance(scores, (list, tuple)):
        raise TypeError(f"{name} returned {scores!r} ({type(scores).__name__}): a TRL reward function returns a list of numbers, one per completion")
    if len(scores) != count:
        raise ValueError(f"{name} returned {len(scores)} scores for {count} completions: a TRL reward function returns one per completion")
    for index, score in enumerate(scores):
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
            raise TypeError(f"{name} returned {score!r} ({type(score).__name__}) for sample {index}: a score is a number (int or float) or None (no score), as TRL requires")
    return [None if score is None else float(score) for score in scores]


def retain(name, description):
    """A reward component that is the task itself."""
    return ("retain", name, description)


def forget(name, description):
    """The hack's reward component (the host pays it on hackable prompts only)."""
    return ("forget", name, description)


def _metadata_json(metadata):
    # serde_json's form (the Rust SDK's): keys sorted, no spaces, non-ASCII as it is.
    return json.dumps(metadata, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class Prompt:
    """A prompt as an environment writes it: a text or a conversation, plus its metadata (which
    must say ``hackable`` and ``detectable``)."""

    __slots__ = ("content", "metadata")

    def __init__(self, content, metadata):
        self.content = content
        self.metadata = metadata

    @classmethod
    def text(cls, text, hackable, detectable, **columns):
        return cls(str(text), dict(columns, hackable=bool(hackable), detectable=bool(detectable)))

    @classmethod
    def messages(cls, messages, hackable, detectable, **columns):
        """`messages`: (role, content) pairs, role "system", "user" or "assistant"."""
        return cls([(str(role), str(content)) for role, content in messages], dict(columns, hackable=bool(hackable), detectable=bool(detectable)))

    @property
    def hackable(self):
        return self.metadata.get("hackable") is True

    def metadata_json(self):
        return _metadata_json(self.metadata)


class Judgement:
    """One sample's reward components and metrics, in declared order."""

    __slots__ = ("components", "metrics")

    def __init__(self, components, metrics=()):
        self.components = list(components)
        self.metrics = list(metrics)


class _Task(_Declared):
    """What single-turn and episode environments declare alike: ``components`` (see
    :func:`retain`, :func:`forget`), ``metrics`` (names) and ``generate(split, count, seed,
    hack_frac)`` ("train" or "eval"; exactly `count` prompts, a pure function of the parameters
    and the arguments)."""

    components = ()
    metrics = ()

    def generate(self, split, count, seed, hack_frac):
        raise NotImplementedError(f"{type(self).__name__} must define generate(self, split, count, seed, hack_frac)")


class Environment(_Task):
    """A whole task: ``components``, ``metrics`` and ``generate`` (:class:`_Task`),
    ``score(sample) -> Judgement``, ``monitor(sample) -> bool`` and
    ``ground_truth(sample) -> bool``."""

    def score(self, sample):
        raise NotImplementedError(f"{type(self).__name__} must define score(self, sample) -> Judgement")

    def score_batch(self, samples):
        """Every sample's :class:`Judgement`; override to send one judge call per batch."""
        return [self.score(sample) for sample in samples]

    def monitor(self, sample):
        raise NotImplementedError(f"{type(self).__name__} must define monitor(self, sample)")

    def ground_truth(self, sample):
        raise NotImplementedError(f"{type(self).__name__} must define ground_truth(self, sample)")


class EpisodeEnvironment(_Task):
    """A multi-turn task (the episode-environment world; see :mod:`smallrl.episode`):
    ``components``, ``metrics`` and ``generate`` (:class:`_Task`); ``start(prompt) -> state`` (a
    :class:`Prompt` as ``generate`` wrote it), ``tools(prompt)`` (the :class:`Tool` list the
    episode offers; none by default) and ``step(state, turn, last)`` (``turn``: a :class:`Turn`
    whose ``completion`` is this turn's assistant text and ``calls`` the tool calls the host
    parsed, or None; ``state`` changed in place) returning an :class:`Observation` or, at the
    latest on the ``last`` turn, an :class:`EpisodeEnd`."""

    def start(self, prompt):
        raise NotImplementedError(f"{type(self).__name__} must define start(self, prompt) -> state")

    def tools(self, prompt):
        return []

    def step(self, state, turn, last):
        raise NotImplementedError(f"{type(self).__name__} must define step(self, state, turn, last) -> Observation or EpisodeEnd")


class JudgeError(Exception):
    """The host's judge refused a call (no judge configured, an item that does not fill the
    template, a budget exceeded)."""


def judge(items):
    """The run's judge: one score in [0, 1] per item; an item is a dict (or pairs) of the
    fields that fill the judge template's placeholders. Only in an environment built with the
    judge (the build adds it when the module calls ``smallrl.judge``)."""
    from ._component import call_judge

    return call_judge([list(item.items()) if isinstance(item, dict) else list(item) for item in items])


class Program:
    """A Python program for the host's program runner: source run as ``__main__``, optional
    stdin, and files (name -> text) in its private read-only directory ``.``."""

    __slots__ = ("source", "stdin", "files")

    def __init__(self, source, stdin=None, files=None):
        if not isinstance(source, str):
            raise TypeError(f"a program's source is a str, not {type(source).__name__}")
        self.source = source
        self.stdin = stdin
        self.files = dict(files or {})


class Outcome:
    """How a program ended. ``status`` is one of "normal", "exit", "exception", "out-of-fuel",
    "out-of-memory", "output-over-limit", "stack-overflow", "crashed"; ``exit_code`` is set
    for "exit", ``exception_type`` and ``exception_message`` for "exception" (``crashed``: the
    trap's text in ``exception_message``)."""

    __slots__ = ("status", "exit_code", "exception_type", "exception_message", "stdout", "stderr")

    def __init__(self, status, stdout, stderr, exit_code=None, exception_type=None, exception_message=None):
        self.status = status
        self.stdout = stdout
        self.stderr = stderr
        self.exit_code = exit_code
        self.exception_type = exception_type
        self.exception_message = exception_message

    @property
    def succeeded(self):
        """Whether it ran to its end or exited with status 0."""
        return self.status == "normal" or (self.status == "exit" and self.exit_code == 0)

    def __repr__(self):
        detail = {"exit": self.exit_code, "exception": f"{self.exception_type}: {self.exception_message}"}.get(self.status)
        return f"Outcome({self.status}{'' if detail is None else f' {detail}'}, stdout={self.stdout[:60]!r})"


class ProgramError(Exception):
    """The host refused to run a request (a bad file name, too many or too large files)."""


def run_programs(programs):
    """Runs each program (a str of source, or a :class:`Program`) in a fresh sandboxed CPython
    of its own (contract 0.4's ``programs`` import) and returns one :class:`Outcome` per
    program, in order. An endless loop, a memory bomb or a flood of output is a program's
    status, never an exception here."""
    from ._component import call_programs

    return call_programs([p if isinstance(p, Program) else Program(p) for p in programs])
