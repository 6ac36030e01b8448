#!/usr/bin/env python3
"""Time TRL 1.16's own GRPO training steps on the CPU: the figure `smallrl bench train` is held to.

Usage (from the repo root):
    .venv/bin/python scripts/reference/trl_step_bench.py --model .fixtures/smollm2-135m-instruct \
        --prompts ../shared/fixtures/tiny-stories/prompts.txt [--bf16] [--threads 2] [--steps 4]

A real `trl.GRPOTrainer(...).train()` runs unmodified: transformers' `generate` samples, TRL scores,
computes advantages and trains (AdamW). The settings are `smallrl bench train`'s with
`--set batch_size=16 --set num_generations=16 --set max_completion_length=32 --set beta=0`
(the flags change each): one prompt a step (raw text, as smallrl's default `prompt_format: raw`),
16 completions of up to 32 tokens, temperature 1, loss_type "grpo", beta 0 (TRL's default; no
reference pass; `--beta 0.02` is smallrl's default, with TRL's reference pass), lr 1e-5,
no gradient checkpointing, the model in float32 (`--bf16`: TRL's `bf16=True`, torch.autocast on
the CPU). The reward is the completion's length in characters (a few microseconds; smallrl's
bench scores with a wasm plugin in about as little).

Printed: each step's wall time and the part `_generate_and_score_completions` took (generation,
reward, old log-probs where TRL computes them), then the median of the steps after the first
`--warmup` ones, and the mean completion length (a stopped completion is cheaper: compare it with
smallrl's `completions/mean_length`).
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description="Time TRL's GRPO steps on the CPU.")
    ap.add_argument("--model", type=Path, required=True, help="a local model directory")
    ap.add_argument("--prompts", type=Path, required=True, help="one prompt per line")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--num-generations", type=int, default=16)
    ap.add_argument("--max-completion-length", type=int, default=32)
    ap.add_argument("--beta", type=float, default=0.0, help="the KL coefficient (TRL's default 0; smallrl's 0.02)")
    ap.add_argument("--bf16", action="store_true", help="TRL's bf16=True (torch.autocast on the CPU)")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model}: no config.json (give a local model directory)")
    prompts = [line.strip() for line in args.prompts.read_text().splitlines() if line.strip()]
    if not prompts:
        raise SystemExit(f"{args.prompts}: no prompt")
    steps = args.warmup + args.steps
    prompts_per_step = args.batch_size // args.num_generations
    rows = [prompts[i % len(prompts)] for i in range(steps * prompts_per_step)]

    lengths = []

    def completion_length(completions, completion_ids, **kw):
        lengths.extend(len(ids) for ids in completion_ids)
        return [float(len(c)) for c in completions]

    step_times, generate_times = [], []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            step_times.append(time.perf_counter() - self.start)

    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out, use_cpu=True, report_to=[], bf16=args.bf16, seed=0,
            per_device_train_batch_size=args.batch_size, num_generations=args.num_generations,
            max_completion_length=args.max_completion_length, temperature=1.0, beta=args.beta,
            loss_type="grpo", learning_rate=1e-5, max_steps=steps, save_strategy="no",
            logging_steps=1, log_completions=False, disable_tqdm=True, dataloader_num_workers=0,
            gradient_checkpointing=False, shuffle_dataset=False,
        )
        model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(args.model), local_files_only=True, padding_side="left")
        trainer = GRPOTrainer(model=model, reward_funcs=completion_length, args=cfg, processing_class=tokenizer,
                              train_dataset=Dataset.from_dict({"prompt": rows}), callbacks=[StepTimer()])
        generate_and_score = trainer._generate_and_score_completions

        def timed(*a, **kw):
            start = time.perf_counter()
            result = generate_and_score(*a, **kw)
            generate_times.append(time.perf_counter() - start)
            return result

        trainer._generate_and_score_completions = timed
        trainer.train()

    print(f"TRL GRPO, {args.model}, {args.batch_size} completions ({args.num_generations} per prompt) of up to "
          f"{args.max_completion_length} tokens, {args.threads} threads, {'bf16=True' if args.bf16 else 'float32'}, beta {args.beta}")
    for i, (step, generate) in enumerate(zip(step_times, generate_times)):
        print(f"  step {i + 1}: {step:.3f} s (generate and score {generate:.3f} s, train {step - generate:.3f} s)")
    timed_steps = step_times[args.warmup:]
    timed_generate = generate_times[args.warmup:]
    print(f"median of steps {args.warmup + 1}-{steps}: {statistics.median(timed_steps):.3f} s "
          f"(generate and score {statistics.median(timed_generate):.3f} s); "
          f"mean completion length {statistics.mean(lengths):.1f} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
