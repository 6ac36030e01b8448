"""TRL's documented conversational reward function, unchanged (TRL docs, "GRPO Trainer",
"Using a custom reward function", Example 2): `completions` are lists of one message, as TRL
passes them for a conversational dataset, which smallrl does in a chat run."""

import re


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]
