#!/usr/bin/env bash
# The teacher gap of the embedded SmolLM2-135M-Instruct on Sokoban (6x6, one box, the
# :cpu preset's 6-turn limit), before and after the levers of issue 24, on the first 8
# held-out (valid_unseen) puzzles. Each warm start is behaviour cloning alone
# (rl.iterations=0) on 24 training puzzles; each measurement is `python -m
# seed_jax.teacher_gap`. Finished steps are skipped, so the same command continues after a
# stop. From the repository root:
#   bash results/teacher_gap/sokoban.sh [RUNS_DIR]      (warm-start checkpoints: not in git)
set -euo pipefail
OUT=results/teacher_gap/sokoban
RUNS=${1:-runs/teacher_gap_sokoban}
PY=.venv/bin/python
mkdir -p "$OUT"

warm_start() {  # NAME, then overrides
  local name=$1; shift
  if [ -d "$RUNS/$name/checkpoints/0" ]; then return 0; fi
  /usr/bin/time -f "warm start $name: %e s" -a -o "$OUT/times.txt" \
    $PY -m seed_jax.main --config=configs/sokoban.py:cpu --workdir="$RUNS/$name" \
      --config.algorithm=grpo --config.rl.iterations=0 --config.eval.at_end=False \
      --config.checkpoint.export_hf=False --config.log.plots=False \
      --config.bc.episodes=24 "$@" > "$OUT/$name.bc.log" 2>&1
}

gap() {  # NAME, INIT ("" = untrained), then overrides
  local name=$1 init=$2; shift 2
  if [ -f "$OUT/$name.json" ]; then return 0; fi
  /usr/bin/time -f "teacher gap $name: %e s" -a -o "$OUT/times.txt" \
    $PY -m seed_jax.teacher_gap --config=configs/sokoban.py:cpu ${init:+--init=$init} \
      --episodes=8 --json="$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
}

# The skill-reading warm start (each cloned step shown plain and again with its puzzle's
# oracle plan at the end of the message), then the untrained model and plain BC beside it.
warm_start bc_skill_end --config.bc.skill_fraction=1.0 --config.skill_placement=end
gap bc_skill_end.end "$RUNS/bc_skill_end" --placement=end
gap untrained.end "" --placement=end --parts=decision
warm_start bc_plain
gap bc_plain.end "$RUNS/bc_plain" --placement=end --parts=acting,decision
gap bc_skill_end.task_line "$RUNS/bc_skill_end" --placement=task_line --parts=acting,decision
