#!/usr/bin/env bash
# Starts seed_jax training on every worker of a TPU slice, in the background.
# Usage: bash launch/tpu_run.sh NAME ZONE --config=CONFIG --workdir=SHARED_DIR [--config.KEY=VALUE ...]
#        bash launch/tpu_run.sh NAME ZONE --stop
#   e.g. bash launch/tpu_run.sh seed-v5p us-east5-a --config=configs/alfworld.py \
#          --workdir=/mnt/shared/runs/alfworld-v5p --config.mesh.fsdp=-1
# Every worker runs `python -m seed_jax.main --multihost ARGS` (SPMD: the same program on each
# host; jax.distributed.initialize() finds the other hosts from the TPU metadata) under nohup,
# so the run outlives this ssh session. Each worker logs to ~/seed_jax/logs/worker-N.log;
# follow worker 0 with launch/tpu_logs.sh. A worker already running seed_jax refuses to
# start a second run; --stop sends the run SIGTERM on every worker, which stops it at the next
# safe point with its last iteration checkpointed (the same command with the same workdir
# resumes it). The workdir must be one folder every worker sees (gs://bucket/run, NFS or a
# GCS FUSE mount): checkpoints are written by all hosts together. Set up the workers first
# with launch/tpu_setup.sh.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
fail() { echo "tpu_run.sh: $1" >&2; echo >&2; usage >&2; exit 2; }

[ $# -ge 3 ] || fail "expected NAME ZONE and the run's flags (or --stop), got ${#} argument(s)"
NAME="$1"; ZONE="$2"; shift 2
[[ "$NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] ||
  fail "NAME '$NAME' must be lower-case letters, digits and dashes, starting with a letter"
[[ "$ZONE" =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] || fail "ZONE '$ZONE' is not a zone like us-east5-a"

# The worker index as gcloud's --worker counts it, from the TPU VM's metadata.
WORKER='W=$(curl -sf -H Metadata-Flavor:Google http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number || hostname)'
PID_FILE='~/seed_jax/logs/seed_jax.pid'

if [ "$1" = "--stop" ]; then
  [ $# -eq 1 ] || fail "--stop takes no other arguments"
  gcloud compute tpus tpu-vm ssh "$NAME" --zone="$ZONE" --worker=all --command="$WORKER
    if [ -f $PID_FILE ] && kill \$(cat $PID_FILE) 2>/dev/null; then echo \"worker \$W: stopped\";
    else echo \"worker \$W: no run\"; fi; rm -f $PID_FILE"
  exit 0
fi

printf '%s\n' "$@" | grep -q '^--config=' || fail "missing --config=CONFIG (e.g. configs/alfworld.py)"
printf '%s\n' "$@" | grep -qE '^--(config\.)?workdir=' ||
  fail "missing --workdir=SHARED_DIR: a folder every worker sees (gs://bucket/run, NFS, ...)"
ARGS="$(printf ' %q' "$@")"

gcloud compute tpus tpu-vm ssh "$NAME" --zone="$ZONE" --worker=all --command="$WORKER
  cd ~/seed_jax && mkdir -p logs
  if [ -f $PID_FILE ] && kill -0 \$(cat $PID_FILE) 2>/dev/null; then
    echo \"worker \$W: seed_jax is already running (pid \$(cat $PID_FILE)); stop it with:\" \
      \"bash launch/tpu_run.sh $NAME $ZONE --stop\" >&2
    exit 1
  fi
  nohup .venv/bin/python -m seed_jax.main --multihost$ARGS > logs/worker-\$W.log 2>&1 < /dev/null &
  echo \$! > $PID_FILE
  echo \"worker \$W: started, log ~/seed_jax/logs/worker-\$W.log\""
echo "started on every worker of $NAME; follow it: bash launch/tpu_logs.sh $NAME $ZONE"
