#!/usr/bin/env bash
# The GPU checks of issue 16, reproducible by anyone with a GPU: CUDA parity tests (logits and
# greedy decodes against transformers, CUDA-graph decoding against eager decoding) and the
# speed figures (`smallrl bench sample|train --device cuda`) next to the issue's targets.
#
#   scripts/gpu-check.sh bundle TORCH_DIR [OUT.tar.xz]   where Rust is (and the network, for tch 0.24)
#   scripts/gpu-check.sh run BUNDLE.tar.xz                on the GPU machine (no Rust needed)
#   scripts/gpu-check.sh local                            Rust and a GPU on one machine: both steps
#   scripts/gpu-check.sh canonical BUNDLE.tar.xz          on the GPU machine: the paper's canonical step
#   scripts/gpu-check.sh canonical-configs DIR MODEL DTYPE [RUNS [TRAIN_DTYPE]]  the canonical runs' YAML files alone
#
# `canonical` (issue 38, one call of at most 10 minutes): the canonical SmolLM2-135M step of
# configs/envs/sorting.yaml (544 rows: 512 completions and 32 coherence rows, 48 tokens) alone,
# then five such runs packed in one process (`train --pack-config`), each in float32 and
# bfloat16 weights, and the run alone once more with float32 weights and `train_dtype: bfloat16`
# (issue 50: the training passes' products in bfloat16, torch.autocast's rule); prints the
# median step time (steps after the first) and each run's phase table (the median of every
# `timing/*` metric over steps 2 and later: sampling and its set-up, scoring, reference, old
# log-probs, training and its optimizer) beside the original's figures
# (1.50 s a step alone on an H100; five time-sliced runs at 4.4 s a step each) and the peak
# device memory (nvidia-smi, sampled every 200 ms, the whole device). The weights are random
# (SmolLM2's config.json and tokenizer from the bundle, weights drawn here by transformers: the
# bundle cannot carry 514 MB), so completions run to their 48-token limit where a trained model
# stops earlier: an upper bound on sampling. Each part has a time limit; a part that runs out or
# fails is named at the end ("could not: ...") and the rest still run. The limits (90 s a run
# alone, 120 s a pack, five parts) add up to 510 s, so the call fits the device tool's 10 minutes.
#
# TORCH_DIR is the `torch/` package directory of the PyTorch the GPU machine runs (tch pairs
# with exactly one libtorch: 2.13 -> tch 0.26, 2.11 -> tch 0.24; see ../shared/notes/gpu.md).
# Binaries are built in $STAGE with that libtorch and run from the same path on the GPU
# machine, because the test binaries find fixtures and reference scripts through the path
# they were built at. Any failed step (a CUDA test without a device fails), or a
# libtorch version other than the one built against stops the script with an error.
set -euo pipefail

STAGE=/tmp/smallrl-gpu-check
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() {
    echo "gpu-check: $*" >&2
    exit 1
}

# "2.11.0+cu130" from a torch/ directory's version.py.
torch_version() {
    local version
    version=$(sed -n "s/^__version__ = '\(.*\)'$/\1/p" "$1/version.py")
    [[ -n $version ]] || die "no __version__ in $1/version.py: is $1 a torch/ package directory?"
    echo "$version"
}

# The tch release built against a given libtorch version.
tch_for() {
    case $1 in
        2.13.*) echo 0.26 ;;
        2.11.*) echo 0.24 ;;
        *) die "no known tch release for libtorch $1 (tch 0.26 needs 2.13, 0.24 needs 2.11)" ;;
    esac
}

bundle() {
    local torch_dir out version tch repo
    torch_dir=$(cd "${1:?usage: gpu-check.sh bundle TORCH_DIR [OUT.tar.xz]}" && pwd -P)
    out=${2:-$PWD/smallrl-gpu-check.tar.xz}
    [[ $out = /* ]] || out=$PWD/$out
    [[ -f $torch_dir/lib/libtorch_cuda.so ]] || die "$torch_dir/lib has no libtorch_cuda.so: not a CUDA build of libtorch"
    version=$(torch_version "$torch_dir")
    tch=$(tch_for "$version")
    echo "gpu-check: building against libtorch $version ($torch_dir) with tch $tch in $STAGE"
    ls "$ROOT"/plugins/*.wasm >/dev/null 2>&1 || die "no plugins/*.wasm: run \`make plugins\` first"
    [[ -d $ROOT/../shared/fixtures ]] || die "$ROOT/../shared/fixtures is missing (the test fixtures)"

    repo=$STAGE/repo
    rm -rf "$repo" "$STAGE/shared"
    mkdir -p "$repo" "$STAGE/shared"
    # The working tree as git sees it (tracked and untracked, not ignored), plus built plugins.
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -C "$repo" -xf -
    cp "$ROOT"/plugins/*.wasm "$repo/plugins/"
    cp -r "$ROOT/../shared/fixtures" "$STAGE/shared/fixtures"
    # SmolLM2-135M-Instruct without its weights (`canonical` draws random ones of its shape).
    local smollm2=$ROOT/.fixtures/smollm2-135m-instruct
    [[ -f $smollm2/config.json ]] || die "$smollm2 is missing: run \`bash scripts/real-model.sh\` (make setup)"
    mkdir -p "$STAGE/shared/smollm2-shape"
    find "$smollm2" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$STAGE/shared/smollm2-shape/" \;
    if [[ $tch != 0.26 ]]; then
        sed -i -e "s/^tch = \"0.26\"/tch = \"$tch\"/" -e "s/^torch-sys = \"0.26\"/torch-sys = \"$tch\"/" "$repo/host/Cargo.toml"
        grep -q "^tch = \"$tch\"" "$repo/host/Cargo.toml" || die "could not pin tch $tch in host/Cargo.toml"
    fi
    ln -sfn "$torch_dir" "$repo/.libtorch"

    (
        cd "$repo"
        export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$STAGE/target}
        local messages tests
        messages=$(cargo build --bin smallrl --message-format=json-render-diagnostics)
        grep -q '"cfgs":\["smallrl_cuda_graphs"\]' <<<"$messages" \
            || die "the CUDA-graph shim was not built (SMALLRL_CUDA_GRAPHS_BUILD in the build script's output says why)"
        mkdir -p gpu-bin
        cp "$CARGO_TARGET_DIR/debug/smallrl" gpu-bin/smallrl
        messages=$(cargo test --test model --no-run --message-format=json-render-diagnostics)
        tests=$(sed -n '/"kind":\["test"\]/s/.*"executable":"\([^"]*\)".*/\1/p' <<<"$messages")
        [[ -f $tests ]] || die "cargo did not report the model test binary"
        cp "$tests" gpu-bin/model-tests
        strip gpu-bin/smallrl gpu-bin/model-tests
        echo "$version" >gpu-bin/TORCH_VERSION
    )
    tar -C "$STAGE" --exclude=repo/.libtorch -cJf "$out" repo shared
    echo "gpu-check: wrote $out ($(du -h "$out" | cut -f1)); on the GPU machine: scripts/gpu-check.sh run $(basename "$out")"
}

# Unpacks BUNDLE into $STAGE, checks that it was built for this machine's libtorch, and enters
# its repository.
unpack_bundle() {
    local archive torch_dir version
    archive=$(realpath "$1")
    command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this machine has no NVIDIA driver"
    nvidia-smi -L || die "nvidia-smi sees no GPU"
    torch_dir=${TORCH_DIR:-$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')} \
        || die "no PyTorch for python3: set TORCH_DIR to a torch/ package directory"
    version=$(torch_version "$torch_dir")
    rm -rf "$STAGE/repo" "$STAGE/shared"
    mkdir -p "$STAGE"
    tar -C "$STAGE" -xJf "$archive"
    [[ $(cat "$STAGE/repo/gpu-bin/TORCH_VERSION") == "$version" ]] \
        || die "the bundle was built for libtorch $(cat "$STAGE/repo/gpu-bin/TORCH_VERSION"), this machine has $version"
    ln -sfn "$torch_dir" "$STAGE/repo/.libtorch"
    cd "$STAGE/repo"
}

run_checks() {
    local repo log fixtures
    unpack_bundle "${1:?usage: gpu-check.sh run BUNDLE.tar.xz}"
    repo=$STAGE/repo
    # The reference scripts run with the project's Python: here, the system's (transformers).
    mkdir -p "$repo/.venv/bin"
    ln -sfn "$(command -v python3)" "$repo/.venv/bin/python"
    log=$STAGE/gpu-check.log
    fixtures=$STAGE/shared/fixtures

    echo "== CUDA parity tests (tests/model.rs, every test with cuda in its name)"
    # The CUDA tests are #[ignore]d on machines without a GPU; here they run, and fail without one.
    gpu-bin/model-tests cuda --include-ignored --test-threads 1 --nocapture 2>&1 | tee "$log"
    grep -q "test result: ok" "$log" || die "the CUDA parity tests failed (log: $log)"

    echo "== sampling 32 x 128 (target: at least 200,000 tokens/s)"
    gpu-bin/smallrl bench sample --device cuda --model "$fixtures/tiny-random" --batch 32 --max-new-tokens 128 2>&1 | tee -a "$log"
    echo "== sampling 512 x 128"
    gpu-bin/smallrl bench sample --device cuda --model "$fixtures/tiny-random" --batch 512 --max-new-tokens 128 2>&1 | tee -a "$log"
    echo "== one default run (target: at most 0.07 s per step; TRL 1.16 on an H100: 1.03 s)"
    gpu-bin/smallrl bench train --device cuda --model "$fixtures/tiny-random" \
        --prompts "$fixtures/tiny-stories/prompts.txt" --reward-plugin plugins/happy.wasm 2>&1 | tee -a "$log"
    grep -q "CUDA graphs: median" "$log" || die "bench sample did not measure CUDA-graph decoding (log: $log)"
    echo "== 16 runs x 32 x 128 sampled one after another and stacked (what a pack does on CUDA)"
    gpu-bin/smallrl bench sample --device cuda --model "$fixtures/tiny-random" --batch 32 --max-new-tokens 128 --pack 16 2>&1 | tee -a "$log"
    for setting in "auto 1" "auto 8" "never 8"; do
        read -r stacking workers <<<"$setting"
        echo "== 16 default runs alone and in one pack, stacking $stacking, $workers worker thread(s) (target: at least 100 steps/s in all)"
        gpu-bin/smallrl bench train --device cuda --model "$fixtures/tiny-random" --pack 16 --pack-workers "$workers" --pack-stacking "$stacking" \
            --prompts "$fixtures/tiny-stories/prompts.txt" --reward-plugin plugins/happy.wasm 2>&1 | tee -a "$log"
    done
    echo "gpu-check: all checks passed; log in $log"
}

# The YAML files of `canonical`: RUNS (1 or 5) copies of configs/envs/sorting.yaml with the
# given model, dtype and seed 1..RUNS, on CUDA, 3 steps, a short evaluation at the end only.
canonical_configs() {
    local dir=${1:?usage: gpu-check.sh canonical-configs DIR MODEL DTYPE [RUNS [TRAIN_DTYPE]]} model=${2:?model directory} dtype=${3:?float32 or bfloat16} runs=${4:-1} train_dtype=${5:-float32} seed
    mkdir -p "$dir"
    for seed in $(seq 1 "$runs"); do
        # The file's own keys that are set here are dropped first (a YAML key appears once).
        sed -E '/^(model|max_steps|seed|eval_every|eval_samples):/d' "$ROOT/configs/envs/sorting.yaml" >"$dir/canonical_$seed.yaml"
        cat >>"$dir/canonical_$seed.yaml" <<YAML
model: $model
device: cuda
dtype: $dtype
train_dtype: $train_dtype
seed: $seed
name: canonical_${dtype}_train_${train_dtype}_x${runs}
output_dir: $dir/runs
max_steps: 3
save_steps: 3
eval_every: 3
eval_samples: 16
YAML
    done
}

# Runs COMMAND... under a time limit with the device's memory sampled; prints the median step
# time of each run's metrics.jsonl under RUNS_DIR (steps 2 and later) and the peak memory.
timed_part() {
    local label=$1 limit=$2 runs_dir=$3 figure=$4 sampler peak
    shift 4
    echo "== $label (the original: $figure)"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$STAGE/memory.log" &
    sampler=$!
    if timeout "$limit" "$@" >>"$STAGE/canonical.log" 2>&1; then
        python3 - "$runs_dir" <<'PY'
import json, pathlib, statistics, sys
for metrics in sorted(pathlib.Path(sys.argv[1]).glob("*/metrics.jsonl")):
    times = [json.loads(line)["step_time"] for line in metrics.read_text().splitlines() if line.strip()]
    print(f"  {metrics.parent.name}: median step {statistics.median(times[1:] or times):.2f} s over steps 2-{len(times)} (first step {times[0]:.2f} s)")
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    phases = sorted({key for line in lines for key in line if key.startswith("timing/")})
    if not phases:
        sys.exit(f"{metrics}: no timing/* metrics, no phase table")
    for key in phases:
        values = [line[key] for line in lines[1:] or lines if key in line]
        print(f"    {key:<28} {statistics.median(values):8.3f} s")
PY
    else
        COULD_NOT+=("$label (exit $?; over ${limit} s or failed: log $STAGE/canonical.log)")
    fi
    kill "$sampler" 2>/dev/null || true
    peak=$(sort -n "$STAGE/memory.log" | tail -1)
    echo "  peak device memory: ${peak:-?} MiB (the whole device)"
}

canonical() {
    local model dtype dir
    unpack_bundle "${1:?usage: gpu-check.sh canonical BUNDLE.tar.xz}"
    ROOT=$STAGE/repo
    rm -rf "$STAGE/canonical"
    model=$STAGE/smollm2-random
    cp -r "$STAGE/shared/smollm2-shape" "$model"
    python3 -c 'import sys, torch, transformers as t
c = t.AutoConfig.from_pretrained(sys.argv[1]); torch.manual_seed(0)
t.AutoModelForCausalLM.from_config(c).save_pretrained(sys.argv[1])' "$model" || die "transformers could not draw SmolLM2 weights"
    COULD_NOT=()
    : >"$STAGE/canonical.log"
    for dtype in float32 bfloat16; do
        dir=$STAGE/canonical/$dtype-alone
        canonical_configs "$dir" "$model" "$dtype" 1
        timed_part "one canonical run alone, $dtype, 3 steps" 90 "$dir/runs" "1.50 s a step on an H100, fp32" \
            gpu-bin/smallrl train --config "$dir/canonical_1.yaml"
        dir=$STAGE/canonical/$dtype-packed
        canonical_configs "$dir" "$model" "$dtype" 5
        timed_part "five canonical runs packed in one process, $dtype, 3 steps" 120 "$dir/runs" "4.4 s a step each, five time-sliced runs, fp32" \
            gpu-bin/smallrl train --pack-config "$dir"/canonical_{1,2,3,4,5}.yaml
    done
    dir=$STAGE/canonical/float32-train-bfloat16-alone
    canonical_configs "$dir" "$model" float32 1 bfloat16
    timed_part "one canonical run alone, float32 weights, train_dtype bfloat16, 3 steps" 90 "$dir/runs" "1.50 s a step on an H100, fp32" \
        gpu-bin/smallrl train --config "$dir/canonical_1.yaml"
    echo "not measured here: the original's five runs time-sliced as five processes (these five are one packed process); trained weights (these are random)"
    if [[ ${#COULD_NOT[@]} -gt 0 ]]; then
        printf 'could not: %s\n' "${COULD_NOT[@]}"
        exit 1
    fi
    echo "gpu-check canonical: every part ran; log in $STAGE/canonical.log"
}

case ${1:-} in
    bundle) shift; bundle "$@" ;;
    run) shift; run_checks "$@" ;;
    local)
        bundle "$ROOT/.libtorch" "$STAGE.tar.xz"
        run_checks "$STAGE.tar.xz"
        ;;
    canonical) shift; canonical "$@" ;;
    canonical-configs) shift; canonical_configs "$@" ;;
    *) die "usage: gpu-check.sh bundle TORCH_DIR [OUT.tar.xz] | run BUNDLE.tar.xz | local | canonical BUNDLE.tar.xz | canonical-configs DIR MODEL DTYPE [RUNS [TRAIN_DTYPE]]" ;;
esac
