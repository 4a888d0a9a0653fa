#!/usr/bin/env bash
# Creates a Cloud TPU slice (a TPU VM per worker host) to run seed_jax on.
# Usage: bash launch/tpu_create.sh NAME ZONE ACCELERATOR_TYPE [--version=RUNTIME] [--spot] [--queued]
#   e.g. bash launch/tpu_create.sh seed-v5p us-east5-a v5p-16 --queued --spot
#   ACCELERATOR_TYPE   v5p-8, v5litepod-16, v6e-8, v4-32, ... as Cloud TPU names slices
#   --version=RUNTIME  TPU software version; by default the one Cloud TPU recommends for JAX:
#                      v6e v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5e v2-alpha-tpuv5-lite,
#                      v4 and older tpu-ubuntu2204-base
#   --spot             Spot capacity: cheaper, preempted at any time (resume from the checkpoint)
#   --queued           request a queued resource, also called NAME, served when capacity frees
#                      up; watch it: gcloud compute tpus queued-resources describe NAME --zone=ZONE
# The project is gcloud's default (gcloud config set project P, or CLOUDSDK_CORE_PROJECT=P).
# Next: bash launch/tpu_setup.sh NAME ZONE; delete with launch/tpu_delete.sh (add --queued).
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
fail() { echo "tpu_create.sh: $1" >&2; echo >&2; usage >&2; exit 2; }

default_runtime() {
  case "$1" in
    v6e-*) echo v2-alpha-tpuv6e ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-* | v5e-*) echo v2-alpha-tpuv5-lite ;;
    *) echo tpu-ubuntu2204-base ;;
  esac
}

[ $# -ge 3 ] || fail "expected NAME ZONE ACCELERATOR_TYPE, got ${#} argument(s)"
NAME="$1"; ZONE="$2"; ACCELERATOR="$3"; shift 3
[[ "$NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] ||
  fail "NAME '$NAME' must be lower-case letters, digits and dashes, starting with a letter"
[[ "$ZONE" =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] || fail "ZONE '$ZONE' is not a zone like us-east5-a"
[[ "$ACCELERATOR" =~ ^v[0-9]+[a-z]*-[0-9]+$ ]] ||
  fail "ACCELERATOR_TYPE '$ACCELERATOR' is not a slice type like v5p-8 or v5litepod-16"

RUNTIME="$(default_runtime "$ACCELERATOR")"; QUEUED=0; SPOT=()
for arg in "$@"; do
  case "$arg" in
    --version=?*) RUNTIME="${arg#--version=}" ;;
    --spot) SPOT=(--spot) ;;
    --queued) QUEUED=1 ;;
    *) fail "unknown argument '$arg'" ;;
  esac
done

if [ "$QUEUED" = 1 ]; then
  gcloud compute tpus queued-resources create "$NAME" --node-id="$NAME" --zone="$ZONE" \
    --accelerator-type="$ACCELERATOR" --runtime-version="$RUNTIME" ${SPOT[@]+"${SPOT[@]}"}
  echo "queued $NAME; it is ready when 'gcloud compute tpus queued-resources describe $NAME" \
    "--zone=$ZONE' says ACTIVE"
else
  gcloud compute tpus tpu-vm create "$NAME" --zone="$ZONE" --accelerator-type="$ACCELERATOR" \
    --version="$RUNTIME" ${SPOT[@]+"${SPOT[@]}"}
fi
