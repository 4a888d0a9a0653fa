#!/usr/bin/env bash
# Runs seed_jax on every worker of a Cloud TPU pod slice (SPMD: every host runs the same
# program; jax.distributed.initialize() finds the others from the TPU metadata).
#   bash launch/tpu_pod.sh TPU_NAME ZONE --config=configs/alfworld.py --workdir=/shared/runs/x
# Install first on every worker:  gcloud ... --worker=all --command="bash launch/install.sh"
# and add `jax[tpu]` of the pinned jax version to requirements.txt there.
# The workdir must be visible to every worker (NFS or a GCS FUSE mount).
set -euo pipefail
TPU_NAME="$1"; ZONE="$2"; shift 2
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command \
  "cd \$HOME/seed_jax && .venv/bin/python -m seed_jax.main --multihost $*"
