#!/usr/bin/env python3
"""Write small random LlamaForCausalLM variants + transformers reference outputs, and greedy
decodes of the pre-trained tiny-stories fixture.

Usage (from the repo root):
    .venv/bin/python scripts/reference/llama_variants.py OUT_DIR [--fixtures DIR]

Writes, for every variant V in (untied, mha, rope_theta, head_dim):
    OUT_DIR/V/config.json, OUT_DIR/V/model.safetensors     (save_pretrained, fp32)
    OUT_DIR/V/reference.safetensors                        (layout below)
    OUT_DIR/V/reference.json                               (config summary, prompts, versions)
and OUT_DIR/greedy.json (greedy decoding of the tiny-stories fixture).

The variants exercise config paths that the SimpleStories-1.25M fixtures do not:
    untied      tie_word_embeddings=false (separate lm_head.weight), GQA 4/2, rms_norm_eps 1e-5
    mha         num_key_value_heads == num_attention_heads (4/4), 3 layers
    rope_theta  rope theta 500000 written the OLD way: a top-level "rope_theta" key in
                config.json and no "rope_parameters" (what transformers < 5 wrote), and no
                "head_dim" key either (derive hidden_size / num_attention_heads = 16); the
                script checks that transformers 5 reloads it with theta 500000, head_dim 16
                and the same logits
    head_dim    explicit head_dim 32 != hidden_size / num_attention_heads (64 / 4 = 16),
                rms_norm_eps 1e-3
Every variant has random RMSNorm weights (U(0.5, 1.5)), unlike the random fixture whose norms
are all 1, odd intermediate sizes, and a larger init std (0.1) so that logits are not flat.

reference.safetensors (same layout as the fixtures'; fp32, eager attention, no cache, no grad,
1 thread, computed by the model *reloaded from OUT_DIR/V*):
    input_ids_i   int64 [T]      random ids in [2, vocab) (i = 0..3, lengths 5, 17, 100, 1)
    logits_i      float32 [T, V]
    logprobs_i    float32 [T-1]  log_softmax(logits_i[t])[input_ids_i[t+1]] (absent for T=1)
    batch_input_ids       int64 [3, 100]  prompts 0..2 left-padded with id 1
    batch_attention_mask  int64 [3, 100]
    batch_logits          float32 [3, 100, V]  position_ids = arange(T) on every row (TRL's
                                              scoring path)
    batch_gen_position_ids int64 [3, 100]      cumsum(mask) - 1, clamped at 0 (generate's path)
    batch_gen_logits       float32 [3, 100, V]
Compare batch outputs only where the mask is 1.

greedy.json: for the first 5 lines of tiny-stories/prompts.txt, each run unbatched:
prompt ids (add_special_tokens=False), generated ids (new tokens only, including the final
[EOS]=1 if produced), do_sample=False, max_new_tokens=64, eos 1; also the smallest top-1/top-2
logit margin along the greedy path (how robust the argmax is to float noise); and the greedy
decode with repetition_penalty=1.3 (generated_ids_repetition_penalty).

Deterministic (torch.manual_seed per variant), takes about 2 s on 1 CPU thread.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import safetensors  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FIXTURES = REPO_ROOT.parent / "shared" / "fixtures"
PAD_ID = 1
PROMPT_LENGTHS = [5, 17, 100, 1]  # prompts 0..2 also form the left-padded batch
BATCH_PROMPTS = [0, 1, 2]

COMMON = dict(
    vocab_size=512,
    max_position_embeddings=256,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
    attention_dropout=0.0,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=1,
    pad_token_id=1,
    use_cache=True,
)

BASE = dict(  # what a variant does not override
    hidden_size=64, intermediate_size=171, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
VARIANTS = {
    "untied": {**BASE, "tie_word_embeddings": False, "rms_norm_eps": 1e-5},
    "mha": {**BASE, "num_key_value_heads": 4, "num_hidden_layers": 3, "intermediate_size": 150},
    "rope_theta": {**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    "head_dim": {**BASE, "head_dim": 32, "rms_norm_eps": 1e-3},
}


def die(msg: str) -> None:
    print(f"llama_variants.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def load_model(model_dir: Path) -> LlamaForCausalLM:
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager", local_files_only=True
    )
    return model.eval()


@torch.no_grad()
def forward_logits(model, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.logits.float()


def make_variant(name: str, seed: int) -> tuple[LlamaForCausalLM, LlamaConfig]:
    torch.manual_seed(seed)
    config = LlamaConfig(**COMMON, **VARIANTS[name])
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight") or pname.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)  # random-init norms are all 1.0: make a missing weight visible
    return model, config


@torch.no_grad()
def reference_tensors(model, vocab: int, gen: torch.Generator) -> tuple[dict, list[list[int]]]:
    tensors: dict[str, torch.Tensor] = {}
    prompts = [torch.randint(2, vocab, (n,), generator=gen, dtype=torch.int64) for n in PROMPT_LENGTHS]
    for i, ids in enumerate(prompts):
        logits = forward_logits(model, ids[None])[0]
        tensors[f"input_ids_{i}"] = ids.clone()
        tensors[f"logits_{i}"] = logits.contiguous()
        if len(ids) > 1:
            lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[1:, None])[:, 0]
            tensors[f"logprobs_{i}"] = lp.contiguous()
    rows = [prompts[i] for i in BATCH_PROMPTS]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), PAD_ID, dtype=torch.int64)
    mask = torch.zeros((len(rows), T), dtype=torch.int64)
    for r, row in enumerate(rows):
        ids[r, T - len(row):] = row
        mask[r, T - len(row):] = 1
    pos = torch.arange(T, dtype=torch.int64)[None].expand(len(rows), T).contiguous()
    gen_pos = (mask.cumsum(-1) - 1).clamp(min=0)
    batch_logits = forward_logits(model, ids, mask, pos)
    batch_gen_logits = forward_logits(model, ids, mask, gen_pos)
    # self-check: padded rows match the unpadded forward where mask == 1
    for r, i in enumerate(BATCH_PROMPTS):
        n = len(prompts[i])
        for bl in (batch_logits, batch_gen_logits):
            err = (bl[r, T - n:] - tensors[f"logits_{i}"]).abs().max().item()
            if err > 1e-4:
                die(f"batched logits of prompt {i} differ from unpadded by {err:.2e}")
    tensors.update(
        batch_input_ids=ids, batch_attention_mask=mask, batch_logits=batch_logits.contiguous(),
        batch_gen_position_ids=gen_pos, batch_gen_logits=batch_gen_logits.contiguous(),
    )
    return tensors, [p.tolist() for p in prompts]


def to_old_rope_layout(config_path: Path, theta: float) -> None:
    """Rewrite config.json the way older transformers wrote it: top-level rope_theta, no
    rope_parameters, and no head_dim key (so a loader must derive hidden_size / num_heads)."""
    cfg = json.loads(config_path.read_text())
    rp = cfg.pop("rope_parameters", None)
    if rp is None or rp.get("rope_theta") != theta or rp.get("rope_type", "default") != "default":
        die(f"unexpected rope_parameters in {config_path}: {rp}")
    if cfg.pop("head_dim") != cfg["hidden_size"] // cfg["num_attention_heads"]:
        die("the rope_theta variant must use the default head_dim")
    cfg["rope_theta"] = theta
    config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def write_variant(out_dir: Path, name: str, seed: int) -> str:
    vdir = out_dir / name
    vdir.mkdir(parents=True, exist_ok=True)
    model, config = make_variant(name, seed)
    model.save_pretrained(str(vdir), safe_serialization=True)
    (vdir / "generation_config.json").unlink(missing_ok=True)  # not needed; keep the dir minimal
    theta = VARIANTS[name]["rope_parameters"]["rope_theta"]
    if name == "rope_theta":
        to_old_rope_layout(vdir / "config.json", theta)

    # Everything below uses the model reloaded from disk: that is what the Rust side loads.
    reloaded = load_model(vdir)
    got_theta = reloaded.config.rope_parameters["rope_theta"]
    if got_theta != theta:
        die(f"{name}: transformers reloaded rope_theta {got_theta}, expected {theta}")
    if reloaded.config.head_dim != VARIANTS[name]["head_dim"]:
        die(f"{name}: transformers reloaded head_dim {reloaded.config.head_dim}")
    with safetensors.safe_open(str(vdir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    if ("lm_head.weight" in keys) == VARIANTS[name]["tie_word_embeddings"]:
        die(f"{name}: lm_head.weight presence does not match tie_word_embeddings")
    if VARIANTS[name]["tie_word_embeddings"] and reloaded.lm_head.weight.data_ptr() != reloaded.model.embed_tokens.weight.data_ptr():
        die(f"{name}: reloaded model does not tie lm_head to embed_tokens")

    gen = torch.Generator().manual_seed(1000 + seed)
    tensors, prompts = reference_tensors(reloaded, config.vocab_size, gen)
    # the in-memory model (before the save / config rewrite) must give the very same logits
    for i in range(len(PROMPT_LENGTHS)):
        # (not bit-equal: the two models' weights live in differently laid-out storage; ~1e-6 noise)
        err = (forward_logits(model, tensors[f"input_ids_{i}"][None])[0] - tensors[f"logits_{i}"]).abs().max().item()
        if err > 1e-5:
            die(f"{name}: reloaded model's logits differ from the in-memory model's by {err:.2e} (prompt {i})")
    save_file(tensors, str(vdir / "reference.safetensors"))

    cfg_json = json.loads((vdir / "config.json").read_text())
    n_params = sum(p.numel() for p in reloaded.parameters())
    meta = {
        "description": "transformers reference forward passes of a random LlamaForCausalLM variant "
        "(float32, eager attention, use_cache=False, no grad, 1 thread); RMSNorm weights ~ U(0.5, 1.5). "
        "batch_logits use position_ids arange(T); batch_gen_logits use cumsum(mask)-1.",
        "variant": name,
        "seed": seed,
        "num_parameters": n_params,
        "safetensors_keys": sorted(keys),
        "rope_theta_effective": got_theta,
        "config_json": cfg_json,
        "prompts": prompts,
        "batch_prompts": BATCH_PROMPTS,
        "pad_id": PAD_ID,
        "versions": versions(),
    }
    (vdir / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
    std = tensors["logits_2"].std().item()
    return (
        f"{name:<11} {n_params:>7} params  theta={got_theta:g} eps={config.rms_norm_eps:g} "
        f"heads={config.num_attention_heads}/{config.num_key_value_heads} head_dim={config.head_dim} "
        f"tied={config.tie_word_embeddings}  logits std {std:.2f}"
    )


def versions() -> dict:
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "safetensors": safetensors.__version__, "python": sys.version.split()[0]}


REPETITION_PENALTY = 1.3


@torch.no_grad()
def write_greedy(out_dir: Path, fixtures: Path, n_prompts: int = 5, max_new_tokens: int = 64) -> str:
    mdir = fixtures / "tiny-stories"
    model = load_model(mdir)
    tok = PreTrainedTokenizerFast.from_pretrained(str(mdir), local_files_only=True)
    lines = [ln.rstrip("\n") for ln in (mdir / "prompts.txt").read_text().splitlines() if ln.strip()][:n_prompts]
    results = []
    for text in lines:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        input_ids = torch.tensor([ids], dtype=torch.int64)
        out = model.generate(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
            max_new_tokens=max_new_tokens, eos_token_id=1, pad_token_id=1, use_cache=True,
            output_scores=True, return_dict_in_generate=True,
        )
        new = out.sequences[0, len(ids):].tolist()
        # generate pads after EOS only in batched runs; unbatched there is nothing after EOS
        if 1 in new:
            new = new[: new.index(1) + 1]
        margins = [(lambda t: (t[0] - t[1]).item())(torch.topk(s[0], 2).values) for s in out.scores[: len(new)]]
        # the same decode without the KV cache must agree (guards against cache-path float noise)
        nc = model.generate(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
            max_new_tokens=max_new_tokens, eos_token_id=1, pad_token_id=1, use_cache=False,
        )[0, len(ids):].tolist()
        if 1 in nc:
            nc = nc[: nc.index(1) + 1]
        if nc != new:
            die(f"greedy decode with and without KV cache differ for prompt {text!r}")
        # greedy with HF's repetition penalty (RepetitionPenaltyLogitsProcessor) on prompt and output
        pen = model.generate(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
            max_new_tokens=max_new_tokens, eos_token_id=1, pad_token_id=1, use_cache=True,
            repetition_penalty=REPETITION_PENALTY,
        )[0, len(ids):].tolist()
        if 1 in pen:
            pen = pen[: pen.index(1) + 1]
        results.append({
            "prompt": text,
            "prompt_ids": ids,
            "generated_ids": new,
            "generated_ids_repetition_penalty": pen,
            "ends_with_eos": bool(new and new[-1] == 1),
            "generated_text": tok.decode(new, skip_special_tokens=True),
            "min_top2_logit_margin": min(margins),
        })
    payload = {
        "description": "greedy decoding (do_sample=False) of the tiny-stories fixture, each prompt unbatched; "
        "prompt_ids encoded with add_special_tokens=False; generated_ids = new tokens only, including the "
        "final [EOS]=1 if produced within max_new_tokens. fp32, eager attention, 1 thread.",
        "model_dir": "../shared/fixtures/tiny-stories",
        "max_new_tokens": max_new_tokens,
        "repetition_penalty": REPETITION_PENALTY,
        "eos_token_id": 1,
        "results": results,
        "versions": versions(),
    }
    (out_dir / "greedy.json").write_text(json.dumps(payload, indent=1) + "\n")
    lens = [len(r["generated_ids"]) for r in results]
    return f"greedy.json: {len(results)} prompts, generated lengths {lens}, min margin {min(r['min_top2_logit_margin'] for r in results):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES,
                    help=f"shared fixtures dir (default {DEFAULT_FIXTURES})")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    for f in ("config.json", "model.safetensors", "tokenizer.json", "prompts.txt"):
        if not (args.fixtures / "tiny-stories" / f).is_file():
            die(f"missing fixture file {args.fixtures / 'tiny-stories' / f}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for seed, name in enumerate(VARIANTS):
        print("wrote", args.out_dir / name, "-", write_variant(args.out_dir, name, seed))
    print("wrote", args.out_dir / "greedy.json", "-", write_greedy(args.out_dir, args.fixtures))
    print(f"done in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
