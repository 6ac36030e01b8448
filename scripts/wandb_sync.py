"""Copies one smallrl run directory into a Weights & Biases run with the official `wandb` SDK.

Run by `smallrl wandb-sync RUN_DIR` (host/src/wandb.rs), which finds the project's Python,
reads the run's config.yaml with smallrl's own YAML reader and passes it here as JSON on
standard input, so the wandb config holds the values smallrl resolved (PyYAML would read
`1e-3` as text). Standalone: `python scripts/wandb_sync.py RUN_DIR --project P <config.json`.

What the wandb run holds:
- name: the run directory's name; id: given by smallrl (derived from the run directory's
  absolute path), resumed with `resume="allow"`, so a second sync, or a sync after
  `train --resume`, continues the same wandb run;
- config: the run's config.yaml (the resolved configuration), unchanged;
- history: every line of metrics.jsonl at its `step`, every key under its own name (nulls
  left out: wandb has no missing value); every line of routing_eval.jsonl at its `step`,
  each mode's values as `routing_eval/<mode>/<key>` (TensorBoard's tags) and the line's other
  keys as `routing_eval/<key>`. Steps before the resumed run's current step were logged by an
  earlier sync and are skipped (wandb drops steps that go backwards);
- tables, logged with the last step when there is one to log: `samples` (step, prompt,
  completion) from train.log's `[Sample @ step N] <prompt> ||| <completion>` lines, and
  `completions` (every column of completions.jsonl) when the run logged completions.

The run directory is only read. A JSON-lines line without its final newline (a run still
writing it) is left for the next sync.
"""

import argparse
import json
import re
import sys
from pathlib import Path

SAMPLE_HEAD = re.compile(r"^\[Sample @ step (\d+)\] ")
EVAL_PREFIX = "routing_eval"


def fail(message, code=2):
    print(f"wandb_sync.py: {message}", file=sys.stderr)
    sys.exit(code)


def read_jsonl(path):
    """Every complete line of a JSON-lines file (none when the file is absent)."""
    if not path.exists():
        return []
    lines = []
    text = path.read_text(encoding="utf-8")
    complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
    for number, line in enumerate(complete.splitlines(), start=1):
        if line.strip():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError as error:
                fail(f"{path} line {number} is not JSON ({error}); the file is damaged")
    return lines


def history(run_dir):
    """{step: {key: value}}: metrics.jsonl and routing_eval.jsonl merged by step."""
    rows = {}
    for line in read_jsonl(run_dir / "metrics.jsonl"):
        step = line.get("step")
        if not isinstance(step, int):
            fail(f"{run_dir / 'metrics.jsonl'}: a line has no integer step: {line}")
        rows.setdefault(step, {}).update({k: v for k, v in line.items() if k != "step" and v is not None})
    for line in read_jsonl(run_dir / "routing_eval.jsonl"):
        step = line.get("step")
        if not isinstance(step, int):
            fail(f"{run_dir / 'routing_eval.jsonl'}: a line has no integer step: {line}")
        row = rows.setdefault(step, {})
        for key, value in line.items():
            if key == "modes":
                for mode, values in value.items():
                    row.update({f"{EVAL_PREFIX}/{mode}/{k}": v for k, v in values.items() if v is not None})
            elif key != "step" and value is not None:
                row[f"{EVAL_PREFIX}/{key}"] = value
    return rows


def samples(run_dir):
    """train.log's `[Sample @ step N] prompt ||| completion` records as [step, prompt, completion]
    rows. A prompt or completion may hold newlines (a chat prompt does): a record runs until the
    `[Step N]` line the trainer writes right after it; it splits at the first ` ||| `."""
    log = run_dir / "train.log"
    if not log.exists():
        return []
    rows, record, step = [], None, None
    for line in log.read_text(encoding="utf-8").split("\n"):
        if record is not None and line.startswith(f"[Step {step}] "):
            prompt, _, completion = "\n".join(record).partition(" ||| ")
            rows.append([step, prompt, completion])
            record = None
        elif record is not None:
            record.append(line)
        else:
            match = SAMPLE_HEAD.match(line)
            if match:
                step, record = int(match.group(1)), [line[match.end():]]
    return rows


def completions_table(wandb, run_dir):
    lines = read_jsonl(run_dir / "completions.jsonl")
    if not lines:
        return None
    columns = []
    for line in lines:
        columns.extend(key for key in line if key not in columns)
    return wandb.Table(columns=columns, data=[[line.get(c) for c in columns] for line in lines])


def first_incomplete(rows, config):
    """The first step whose routing evaluation is due (every `eval_every` steps and at the last)
    but not written yet: a run syncing while it trains has written that step's metrics line
    and not yet its evaluation. It and later steps wait for the next sync, since wandb takes no
    value for a step it has passed."""
    eval_every, max_steps = config.get("eval_every"), config.get("max_steps")
    if not isinstance(eval_every, int) or not isinstance(max_steps, int) or eval_every <= 0:
        return float("inf")  # a run without routing evaluations (none are due)
    for step in sorted(rows):
        due = step % eval_every == 0 or step == max_steps
        if due and not any(key.startswith(EVAL_PREFIX + "/") for key in rows[step]):
            return step
    return float("inf")


def main():
    parser = argparse.ArgumentParser(prog="wandb_sync.py", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--id", required=True, help="the wandb run id (smallrl derives it from the run directory)")
    parser.add_argument("--project", required=True)
    parser.add_argument("--entity")
    parser.add_argument("--group")
    parser.add_argument("--mode", help="online, offline or disabled; default: WANDB_MODE, else wandb's own default")
    args = parser.parse_args()

    run_dir = args.run_dir.resolve()
    if not (run_dir / "config.yaml").is_file():
        fail(f"{run_dir} is not a smallrl run directory (it has no config.yaml)")
    try:
        config = json.load(sys.stdin)
    except json.JSONDecodeError as error:
        fail(f"the run's configuration (JSON on standard input) does not parse: {error}")
    try:
        import wandb
    except ImportError as error:
        fail(f"cannot import wandb ({error}): install scripts/requirements.txt into this Python (`make setup`)", 3)

    rows = history(run_dir)
    sample_rows = samples(run_dir)
    run = wandb.init(
        project=args.project,
        entity=args.entity,
        group=args.group,
        mode=args.mode,
        id=args.id,
        name=run_dir.name,
        resume="allow",
        config=config,
    )
    start = run.step
    steps = [step for step in sorted(rows) if step >= start and step < first_incomplete(rows, config)]
    if steps:
        last = rows[steps[-1]]
        if sample_rows:
            last["samples"] = wandb.Table(columns=["step", "prompt", "completion"], data=sample_rows)
        table = completions_table(wandb, run_dir)
        if table is not None:
            last["completions"] = table
    for step in steps:
        run.log(rows[step], step=step)
    skipped = len(rows) - len(steps)
    print(
        f"wandb-sync: {run_dir.name}: {len(steps)} steps logged"
        + (f" ({skipped} already in the wandb run skipped)" if skipped else "")
        + f", {len(sample_rows)} sample lines of train.log; wandb run id {args.id} in project {args.project}"
    )
    run.finish()


if __name__ == "__main__":
    main()
