"""Writes a miniature SimpleStories dataset as the HF cache would hold it, plus the prompts the
original pipeline would extract from it (computed with HF `tokenizers`, independently of smallrl).

Usage: simplestories_parquet.py HF_HOME_DIR TOKENIZER_JSON

Layout: HF_HOME_DIR/hub/datasets--SimpleStories--SimpleStories/refs/main (a commit id) and
snapshots/<commit>/data/{train,test}-00000-of-00001.parquet with columns `story` and `topic`
(snappy-compressed, like the Hub's). HF_HOME_DIR/expected.json: for each split, the set of
distinct decoded first-8-token prompts of stories with at least 8 tokens.
"""
import json
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

PROMPT_LENGTH = 8
WORDS = "the a little big cat dog girl boy named lily tom went to park and saw happy sad bird tree".split()


def story(rng):
    sentences = []
    for _ in range(rng.randint(1, 4)):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 9))]
        sentences.append(" ".join(words) + rng.choice([".", "!", "?", ", and then"]))
    return " ".join(sentences).capitalize()


def main():
    home, tokenizer_path = sys.argv[1], sys.argv[2]
    tokenizer = Tokenizer.from_file(tokenizer_path)
    repo = os.path.join(home, "hub", "datasets--SimpleStories--SimpleStories")
    commit = "0123456789abcdef0123456789abcdef01234567"
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    data = os.path.join(repo, "snapshots", commit, "data")
    os.makedirs(data, exist_ok=True)
    rng = random.Random(5)
    expected = {}
    for split, count in [("train", 400), ("test", 150)]:
        stories = [story(rng) for _ in range(count)]
        table = pa.table({"topic": [f"t{i}" for i in range(count)], "story": stories})
        pq.write_table(table, os.path.join(data, f"{split}-00000-of-00001.parquet"), compression="snappy")
        prompts = set()
        for text in stories:
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) >= PROMPT_LENGTH:
                prompts.add(tokenizer.decode(ids[:PROMPT_LENGTH], skip_special_tokens=True))
        expected[split] = sorted(prompts)
    with open(os.path.join(home, "expected.json"), "w") as f:
        json.dump(expected, f)
    print(f"wrote {repo}: train {len(expected['train'])}, test {len(expected['test'])} distinct prompts")


if __name__ == "__main__":
    main()
