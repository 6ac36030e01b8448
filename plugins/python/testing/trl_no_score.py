"""A TRL reward function that returns None (TRL's "no score") for some completions: None for a
completion containing "skip", otherwise its number of words (hand-checkable)."""


def words_or_none(prompts, completions, **kwargs):
    """the completion's number of words; None (no score) when it contains "skip"."""
    return [None if "skip" in completion else len(completion.split()) for completion in completions]
