#!/usr/bin/env python3
"""Run TRL 1.16's own importance-sampling correction (vllm_importance_sampling_correction) on given tensors.

Usage (from the repo root):
    .venv/bin/python scripts/reference/trl_is_correction.py --dir DIR
    DIR/inputs.safetensors: old_per_token_logps, sampling_per_token_logps (float32 [B, C]),
                            completion_mask (int64 [B, C])
    DIR/cases.json: [{"mode": "token_truncate" | "token_mask" | "sequence_truncate" | "sequence_mask",
                      "clip_min": float | null, "clip_max": float | null}, ...]
    writes DIR/ratio.<i>.safetensors ("ratio": [B, C] or [B, 1]) and DIR/metrics.<i>.json per case.

How TRL is driven (nothing of the correction is re-implemented here)
--------------------------------------------------------------------
TRL computes the correction inline in `GRPOTrainer._generate_and_score_completions` (not in a
method of its own), in two blocks guarded by `if self.use_vllm and
self.vllm_importance_sampling_correction:`: the ratio (grpo_trainer.py:2660-2707: the log-difference
`(old - sampling) * mask`, NaN to 0, summed per sequence in the sequence modes, `exp`, clamped into
[clip_min, clip_max] or set to 0 outside it) and its metrics (2860-2896:
`sampling/sampling_logp_difference/mean|max`, `sampling/importance_sampling_ratio/min|mean|max`).
This script reads those two blocks from the installed TRL's source (`inspect.getsource`), checks
that they are the ones described, and executes them unchanged with `self` standing for a trainer
on one process (its `vllm_importance_sampling_*` attributes, `_metrics`, and an `accelerator` whose
`gather` is the identity over one process). The loss then multiplies the per-token loss by the
ratio (grpo_trainer.py:3146-3147, `per_token_loss * inputs["importance_sampling_ratio"]`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file

GUARD = "if self.use_vllm and self.vllm_importance_sampling_correction:"


def trl_blocks() -> tuple[str, str]:
    """The two guarded blocks of TRL's `_generate_and_score_completions` that compute and log the ratio, dedented
    (a third only stores it in the batch)."""
    from trl import GRPOTrainer

    lines = inspect.getsource(GRPOTrainer._generate_and_score_completions).splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != GUARD:
            continue
        indent = len(line) - len(line.lstrip())
        end = i + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
            end += 1
        blocks.append(textwrap.dedent("\n".join(lines[i:end])))
    ratio = [b for b in blocks if "vllm_importance_sampling_ratio = torch.exp(logps_diff)" in b]
    metrics = [b for b in blocks if "sampling/importance_sampling_ratio/mean" in b]
    if len(ratio) != 1 or len(metrics) != 1:
        raise RuntimeError("TRL's importance-sampling blocks are not the ones this script was written against (TRL 1.16): "
                           f"{len(ratio)} computing the ratio, {len(metrics)} logging it")
    ratio, metrics = ratio[0], metrics[0]
    return ratio, metrics


def run_case(inputs: dict[str, torch.Tensor], case: dict, blocks: tuple[str, str]) -> tuple[torch.Tensor, dict]:
    from trl.trainer.utils import nanmax, nanmin

    trainer = SimpleNamespace(
        use_vllm=True,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=case["mode"],
        vllm_importance_sampling_clip_min=case["clip_min"],
        vllm_importance_sampling_clip_max=case["clip_max"],
        _metrics={"train": defaultdict(list)},
        accelerator=SimpleNamespace(gather=lambda t: t.reshape(1)),  # one process
    )
    scope = {
        "self": trainer, "torch": torch, "math": math, "nanmin": nanmin, "nanmax": nanmax,
        "old_per_token_logps": inputs["old_per_token_logps"],
        "sampling_per_token_logps": inputs["sampling_per_token_logps"],
        "completion_mask": inputs["completion_mask"], "tool_mask": None,
        "device": torch.device("cpu"), "mode": "train",
    }
    with torch.no_grad():
        for block in blocks:
            exec(block, scope)  # noqa: S102 - TRL's own source, read from the installed package
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return scope["vllm_importance_sampling_ratio"].contiguous(), metrics


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    args = ap.parse_args()
    inputs = load_file(str(args.dir / "inputs.safetensors"))
    cases = json.loads((args.dir / "cases.json").read_text())
    blocks = trl_blocks()
    import trl

    # The same code on the inputs in float64: the values both float32 results approximate.
    double = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    for i, case in enumerate(cases):
        ratio, metrics = run_case(inputs, case, blocks)
        ratio64, metrics64 = run_case(double, case, blocks)
        save_file({"ratio": ratio.float(), "ratio64": ratio64.double()}, str(args.dir / f"ratio.{i}.safetensors"))
        record = {"trl_version": trl.__version__, "case": case, "metrics": metrics, "metrics64": metrics64}
        (args.dir / f"metrics.{i}.json").write_text(json.dumps(record, indent=1))
        print(f"case {i} {case}: {metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
