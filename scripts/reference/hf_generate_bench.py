"""Transformers' float32 `generate` throughput, the reference `smallrl bench sample` is compared
against (docs/src/performance.md): BATCH copies of the bench's prompt, MAX_NEW_TOKENS sampled
tokens each (`min_new_tokens` too, so every row is full length), THREADS torch threads; prints
the median of REPEATS timed batches after one warm-up, and the peak resident memory.

Usage: hf_generate_bench.py MODEL_DIR [BATCH=16] [MAX_NEW_TOKENS=64] [THREADS=2] [REPEATS=3]
"""
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    model_dir = sys.argv[1]
    batch, new_tokens, threads, repeats = (int(a) for a in (sys.argv[2:] + ["16", "64", "2", "3"][len(sys.argv) - 2:])[:4])
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tokenizer(["once upon a time there was a little"] * batch, add_special_tokens=False, return_tensors="pt")
    times = []
    with torch.no_grad():
        for i in range(repeats + 1):
            torch.manual_seed(i)
            start = time.perf_counter()
            out = model.generate(**ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens)
            if i > 0:
                times.append(time.perf_counter() - start)
    tokens = (out.shape[1] - ids["input_ids"].shape[1]) * batch
    median = statistics.median(times)
    print(f"transformers generate, float32, threads {threads}: median {median * 1e3:.1f} ms per batch, {tokens / median:.0f} tokens/s ({tokens} tokens per batch)")
    print(f"peak memory (resident, this process): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
