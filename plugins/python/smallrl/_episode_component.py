"""The episode-environment world's export classes (`Env` and `Episodes`) for a module's
:class:`smallrl.EpisodeEnvironment`, as the Rust SDK's glue (plugins/sdk/src/guest/episode_glue.rs)
writes them: `env` gives the declaration and the prompts (its `score`, `monitor` and
`ground-truth` are never called for episodes), `episodes` keeps one :class:`smallrl.Episodes`
per instance and answers each turn with what it checked. Imported only inside a component.
"""

import json

import smallrl

from ._component import _guarded, _samples, environment_base


def _prompt(prompt):
    """The prompt the host sends back, as `generate` wrote it."""
    from wit_world.imports import environment_types as env

    metadata = json.loads(prompt.metadata)
    if not isinstance(metadata, dict):
        raise ValueError(f"the host sent metadata that is not a JSON object: {prompt.metadata[:200]}")
    if isinstance(prompt.content, env.PromptContent_Text):
        return smallrl.Prompt(prompt.content.value, metadata)
    return smallrl.Prompt([(m.role, m.content) for m in prompt.content.value], metadata)


def _not_for_episodes(call):
    from componentize_py_types import Err

    raise Err(f"{call}: an episode environment scores at the end of each episode (episodes.step), not per sample")


def episode_exports(instance):
    from wit_world import exports
    from wit_world.imports import environment_types as env, episode_types as wit

    episodes = smallrl.Episodes(instance.plugin)

    def answer(result):
        if isinstance(result, smallrl.Observation):
            return wit.TurnResult_Observation([env.Message(role, content) for role, content in result.messages])
        return wit.TurnResult_End(wit.EpisodeEnd([float(v) for v in result.components], [float(v) for v in result.metrics], result.monitor, result.ground_truth))

    def start(starts):
        return [[wit.Tool(t.name, t.description, t.parameters) for t in episodes.start(start.id, _prompt(start.prompt))] for start in starts]

    def calls(entries):
        if entries is None:
            return None
        return [smallrl.ToolCall(e.value.name, e.value.arguments) if isinstance(e, wit.CallEntry_Call) else smallrl.MalformedCall(e.value) for e in entries]

    def step(turns):
        samples = _samples([turn.assistant for turn in turns])
        return [answer(episodes.step(turn.id, smallrl.Turn(sample, calls(turn.calls)), turn.last)) for turn, sample in zip(turns, samples)]

    class Env(environment_base(instance)):
        def score(self, batch):
            _not_for_episodes("score")

        def monitor(self, batch):
            _not_for_episodes("monitor")

        def ground_truth(self, batch):
            _not_for_episodes("ground-truth")

    class Episodes(exports.Episodes):
        def start(self, starts):
            return _guarded(lambda: start(starts))

        def step(self, turns):
            return _guarded(lambda: step(turns))

    return Env, Episodes
