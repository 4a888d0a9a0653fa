#!/usr/bin/env bash
# Deletes a TPU slice made by launch/tpu_create.sh (its workers' disks go with it; the shared
# workdir does not). gcloud asks to confirm unless --yes.
# Usage: bash launch/tpu_delete.sh NAME ZONE [--queued] [--yes]
#   --queued   the slice came from a queued resource (tpu_create.sh --queued): delete the
#              request and its slice together
#   --yes      do not ask
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
fail() { echo "tpu_delete.sh: $1" >&2; echo >&2; usage >&2; exit 2; }

[ $# -ge 2 ] || fail "expected NAME ZONE, got ${#} argument(s)"
NAME="$1"; ZONE="$2"; shift 2
[[ "$NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] ||
  fail "NAME '$NAME' must be lower-case letters, digits and dashes, starting with a letter"
[[ "$ZONE" =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] || fail "ZONE '$ZONE' is not a zone like us-east5-a"
QUEUED=0; QUIET=()
for arg in "$@"; do
  case "$arg" in
    --queued) QUEUED=1 ;;
    --yes) QUIET=(--quiet) ;;
    *) fail "unknown argument '$arg'" ;;
  esac
done

if [ "$QUEUED" = 1 ]; then
  # --force deletes the slice the request holds, not only the request.
  gcloud compute tpus queued-resources delete "$NAME" --zone="$ZONE" --force \
    ${QUIET[@]+"${QUIET[@]}"}
else
  gcloud compute tpus tpu-vm delete "$NAME" --zone="$ZONE" ${QUIET[@]+"${QUIET[@]}"}
fi
