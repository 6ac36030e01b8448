#!/usr/bin/env python3
"""Run TRL 1.16's own GRPO code on a given batch and save the loss and every parameter gradient.

Usage (from the repo root):
    .venv/bin/python scripts/reference/trl_grpo.py --batch B.safetensors --args A.json --out O.safetensors
    .venv/bin/python scripts/reference/trl_grpo.py --case-dirs DIR [DIR ...]   (DIR/args.json, DIR/batch.safetensors)
    .venv/bin/python scripts/reference/trl_grpo.py --self-test

How TRL is driven (nothing of the loss is re-implemented here)
--------------------------------------------------------------
A real `trl.GRPOTrainer` is constructed offline on CPU (GRPOConfig(use_cpu=True, report_to=[],
bf16=False (A.json's "bf16": true sets bf16=True, TRL's mixed precision: each pass under
torch.autocast("cpu", bfloat16), checked from a linear layer's output dtype), gradient_checkpointing=False, gradient_accumulation_steps=GAS,
per_device_train_batch_size=B/GAS; GAS = "gradient_accumulation_steps" of A.json, default 1), a dummy dataset, one reward function). Then:
1. `trainer._generate_and_score_completions(rows)` runs unmodified. Generation is replaced through
   TRL's own `rollout_func` hook (trainer.py `_generate`, grpo_trainer.py:2200-2222), which returns
   the given prompt ids (left padding stripped) and completion ids (cut to `completion_mask`); the
   reward function returns the given `rewards` in row order. So TRL itself pads the batch, builds
   `completion_mask`, computes `num_items_in_batch`, the reference log-probs and the advantages.
2. With num_iterations > 1 and `old_per_token_logps` in the batch, `inputs["old_per_token_logps"]`
   is replaced by the given one (TRL would have computed it from the current policy, giving
   ratio 1; the Rust test supplies it to make the clip active).
3. `trainer.compute_loss(trainer.model, inputs)` (-> `_compute_loss`, grpo_trainer.py:3020-3292)
   with the model in train mode, then `loss.backward()`.
The reference model: TRL builds it itself from `model.config._name_or_path`
(grpo_trainer.py:990-1003, `create_model_from_path(get_config_model_id(self.model.config))`), so
that field of the policy's config is pointed at `ref_model_dir` before construction.
`trainer.current_gradient_accumulation_steps` is only set by `Trainer`'s training loop; it is set
to GAS here, and with GAS > 1 step 3 runs once per chunk of consecutive rows (TRL's
`split_tensor_dict`, without the row shuffle of `_prepare_inputs`), each chunk's loss backward.

What TRL 1.16 does (source lines of trl/trainer/grpo_trainer.py, grpo_config.py, utils.py)
-------------------------------------------------------------------------------------------
Advantages (grpo_trainer.py:2763-2788, multi_objective_aggregation="sum_then_normalize"):
    r = sum_k w_k r_k (w = 1);  mean_g = nanmean over the group of num_generations adjacent rows
    std_g = nanstd(...) = UNBIASED (n-1) std, computed as sqrt(nanmean((r - mean)^2) * n / (n-1))
            (trl/trainer/utils.py:1037-1044; not torch.std: the fp32 rounding differs slightly)
    A = (r - mean_g) / (std_g + 1e-4)   if scale_rewards in {"group" (DEFAULT), "batch"}
    A = r - mean_g                      if scale_rewards == "none"
    ("batch": std over the whole batch instead of the group, mean is still per group.)
    frac_reward_zero_std = mean(isclose(std_g, 0)) (2788). All-equal group -> A = 0 exactly.
    All in fp32; NaN advantages (unscorable rows) -> 0 (2810).
Advantages with multi_objective_aggregation="normalize_then_sum" (GDPO, 2790-2799), from the K
    reward functions' rewards r_k (NaN where a function returned None) and weights w_k:
    z_k = (r_k - nanmean_g(r_k)) / (nanstd_g(r_k) + 1e-4) per group (NaN with one value: nansum drops it)
    s = nansum_k(w_k z_k); s = NaN on rows where every function returned None (unscorable)
    A = (s - nanmean(s)) / (nanstd(s) + 1e-4) over the whole batch (scale_rewards is not read);
    frac_reward_zero_std = isclose(nanstd(s), 0) on every row.
Per-token log-probs (_get_per_token_logps_and_entropies, 1419-1508; utils.add_fused_lm_head
1548-1698; kernels/chunked_logprob.py):
    * one forward over cat([prompt_ids, completion_ids]) with attention_mask =
      cat([prompt_mask, completion_mask]); NO position_ids are passed, so positions are
      arange(P+C) on every row, including left-padded ones (generate uses cumsum(mask)-1 instead).
      The completion's right padding is masked out of attention (mask 0), like the prompt padding.
    * logits_to_keep = C (completion width); labels = input_ids with -100 where attention_mask==0
      and on all but the last C columns; hidden[:, :-1] scores labels[:, 1:], and the last C of
      those are kept: completion token j is scored from position P-1+j. The final position
      (P+C-1) is never projected.
    * the LM head is TRL's fused chunked log-softmax: z = logits / temperature (temperature from
      GRPOConfig, applied to the POLICY AND THE REFERENCE, both patched with add_fused_lm_head at
      grpo_trainer.py:1068-1077); logp = z[label] - (max z + log sum exp(z - max z)). Its backward
      is hand-written but exact (d logp / dz = onehot - softmax; entropy grad too).
    * per-token outputs are exactly 0 where the label is -100 (completion padding), so
      per_token_logps, ref_per_token_logps, entropy and kl are 0 there.
    * entropy (logged, no gradient unless entropy_coef != 0) = log Z - sum softmax(z) * z of the
      temperature-scaled logits, from the same pass.
Reference log-probs: computed once in _generate_and_score_completions (2706-2738) under no_grad
    from `ref_model` with the same fused head and temperature (only if beta != 0).
Old log-probs: None (-> per_token_logps.detach(), ratio exactly 1) unless
    gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0 (2639-2656), e.g.
    num_iterations=2 with GAS=1; then the current policy's no-grad log-probs at generation time.
Loss (_compute_loss 3020-3292), defaults: epsilon=0.2, epsilon_high=None -> epsilon (so
    epsilon_low = epsilon_high = 0.2), delta=None, importance_sampling_level="token",
    top_entropy_quantile=1.0 (no entropy mask), entropy_coef=0.0, off_policy_mask_threshold=None,
    mask_truncated_completions=False (truncated completions stay in the loss), beta=0.0 (!),
    loss_type="dapo" (!), scale_rewards="group", use_bias_correction_kl=True (!), bf16=True (!).
    coef_1 = exp(logp - old)   (importance_sampling_level "token")
           = exp(sum_t((logp - old) * mask) / clamp(sum_t mask, min=1)), [B, 1]   ("sequence", GSPO)
    coef_2 = clamp(coef_1, 1 - eps_low, 1 + eps_high)
    if delta is not None: coef_1 = clamp(coef_1, max=delta)   (two-sided clipping; also in the
        clip metrics below, which read the clamped coef_1)
    per_token_loss = -min(coef_1 * A, coef_2 * A)
    cispo (3109-3111): per_token_loss = -clamp(coef_1, max=epsilon_high).detach() * A * logp
        (epsilon_high is the weight's absolute cap here; delta and epsilon are not used), and
        aggregated as dapo; TRL logs cispo_clip_ratio = mean((coef_1 > epsilon_high) & (A > 0))
        instead of clip_ratio/*.
    top_entropy_quantile q < 1 (1049-1052, get_high_entropy_mask 1380-1416): threshold =
        torch.quantile(entropies[mask], 1 - q) (linear interpolation, all processes' tokens);
        per_token_loss *= (entropies * mask >= threshold) & mask, BEFORE the KL term is added
        (the KL still acts on every token) and the aggregations still count every mask token.
    per_token_kl = exp(ref - logp) - (ref - logp) - 1          (k3)
    if use_bias_correction_kl: per_token_kl *= coef_1   <- NEW in TRL 1.x and ON by default. coef_1
        is differentiable, so even on-policy (value 1) the KL gradient gains + kl * dlogp. This
        script defaults it to False (the behaviour in the reference note, section 2); pass
        "use_bias_correction_kl": true in A.json for TRL's default.
    per_token_loss += beta * per_token_kl
    mask = completion_mask; with mask_truncated_completions, rows whose last completion token is
        not EOS/pad get an all-zero completion_mask in _generate_and_score_completions (2487-2495),
        before num_items_in_batch (so dapo's divisor drops their tokens) and the forward pass; their
        rewards still enter the group statistics.
    grpo:    mean_i( sum_t(l*m)_i / clamp(sum_t m_i, min=1) ) / GAS
    bnpo:    sum(l*m) / clamp(sum(m), min=1) / GAS                       (local batch tokens)
    dr_grpo: sum(l*m) / (B * max_completion_length) / GAS    (config max_completion_length, not C)
    cispo, dapo: sum(l*m) / (clamp(num_items_in_batch, min=1) / num_processes * GAS / steps_per_generation)
             num_items_in_batch = active tokens of the whole generation batch, summed over processes
             (2497-2498); with 1 process, GAS = steps_per_generation = 1 it equals bnpo.
Metrics (3253-3290): kl = masked mean of per_token_kl over all tokens; entropy = masked mean;
    clip_ratio/low_mean = masked mean of (coef_1 < 1-eps_low) & (A < 0); high_mean: (coef_1 > 1+eps_high)
    & (A > 0); region_mean = either (means over completions, not tokens, with sequence ratios);
    low_min / high_max = min/max over sequences of the per-sequence mean.
Also worth knowing: advantages of unscorable rows (reward None) are 0; `_prepare_inputs` shuffles
the rows (shuffle_sequence_dict) and splits them into steps_per_generation chunks before the loss;
padding uses the tokenizer's pad id (pad = eos = 1 here) and prompts are padded on the left.

Input / output formats
----------------------
A.json: {"model_dir", "ref_model_dir", "beta", "epsilon", "loss_type" in grpo|dr_grpo|dapo|bnpo|cispo|sapo|luspo|vespo,
         "temperature", "max_completion_length", "num_generations", "num_iterations"}; optional:
         "epsilon_high" (default = epsilon; cispo's weight cap), "delta" (none),
         "importance_sampling_level" ("token"), "top_entropy_quantile" (1.0),
         "gradient_accumulation_steps" (1; the batch trained as that many consecutive row chunks,
         TRL's steps_per_generation equal to it; the loss saved is the chunks' sum),
         "scale_rewards" ("group"), "mask_truncated_completions" (false), "use_bias_correction_kl"
         (false), TRL's "sapo_temperature_pos" / "_neg", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
         "vespo_lambda_neg" (TRL's defaults), "bf16" (false; TRL's bf16=True) and "off_policy_mask_threshold" (none; with it the
         sampler's log-probabilities are returned by rollout_func, as with the correction), "importance_sampling_correction" (false; with "importance_sampling_mode",
         "importance_sampling_clip_min", "importance_sampling_clip_max": smallrl's names of TRL's
         vllm_importance_sampling_*, a lower bound 0 passed as TRL's None; TRL applies it only with
         use_vllm, which is set on the trainer after construction, no vLLM started), "tokenizer" (a tokenizer.json; default model_dir/tokenizer.json, else the fixtures'
         simplestories-4096.json; only used to decode completions for logging).
         Relative paths are resolved against the current directory.
B.safetensors: prompt_ids int64 [B,P] left-padded with 1, prompt_mask int64 [B,P],
         completion_ids int64 [B,C] right-padded with 1, completion_mask int64 [B,C] (a prefix of
         ones), rewards float32 [B] (groups of num_generations adjacent rows), optional
         rewards_per_func float32 [B,K] (then TRL gets K reward functions, each returning its column,
         None where it is NaN, with A.json's "reward_weights" [K] and "multi_objective_aggregation",
         which must be "normalize_then_sum"; "rewards" is then not read), advantages float32
         [B], optional old_per_token_logps float32 [B,C], sampling_per_token_logps float32 [B,C] (the
         sampler's, returned by rollout_func as vLLM's "logprobs"; required with the correction),
         optional tool_mask int64 [B,C] (1 on the model's tokens, 0 on a multi-turn episode's
         observation tokens): returned by rollout_func as its `env_mask` extra field, which TRL
         1.16 takes as the `tool_mask` its tool-calling loop builds (grpo_trainer.py:2270-2272,
         0 for tool-result tokens, 2146-2154), so the loss, num_items_in_batch, the KL and
         entropy metrics and completions/*_length count the model's tokens only (2276-2277,
         2497, 3027); the independent loss multiplies its mask by it.
O.safetensors (all float32): loss [] ; advantages_trl [B]; advantages_given [B];
         per_token_logps, ref_per_token_logps, per_token_kl (k3, before the optional coef_1
         factor), entropy, old_per_token_logps (what the loss used) [B,C], 0 where the mask is 0;
         completion_mask_trl [B,C]; tool_mask_trl [B,C] (with a given tool_mask); num_items_in_batch []; grad.<hf parameter name> for every
         trainable parameter (named_parameters(): with tied embeddings there is no lm_head.weight
         entry, the head's gradient is accumulated into grad.model.embed_tokens.weight).
O.metrics.json (next to O): TRL's logged metrics for the batch (kl, entropy, clip_ratio/*, reward,
         reward_std, frac_reward_zero_std, completions/*), TRL's padded widths, max |A_trl - A_given|.
If the given P or C is wider than needed, TRL pads only to the longest row: outputs are still
[B, C] (zeros appended on the right) and the metrics JSON records trl_prompt_width /
trl_completion_width; extra left padding of the prompts shifts TRL's positions (arange over the
narrower tensor), so give canonically padded batches for bit-level comparisons.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental"
os.environ.setdefault("ACCELERATE_USE_CPU", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402

torch.set_num_threads(1)

import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()
warnings.filterwarnings("ignore")

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT.parent / "shared" / "fixtures"
PAD_ID = 1
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
# GRPOConfig arguments passed through under TRL's own names when A.json has them (TRL's defaults otherwise).
TRL_KEYS = ("sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
            "vespo_lambda_neg", "off_policy_mask_threshold", "multi_objective_aggregation", "reward_weights", "entropy_coef",
            "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target")
REQUIRED_ARGS = ("model_dir", "ref_model_dir", "beta", "epsilon", "loss_type", "temperature",
                 "max_completion_length", "num_generations", "num_iterations")


class InputError(Exception):
    pass


# ----------------------------------------------------------------------------- inputs

def read_args(path: Path) -> dict:
    if not path.is_file():
        raise InputError(f"args file not found: {path}")
    a = json.loads(path.read_text())
    missing = [k for k in REQUIRED_ARGS if k not in a]
    if missing:
        raise InputError(f"{path}: missing keys {missing}")
    if a["loss_type"] not in LOSS_TYPES:
        raise InputError(f"{path}: loss_type {a['loss_type']!r} not in {LOSS_TYPES}")
    for key in ("model_dir", "ref_model_dir"):
        d = Path(a[key])
        for f in ("config.json", "model.safetensors"):
            if not (d / f).is_file():
                raise InputError(f"{key}: missing {d / f}")
    return a


def read_batch(path: Path, a: dict) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise InputError(f"batch file not found: {path}")
    b = load_file(str(path))
    need = {"prompt_ids": torch.int64, "prompt_mask": torch.int64, "completion_ids": torch.int64,
            "completion_mask": torch.int64, "rewards": torch.float32, "advantages": torch.float32}
    for k, dt in need.items():
        if k not in b:
            raise InputError(f"{path}: missing tensor {k!r}")
        if b[k].dtype != dt:
            raise InputError(f"{path}: {k} has dtype {b[k].dtype}, expected {dt}")
    B, P = b["prompt_ids"].shape
    C = b["completion_ids"].shape[1]
    shapes = {"prompt_mask": (B, P), "completion_ids": (B, C), "completion_mask": (B, C),
              "rewards": (B,), "advantages": (B,), "old_per_token_logps": (B, C), "sampling_per_token_logps": (B, C)}
    for k, s in shapes.items():
        if k in b and tuple(b[k].shape) != s:
            raise InputError(f"{path}: {k} has shape {tuple(b[k].shape)}, expected {s}")
    G = a["num_generations"]
    if B % G:
        raise InputError(f"batch size {B} is not a multiple of num_generations {G}")
    pm, cm = b["prompt_mask"], b["completion_mask"]
    n_p, n_c = pm.sum(1), cm.sum(1)
    for i in range(B):
        if not torch.equal(pm[i], (torch.arange(P) >= P - n_p[i]).long()):
            raise InputError(f"prompt_mask row {i} is not left padding (zeros then ones)")
        if not torch.equal(cm[i], (torch.arange(C) < n_c[i]).long()):
            raise InputError(f"completion_mask row {i} is not a prefix of ones")
        if n_p[i] == 0:
            raise InputError(f"prompt row {i} is empty")
    if C > a["max_completion_length"]:
        raise InputError(f"completion width {C} > max_completion_length {a['max_completion_length']}")
    if "tool_mask" in b:
        tm = b["tool_mask"]
        if tm.dtype != torch.int64 or tuple(tm.shape) != (B, C) or not bool(((tm == 0) | (tm == 1)).all()):
            raise InputError(f"{path}: tool_mask must be int64 [B, C] of zeros and ones")
        if bool(((tm == 1) & (cm == 0)).any()) or bool(((tm * cm).sum(1) == 0).any()):
            raise InputError(f"{path}: tool_mask must mark model tokens inside completion_mask, at least one per row")
    if "old_per_token_logps" in b and b["old_per_token_logps"].dtype != torch.float32:
        raise InputError(f"{path}: old_per_token_logps must be float32")
    if "rewards_per_func" in b:
        K = len(a.get("reward_weights") or [])
        if a.get("multi_objective_aggregation") != "normalize_then_sum" or b["rewards_per_func"].shape != (B, K):
            raise InputError(f"{path}: rewards_per_func must be [B, K] float32 with K = len(reward_weights) and "
                             "multi_objective_aggregation normalize_then_sum")
    if a.get("importance_sampling_correction", False) and "sampling_per_token_logps" not in b:
        raise InputError(f"{path}: importance_sampling_correction needs the sampler's log-probabilities (sampling_per_token_logps)")
    return b


def correction_settings(a: dict) -> dict:
    """TRL's vllm_importance_sampling_* arguments from smallrl's names (a lower bound 0 is TRL's None)."""
    clip_min = float(a.get("importance_sampling_clip_min", 0.0))
    return {"vllm_importance_sampling_correction": bool(a.get("importance_sampling_correction", False)),
            "vllm_importance_sampling_mode": a.get("importance_sampling_mode", "sequence_mask"),
            "vllm_importance_sampling_clip_min": clip_min if clip_min > 0 else None,
            "vllm_importance_sampling_clip_max": float(a.get("importance_sampling_clip_max", 3.0))}




def load_tokenizer(a: dict) -> PreTrainedTokenizerFast:
    cands = [Path(a["tokenizer"])] if a.get("tokenizer") else [
        Path(a["model_dir"]) / "tokenizer.json", FIXTURES / "simplestories-4096.json"]
    for f in cands:
        if f.is_file():
            return PreTrainedTokenizerFast(tokenizer_file=str(f), unk_token="[UNK]", eos_token="[EOS]",
                                           pad_token="[EOS]", padding_side="left")
    raise InputError(f"no tokenizer found (tried {', '.join(map(str, cands))})")


def load_model(model_dir) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                attn_implementation="eager", local_files_only=True)


# ----------------------------------------------------------------------------- TRL run

def run_trl(a: dict, b: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """Drive TRL's GRPOTrainer on batch `b`; returns (tensors to save, metrics)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import split_tensor_dict

    B, P = b["prompt_ids"].shape
    C = b["completion_ids"].shape[1]
    n_p, n_c = b["prompt_mask"].sum(1).tolist(), b["completion_mask"].sum(1).tolist()
    prompt_lists = [b["prompt_ids"][i, P - n_p[i]:].tolist() for i in range(B)]
    completion_lists = [b["completion_ids"][i, : n_c[i]].tolist() for i in range(B)]
    rewards = b["rewards"].tolist()
    gas = int(a.get("gradient_accumulation_steps", 1))  # steps_per_generation defaults to it
    correction = correction_settings(a)
    sampling = None
    # The sampler's log-probs, as vLLM returns them: read by the correction and by the off-policy mask
    # (which falls back to the old log-probs without them, as TRL does without vLLM).
    if correction["vllm_importance_sampling_correction"] or a.get("off_policy_mask_threshold") is not None:
        sampling = [b["sampling_per_token_logps"][i, : n_c[i]].tolist() for i in range(B)]

    # Episodes: the model-token mask as rollout_func's env_mask (TRL's tool_mask).
    env_mask = None if "tool_mask" not in b else [b["tool_mask"][i, : n_c[i]].tolist() for i in range(B)]

    def rollout_func(prompts, trainer):  # TRL's generation hook: hand back the given batch
        if len(prompts) != B:
            raise RuntimeError(f"rollout_func got {len(prompts)} prompts, expected {B}")
        out = {"prompt_ids": prompt_lists, "completion_ids": completion_lists, "logprobs": sampling}
        return out if env_mask is None else out | {"env_mask": env_mask}

    def given_reward(prompts, completions, completion_ids, **kw):
        if [list(c) for c in completion_ids] != completion_lists:
            raise RuntimeError("reward function saw completions in an unexpected order")
        return rewards

    def given_column(k):  # reward function k of rewards_per_func: its column, None where NaN
        def reward(prompts, completions, completion_ids, **kw):
            if [list(c) for c in completion_ids] != completion_lists:
                raise RuntimeError("reward function saw completions in an unexpected order")
            return [None if math.isnan(v) else v for v in b["rewards_per_func"][:, k].tolist()]
        reward.__name__ = f"given_reward_{k}"
        return reward

    reward_funcs = given_reward
    if "rewards_per_func" in b:
        reward_funcs = [given_column(k) for k in range(b["rewards_per_func"].shape[1])]

    tmp = tempfile.mkdtemp(prefix="trl_grpo_")
    try:
        cfg = GRPOConfig(
            output_dir=tmp, use_cpu=True, report_to=[], bf16=bool(a.get("bf16", False)), fp16=False,
            gradient_checkpointing=False, per_device_train_batch_size=B // gas, gradient_accumulation_steps=gas,
            num_generations=a["num_generations"], max_completion_length=a["max_completion_length"],
            beta=a["beta"], epsilon=a["epsilon"], epsilon_high=a.get("epsilon_high"),
            loss_type=a["loss_type"], temperature=a["temperature"], num_iterations=a["num_iterations"],
            scale_rewards=a.get("scale_rewards", "group"), delta=a.get("delta"),
            importance_sampling_level=a.get("importance_sampling_level", "token"),
            mask_truncated_completions=bool(a.get("mask_truncated_completions", False)),
            top_entropy_quantile=float(a.get("top_entropy_quantile", 1.0)),
            use_bias_correction_kl=bool(a.get("use_bias_correction_kl", False)),
            save_strategy="no", logging_steps=1, seed=0, dataloader_num_workers=0,
            log_completions=False, disable_tqdm=True, **correction, **{k: a[k] for k in TRL_KEYS if k in a},
        )
        policy = load_model(a["model_dir"])
        # TRL creates the reference model itself from this field (grpo_trainer.py:1003)
        policy.config._name_or_path = str(Path(a["ref_model_dir"]).resolve())
        dataset = Dataset.from_dict({"prompt": [f"row {i}" for i in range(B)]})
        trainer = GRPOTrainer(model=policy, reward_funcs=reward_funcs, args=cfg, train_dataset=dataset,
                              processing_class=load_tokenizer(a), rollout_func=rollout_func)
        if trainer.model is not policy or trainer.ref_model is None:
            raise RuntimeError("unexpected trainer layout (model wrapped or no ref model)")
        # sanity: the ref model TRL built is the one from ref_model_dir
        ref_check = load_file(str(Path(a["ref_model_dir"]) / "model.safetensors"))
        k = "model.embed_tokens.weight"
        if not torch.equal(trainer.ref_model.state_dict()[k], ref_check[k]):
            raise RuntimeError("TRL's reference model does not hold ref_model_dir's weights")
        trainer.current_gradient_accumulation_steps = gas  # set by Trainer's train loop otherwise
        if correction["vllm_importance_sampling_correction"]:
            # TRL applies its correction only with use_vllm (grpo_trainer.py:2660, 2860, 3146): set it
            # after construction (no vLLM is started); the rollout_func path then only syncs vLLM's
            # weights when the step changed (2202), which _last_loaded_step rules out.
            trainer.use_vllm = True
            trainer._last_loaded_step = trainer.state.global_step
        trainer.model.train()
        trainer.model.zero_grad(set_to_none=True)

        calls = []  # record TRL's per-token log-prob calls (policy / ref) for the outputs
        orig = trainer._get_per_token_logps_and_entropies

        def recording(model, *args, **kwargs):
            out = orig(model, *args, **kwargs)
            calls.append(("ref" if model is trainer.ref_model else "policy", kwargs.get("compute_entropy", False), out))
            return out

        trainer._get_per_token_logps_and_entropies = recording
        products = watch_products(trainer)

        inputs = trainer._generate_and_score_completions([{"prompt": f"row {i}"} for i in range(B)])
        Ct = inputs["completion_ids"].size(1)
        Pt = inputs["prompt_ids"].size(1)
        if "old_per_token_logps" in b:
            if a["num_iterations"] > 1:
                inputs["old_per_token_logps"] = b["old_per_token_logps"][:, :Ct].clone()
            else:
                print("note: old_per_token_logps ignored (num_iterations == 1: TRL uses logp.detach())")
        # TRL's _prepare_inputs splits the generation batch into steps_per_generation chunks
        # (after shuffling the rows, left out here so that the chunks are consecutive rows) and
        # each optimizer step accumulates one backward pass per chunk.
        loss = torch.zeros(())
        for chunk in split_tensor_dict(inputs, gas):
            chunk_loss = trainer.compute_loss(trainer.model, chunk)
            chunk_loss.backward()
            loss = loss + chunk_loss.detach()

        ref_calls = [o for tag, _, o in calls if tag == "ref"]
        pol_calls = [o for tag, ent, o in calls if tag == "policy" and ent]
        logp = torch.cat([o[0] for o in pol_calls[-gas:]]).detach()  # one call per chunk
        entropy = torch.cat([o[1] for o in pol_calls[-gas:]]).detach()
        ref_logp = ref_calls[-1][0] if ref_calls else torch.zeros_like(logp)
        old = inputs.get("old_per_token_logps")
        old = logp if old is None else old

        def widen(x):  # back to the given completion width
            return torch.nn.functional.pad(x.float(), (0, C - x.size(1))).contiguous()

        out = {
            "loss": loss.detach().float().reshape(()),
            "advantages_trl": inputs["advantages"].detach().float().contiguous(),
            "advantages_given": b["advantages"].clone(),
            "per_token_logps": widen(logp),
            "ref_per_token_logps": widen(ref_logp),
            "per_token_kl": widen(torch.exp(ref_logp - logp) - (ref_logp - logp) - 1),
            "entropy": widen(entropy),
            "old_per_token_logps": widen(old),
            "completion_mask_trl": widen(inputs["completion_mask"]),
            "num_items_in_batch": inputs["num_items_in_batch"].float().reshape(()),
        }
        if env_mask is not None:
            if inputs.get("tool_mask") is None:
                raise RuntimeError("TRL did not keep the env_mask as its tool_mask")
            out["tool_mask_trl"] = widen(inputs["tool_mask"])
        check_products(products, bool(a.get("bf16", False)))
        n_missing = 0
        for name, p in trainer.model.named_parameters():
            if p.requires_grad:
                if p.grad is None:
                    n_missing += 1
                out[f"grad.{name}"] = (torch.zeros_like(p) if p.grad is None else p.grad).detach().float().contiguous()
        metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if v}
        adv_diff = (inputs["advantages"].float() - b["advantages"]).abs().max().item()
        info = {
            "trl_version": __import__("trl").__version__,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "loss": out["loss"].item(),
            "metrics": metrics,
            "max_abs_advantage_diff_trl_vs_given": adv_diff,
            "trl_prompt_width": Pt, "trl_completion_width": Ct, "given_prompt_width": P, "given_completion_width": C,
            "num_items_in_batch": out["num_items_in_batch"].item(),
            "params_without_grad": n_missing,
            "tied_embeddings": bool(trainer.model.config.tie_word_embeddings),
            "product_dtypes": {tag: sorted(kinds) for tag, kinds in products.items()},
            "args": a,
        }
        return out, info
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def watch_products(trainer) -> dict[str, set[str]]:
    """The dtypes the policy's and the reference's first query projection gave during TRL's
    passes: with bf16=True, TRL runs each pass under `self.accelerator.autocast()`
    (grpo_trainer.py:1497), which accelerate 1.x turns into torch.autocast("cpu", bfloat16) on
    the CPU, so a Linear's output is bfloat16 there; float32 without it."""
    seen: dict[str, set[str]] = {"policy": set(), "ref": set()}
    for tag, model in (("policy", trainer.model), ("ref", trainer.ref_model)):
        if model is not None:
            projection = model.model.layers[0].self_attn.q_proj
            projection.register_forward_hook(lambda _m, _i, out, tag=tag: seen[tag].add(str(out.dtype)))
    return seen


def check_products(products: dict[str, set[str]], bf16: bool) -> None:
    """Refuse a run whose passes did not compute in the precision asked for (a TRL, transformers
    or accelerate that stopped autocasting would otherwise pass for a bf16 reference)."""
    want = "torch.bfloat16" if bf16 else "torch.float32"
    for tag, kinds in products.items():
        if kinds and kinds != {want}:
            raise RuntimeError(f"TRL's {tag} passes gave {sorted(kinds)} from their linear layers, expected {want} (bf16={bf16})")
    if not products["policy"]:
        raise RuntimeError("TRL ran no policy pass through the watched projection")


def run_cli(args_path: Path, batch_path: Path, out_path: Path, quiet: bool = False) -> dict:
    a = read_args(args_path)
    b = read_batch(batch_path, a)
    t0 = time.perf_counter()
    out, info = run_trl(a, b)
    info["seconds"] = round(time.perf_counter() - t0, 3)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(out_path))
    mpath = metrics_path(out_path)
    mpath.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    if not quiet:
        m = info["metrics"]
        print(f"loss {info['loss']:.9g}  ({a['loss_type']}, num_iterations {a['num_iterations']}, beta {a['beta']})")
        print("metrics: " + "  ".join(f"{k}={m[k]:.6g}" for k in
              ("kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
               "reward", "reward_std", "frac_reward_zero_std") if k in m))
        print(f"max |advantages_trl - advantages_given| = {info['max_abs_advantage_diff_trl_vs_given']:.3g}")
        if (info["trl_prompt_width"], info["trl_completion_width"]) != (info["given_prompt_width"], info["given_completion_width"]):
            print(f"note: TRL padded to P={info['trl_prompt_width']}, C={info['trl_completion_width']} "
                  f"(given P={info['given_prompt_width']}, C={info['given_completion_width']})")
        n_grads = sum(1 for k in out if k.startswith("grad."))
        print(f"wrote {out_path} ({n_grads} gradients) and {mpath} in {info['seconds']}s")
    return info


def metrics_path(out_path: Path) -> Path:
    name = out_path.name
    stem = name[: -len(".safetensors")] if name.endswith(".safetensors") else name
    return out_path.with_name(stem + ".metrics.json")


# ----------------------------------------------------------------------------- self-test

def independent_loss(a: dict, b: dict[str, torch.Tensor], exact: bool = False) -> dict:
    """Plain-torch GRPO from the reference note's formulas (no TRL code). Returns loss, grads,
    per-token log-probs and the metrics TRL logs.

    exact=False: fp32, one forward over the padded batch with positions arange(P+C) on every row
        and the concatenated masks (the inputs TRL's forward gets), HF logits -> log_softmax.
    exact=True: float64, one unpadded forward per row (positions 0..len-1). RoPE makes this
        mathematically identical to TRL's left-padded forward (a uniform position shift cancels in
        q.k), so it measures TRL's own fp32 rounding and checks that padding/positions do not
        matter. (Unpadded also because transformers' eager attention returns NaN for left-padded
        float64 rows.)
    """
    dtype = torch.float64 if exact else torch.float32
    model = load_model(a["model_dir"]).to(dtype).train()
    ref = load_model(a["ref_model_dir"]).to(dtype).eval()
    B, P = b["prompt_ids"].shape
    C = b["completion_ids"].size(1)
    n_p, n_c = b["prompt_mask"].sum(1).tolist(), b["completion_mask"].sum(1).tolist()

    def log_softmax_and_entropy(logits, targets):
        lsm = torch.log_softmax(logits / a["temperature"], -1)
        return lsm.gather(-1, targets[..., None])[..., 0], -(lsm.exp() * lsm).sum(-1)

    def logps(m):
        if not exact:
            ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
            attn = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
            pos = torch.arange(P + C)[None].expand(B, -1)
            logits = m(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
            return log_softmax_and_entropy(logits[:, P - 1: P + C - 1], b["completion_ids"])
        lps, ents = [], []
        for i in range(B):
            seq = torch.cat([b["prompt_ids"][i, P - n_p[i]:], b["completion_ids"][i, : n_c[i]]])[None]
            logits = m(input_ids=seq, use_cache=False).logits[0, n_p[i] - 1: n_p[i] + n_c[i] - 1]
            lp, ent = log_softmax_and_entropy(logits, seq[0, n_p[i]:])
            lps.append(torch.nn.functional.pad(lp, (0, C - n_c[i])))
            ents.append(torch.nn.functional.pad(ent, (0, C - n_c[i])))
        return torch.stack(lps), torch.stack(ents)

    lp, ent = logps(model)
    with torch.no_grad():
        ref_lp, _ = logps(ref)
    G = a["num_generations"]
    if "rewards_per_func" in b:
        adv = gdpo_advantages(b["rewards_per_func"].to(dtype), a["reward_weights"], G).view(-1, 1)
    else:
        r = b["rewards"].to(dtype).view(-1, G)
        scale = a.get("scale_rewards", "group")
        std = {"group": r.std(1, keepdim=True, unbiased=True) + 1e-4, "batch": r.std(unbiased=True) + 1e-4, "none": 1.0}[scale]
        adv = ((r - r.mean(1, keepdim=True)) / std).view(-1, 1)
    m = b["completion_mask"].to(dtype)
    if a.get("mask_truncated_completions", False):  # rows whose last token is not EOS leave the loss
        last = b["completion_ids"].gather(1, (b["completion_mask"].sum(1, keepdim=True) - 1).clamp(min=0))
        m = m * (last == PAD_ID).to(dtype)  # EOS is the pad id here
    if "tool_mask" in b:  # episodes: observation tokens carry no loss, KL or entropy
        m = m * b["tool_mask"].to(dtype)
    given_old = a["num_iterations"] > 1 and "old_per_token_logps" in b
    old = b["old_per_token_logps"].to(dtype) if given_old else lp.detach()
    if a.get("importance_sampling_level", "token") == "sequence":  # GSPO: exp of the mean log-ratio
        ratio = torch.exp(((lp - old) * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1))
    else:
        ratio = torch.exp(lp - old)
    eps_lo, eps_hi = a["epsilon"], a.get("epsilon_high") or a["epsilon"]
    unclipped = ratio if a.get("delta") is None else torch.clamp(ratio, max=a["delta"])
    lt = a["loss_type"]
    rho = importance_weights(a, b, old, m)
    if lt == "cispo":  # MiniMax-M1: the capped ratio, detached, weighs the log-prob
        pg = -torch.clamp(ratio, max=eps_hi).detach() * adv * lp
    elif lt == "sapo":  # SAPO: a sigmoid gate of slope 1 at r = 1 in place of the clip
        tau = torch.where(adv > 0, a.get("sapo_temperature_pos", 1.0), a.get("sapo_temperature_neg", 1.05))
        pg = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv
    elif lt == "vespo":  # VESPO: phi(w) = w^k e^(lambda (1 - w)) of the sequence weight, detached
        pg = -vespo_phi(a, adv, lp.detach() - old, m, rho) * adv * lp
    else:
        pg = -torch.minimum(unclipped * adv, torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi) * adv)
    if a.get("off_policy_mask_threshold") is not None:  # DeepSeek-V3.2: drop far off-policy negatives
        behaviour = b["sampling_per_token_logps"].to(dtype)
        gap = ((behaviour - lp.detach()) * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)
        pg = pg * ((adv >= 0) | (gap <= a["off_policy_mask_threshold"])).to(dtype)
    gas = int(a.get("gradient_accumulation_steps", 1))
    chunks = [slice(k * B // gas, (k + 1) * B // gas) for k in range(gas)]  # consecutive rows
    quantile = a.get("top_entropy_quantile", 1.0)
    if quantile < 1.0:  # "Beyond the 80/20 rule": the policy term of the top-entropy loss tokens only
        keep = torch.zeros_like(m)
        for rows in chunks:  # each micro-batch's own threshold
            threshold = torch.quantile(ent.detach()[rows][m[rows].bool()], 1 - quantile)
            keep[rows] = ((ent.detach()[rows] >= threshold) & m[rows].bool()).to(dtype)
        pg = pg * keep
    kl = torch.exp(ref_lp - lp) - (ref_lp - lp) - 1
    if rho is not None and lt != "vespo":  # VESPO folds the correction into its weight
        pg = pg * rho.detach()
    if a.get("use_bias_correction_kl", False):
        kl = kl * ratio
    l = (pg + a["beta"] * kl) * m
    if lt in ("grpo", "sapo"):
        loss = (l.sum(1) / m.sum(1).clamp(min=1)).mean()
    elif lt == "dr_grpo":
        loss = l.sum() / (l.size(0) * a["max_completion_length"])
    elif lt == "bnpo":  # each micro-batch over its own tokens, averaged over the micro-batches
        loss = sum(l[rows].sum() / m[rows].sum().clamp(min=1) for rows in chunks) / gas
    elif lt == "luspo":  # each sequence's token sum, mean over sequences
        loss = l.sum(1).mean()
    else:  # dapo, cispo and vespo (1 process): all active tokens of the generation batch
        loss = l.sum() / m.sum().clamp(min=1)
    # The entropy bonus: each micro-batch's mean entropy over the tokens whose policy term trains,
    # divided by the accumulation steps. An adaptive control applies nothing at the first step
    # (no entropy measured yet).
    policy_loss = loss.item()
    coef = 0.0 if a.get("use_adaptive_entropy", False) else a.get("entropy_coef", 0.0)
    if coef != 0.0:
        eff = m * keep if quantile < 1.0 else m
        loss = loss - coef * sum((ent[rows] * eff[rows]).sum() / eff[rows].sum().clamp(min=1) for rows in chunks) / gas
    loss.backward()
    low_clipped, high_clipped = (unclipped < 1 - eps_lo) & (adv < 0), (unclipped > 1 + eps_hi) & (adv > 0)
    clipped = low_clipped | high_clipped
    clip_mask = torch.ones_like(clipped, dtype=dtype) if clipped.size(1) == 1 else m  # per completion or per token
    clip_mean = lambda flags: ((flags * clip_mask).sum() / clip_mask.sum()).item()
    # What the comparison with smallrl needs in float64 (TRL's metric definitions, this loss's
    # values): the loss before the entropy bonus, the entropy of the tokens the bonus counts,
    # the ratios (each token's distance to the clip bounds decides the clip fractions), VESPO's
    # mean weight and the importance-sampling correction's statistics.
    extra = {
        "policy_loss": policy_loss,
        "ratio": (ratio.detach() * (clip_mask if ratio.size(1) > 1 else 1.0)),
        "clip_ratio/low_mean": clip_mean(low_clipped),
        "clip_ratio/high_mean": clip_mean(high_clipped),
        "cispo_clip_ratio": ((((ratio > eps_hi) & (adv > 0)) * m).sum() / m.sum()).item(),
    }
    if lt == "vespo":
        extra["vespo/phi_seq_mean"] = vespo_phi(a, adv, lp.detach() - old, m, rho).mean().item()
    if rho is not None:
        tokens = m.bool()
        rhos = rho.flatten() if rho.size(1) == 1 else rho[tokens]
        gaps = (old - b["sampling_per_token_logps"].to(dtype)).abs()[tokens]
        extra |= {
            "sampling/importance_sampling_ratio/min": rhos.min().item(),
            "sampling/importance_sampling_ratio/mean": rhos.mean().item(),
            "sampling/importance_sampling_ratio/max": rhos.max().item(),
            "sampling/sampling_logp_difference/mean": gaps.mean().item(),
            "sampling/sampling_logp_difference/max": gaps.max().item(),
        }
    return extra | {
        "loss": loss.item(),
        "grads": {f"grad.{n}": p.grad.detach() for n, p in model.named_parameters()},
        "per_token_logps": (lp.detach() * m).float(),
        "advantages": adv.view(-1).float(),
        "advantages64": adv.view(-1).detach(),
        "per_token_logps64": lp.detach() * m,
        "kl": ((kl.detach() * m).sum() / m.sum()).item(),
        "entropy": ((ent.detach() * m).sum() / m.sum()).item(),
        "clip_ratio/region_mean": ((clipped * clip_mask).sum() / clip_mask.sum()).item(),
    }


def gdpo_advantages(rpf: torch.Tensor, weights: list, G: int) -> torch.Tensor:
    """GDPO from the paper's definition, row by row (no TRL code): each function's z-score within
    its group over its non-NaN values (unbiased std; 0 with fewer than two), the weighted sum, its
    z-score over the batch's scorable rows (not all NaN); 0 for unscorable rows."""
    def z(values: list, x: float) -> float:
        if len(values) < 2:
            return 0.0
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        return (x - mean) / (std + 1e-4)
    B, K = rpf.shape
    rows = rpf.tolist()
    scorable = [not all(math.isnan(v) for v in row) for row in rows]
    sums = []
    for i in range(B):
        group = range(i // G * G, i // G * G + G)
        sums.append(sum(weights[k] * z([rows[j][k] for j in group if not math.isnan(rows[j][k])], rows[i][k])
                        for k in range(K) if not math.isnan(rows[i][k])))
    kept = [s for s, ok in zip(sums, scorable) if ok]
    return torch.tensor([z(kept, s) if ok else 0.0 for s, ok in zip(sums, scorable)], dtype=rpf.dtype)


def importance_weights(a: dict, b: dict, old: torch.Tensor, m: torch.Tensor) -> torch.Tensor | None:
    """The correction's weight exp(old - sampler), per token or per sequence, truncated or masked."""
    settings = correction_settings(a)
    if not settings["vllm_importance_sampling_correction"]:
        return None
    diff = (old - b["sampling_per_token_logps"].to(old.dtype)) * m
    per_sequence = settings["vllm_importance_sampling_mode"].startswith("sequence")
    rho = torch.exp(diff.sum(1, keepdim=True) if per_sequence else diff)
    low, high = settings["vllm_importance_sampling_clip_min"] or 0.0, settings["vllm_importance_sampling_clip_max"]
    if settings["vllm_importance_sampling_mode"].endswith("truncate"):
        return rho.clamp(low, high)
    return torch.where((rho < low) | (rho > high), torch.zeros_like(rho), rho)


def vespo_phi(a: dict, adv: torch.Tensor, log_ratio: torch.Tensor, m: torch.Tensor, rho: torch.Tensor | None) -> torch.Tensor:
    """VESPO's Gamma weight w^k exp(lambda (1 - w)) of the sequence weight w = prod_t r_t (times the
    per-token correction's weights), (k, lambda) by the advantage's sign, with TRL's clamps of log w."""
    log_w = (log_ratio.clamp(-20, 20) * m).sum(1, keepdim=True)
    if rho is not None:
        log_w = log_w + (torch.log(rho).clamp(math.log(1e-8), 20) * m).sum(1, keepdim=True)
    log_w = log_w.clamp(math.log(1e-8), 20)
    k = torch.where(adv >= 0, a.get("vespo_k_pos", 2.0), a.get("vespo_k_neg", 3.0))
    lam = torch.where(adv >= 0, a.get("vespo_lambda_pos", 3.0), a.get("vespo_lambda_neg", 2.0))
    return (torch.exp(log_w) ** k * torch.exp(lam * (1 - torch.exp(log_w)))).detach()


@torch.no_grad()
def build_self_test_batch(policy_dir: Path, G: int, C_max: int) -> dict[str, torch.Tensor]:
    mdir = FIXTURES / "tiny-stories"
    tok = PreTrainedTokenizerFast.from_pretrained(str(mdir), local_files_only=True)
    lines = [ln for ln in (mdir / "prompts.txt").read_text().splitlines() if ln.strip()][:2]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in lines]
    prompts[0] = prompts[0][:5]  # different prompt lengths -> real left padding
    model = load_model(policy_dir).eval()
    torch.manual_seed(1234)
    rows = []
    for p in prompts:
        ids = torch.tensor([p] * G)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_k=0, top_p=1.0, max_new_tokens=C_max, eos_token_id=1, pad_token_id=1)
        for row in out[:, len(p):].tolist():
            rows.append((p, row[: row.index(1) + 1] if 1 in row else row))
    B = len(rows)
    P = max(len(p) for p, _ in rows)
    C = max(len(c) for _, c in rows)
    b = {k: torch.zeros(B, w, dtype=torch.int64) for k, w in
         (("prompt_ids", P), ("prompt_mask", P), ("completion_ids", C), ("completion_mask", C))}
    b["prompt_ids"].fill_(PAD_ID)
    b["completion_ids"].fill_(PAD_ID)
    for i, (p, c) in enumerate(rows):
        b["prompt_ids"][i, P - len(p):] = torch.tensor(p)
        b["prompt_mask"][i, P - len(p):] = 1
        b["completion_ids"][i, : len(c)] = torch.tensor(c)
        b["completion_mask"][i, : len(c)] = 1
    g = torch.Generator().manual_seed(7)
    rewards = torch.rand(B, generator=g)
    rewards[G: 2 * G] = torch.tensor([1.0, 0.0, 0.0, 1.0] * (G // 4 + 1))[:G]  # a binary-reward group
    b["rewards"] = rewards.float()
    r = b["rewards"].view(-1, G)
    b["advantages"] = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1).float()
    # an "old" policy: the current log-probs moved by up to +-0.5 so that the clip is active
    lp_model = load_model(policy_dir).eval()
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    attn = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
    logits = lp_model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, P - 1: P + C - 1]
    lp = torch.log_softmax(logits, -1).gather(-1, b["completion_ids"][..., None])[..., 0]
    b["old_per_token_logps"] = ((lp + (torch.rand(B, C, generator=g) - 0.5)) * b["completion_mask"]).float().contiguous()
    return b


def self_test() -> int:
    t_start = time.perf_counter()
    fix = FIXTURES / "tiny-stories"
    for f in ("config.json", "model.safetensors", "prompts.txt", "tokenizer.json"):
        if not (fix / f).is_file():
            raise InputError(f"missing fixture file {fix / f}")
    work = Path(tempfile.mkdtemp(prefix="trl_grpo_selftest_"))
    try:
        # perturbed policy: tiny-stories + small noise on every weight; the reference is the fixture
        policy_dir = work / "policy"
        torch.manual_seed(0)
        m = load_model(fix)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.02 * p.std().clamp(min=1e-3))
        m.save_pretrained(str(policy_dir), safe_serialization=True)
        del m
        G, C_max, max_len = 4, 64, 80  # sample <= 64 tokens; config max_completion_length 80 (dr_grpo's divisor)
        batch = build_self_test_batch(policy_dir, G, C_max)
        n_c = batch["completion_mask"].sum(1).tolist()
        print(f"self-test batch: B={len(n_c)} (2 groups x G={G}), P={batch['prompt_ids'].size(1)}, "
              f"C={batch['completion_ids'].size(1)}, completion lengths {n_c}")
        cases = [(lt, it, False) for lt in LOSS_TYPES for it in (1, 2)] + [("grpo", 1, True), ("dapo", 2, True)]
        print(f"{'':<21} {'':>14} | {'fp32 independent (same inputs)':^41} | {'float64 unpadded':^23} |")
        print(f"{'loss_type':<8} {'iters':>5} {'biasKL':>6} {'TRL loss':>14} | {'rel diff':>8} {'grad rel':>8} "
              f"{'logp':>7} {'adv':>7} {'kl rel':>7} | {'rel diff':>8} {'grad rel':>8} {'logp':>5} | "
              f"{'clip':>5} {'kl':>7} {'s':>4}")
        failures = 0
        for lt, it, bias in cases:
            a = {"model_dir": str(policy_dir), "ref_model_dir": str(fix), "beta": 0.02, "epsilon": 0.2,
                 "loss_type": lt, "temperature": 1.0, "max_completion_length": max_len, "num_generations": G,
                 "num_iterations": it, "use_bias_correction_kl": bias}
            b = batch if it > 1 else {k: v for k, v in batch.items() if k != "old_per_token_logps"}
            apath = work / "args.json"
            bpath = work / f"batch_{it}.safetensors"
            opath = work / f"out_{lt}_{it}_{int(bias)}.safetensors"
            apath.write_text(json.dumps(a))
            save_file(b, str(bpath))
            t0 = time.perf_counter()
            info = run_cli(apath, bpath, opath, quiet=True)
            secs = time.perf_counter() - t0
            got = load_file(str(opath))
            mtr = info["metrics"]
            ind64 = independent_loss(a, b, exact=True)
            rel64 = abs(got["loss"].item() - ind64["loss"]) / abs(ind64["loss"])
            grad64 = max((got[k] - g).abs().max().item() / g.abs().max().item() for k, g in ind64["grads"].items())
            logp64 = (got["per_token_logps"] - ind64["per_token_logps"]).abs().max().item()
            ind = independent_loss(a, b)
            errs = {
                "loss": abs(got["loss"].item() - ind["loss"]) / abs(ind["loss"]),
                "grad": max((got[k] - g).abs().max().item() / g.abs().max().item() for k, g in ind["grads"].items()),
                "logp": (got["per_token_logps"] - ind["per_token_logps"]).abs().max().item(),
                "adv": (got["advantages_trl"] - ind["advantages"]).abs().max().item(),
                "kl": abs(mtr["kl"] - ind["kl"]) / ind["kl"],
                "ent": abs(mtr["entropy"] - ind["entropy"]) / ind["entropy"],
                # cispo, sapo and vespo log no clip_ratio/* (TRL): nothing to compare there
                "clip": abs(mtr["clip_ratio/region_mean"] - ind["clip_ratio/region_mean"]) if "clip_ratio/region_mean" in mtr else 0.0,
            }
            tol = {"loss": 1e-6, "grad": 1e-4, "logp": 2e-5, "adv": 1e-6, "kl": 1e-4, "ent": 1e-5, "clip": 0.0}
            loss64_tol = 1e-5
            if lt == "vespo" and it > 1:
                # VESPO's weight exp(lambda + k log w - lambda w) of a float32 sum of up to 64 shifted
                # log-ratios amplifies that sum's rounding by about k + lambda w: TRL's loss is
                # 2.7e-5 from float64 here and the independent fp32 one differs by 4.2e-5.
                tol["loss"] = loss64_tol = 1e-4
            missing = set(ind["grads"]) ^ {k for k in got if k.startswith("grad.")}
            ok = not missing and all(errs[k] <= tol[k] for k in tol)
            # float64 truth: TRL's fp32 rounding only (absolute floor: with ratio 1 the grpo loss is
            # beta*kl + a cancelling -mean(A), whose fp32 residue is ~1e-8)
            ok &= abs(got["loss"].item() - ind64["loss"]) <= loss64_tol * abs(ind64["loss"]) + 2e-7
            ok &= grad64 <= 1e-4 and logp64 <= 2e-5
            failures += not ok
            print(f"{lt:<8} {it:>5} {str(bias):>6} {got['loss'].item():>14.9f} | {errs['loss']:>8.1e} {errs['grad']:>8.1e} "
                  f"{errs['logp']:>7.0e} {errs['adv']:>7.0e} {errs['kl']:>7.0e} | {rel64:>8.1e} {grad64:>8.1e} "
                  f"{logp64:>5.0e} | {mtr.get('clip_ratio/region_mean', float('nan')):>5.3f} {mtr['kl']:>7.1e} {secs:>4.1f}"
                  f"{'' if ok else '  FAIL ' + str(sorted(missing))}")
        print("rel diff = |loss_TRL - loss_indep| / |loss_indep|; grad rel = max over parameters of max|dgrad| / "
              "max|grad|; logp, adv = max abs diff of per-token log-probs / advantages; kl rel = relative diff of "
              "TRL's logged kl (entropy checked too); clip = TRL's clip_ratio/region_mean; s = seconds per TRL run")
        print(f"gradients of {len(ind['grads'])} parameters compared (tied embeddings: no lm_head.weight)")
        print(f"self-test {'PASSED' if failures == 0 else f'FAILED ({failures} cases)'} in {time.perf_counter() - t_start:.1f}s")
        return 0 if failures == 0 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_case(args_path: Path, batch_path: Path, out_path: Path, float64_out: Path | None, quiet: bool = False) -> None:
    run_cli(args_path, batch_path, out_path, quiet=quiet)
    if float64_out:
        a = read_args(args_path)
        exact = independent_loss(a, read_batch(batch_path, a), exact=True)
        scalars = {k: torch.tensor(v, dtype=torch.float64) for k, v in exact.items() if isinstance(v, float) and k != "loss"}
        tensors = {k: exact[k].contiguous() for k in ("advantages64", "per_token_logps64", "ratio")}
        save_file({"loss": torch.tensor(exact["loss"], dtype=torch.float64), **exact["grads"], **scalars, **tensors}, str(float64_out))


def main() -> int:
    ap = argparse.ArgumentParser(description="Run TRL's GRPO loss on a batch; save loss and gradients.")
    ap.add_argument("--batch", type=Path)
    ap.add_argument("--args", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--self-test", action="store_true", help="check this script against an independent loss")
    ap.add_argument("--float64-out", type=Path, help="also save the float64 gradients of the independent "
                    "loss (unpadded rows, no TRL code): the exact values both fp32 results approximate")
    ap.add_argument("--case-dirs", type=Path, nargs="+", help="several batches in one process (imports are "
                    "most of a run's time): each DIR holds batch.safetensors and args.json and gets "
                    "trl.safetensors, trl.metrics.json and exact.safetensors")
    ns = ap.parse_args()
    try:
        if ns.self_test:
            return self_test()
        if ns.case_dirs:
            for d in ns.case_dirs:
                run_case(d / "args.json", d / "batch.safetensors", d / "trl.safetensors", d / "exact.safetensors", quiet=True)
            return 0
        if not (ns.batch and ns.args and ns.out):
            ap.error("--batch, --args and --out are required (or --case-dirs, or --self-test)")
        run_case(ns.args, ns.batch, ns.out, ns.float64_out)
        return 0
    except InputError as e:
        print(f"trl_grpo.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
