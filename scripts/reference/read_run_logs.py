"""Reads a smallrl run directory's TensorBoard event files with TensorBoard's own reader
(EventAccumulator, which also checks the records' CRCs and applies restarts), and its
completions.jsonl with pandas; prints what they hold as JSON for tests/train/ to compare with
metrics.jsonl and routing_eval.jsonl.

usage: read_run_logs.py RUN_DIR [NUM_GENERATIONS]
"""

import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util


def tensorboard(run_dir):
    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = {tag: [[e.step, e.value] for e in accumulator.Scalars(tag)] for tag in tags["scalars"]}
    texts = {}
    for tag in tags["tensors"]:
        events = accumulator.Tensors(tag)
        texts[tag] = [[e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode()] for e in events]
    return {"scalars": scalars, "texts": texts}


def completions(run_dir, num_generations):
    import pandas

    frame = pandas.read_json(f"{run_dir}/completions.jsonl", lines=True)
    # The advantages as TRL defines them, recomputed from the logged rewards: per group of
    # num_generations consecutive completions, (r - mean) / (sample std + 1e-4).
    group = frame["index"] // num_generations
    grouped = frame.groupby([frame["step"], group])["reward"]
    advantage = (frame["reward"] - grouped.transform("mean")) / (grouped.transform("std") + 1e-4)
    per_step = frame.drop(columns=["prompt", "completion"]).groupby("step").mean(numeric_only=True)
    return {
        "columns": list(frame.columns),
        "rows_per_step": {str(step): int(rows) for step, rows in frame.groupby("step").size().items()},
        "means": {str(step): row.dropna().to_dict() for step, row in per_step.iterrows()},
        "max_advantage_error": float((advantage - frame["advantage"]).abs().max()),
        "first": frame.iloc[0][["step", "prompt", "completion"]].to_dict(),
    }


def main():
    run_dir = sys.argv[1]
    result = {"tensorboard": tensorboard(run_dir)}
    if len(sys.argv) > 2:
        result["completions"] = completions(run_dir, int(sys.argv[2]))
    json.dump(result, sys.stdout, default=str)


if __name__ == "__main__":
    main()
