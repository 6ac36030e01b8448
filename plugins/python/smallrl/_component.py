"""Binds a user's module to the classes componentize-py's bindings export (`Plugin` and
`Scorer` for a reward, `Plugin` and `Flagger` for a detector, `Env` for an environment, `Env`
and `Episodes` for an episode environment).
Imported only inside a component: `smallrl plugin build` writes the app module that calls
:func:`bind` at build time, so a module that declares no plugin (or two) fails the build.

Every call starts by reseeding Python's `random` from the host's random stream, which the host
seeds by the plugin and the call's inputs: `random.random()` gives the same values for the same
call in any run. An exception in the plugin's code becomes the call's error string (with its
traceback), which the host reports with the plugin's file.
"""

import os
import random
import traceback

import smallrl
from componentize_py_types import Err

from ._find import find_plugin

def _reseed():
    random.seed(int.from_bytes(os.urandom(32), "little"))


def _guarded(function):
    """Runs `function` after reseeding; an exception becomes the call's error string."""
    _reseed()
    try:
        return function()
    except Err:
        raise
    except BaseException as error:  # SystemExit and KeyboardInterrupt are errors of the call too
        raise Err(_describe(error)) from None


# The most of an exception's message and traceback an error string carries (the host shows
# 4 KiB): a huge message is cut before it is copied or formatted.
_MAX_MESSAGE = 2048


def _describe(error):
    message = str(error)
    if len(message) > _MAX_MESSAGE:
        message = f"{message[:_MAX_MESSAGE]} [... {len(message) - _MAX_MESSAGE} more characters]"
    frames = "".join(traceback.format_tb(error.__traceback__))[-_MAX_MESSAGE:]
    return f"{type(error).__name__}: {message}\nTraceback (most recent call last):\n{frames}"


def _samples(batch):
    return [
        smallrl.Sample(s.prompt, s.completion, s.completion_tokens_joined, s.completion_token_ends, s.completion_ids, s.ended_with_eos, s.metadata)
        for s in batch
    ]


def _numbers(kind, values):
    out = []
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{kind} of sample {index} is {value!r} ({type(value).__name__}), not a number")
        out.append(float(value))
    return out


def _scores(kind, values):
    """Numbers or None (no score, contract 0.5): what a reward's score and an environment's
    components may be."""
    out = []
    for index, value in enumerate(values):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TypeError(f"{kind} of sample {index} is {value!r} ({type(value).__name__}), not a number or None (no score)")
        out.append(None if value is None else float(value))
    return out


def _flags(kind, values):
    out = []
    for index, value in enumerate(values):
        if not isinstance(value, bool):
            raise TypeError(f"{kind} of sample {index} is {value!r} ({type(value).__name__}), not a bool")
        out.append(value)
    return out


class _Instance:
    """The user's plugin, instantiated once and configured by the host."""

    def __init__(self, plugin_class):
        self.plugin_class = plugin_class
        self.plugin = plugin_class()
        if not plugin_class.name:
            raise TypeError(f"{plugin_class.__name__}: a plugin declares its name")

    def param_infos(self, types):
        return [types.ParamInfo(p.name, p.type_name, p.default_json(), p.description) for p in self.plugin_class.params]

    def configure(self, params_json):
        params = smallrl.Params(self.plugin_class.name, self.plugin_class.params, params_json)
        # Kept before configure() so a plugin reads them as self.params however it configures.
        self.plugin.params = params
        self.plugin.configure(params)


def _configure(instance, params_json):
    try:
        _reseed()
        instance.configure(params_json)
    except Err:
        raise
    except BaseException as error:
        raise Err(str(error) if isinstance(error, ValueError) else _describe(error)) from None


def bind(module, kind):
    """The export classes of `kind`'s world for the plugin `module` declares."""
    instance = _Instance(find_plugin(module, kind))
    if kind == "environment":
        return _environment_exports(instance)
    if kind == "episode":
        from ._episode_component import episode_exports

        return episode_exports(instance)
    from wit_world import exports
    from wit_world.imports import types

    plugin_kind = types.PluginKind.REWARD if kind == "reward" else types.PluginKind.DETECTOR
    declared = instance.plugin_class

    class Plugin(exports.Plugin):
        def info(self):
            return types.PluginInfo(declared.name, declared.version, plugin_kind, declared.description, instance.param_infos(types))

        def configure(self, params_json):
            _configure(instance, params_json)

    if kind == "reward":
        class Scorer(exports.Scorer):
            def score(self, batch):
                return _guarded(lambda: _scores("score", instance.plugin.score_batch(_samples(batch))))

        return Plugin, Scorer

    class Flagger(exports.Flagger):
        def detect(self, batch):
            return _guarded(lambda: _flags("detect", instance.plugin.detect_batch(_samples(batch))))

    return Plugin, Flagger


def environment_info(instance):
    """`env.info` of an environment or episode environment: its declaration."""
    from wit_world.imports import environment_types as env, types

    declared = instance.plugin_class
    roles = {"retain": env.Role.RETAIN, "forget": env.Role.FORGET}
    components = [env.ComponentInfo(name, roles[role], description) for role, name, description in declared.components]
    return env.EnvironmentInfo(declared.name, declared.version, declared.description, instance.param_infos(types), components, list(declared.metrics))


def generate(instance, split, count, seed, hack_frac):
    """`env.generate`: the plugin's prompts, as the contract's records."""
    from wit_world.imports import environment_types as env

    def to_wit(prompt):
        if isinstance(prompt.content, str):
            content = env.PromptContent_Text(prompt.content)
        else:
            content = env.PromptContent_Messages([env.Message(role, text) for role, text in prompt.content])
        return env.Prompt(content, prompt.metadata_json())

    name = "train" if split == env.Split.TRAIN else "eval"
    return _guarded(lambda: [to_wit(p) for p in instance.plugin.generate(name, count, seed, hack_frac)])


def environment_base(instance):
    """The `env` export's declaration and prompts, which environments and episode environments
    share; each adds `score`, `monitor` and `ground_truth`."""
    from wit_world import exports

    class Env(exports.Env):
        def info(self):
            return environment_info(instance)

        def configure(self, params_json):
            _configure(instance, params_json)

        def generate(self, split, count, seed, hack_frac):
            return generate(instance, split, count, seed, hack_frac)

    return Env


def _environment_exports(instance):
    from wit_world.imports import environment_types as env

    declared = instance.plugin_class

    def scores(judgements):
        components = [_scores("component", values) for values in zip(*(j.components for j in judgements))] if judgements else [[] for _ in declared.components]
        metrics = [_numbers("metric", values) for values in zip(*(j.metrics for j in judgements))] if judgements else [[] for _ in declared.metrics]
        return env.Scores(components, metrics)

    class Env(environment_base(instance)):
        def score(self, batch):
            return _guarded(lambda: scores(instance.plugin.score_batch(_samples(batch))))

        def monitor(self, batch):
            return _guarded(lambda: _flags("monitor", [instance.plugin.monitor(s) for s in _samples(batch)]))

        def ground_truth(self, batch):
            return _guarded(lambda: _flags("ground_truth", [instance.plugin.ground_truth(s) for s in _samples(batch)]))

    return Env


def call_judge(items):
    """The host's judge (the `judge` import): scores, or smallrl.JudgeError with its reason."""
    try:
        from wit_world.imports import judge
    except ImportError:
        raise smallrl.JudgeError("this environment was built without the judge: call smallrl.judge in its module so the build imports it") from None
    try:
        return judge.judge(items)
    except Err as error:
        raise smallrl.JudgeError(str(error.value)) from None


# A status case's class name (componentize-py's `Status_OutOfFuel`) -> the SDK's status name.
def _status_name(case):
    name = type(case).__name__.split("_", 1)[-1]
    return "".join(("-" + c.lower()) if c.isupper() else c for c in name).lstrip("-")


def call_programs(programs):
    """The host's program runner (the `programs` import): outcomes, or smallrl.ProgramError."""
    from wit_world.imports import programs as wit

    request = [
        wit.Program(p.source, p.stdin, [wit.ProgramFile(name, contents) for name, contents in p.files.items()])
        for p in programs
    ]
    try:
        outcomes = wit.run(request)
    except Err as error:
        raise smallrl.ProgramError(str(error.value)) from None
    out = []
    for outcome in outcomes:
        status = _status_name(outcome.status)
        result = smallrl.Outcome(status, outcome.stdout, outcome.stderr)
        if status == "exit":
            result.exit_code = outcome.status.value
        elif status == "exception":
            result.exception_type = outcome.status.value.type_name
            result.exception_message = outcome.status.value.message
        elif status == "crashed":
            result.exception_message = outcome.status.value
        out.append(result)
    return out
