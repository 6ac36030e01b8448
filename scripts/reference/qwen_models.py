#!/usr/bin/env python3
"""Write small random Qwen2ForCausalLM / Qwen3ForCausalLM models + transformers reference outputs.

Usage (from the repo root):
    .venv/bin/python scripts/reference/qwen_models.py OUT_DIR [--fixtures DIR]
    .venv/bin/python scripts/reference/qwen_models.py --score MODEL_DIR IDS_JSON OUT_JSON

Writes, for every variant V below, a model directory transformers and smallrl both load:
    OUT_DIR/V/config.json, model.safetensors        (save_pretrained, fp32)
    OUT_DIR/V/tokenizer.json, tokenizer_config.json (tiny-random's: vocab 4096, [EOS] = 1)
    OUT_DIR/V/reference.safetensors                 (layout below)
    OUT_DIR/V/greedy.json                           (transformers' greedy decodes)

    qwen2_gqa_tied     Qwen2, 4 heads / 2 kv heads, tied embeddings, q/k/v biases ~ U(-0.5, 0.5)
    qwen2_mha_untied   Qwen2, 4 / 4 heads, untied lm_head, rms_norm_eps 1e-5, 3 layers
    qwen3_gqa_tied     Qwen3, 4 / 2 heads, head_dim 32 != hidden 64 / 4, tied
    qwen3_untied       Qwen3, 4 / 1 heads, head_dim 24, untied, rms_norm_eps 1e-5
Every RMSNorm weight (the per-head q_norm / k_norm of Qwen3 included) ~ U(0.5, 1.5), init std
0.1, so that a missing norm, bias or scale shows in the logits.

reference.safetensors (fp32, eager attention, no cache, no grad, 1 thread, computed by the model
reloaded from OUT_DIR/V):
    input_ids_i   int64 [T]      random ids in [2, 4096), i = 0..2, lengths 5, 17, 40
    logits_i      float32 [T, V]
    logprobs_i    float32 [T-1]  log_softmax(logits_i[t])[input_ids_i[t+1]], computed in float64
    batch_input_ids / batch_attention_mask  int64 [3, 40]  the prompts left-padded with id 1
    batch_logits          float32 [3, 40, V]  position_ids = arange(T) on every row
    batch_gen_position_ids int64 [3, 40]      cumsum(mask) - 1, clamped at 0
    batch_gen_logits       float32 [3, 40, V]

greedy.json: each prompt unbatched, generate(do_sample=False, max_new_tokens=8, eos 1), new
tokens only (through the first EOS when one is drawn), with the smallest top-1/top-2 margin.

--score: log-probabilities of each row of IDS_JSON (a list of id lists) under the model in
MODEL_DIR (for an exported model: transformers loads what smallrl wrote); writes
{"logprobs": [[...], ...]} (float64 log_softmax of fp32 logits; one list per row, T-1 values).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FIXTURES = REPO_ROOT.parent / "shared" / "fixtures"
PAD_ID = 1
PROMPT_LENGTHS = [5, 17, 40]
MAX_NEW_TOKENS = 8

COMMON = dict(
    vocab_size=4096, max_position_embeddings=256, hidden_act="silu", attention_dropout=0.0,
    initializer_range=0.1, bos_token_id=None, eos_token_id=1, pad_token_id=1, use_cache=True,
    use_sliding_window=False, hidden_size=64, intermediate_size=171, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
VARIANTS = {
    "qwen2_gqa_tied": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen2_mha_untied": (Qwen2Config, Qwen2ForCausalLM, {"num_key_value_heads": 4, "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "num_hidden_layers": 3, "intermediate_size": 150}),
    "qwen3_gqa_tied": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 32, "attention_bias": False}),
    "qwen3_untied": (Qwen3Config, Qwen3ForCausalLM, {"num_key_value_heads": 1, "head_dim": 24, "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "attention_bias": False}),
}


def die(msg: str) -> None:
    print(f"qwen_models.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def load_model(model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager", local_files_only=True).eval()


@torch.no_grad()
def forward_logits(model, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False).logits.float()


def logprobs_of(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits[:-1].double(), dim=-1).gather(-1, ids[1:, None])[:, 0]


def make_variant(name: str, seed: int):
    config_class, model_class, overrides = VARIANTS[name]
    torch.manual_seed(seed)
    config = config_class(**{**COMMON, **overrides})
    config._attn_implementation = "eager"
    model = model_class(config).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)  # random-init norms are all 1: make a missing weight visible
            elif pname.endswith(".bias"):
                p.uniform_(-0.5, 0.5)  # random-init biases are 0
    return model, config


@torch.no_grad()
def write_variant(out_dir: Path, fixtures: Path, name: str, seed: int) -> str:
    vdir = out_dir / name
    vdir.mkdir(parents=True, exist_ok=True)
    model, config = make_variant(name, seed)
    model.save_pretrained(str(vdir), safe_serialization=True)
    (vdir / "generation_config.json").unlink(missing_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(fixtures / "tiny-random" / f, vdir / f)
    reloaded = load_model(vdir)
    names = [n for n, _ in reloaded.named_parameters()]
    if name.startswith("qwen2") and not any(n.endswith("q_proj.bias") for n in names):
        die(f"{name}: no q_proj.bias")
    if name.startswith("qwen3") and not any(n.endswith("q_norm.weight") for n in names):
        die(f"{name}: no q_norm")
    gen = torch.Generator().manual_seed(1000 + seed)
    tensors = {}
    prompts = [torch.randint(2, config.vocab_size, (n,), generator=gen, dtype=torch.int64) for n in PROMPT_LENGTHS]
    for i, ids in enumerate(prompts):
        logits = forward_logits(reloaded, ids[None])[0]
        tensors[f"input_ids_{i}"] = ids.clone()
        tensors[f"logits_{i}"] = logits.contiguous()
        tensors[f"logprobs_{i}"] = logprobs_of(logits, ids).float().contiguous()
        err = (forward_logits(model, ids[None])[0] - logits).abs().max().item()
        if err > 1e-5:
            die(f"{name}: the reloaded model's logits differ from the in-memory model's by {err:.2e}")
    T = max(PROMPT_LENGTHS)
    ids = torch.full((len(prompts), T), PAD_ID, dtype=torch.int64)
    mask = torch.zeros((len(prompts), T), dtype=torch.int64)
    for r, row in enumerate(prompts):
        ids[r, T - len(row):] = row
        mask[r, T - len(row):] = 1
    pos = torch.arange(T, dtype=torch.int64)[None].expand(len(prompts), T).contiguous()
    gen_pos = (mask.cumsum(-1) - 1).clamp(min=0)
    tensors.update(
        batch_input_ids=ids, batch_attention_mask=mask, batch_logits=forward_logits(reloaded, ids, mask, pos).contiguous(),
        batch_gen_position_ids=gen_pos, batch_gen_logits=forward_logits(reloaded, ids, mask, gen_pos).contiguous(),
    )
    save_file(tensors, str(vdir / "reference.safetensors"))
    results = []
    for p in prompts:
        out = reloaded.generate(
            input_ids=p[None], attention_mask=torch.ones_like(p[None]), do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
            eos_token_id=1, pad_token_id=1, use_cache=True, output_scores=True, return_dict_in_generate=True,
        )
        new = out.sequences[0, len(p):].tolist()
        if 1 in new:
            new = new[: new.index(1) + 1]
        margins = [(lambda t: (t[0] - t[1]).item())(torch.topk(s[0], 2).values) for s in out.scores[: len(new)]]
        results.append({"prompt_ids": p.tolist(), "generated_ids": new, "min_top2_logit_margin": min(margins)})
    greedy = {"max_new_tokens": MAX_NEW_TOKENS, "eos_token_id": 1, "results": results, "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    (vdir / "greedy.json").write_text(json.dumps(greedy, indent=1) + "\n")
    n_params = sum(p.numel() for p in reloaded.parameters())
    return f"{name:<17} {n_params:>7} params, heads {config.num_attention_heads}/{config.num_key_value_heads}, head_dim {getattr(reloaded.config, 'head_dim', config.hidden_size // config.num_attention_heads)}, tied {config.tie_word_embeddings}, min greedy margin {min(r['min_top2_logit_margin'] for r in results):.3f}"


@torch.no_grad()
def score(model_dir: Path, ids_json: Path, out_json: Path) -> None:
    model = load_model(model_dir)
    rows = json.loads(ids_json.read_text())
    logprobs = []
    for row in rows:
        ids = torch.tensor(row, dtype=torch.int64)
        logprobs.append(logprobs_of(forward_logits(model, ids[None])[0], ids).tolist())
    out_json.write_text(json.dumps({"logprobs": logprobs, "model_type": model.config.model_type}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, nargs="?")
    ap.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES)
    ap.add_argument("--score", nargs=3, type=Path, metavar=("MODEL_DIR", "IDS_JSON", "OUT_JSON"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.score:
        score(*args.score)
        return
    if args.out_dir is None:
        die("OUT_DIR is required")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if not (args.fixtures / "tiny-random" / f).is_file():
            die(f"missing fixture file {args.fixtures / 'tiny-random' / f}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for seed, name in enumerate(VARIANTS):
        print("wrote", args.out_dir / name, "-", write_variant(args.out_dir, args.fixtures, name, seed))


if __name__ == "__main__":
    main()
