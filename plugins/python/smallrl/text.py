"""Text helpers of the standard plugins, as the Rust SDK's (plugins/sdk/src/text.rs)."""


def count_substring(text, needle):
    """Non-overlapping occurrences (Python's str.count); an empty needle counts 0."""
    return text.count(needle) if needle else 0


def count_whole_word(text, word):
    """Occurrences of `word` not glued to a letter or digit on either side."""
    if not word:
        return 0
    count, start = 0, 0
    while True:
        at = text.find(word, start)
        if at < 0:
            return count
        before = text[at - 1] if at > 0 else ""
        after = text[at + len(word)] if at + len(word) < len(text) else ""
        if not before.isalnum() and not after.isalnum():
            count += 1
        start = at + len(word)


def count_matches(text, needle, whole_word):
    """Case-insensitive count of `needle` in `text`: substrings, or whole words if asked."""
    text, needle = text.lower(), needle.lower()
    return count_whole_word(text, needle) if whole_word else count_substring(text, needle)


def is_sentence_end(token):
    return token in (".", "?", "!")


def sentence_lengths(tokens):
    """Lengths in tokens of the complete sentences (the end token excluded; empty sentences
    dropped; the trailing unfinished sentence ignored)."""
    lengths, current = [], 0
    for token in tokens:
        if is_sentence_end(token):
            if current > 0:
                lengths.append(current)
            current = 0
        else:
            current += 1
    return lengths
