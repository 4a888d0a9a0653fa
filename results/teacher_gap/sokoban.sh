#!/usr/bin/env bash
# The teacher gap of the embedded SmolLM2-135M-Instruct on Sokoban (6x6, one box, the
# :cpu preset's 6-turn limit), before and after the levers of issue 24, on the first 8
# held-out (valid_unseen) puzzles. Each warm start is behaviour cloning alone
# (rl.iterations=0) on 24 training puzzles unless its step says more; each measurement is
# `python -m seed_jax.teacher_gap`. Finished measurements are skipped and a warm start is
# trained only when a missing measurement needs it, so the same command continues after a
# stop, on a new machine too. From the repository root:
#   bash results/teacher_gap/sokoban.sh [RUNS_DIR]      (warm-start checkpoints: not in git)
set -euo pipefail
OUT=results/teacher_gap/sokoban
RUNS=${1:-runs/teacher_gap_sokoban}
CONFIG=configs/sokoban.py:cpu
WARM_ARGS=(--config.bc.episodes=24)
GAP_ARGS=()
mkdir -p "$OUT"
source results/teacher_gap/common.sh

# The skill-reading warm start (each cloned step shown plain and again with its puzzle's
# oracle plan at the end of the message), then the untrained model and plain BC beside it.
warm_start bc_skill_end --config.bc.skill_fraction=1.0 --config.skill_placement=end
gap bc_skill_end.end bc_skill_end --placement=end
gap untrained.end "" --placement=end --parts=decision
# More distinct puzzles at about the same number of updates (66 against 50): 64 puzzles
# cloned once each, plain and with the plan, so that memorising a board pays less than
# reading the plan.
warm_start bc_skill_end64 --config.bc.skill_fraction=1.0 --config.skill_placement=end \
  --config.bc.episodes=64 --config.bc.epochs=1 --config.env.num_tasks.train=64
gap bc_skill_end64.end bc_skill_end64 --placement=end --parts=acting,decision
# The same at 96 puzzles (104 updates): does the gap keep growing with the puzzles cloned?
warm_start bc_skill_end96 --config.bc.skill_fraction=1.0 --config.skill_placement=end \
  --config.bc.episodes=96 --config.bc.epochs=1 --config.env.num_tasks.train=96
gap bc_skill_end96.end bc_skill_end96 --placement=end --parts=acting,decision
# 16 held-out puzzles (the 8 above and the next 8): enough to tell a 20-point acting gap
# from a puzzle or two. Then 128 puzzles, measured the same way.
SIXTEEN=(--placement=end --parts=acting,decision --episodes=16
         --config.env.num_tasks.valid_unseen=16)
gap bc_skill_end96.end16 bc_skill_end96 "${SIXTEEN[@]}"
warm_start bc_skill_end128 --config.bc.skill_fraction=1.0 --config.skill_placement=end \
  --config.bc.episodes=128 --config.bc.epochs=1 --config.env.num_tasks.train=128
gap bc_skill_end128.end16 bc_skill_end128 "${SIXTEEN[@]}"
warm_start bc_plain
gap bc_plain.end bc_plain --placement=end --parts=acting,decision
gap bc_skill_end.task_line bc_skill_end --placement=task_line --parts=acting,decision
