#!/usr/bin/env bash
# The controls result (CHANGELOG.md): the demo's task (configs/sentence_length_10_smooth_with_happy.yaml,
# the demo's pre-trained model and prompts, 240 steps, lr 2e-3, ablated_frac 0.5) with every
# intervention arm (none, routing, penalty, filter, placebo, verified, adv_mod, matched_placebo;
# the result in CHANGELOG.md predates the last three) x SEEDS, a ground-truth monitor
# (any "happy" at all, while the routing detector flags 3 or more), and the sweep's arm summary
# (arms.csv: means over seeds with 95% bootstrap intervals) and Pareto chart (charts/pareto.png).
# Needs `make demo` first (it makes runs/demo/pretrain/model and runs/demo/prompts.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

SMALLRL=${SMALLRL:-./target/debug/smallrl}
DEMO_DIR=${DEMO_DIR:-runs/demo}
OUT=${OUT:-runs/intervention-arms}
SEEDS=${SEEDS:-1,2,3}
JOBS=${JOBS:-2}

for needed in "$DEMO_DIR/pretrain/model/model.safetensors" "$DEMO_DIR/prompts.txt"; do
  [ -s "$needed" ] || { echo "$needed is missing: run \`make demo\` first (it pre-trains the model this uses)" >&2; exit 1; }
done
$SMALLRL sweep --config configs/sentence_length_10_smooth_with_happy.yaml --intervention-arms --grid "seed=$SEEDS" \
  --fixed "model=$DEMO_DIR/pretrain/model" --fixed "prompts=$DEMO_DIR/prompts.txt" \
  --fixed max_steps=240 --fixed lr=2e-3 --fixed ablated_frac=0.5 --fixed eval_every=60 --fixed save_steps=240 \
  --fixed "rh_ground_truth={plugin: happy_any}" --jobs "$JOBS" --output-dir "$OUT"
echo "arms: $OUT/arms.csv    Pareto chart: $OUT/charts/pareto.png"
