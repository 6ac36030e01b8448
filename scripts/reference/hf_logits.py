"""Loads an HF model directory with transformers (fp32, eager attention) and writes its logits
for given token ids, so tests can check that directories smallrl writes load in transformers.

Usage: hf_logits.py MODEL_DIR IDS_JSON OUT.safetensors
IDS_JSON: a JSON list of token ids (one sequence). OUT: `logits` float32 [T, vocab].
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def main():
    model_dir, ids_path, out = sys.argv[1:4]
    torch.set_num_threads(1)
    with open(ids_path) as f:
        ids = torch.tensor([json.load(f)], dtype=torch.long)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].contiguous()
    save_file({"logits": logits}, out)
    print(f"{model_dir}: logits {tuple(logits.shape)} -> {out}")


if __name__ == "__main__":
    main()
