"""A Python episode environment that misbehaves as its `mode` parameter says
(tests/plugins_python_episodes.rs), as plugins/testing/hostile_episode does in Rust; every mode
must end in a clear error naming the plugin's file and the rule:
- `ok`: ends every episode at its first turn (solved 1).
- `never_ends`: answers every turn, the last one included, with an observation.
- `huge_observation`: answers with a 10 MB observation.
- `wrong_role`: answers with an observation in the role "assistant".
- `grows`: keeps 8 MiB more state per turn and never ends before the last turn.
- `wrong_type`: answers with a str, not an Observation or EpisodeEnd.
- `wrong_count`: ends with two components where it declares one.
- `text_score`: ends with the component "1.0", a str.
- `raises`: raises in step.
"""

import smallrl

MODES = ["ok", "never_ends", "huge_observation", "wrong_role", "grows", "wrong_type", "wrong_count", "text_score", "raises"]


class HostileEpisode(smallrl.EpisodeEnvironment):
    name = "hostile_episode_python"
    version = "0.1.0"
    description = "test-only: misbehaves in episodes as `mode` says"
    params = [smallrl.string("mode", "ok", "one of: " + ", ".join(MODES))]
    components = [smallrl.retain("solved", "1 at the end")]

    def configure(self, params):
        if params["mode"] not in MODES:
            raise ValueError(f"unknown mode {params['mode']!r}")

    def generate(self, split, count, seed, hack_frac):
        return [smallrl.Prompt.text(f"{split} {i}", False, False) for i in range(count)]

    def start(self, prompt):
        return []

    def step(self, state, turn, last):
        mode = self.params["mode"]
        if mode == "never_ends":
            return smallrl.Observation.user("again")
        if mode == "huge_observation":
            return smallrl.Observation.user("x" * (10 << 20))
        if mode == "wrong_role":
            return smallrl.Observation([("assistant", "I answer for you")])
        if mode == "grows" and not last:
            state.append(bytearray(8 << 20))
            return smallrl.Observation.user(f"{sum(len(chunk) for chunk in state) >> 20} MiB held")
        if mode == "wrong_type":
            return "higher"
        if mode == "wrong_count":
            return smallrl.EpisodeEnd([1.0, 0.0])
        if mode == "text_score":
            return smallrl.EpisodeEnd(["1.0"])
        if mode == "raises":
            raise RuntimeError("the game broke")
        return smallrl.EpisodeEnd([1.0])
