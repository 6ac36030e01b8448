"""Reference for smallrl's judge (host/src/judge.rs): transformers' answer to a judge request.

Usage: judge.py MODEL_DIR REQUEST.json OUT.json

REQUEST: {"template": "... {topic} ... {text} ...", "items": [{"topic": ..., "text": ...}, ...],
          "mode": "parse_integer" | "answer_logprobs", "min": 1, "max": 5,
          "max_new_tokens": 4, "answers": [" 1", ..., " 5"] (answer_logprobs),
          "chat": false}
OUT: {"prompts": [filled template], "replies": [greedy reply] (parse_integer),
      "scores": [score in [0, 1]]}

Independent of smallrl: the template is filled with Python's str.format, each prompt is
tokenized without special tokens and run alone (no padding); parse_integer is transformers'
greedy generate (do_sample=False) decoded with special tokens skipped, the first integer of the
reply clamped into [min, max] and mapped to (s - min) / (max - min) (no integer: 0);
answer_logprobs is the float64 log-softmax of the last position's logits, restricted to the
answer tokens and renormalised, whose expected value (answer k is min + k) is mapped the same
way. With "chat", each filled template is one user message rendered by the tokenizer's
apply_chat_template with the generation prompt (else the raw text).
"""

import json
import re
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(model_dir, request_path, out_path):
    request = json.load(open(request_path))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    lo, hi = request["min"], request["max"]
    scale = lambda s: (min(max(s, lo), hi) - lo) / (hi - lo)
    prompts = [request["template"].format(**item) for item in request["items"]]
    if request.get("chat"):
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                   for p in prompts]
    out = {"prompts": prompts, "replies": [], "scores": []}
    for prompt in prompts:
        ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
        with torch.no_grad():
            if request["mode"] == "parse_integer":
                generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                           max_new_tokens=request["max_new_tokens"])
                reply = tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=True)
                out["replies"].append(reply)
                found = re.search(r"-?\d+", reply)
                out["scores"].append(scale(int(found.group())) if found else 0.0)
            else:
                logits = model(ids).logits[0, -1].double()
                logp = torch.log_softmax(logits, -1)
                answer_ids = []
                for answer in request["answers"]:
                    encoded = tokenizer.encode(answer, add_special_tokens=False)
                    assert len(encoded) == 1, (answer, encoded)
                    answer_ids.append(encoded[0])
                p = torch.softmax(logp[answer_ids], -1)
                values = torch.arange(lo, hi + 1, dtype=torch.float64)
                out["scores"].append(scale(float((p * values).sum())))
    json.dump(out, open(out_path, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
