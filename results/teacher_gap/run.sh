#!/usr/bin/env bash
# The teacher gap of the embedded SmolLM2-135M-Instruct before and after the levers of
# issue 24, on the first 8 of 16 held-out (valid_unseen) ALFWorld games of the :cpu kind.
# Each warm start is behaviour cloning alone (rl.iterations=0) on the :cpu preset's 6
# training games; each measurement is `python -m seed_jax.teacher_gap`. Finished steps are
# skipped, so the same command continues after a stop. From the repository root:
#   bash results/teacher_gap/run.sh [RUNS_DIR]      (warm-start checkpoints: not in git)
set -euo pipefail
OUT=results/teacher_gap
RUNS=${1:-runs/teacher_gap}
PY=.venv/bin/python
GAMES=(--config.env.num_games.valid_unseen=16)

warm_start() {  # NAME, then overrides
  local name=$1; shift
  if [ -d "$RUNS/$name/checkpoints/0" ]; then return 0; fi
  /usr/bin/time -f "warm start $name: %e s" -a -o "$OUT/times.txt" \
    $PY -m seed_jax.main --config=configs/alfworld.py:cpu --workdir="$RUNS/$name" \
      --config.algorithm=grpo --config.rl.iterations=0 --config.eval.at_end=False \
      --config.checkpoint.export_hf=False --config.log.plots=False \
      "${GAMES[@]}" "$@" > "$OUT/$name.bc.log" 2>&1
}

gap() {  # NAME, INIT ("" = untrained), then overrides
  local name=$1 init=$2; shift 2
  if [ -f "$OUT/$name.json" ]; then return 0; fi
  /usr/bin/time -f "teacher gap $name: %e s" -a -o "$OUT/times.txt" \
    $PY -m seed_jax.teacher_gap --config=configs/alfworld.py:cpu "${GAMES[@]}" \
      ${init:+--init=$init} --episodes=8 --json="$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
}

# First the decision gap alone (the cheapest figure: ~15 minutes a measurement on a 2-core
# machine without bf16 matrix units), then every part.
warm_start bc_skill_end --config.bc.skill_fraction=1.0 --config.skill_placement=end
# What session 29 had time for (a 2-core machine at ~90 GFLOP/s): 4 games, decision only.
gap bc_skill_end.end.decision4 "$RUNS/bc_skill_end" --placement=end --parts=decision --episodes=4
gap untrained.end.decision4 "" --placement=end --parts=decision --episodes=4
gap untrained.task_line.decision4 "" --placement=task_line --parts=decision --episodes=4
gap bc_skill_end.end.decision "$RUNS/bc_skill_end" --placement=end --parts=decision
gap untrained.end.decision "" --placement=end --parts=decision
gap untrained.task_line.decision "" --placement=task_line --parts=decision
warm_start bc_plain
gap bc_plain.end.decision "$RUNS/bc_plain" --placement=end --parts=decision
gap bc_plain.task_line.decision "$RUNS/bc_plain" --placement=task_line --parts=decision
gap bc_skill_end.end "$RUNS/bc_skill_end" --placement=end
gap bc_plain.end "$RUNS/bc_plain" --placement=end
warm_start bc_skill_task_line --config.bc.skill_fraction=1.0
gap bc_skill_task_line.task_line "$RUNS/bc_skill_task_line" --placement=task_line
# The games it cloned: what is left to teach there.
gap bc_skill_end.train_cloned "$RUNS/bc_skill_end" --placement=end --split=train --episodes=6
