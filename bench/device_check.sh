#!/usr/bin/env bash
# The accelerator check of issues 13 and 25 on one NVIDIA H200, in at most 10 minutes: a Qwen2.5-1.5B
# shape with random weights, bfloat16 compute; the chip's measured bf16 matmul peak, the RL
# train step's tokens/s and MFU (every layer rematerialised, and keeping the projections),
# the sampler's tokens/s at batch 64 and 256 beside the memory's measured bandwidth (its
# roofline), peak memory; each beside the last check's figures (docs/device_check.json).
# bench/device_check.py does the measuring (its docstring says what each part measures).
#
# Run it through the session's device tool, from the repository root (the tool copies the
# working tree there and runs the command in its root):
#
#   run(command="bash bench/device_check.sh", timeout_s=600)
#
# The image there has JAX 0.11 (CUDA 13), flax, optax, orbax, chex, numpy, absl-py, tqdm,
# pyyaml, rich, msgpack and treescope: all the check imports. If it prints "missing Python
# packages: NAMES", download their wheels here into .whl/ as /work/.library/device/README.md
# says (`echo /.whl/ >> .git/info/exclude`, then `python3 -m pip download --no-deps
# --only-binary=:all: --python-version 3.12 ... -d .whl NAME==VERSION`) and run
#
#   run(command="bash bench/device_check.sh", timeout_s=600, carry=[".whl"])
#
# Output: one JSON line on stdout, also written to $OUT/device_check.json (with the log in
# $OUT/device_check.log). Copy that JSON to docs/device_check.json and regenerate the
# benchmarks page (bench/run_all.py) to put it there. Here, without $OUT, the files go to
# /tmp/device_check/. Each part has its own timeout; a part that runs out is reported as
# failed and the others still run. A dry run of the script on a CPU, in seconds:
#   PYTHON=.venv/bin/python DEVICE_CHECK_ARGS=--tiny bash bench/device_check.sh

set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_check}
PYTHON=${PYTHON:-python3}
read -r -a ARGS <<<"${DEVICE_CHECK_ARGS:-}"
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
PARTS=$(mktemp -d)
export PYTHONUNBUFFERED=1
: >"$LOG"

# Wheels carried in .whl/ (only those the image lacks) go to their own folder.
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>&1 | tee -a "$LOG"
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

missing=$(timeout 120 "$PYTHON" bench/device_check.py --missing 2>>"$LOG")
if [ $? -ne 0 ] || [ -n "$missing" ]; then
  echo "missing Python packages: ${missing:-(the import check itself failed; see $LOG)}"
  echo "carry their wheels in .whl/ (see this script's header) and run it again"
  exit 2
fi

# Budgets in seconds, 570 together (about 350 needed on 2026-12-04): compiling the 1.5B
# train step (twice: remat full and projections) and the sampler's two batch sizes
# dominates; measuring takes seconds.
# Progress goes to stderr, each part's own output to the log: stdout keeps the one line.
run_part() {
  local part=$1 seconds=$2
  echo "== $part (at most ${seconds} s)" | tee -a "$LOG" >&2
  timeout -k 5 "$seconds" "$PYTHON" bench/device_check.py --part="$part" \
    --out="$PARTS/$part.json" "${ARGS[@]}" >>"$LOG" 2>&1
  local status=$?
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "== $part: timed out after ${seconds} s" | tee -a "$LOG" >&2
  fi
}
run_part matmul 60
run_part train 150
run_part train_projections 150
run_part sampler 200

echo "== result" >>"$LOG"
timeout 60 "$PYTHON" bench/device_check.py --merge="$PARTS" --out="$OUT/device_check.json" \
  "${ARGS[@]}" 2>>"$LOG"
status=$?
cat "$OUT/device_check.json" >>"$LOG" 2>/dev/null
rm -rf "$PARTS"
exit $status
