#!/usr/bin/env bash
# Follows the log of a seed_jax run started by launch/tpu_run.sh (Ctrl-C stops following,
# not the run).
# Usage: bash launch/tpu_logs.sh NAME ZONE [WORKER]
#   WORKER   which worker's log, default 0 (the primary host, which prints the metrics)
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
fail() { echo "tpu_logs.sh: $1" >&2; echo >&2; usage >&2; exit 2; }

[ $# -ge 2 ] && [ $# -le 3 ] || fail "expected NAME ZONE [WORKER], got ${#} argument(s)"
NAME="$1"; ZONE="$2"; WORKER="${3:-0}"
[[ "$NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] ||
  fail "NAME '$NAME' must be lower-case letters, digits and dashes, starting with a letter"
[[ "$ZONE" =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] || fail "ZONE '$ZONE' is not a zone like us-east5-a"
[[ "$WORKER" =~ ^[0-9]+$ ]] || fail "WORKER '$WORKER' must be a worker index: 0, 1, ..."

# ssh -t: a terminal, so that Ctrl-C ends tail on the worker too.
gcloud compute tpus tpu-vm ssh "$NAME" --zone="$ZONE" --worker="$WORKER" \
  --command="tail -n 200 -F ~/seed_jax/logs/worker-$WORKER.log" -- -t
