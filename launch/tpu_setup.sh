#!/usr/bin/env bash
# Puts seed_jax on every worker of a TPU slice, in ~/seed_jax, and installs it for TPU.
# Usage: bash launch/tpu_setup.sh NAME ZONE [--repo=GIT_URL [--ref=BRANCH_TAG_OR_COMMIT]]
#   without --repo   copies this checkout (the files git tracks or would track: no .venv,
#                    no runs/) to every worker, over what is already there
#   --repo=GIT_URL   every worker clones GIT_URL (or fetches, if ~/seed_jax is a clone already)
#   --ref=REF        the branch, tag or commit to check out; default the remote's default branch
# Then every worker runs `bash launch/install.sh --tpu`; where the image's python3 is older
# than 3.11 (Ubuntu 22.04 images ship 3.10), python3.11 is installed with apt first.
# Run it again after changing the code: the copy and the install are both idempotent.
# Next: bash launch/tpu_run.sh NAME ZONE --config=... --workdir=...
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
fail() { echo "tpu_setup.sh: $1" >&2; echo >&2; usage >&2; exit 2; }

[ $# -ge 2 ] || fail "expected NAME ZONE, got ${#} argument(s)"
NAME="$1"; ZONE="$2"; shift 2
[[ "$NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] ||
  fail "NAME '$NAME' must be lower-case letters, digits and dashes, starting with a letter"
[[ "$ZONE" =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] || fail "ZONE '$ZONE' is not a zone like us-east5-a"
REPO=""; REF=""
for arg in "$@"; do
  case "$arg" in
    --repo=?*) REPO="${arg#--repo=}" ;;
    --ref=?*) REF="${arg#--ref=}" ;;
    *) fail "unknown argument '$arg'" ;;
  esac
done
[ -z "$REF" ] || [ -n "$REPO" ] || fail "--ref needs --repo"

# Every worker gets exactly the same code; only then do their SPMD programs agree.
if [ -z "$REPO" ]; then
  ROOT="$(cd "$(dirname "$0")/.." && pwd)"
  STAGE="$(mktemp -d)"
  trap 'rm -rf "$STAGE"' EXIT
  if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    # Tracked and untracked-but-not-ignored files; a tracked file deleted locally is skipped.
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
      while IFS= read -r -d '' file; do if [ -f "$file" ]; then printf '%s\0' "$file"; fi; done |
      tar czf "$STAGE/seed_jax.tar.gz" --null -T -)
  else
    tar czf "$STAGE/seed_jax.tar.gz" -C "$ROOT" --exclude=./.venv --exclude=./runs .
  fi
  gcloud compute tpus tpu-vm scp "$STAGE/seed_jax.tar.gz" "$NAME:seed_jax.tar.gz" \
    --zone="$ZONE" --worker=all
  FETCH="mkdir -p ~/seed_jax && tar xzf ~/seed_jax.tar.gz -C ~/seed_jax && rm ~/seed_jax.tar.gz"
else
  # A branch is taken from origin (a local branch of an old clone would be stale), a tag or
  # commit as it is.
  REF_ARG="$(printf %q "${REF:-HEAD}")"
  FETCH="if [ -d ~/seed_jax/.git ]; then git -C ~/seed_jax fetch --quiet --tags origin;
    else git clone --quiet $(printf %q "$REPO") ~/seed_jax; fi
    git -C ~/seed_jax checkout --quiet --detach origin/$REF_ARG 2>/dev/null ||
      git -C ~/seed_jax checkout --quiet --detach $REF_ARG"
fi

INSTALL="if python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    PY=python3
  else
    PY=python3.11
    command -v python3.11 >/dev/null || { sudo apt-get update -qq &&
      sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv; }
  fi
  cd ~/seed_jax && PYTHON=\$PY bash launch/install.sh --tpu"

gcloud compute tpus tpu-vm ssh "$NAME" --zone="$ZONE" --worker=all \
  --command="set -euo pipefail; $FETCH; $INSTALL"
echo "seed_jax installed on every worker of $NAME"
