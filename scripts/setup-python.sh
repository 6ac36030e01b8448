#!/usr/bin/env bash
# Creates the project-local Python venv (.venv) with the pinned libtorch wheel that tch 0.26
# links against, plus transformers/TRL for the reference scripts, and links .libtorch to it.
# Idempotent: a re-run with everything in place costs well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.smallrl-requirements
if [ -f "$stamp" ] && cmp -s "$stamp" scripts/requirements.txt && [ -e .libtorch/lib/libtorch_cpu.so ]; then
  exit 0
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -m uv --version >/dev/null 2>&1; then
  .venv/bin/pip install --quiet --disable-pip-version-check uv==0.13.8
fi
.venv/bin/python -m uv pip install --quiet --python .venv/bin/python -r scripts/requirements.txt
torch_dir=$(.venv/bin/python -c 'import torch, os; print(os.path.dirname(torch.__file__))')
ln -sfn "$torch_dir" .libtorch
cp scripts/requirements.txt "$stamp"
echo "setup-python: .venv ready, .libtorch -> $torch_dir"
