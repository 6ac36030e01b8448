"""Writes a miniature GSM8K (`openai/gsm8k`) as the HF cache would hold it, and what a reader of
GSM8K should get from it (parsed here, independently of smallrl).

Usage: gsm8k_parquet.py HF_HOME_DIR [SEED]   (another seed: other numbers, the same questions' shape)

Layout, as the Hub's: HF_HOME_DIR/hub/datasets--openai--gsm8k/refs/main (a commit id) and
snapshots/<commit>/{main,socratic}/{train,test}-00000-of-00001.parquet with string columns
`question` and `answer` (the worked solution ending in `#### <final answer>`), snappy-compressed.
The `socratic` configuration holds other questions, so a reader that ignores the configuration
is caught. HF_HOME_DIR/expected.json: for each split of `main`, {question: final answer} with the
final answer as GSM8K's graders read it (after the last `####`, stripped, commas removed).
"""
import json
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def problem(rng, split, i, config):
    a, b = rng.randint(2, 900), rng.randint(2, 900)
    total = a * b
    question = f"{config} {split} {i}: a farm has {a} rows of {b} plants. How many plants are there?"
    answer = f"There are {a} rows of {b} plants.\n{a} * {b} = <<{a}*{b}={total}>>{total}\n#### {total:,}"
    return question, answer


def main():
    home = sys.argv[1]
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
    repo = os.path.join(home, "hub", "datasets--openai--gsm8k")
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    expected = {}
    for config in ["main", "socratic"]:
        folder = os.path.join(repo, "snapshots", commit, config)
        os.makedirs(folder, exist_ok=True)
        for split, count in [("train", 40), ("test", 12)]:
            rows = [problem(rng, split, i, config) for i in range(count)]
            table = pa.table({"question": [q for q, _ in rows], "answer": [a for _, a in rows]})
            pq.write_table(table, os.path.join(folder, f"{split}-00000-of-00001.parquet"), compression="snappy")
            if config == "main":
                expected[split] = {q: a.rsplit("####", 1)[1].strip().replace(",", "") for q, a in rows}
    with open(os.path.join(home, "expected.json"), "w") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
