#!/usr/bin/env bash
# The original paper's seven-environment table (../shared/reference/graft-7env, issue 38) as
# smallrl sweeps into one output directory, to be read with
#   smallrl sweep --collect OUT --compare ../shared/reference/graft-7env
# Usage: scripts/paper-matrix.sh OUT [sweep flags: --dry-run (runs and GPU hours), --emit slurm, --jobs N, ...]
#
# The paper's runs, as its figure script reads them (figures_pareto/proto_pareto_data.py):
# SmolLM2-135M-Instruct on configs/envs/<env>.yaml with the anchor sweeps' recipe (classic
# routing, retain_mode renormalize = renormalization_mode retain_only, no split moment; hack_frac
# 0.5, recall 1, 32 verified coherence rows), 2000 steps (1000 for repeat and topic):
#   gr      routed, seeds 1-5                       -> --intervention-arms routing
#   noi     no intervention (both and retain_only)  -> the none arm every other arm brings
#   filt    filtering (renormalised)                -> filter
#   best_rp the best of a reward-penalty battery: penalty 2, 5, 10 (with 32 coherence rows),
#           at penalty 2 the coherence:main ratios 1:4, 1:2, 1:1 (128+512, 192+384, 256+256
#           rows), and at penalty 2 the advantage-multiplier doses v=2 and v=5 (the verified
#           coherence rows' advantages times 2 or 5: rp_extra_retain_advantage_multiplier, the
#           original's advantages.py:510-515)
#   verif   verified-only, 500 steps, evaluated every 25, seeds 1-3 -> verified
# Seeds here: 5 for the main arms (the paper has 5 for gr and 3 for most others; persona 5),
# 3 for the ratio and multiplier doses and verified-only. Every penalty, filter and verified run
# brings its non-routed baseline (the none arm), so the ratio doses and the 500-step verified
# runs add baselines the paper does not read; `--dry-run` counts them in. The multiplier doses'
# baselines are the main sweep's none runs of seeds 1-3 (the same run directories, reused once
# finished), which `--dry-run` of an empty OUT counts again with each dose.
set -euo pipefail
cd "$(dirname "$0")/.."

SMALLRL=${SMALLRL:-./target/debug/smallrl}
[ $# -ge 1 ] || { echo "usage: $0 OUT [smallrl sweep flags]" >&2; exit 2; }
OUT=$1
shift

long=(addition cities_qa object_qa persona_qa sorting)
short=(repeat topic)
recipe=(renormalization_mode=retain_only split_moment=false)

configs() { for env in "$@"; do echo "configs/envs/$env.yaml"; done; }

sweep() { "$SMALLRL" sweep --output-dir "$OUT" "$@"; }

for group in long short; do
  if [ "$group" = long ]; then envs=("${long[@]}"); steps=2000; else envs=("${short[@]}"); steps=1000; fi
  mapfile -t files < <(configs "${envs[@]}")
  echo "== $group environments (${envs[*]}), $steps steps: routed, penalty 2/5/10, filter"
  sweep --config "${files[@]}" --fixed max_steps=$steps "${recipe[@]}" \
    --grid seed=1,2,3,4,5 rh_penalty=2,5,10 --intervention-arms routing,penalty,filter "$@"
  for ratio in 640:128 576:192 512:256; do
    echo "== $group environments, $steps steps: penalty 2 at coherence:main ${ratio#*:}:$(( ${ratio%:*} - ${ratio#*:} ))"
    sweep --config "${files[@]}" --fixed max_steps=$steps "${recipe[@]}" rh_penalty=2 \
      batch_size=${ratio%:*} coh_samples_per_rollout=${ratio#*:} --grid seed=1,2,3 --intervention-arms penalty "$@"
  done
  for multiplier in 2 5; do
    echo "== $group environments, $steps steps: penalty 2, verified coherence rows' advantages x $multiplier (v=$multiplier)"
    sweep --config "${files[@]}" --fixed max_steps=$steps "${recipe[@]}" rh_penalty=2 \
      rp_extra_retain_advantage_multiplier=$multiplier --grid seed=1,2,3 --intervention-arms penalty "$@"
  done
done
echo "== every environment: verified-only, 500 steps"
mapfile -t files < <(configs "${long[@]}" "${short[@]}")
sweep --config "${files[@]}" --fixed max_steps=500 eval_every=25 --grid seed=1,2,3 --intervention-arms verified "$@"
