# Sourced by run.sh (ALFWorld) and sokoban.sh: a warm start is behaviour cloning alone
# (rl.iterations=0) in $RUNS/NAME; a measurement is `python -m seed_jax.teacher_gap` written
# to $OUT/NAME.{json,txt}. A measurement already in $OUT is skipped, and a warm start is
# trained only when a missing measurement needs it and its checkpoint is not in $RUNS (the
# checkpoints are not in git), so a script continues after a stop, on a new machine too.
# The caller sets OUT, RUNS, CONFIG and the arrays WARM_ARGS (warm starts) and GAP_ARGS
# (measurements).
PY=${PY:-.venv/bin/python}
declare -A WARM_STARTS

warm_start() {  # NAME, then overrides: declares the warm start NAME (trained on demand)
  local name=$1; shift
  WARM_STARTS[$name]=""
  if (($#)); then WARM_STARTS[$name]=$(printf '%q ' "$@"); fi
}

train_warm_start() {  # NAME: trains it unless its checkpoint is there
  local name=$1
  if [ -d "$RUNS/$name/checkpoints/0" ]; then return 0; fi
  if [ -z "${WARM_STARTS[$name]+set}" ]; then
    echo "no warm start named $name declared" >&2; return 1
  fi
  eval "local overrides=(${WARM_STARTS[$name]})"
  /usr/bin/time -f "warm start $name: %e s" -a -o "$OUT/times.txt" \
    $PY -m seed_jax.main --config="$CONFIG" --workdir="$RUNS/$name" \
      --config.algorithm=grpo --config.rl.iterations=0 --config.eval.at_end=False \
      --config.checkpoint.export_hf=False --config.log.plots=False \
      "${WARM_ARGS[@]}" "${overrides[@]}" > "$OUT/$name.bc.log" 2>&1
  cp "$RUNS/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null || true
}

gap() {  # NAME, WARM (a declared warm start; "" = the untrained model), then overrides
  local name=$1 warm=$2; shift 2
  if [ -f "$OUT/$name.json" ]; then return 0; fi
  if [ -n "$warm" ]; then train_warm_start "$warm"; fi
  /usr/bin/time -f "teacher gap $name: %e s" -a -o "$OUT/times.txt" \
    $PY -m seed_jax.teacher_gap --config="$CONFIG" "${GAP_ARGS[@]}" \
      ${warm:+--init=$RUNS/$warm} --episodes=8 --json="$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
}
