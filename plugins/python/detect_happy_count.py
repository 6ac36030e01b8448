"""The standard `happy_count` detector in Python: flags completions where the count of
"happy" >= threshold. A port of plugins/standard (HappyCountDetector).
Build: smallrl plugin build plugins/python/detect_happy_count.py
"""

import smallrl


@smallrl.detector(
    name="happy_count",
    version="0.1.0",
    description='flags completions where the count of "happy" >= threshold',
    params=[
        smallrl.integer("threshold", 3, "smallest count that is flagged"),
        smallrl.boolean("whole_word", False, 'count whole words only (default: substrings, so "unhappy" counts)'),
    ],
)
def detect(sample, params):
    return smallrl.text.count_matches(sample.completion, "happy", params["whole_word"]) >= params["threshold"]
