"""The standard `happy_count` reward in Python: min(count of "happy" / max_count, 1.0).

A port of plugins/standard (HappyCount); tests/plugins_python.rs holds the two equal on every
test text. Build: smallrl plugin build plugins/python/happy_count.py
"""

import smallrl


@smallrl.reward(
    name="happy_count",
    version="0.1.0",
    description='min(count of "happy" / max_count, 1.0)',
    params=[
        smallrl.integer("max_count", 5, "count that earns the full reward of 1.0", minimum=1),
        smallrl.boolean("whole_word", False, 'count whole words only (default: substrings, so "unhappy" counts)'),
    ],
)
def score(sample, params):
    count = smallrl.text.count_matches(sample.completion, "happy", params["whole_word"])
    return min(count / params["max_count"], 1.0)
