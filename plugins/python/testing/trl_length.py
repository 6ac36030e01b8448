"""A TRL reward function as TRL's docs write them, built unchanged by `smallrl plugin build`:
rewards completions close to 20 characters, with a bonus where the prompt's metadata says so."""


def reward_len(prompts, completions, **kwargs):
    """-|20 - len(completion)| / 20, plus `bonus` (a metadata column) where given"""
    bonus = kwargs.get("bonus") or [None] * len(completions)
    return [-abs(20 - len(completion)) / 20 + (b or 0.0) for completion, b in zip(completions, bonus)]
