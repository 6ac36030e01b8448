"""The standard `sentence_length` reward in Python, token-level: the mean over complete
sentences (ended by a `.`, `?` or `!` token) of the length's score against `target`.

A port of plugins/standard (SentenceLength); it reads the completion's token pieces
(`sample.tokens`). Build: smallrl plugin build plugins/python/sentence_length.py
"""

import smallrl


class SentenceLength(smallrl.Reward):
    name = "sentence_length"
    version = "0.1.0"
    description = (
        "mean over complete sentences (ended by a `.`, `?` or `!` token) of: length == target (exact) "
        "or max(0, 1 - 0.2*|target - length|) (smooth); 0 without a sentence"
    )
    params = [
        smallrl.integer("target", 10, "target sentence length in tokens"),
        smallrl.boolean("smooth", False, "partial credit for near misses (0.2 less per token)"),
    ]

    def sentence_score(self, length):
        distance = abs(float(self.params["target"]) - float(length))
        if self.params["smooth"]:
            return max(1.0 - 0.2 * distance, 0.0)
        return float(distance == 0.0)

    def score(self, sample):
        lengths = smallrl.text.sentence_lengths(sample.tokens)
        if not lengths:
            return 0.0
        total = 0.0
        for length in lengths:
            total += self.sentence_score(length)
        return total / len(lengths)
