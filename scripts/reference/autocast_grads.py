"""Per-token log-probabilities and parameter gradients of a weighted log-prob sum under
transformers, in float64 and in float32 under torch.autocast(bfloat16): what TRL's `bf16=True`
computes on the CPU, and the truth it is measured against (issue 50, `train_dtype`).

Usage: autocast_grads.py MODEL_DIR BATCH.safetensors OUT.safetensors
BATCH: prompt_ids, prompt_mask (left-padded), completion_ids, completion_mask (right-padded),
weights [batch, completion_len] float32. The objective is sum(weights * logp * completion_mask),
logp the log-softmax of the logits at the completion tokens (positions 0..seq on every row, as
TRL's scoring forward pass and smallrl's).
OUT: logp64 and logp_bf16 [batch, completion_len] float64, and for every parameter NAME
(HF names; a tied head is the embedding) `grad64.NAME` and `grad_bf16.NAME` float64.
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def objective(model, b, autocast: bool):
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1).long()
    mask = torch.cat([b["prompt_mask"], b["completion_mask"]], 1).long()
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    prompt_len, completion_len = b["prompt_ids"].shape[1], b["completion_ids"].shape[1]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        logits = logits[:, prompt_len - 1 : prompt_len - 1 + completion_len]
        # Under autocast log_softmax runs in float32 (TRL's selective_log_softmax on bf16 logits).
        logp = torch.log_softmax(logits, dim=-1).gather(-1, b["completion_ids"].long().unsqueeze(-1)).squeeze(-1)
    cmask = b["completion_mask"].to(logp.dtype)
    logp = logp * cmask
    return logp, (b["weights"].to(logp.dtype) * logp).sum()


def run(model_dir, b, dtype, autocast: bool):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.train()  # no dropout in these models; gradients on every parameter
    logp, total = objective(model, b, autocast)
    total.backward()
    grads = {n: p.grad.detach().double() for n, p in model.named_parameters()}
    return logp.detach().double(), grads


def main():
    model_dir, batch_path, out = sys.argv[1:4]
    torch.set_num_threads(1)
    b = load_file(batch_path)
    logp64, grads64 = run(model_dir, b, torch.float64, autocast=False)
    logp_bf, grads_bf = run(model_dir, b, torch.float32, autocast=True)
    result = {"logp64": logp64.contiguous(), "logp_bf16": logp_bf.contiguous()}
    for name in grads64:
        result[f"grad64.{name}"] = grads64[name].contiguous()
        result[f"grad_bf16.{name}"] = grads_bf[name].contiguous()
    save_file(result, out)
    print(f"{model_dir}: {len(grads64)} parameters, max |logp_bf16 - logp64| {(logp_bf - logp64).abs().max():.3e} -> {out}")


if __name__ == "__main__":
    main()
