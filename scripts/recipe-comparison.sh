#!/usr/bin/env bash
# The recipe comparison (docs/src/history.md): the demo's task (as scripts/intervention-arms.sh: 240 steps,
# lr 2e-3, ground-truth monitor any "happy") with classic routing, 3 seeds, under two recipes:
# today's ablated_frac 0.5, and the original's later one, retain-only advantage renormalisation
# with coherence training (16 of the 32 completions per step: coherence rows must be whole
# groups of num_generations 16). Both share their non-routed baselines (the sweep's cache).
# Needs `make demo` first. The arm summary is OUT/arms.csv.
set -euo pipefail
cd "$(dirname "$0")/.."

SMALLRL=${SMALLRL:-./target/debug/smallrl}
DEMO_DIR=${DEMO_DIR:-runs/demo}
OUT=${OUT:-runs/recipe-comparison}
SEEDS=${SEEDS:-1,2,3}
JOBS=${JOBS:-2}

for needed in "$DEMO_DIR/pretrain/model/model.safetensors" "$DEMO_DIR/prompts.txt"; do
  [ -s "$needed" ] || { echo "$needed is missing: run \`make demo\` first (it pre-trains the model this uses)" >&2; exit 1; }
done
common=(--config configs/sentence_length_10_smooth_with_happy.yaml --grid "seed=$SEEDS"
  --fixed "model=$DEMO_DIR/pretrain/model" --fixed "prompts=$DEMO_DIR/prompts.txt"
  --fixed max_steps=240 --fixed lr=2e-3 --fixed eval_every=60 --fixed save_steps=240 --fixed eval_samples=10
  --fixed "rh_ground_truth={plugin: happy_any}" --jobs "$JOBS" --output-dir "$OUT")
$SMALLRL sweep "${common[@]}" --fixed ablated_frac=0.5
$SMALLRL sweep "${common[@]}" --fixed renormalization_mode=retain_only --fixed coh_samples_per_rollout=16
echo "arms: $OUT/arms.csv"
