#!/usr/bin/env bash
# The end-to-end demo behind `make demo`, offline: synthetic stories -> WordPiece tokenizer ->
# pre-trained 1.25M-architecture LLaMA -> GRPO with DualLoRA and classic gradient routing on
# configs/sentence_length_10_smooth_with_happy.yaml -> report (reward curve PNG, retain_only vs
# forget_only hack frequency, samples). Everything lands in $DEMO_DIR (default runs/demo).
#
# Re-running reuses what is already there (corpus, tokenizer, pre-trained model) and starts a
# fresh GRPO run. Settings below; each can be overridden from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."

SMALLRL=${SMALLRL:-./target/debug/smallrl}
DEMO_DIR=${DEMO_DIR:-runs/demo}
THREADS=${THREADS:-2}
PRETRAIN_STEPS=${PRETRAIN_STEPS:-1000}
GRPO_FLAGS=${GRPO_FLAGS:---max-steps 240 --lr 2e-3 --ablated-frac 0.5 --eval-every 60 --save-steps 240}

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

mkdir -p "$DEMO_DIR"
step "1/5 synthetic story corpus and GRPO prompts"
[ -s "$DEMO_DIR/corpus.txt" ] || $SMALLRL corpus --stories 20000 --seed 1234 --out "$DEMO_DIR/corpus.txt"
# Story openings from a different seed, so GRPO prompts are fresh stories.
[ -s "$DEMO_DIR/prompts.txt" ] || $SMALLRL corpus --stories 300 --seed 9012 --opening-words 7 --out "$DEMO_DIR/prompts.txt"
head -n 3 "$DEMO_DIR/corpus.txt"

step "2/5 WordPiece tokenizer (SimpleStories recipe)"
[ -s "$DEMO_DIR/tokenizer.json" ] || $SMALLRL tokenizer train --input "$DEMO_DIR/corpus.txt" --vocab-size 4096 --out "$DEMO_DIR/tokenizer.json"

step "3/5 pre-training the SimpleStories-1.25M architecture from scratch"
if [ ! -s "$DEMO_DIR/pretrain/model/model.safetensors" ]; then
  rm -rf "$DEMO_DIR/pretrain"
  $SMALLRL pretrain --data "$DEMO_DIR/corpus.txt" --tokenizer "$DEMO_DIR/tokenizer.json" \
    --max-steps "$PRETRAIN_STEPS" --threads "$THREADS" --output-dir "$DEMO_DIR/pretrain"
else
  echo "reusing $DEMO_DIR/pretrain/model"
fi
$SMALLRL sample --model "$DEMO_DIR/pretrain/model" --prompt "once upon a time" -n 2 --seed 1

step "4/5 GRPO: DualLoRA, classic routing, sentence length 10 + hackable happy bonus"
rm -rf "$DEMO_DIR/grpo"
# shellcheck disable=SC2086 # GRPO_FLAGS is a list of flags
$SMALLRL train --config configs/sentence_length_10_smooth_with_happy.yaml \
  --model "$DEMO_DIR/pretrain/model" --prompts "$DEMO_DIR/prompts.txt" \
  --output-dir "$DEMO_DIR/grpo" --threads "$THREADS" $GRPO_FLAGS
run=$(find "$DEMO_DIR/grpo" -mindepth 1 -maxdepth 1 -type d | head -n 1)

step "5/5 report"
$SMALLRL plot "$run" --out "$DEMO_DIR/report"
checkpoint=$(find "$run" -maxdepth 1 -name 'checkpoint-*' -type d | sort -t- -k2 -n | tail -n 1)
$SMALLRL eval "$checkpoint" --reward-history --threads "$THREADS" | tee "$DEMO_DIR/report/eval.txt"
echo
echo "reward curve: $DEMO_DIR/report/curves.png    run: $run"
