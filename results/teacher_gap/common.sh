# Sourced by run.sh (ALFWorld) and sokoban.sh: a warm start is behaviour cloning alone
# (rl.iterations=0) in $RUNS/NAME; a measurement is `python -m seed_jax.teacher_gap` written
# to $OUT/NAME.{json,txt}. Both skip what is done, so a script continues after a stop.
# The caller sets OUT, RUNS, CONFIG and the arrays WARM_ARGS (warm starts) and GAP_ARGS
# (measurements).
PY=.venv/bin/python

warm_start() {  # NAME, then overrides
  local name=$1; shift
  if [ -d "$RUNS/$name/checkpoints/0" ]; then return 0; fi
  /usr/bin/time -f "warm start $name: %e s" -a -o "$OUT/times.txt" \
    $PY -m seed_jax.main --config="$CONFIG" --workdir="$RUNS/$name" \
      --config.algorithm=grpo --config.rl.iterations=0 --config.eval.at_end=False \
      --config.checkpoint.export_hf=False --config.log.plots=False \
      "${WARM_ARGS[@]}" "$@" > "$OUT/$name.bc.log" 2>&1
}

gap() {  # NAME, INIT ("" = untrained), then overrides
  local name=$1 init=$2; shift 2
  if [ -f "$OUT/$name.json" ]; then return 0; fi
  /usr/bin/time -f "teacher gap $name: %e s" -a -o "$OUT/times.txt" \
    $PY -m seed_jax.teacher_gap --config="$CONFIG" "${GAP_ARGS[@]}" \
      ${init:+--init=$init} --episodes=8 --json="$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
}
