"""Multi-turn environments (issue 48; the `episode-environment` world), as the Rust
SDK's `EpisodeEnvironment` (plugins/sdk/src/episode.rs) writes them: an environment that holds an
episode per sample. It generates its prompts as a single-turn :class:`smallrl.Environment` does;
then the host starts an episode per sampled prompt (``start(prompt) -> state``) and hands it each
assistant turn (``step(state, turn, last)``), and the environment answers with the next
:class:`Observation` (messages in the ``tool`` or ``user`` role) or the :class:`EpisodeEnd`: the
reward components, metrics, monitor flag and ground truth a single-turn environment gives a
sample.

The state is whatever ``start`` returns (a dict, a list, an object), kept per episode by
:class:`Episodes` (in the component, and in a module's native tests), and changed in place by
``step``; it must be a deterministic function of the prompt and the turns. The host bounds the
turns (the last one comes with ``last`` and must be answered with an end), the bytes of an
observation and the fuel of each call.

Tools (contract 0.6): ``tools(prompt)`` (none by default) returns the :class:`Tool` list an
episode offers; where the model's chat template has a tool-call format (Qwen's ``<tool_call>``),
the host renders their schemas into the prompt and parses each turn's calls: ``turn.calls`` is a
list of :class:`ToolCall` and :class:`MalformedCall`, in order. It is None where the host did not
parse (a raw-prompt run, a template without the format, an episode without tools): the
environment then reads ``turn.completion`` with its own plain-text protocol.
"""

import json
import math


class Tool:
    """A tool an episode offers: ``parameters`` is its arguments' JSON schema, a dict (its key
    order is kept) or a JSON object text."""

    __slots__ = ("name", "description", "parameters")

    def __init__(self, name, description, parameters):
        self.name = name
        self.description = description
        self.parameters = parameters if isinstance(parameters, str) else json.dumps(parameters)

    def __eq__(self, other):
        return isinstance(other, Tool) and (self.name, self.description, self.parameters) == (other.name, other.description, other.parameters)

    def __repr__(self):
        return f"Tool({self.name!r}, {self.description!r}, {self.parameters!r})"


class ToolCall:
    """A call of a declared tool as the model wrote it: ``arguments`` is a JSON object text
    (``json.loads`` reads it)."""

    __slots__ = ("name", "arguments")

    def __init__(self, name, arguments):
        self.name = name
        self.arguments = arguments

    def __eq__(self, other):
        return isinstance(other, ToolCall) and (self.name, self.arguments) == (other.name, other.arguments)

    def __repr__(self):
        return f"ToolCall({self.name!r}, {self.arguments!r})"


class MalformedCall:
    """A ``<tool_call>`` block that is not a call of a declared tool: ``observation`` is the text
    the host would show the model."""

    __slots__ = ("observation",)

    def __init__(self, observation):
        self.observation = observation

    def __eq__(self, other):
        return isinstance(other, MalformedCall) and self.observation == other.observation

    def __repr__(self):
        return f"MalformedCall({self.observation!r})"


class Observation:
    """The next observation: (role, content) messages, each role "tool" or "user"."""

    __slots__ = ("messages",)

    def __init__(self, messages):
        self.messages = [(role, content) for role, content in messages]

    @classmethod
    def user(cls, text):
        """One ``user`` message."""
        return cls([("user", text)])

    @classmethod
    def tool(cls, text):
        """One ``tool`` message (a tool's answer)."""
        return cls([("tool", text)])

    def __eq__(self, other):
        return isinstance(other, Observation) and self.messages == other.messages

    def __repr__(self):
        return f"Observation({self.messages!r})"


class EpisodeEnd:
    """How an episode ended: one score per declared component and one value per declared metric,
    in order, the monitor's flag and whether the episode truly hacked."""

    __slots__ = ("components", "metrics", "monitor", "ground_truth")

    def __init__(self, components, metrics=(), monitor=False, ground_truth=False):
        self.components = list(components)
        self.metrics = list(metrics)
        self.monitor = monitor
        self.ground_truth = ground_truth

    def _key(self):
        return (self.components, self.metrics, self.monitor, self.ground_truth)

    def __eq__(self, other):
        return isinstance(other, EpisodeEnd) and self._key() == other._key()

    def __repr__(self):
        return f"EpisodeEnd(components={self.components!r}, metrics={self.metrics!r}, monitor={self.monitor!r}, ground_truth={self.ground_truth!r})"


def _checked_observation(where, observation):
    """The observation's messages as (str, str) pairs; a wrong shape names the message."""
    if not observation.messages:
        raise ValueError(f"{where} returned an observation without messages")
    for index, message in enumerate(observation.messages):
        role, content = message
        if not isinstance(role, str) or not isinstance(content, str):
            raise TypeError(f"{where} returned observation message {index} ({type(role).__name__}, {type(content).__name__}): a message is (role, content), two str")
    return observation


def _checked_end(where, end, declared):
    """The end's values checked against the environment's declaration: one number (not a
    bool) per component and metric, finite; the flags bool."""
    components, metrics = declared.components, declared.metrics
    if len(end.components) != len(components) or len(end.metrics) != len(metrics):
        raise ValueError(f"{where} ended with {len(end.components)} components and {len(end.metrics)} metrics; the environment declares {len(components)} and {len(metrics)}")
    for kind, values in (("component", end.components), ("metric", end.metrics)):
        for index, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{where}: {kind} {index} is {value!r} ({type(value).__name__}), not a number")
            if not math.isfinite(value):
                raise ValueError(f"{where}: {kind} {index} is {value!r}, not finite")
    for flag in ("monitor", "ground_truth"):
        value = getattr(end, flag)
        if not isinstance(value, bool):
            raise TypeError(f"{where}: {flag} is {value!r} ({type(value).__name__}), not a bool")
    return end


class Episodes:
    """The episodes in flight, by the host's ids: what the component keeps, and how a module's
    native tests play episodes (as the Rust SDK's ``Episodes``)."""

    def __init__(self, env):
        self.env = env
        self.states = {}

    def start(self, episode_id, prompt):
        """Starts episode `episode_id` on `prompt` (an id in flight is an error: the host's ids
        are unique); returns the :class:`Tool` list it offers."""
        if episode_id in self.states:
            raise ValueError(f"episode {episode_id} is already in flight")
        self.states[episode_id] = self.env.start(prompt)
        tools = list(self.env.tools(prompt))
        for tool in tools:
            if not isinstance(tool, Tool):
                raise TypeError(f"{type(self.env).__name__}.tools returned {tool!r:.200} ({type(tool).__name__}), not a smallrl.Tool")
        return tools

    def step(self, episode_id, turn, last):
        """Episode `episode_id`'s answer to `turn` (a :class:`smallrl.Turn`: a sample of this
        turn's assistant text, with ``calls``), checked; an end forgets the episode."""
        if episode_id not in self.states:
            raise KeyError(f"episode {episode_id} was never started (or has ended)")
        answer = self.env.step(self.states[episode_id], turn, last)
        where = f"{type(self.env).__name__}.step (episode {episode_id})"
        if isinstance(answer, Observation):
            return _checked_observation(where, answer)
        if isinstance(answer, EpisodeEnd):
            _checked_end(where, answer, self.env)
            del self.states[episode_id]
            return answer
        raise TypeError(f"{where} returned {answer!r:.200} ({type(answer).__name__}): a turn's answer is smallrl.Observation or smallrl.EpisodeEnd")

    @property
    def in_flight(self):
        """How many episodes are in flight."""
        return len(self.states)
