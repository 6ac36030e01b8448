"""Transformers' reference outputs for a real model directory (tests/real_model.rs).

Usage: hf_real_model.py MODEL_DIR REQUEST.json OUT.json

REQUEST: {"score": [text, ...], "score_bf16": [text, ...], "greedy": [text, ...], "max_new_tokens": N,
          "chat": [[{"role", "content"}, ...], ...],
          "templates": [{"template", "messages"}, ...]}
OUT: {"score": [{"ids", "logprobs", "decoded"}], "score_bf16": [{"ids", "logprobs"}], "greedy": [{"prompt_ids", "completion_ids", "completion_text"}],
      "chat": [{"ids", "text"}], "templates": [text], "eos_token_id"}
- score: ids of the text without special tokens, and logprobs[i] = log p(ids[i+1] | ids[..=i])
  from a float64 copy of the model (the float64 reference the tests compare against), and
  `decode(ids, skip_special_tokens=True)`.
- score_bf16: the same log-probs from transformers' own bfloat16 forward (the model loaded with
  dtype=torch.bfloat16 on the CPU; the logits' log_softmax in float32), for comparison.
- greedy: `generate(do_sample=False)` in float32 on the prompt's ids, stopping where the model's
  generation_config says (its eos_token_id); completion_ids include the stop token if reached;
  completion_text is their `decode(..., skip_special_tokens=True)`.
- chat: `apply_chat_template(messages, add_generation_prompt=True)` rendered text and its ids.
- templates: the text of `apply_chat_template(messages, chat_template=template,
  add_generation_prompt=True, tokenize=False)` (other families' templates, this tokenizer's
  special tokens).
Offline, one torch thread, eager attention.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def as_chat(messages):
    """Messages as people write them, role first (the request's JSON may have sorted the keys;
    `tojson` in a template shows the order)."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def main():
    model_dir, request_path, out_path = sys.argv[1:4]
    torch.set_num_threads(1)
    with open(request_path) as f:
        request = json.load(f)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    out = {"eos_token_id": model.generation_config.eos_token_id, "greedy": [], "score": [], "score_bf16": [], "chat": []}
    with torch.no_grad():
        if request.get("score_bf16"):
            bf16 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="eager").eval()
            for text in request["score_bf16"]:
                ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
                logp = bf16(input_ids=ids).logits[0].float().log_softmax(-1)
                picked = logp[:-1].gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
                out["score_bf16"].append({"ids": ids[0].tolist(), "logprobs": picked.tolist()})
            del bf16
        for text in request.get("greedy", []):
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=request["max_new_tokens"])
            completion = generated[0, ids.shape[1]:].tolist()
            out["greedy"].append({"prompt_ids": ids[0].tolist(), "completion_ids": completion,
                                  "completion_text": tokenizer.decode(completion, skip_special_tokens=True)})
        model = model.to(torch.float64)
        for text in request.get("score", []):
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            logp = model(input_ids=ids).logits[0].log_softmax(-1)
            picked = logp[:-1].gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
            out["score"].append({"ids": ids[0].tolist(), "logprobs": picked.tolist(),
                                 "decoded": tokenizer.decode(ids[0].tolist(), skip_special_tokens=True)})
    for messages in map(as_chat, request.get("chat", [])):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        out["chat"].append({"text": text, "ids": list(ids)})
    out["templates"] = [
        tokenizer.apply_chat_template(as_chat(t["messages"]), chat_template=t["template"], add_generation_prompt=True, tokenize=False)
        for t in request.get("templates", [])
    ]
    with open(out_path, "w") as f:
        json.dump(out, f)
    print(f"{model_dir}: {len(out['score'])} scored, {len(out['greedy'])} greedy, {len(out['chat'])} chat -> {out_path}")


if __name__ == "__main__":
    main()
