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
CONFIG=configs/alfworld.py:cpu
GAMES=(--config.env.num_games.valid_unseen=16)
WARM_ARGS=("${GAMES[@]}")
GAP_ARGS=("${GAMES[@]}")
source results/teacher_gap/common.sh

# Session 29 (a 2-core machine at ~90 GFLOP/s) had time for the skill-reading warm start and
# its decision gap only; session 30 ordered the rest so that the table before and after the
# levers fills first: the decision gap on the same 4 games for the untrained model and plain
# BC (no warm start, or a short one), then the acting gap (the 20-point target) of the
# skill-reading warm start, then every part on 8 games.
gap untrained.end.decision4 "" --placement=end --parts=decision --episodes=4
warm_start bc_plain
gap bc_plain.end.decision4 bc_plain --placement=end --parts=decision --episodes=4
# Session 31: the skill-reading warm start's acting gap (the 20-point target) first, then
# plain BC's and the untrained model's acting gaps beside it.
warm_start bc_skill_end --config.bc.skill_fraction=1.0 --config.skill_placement=end
gap bc_skill_end.end.acting bc_skill_end --placement=end --parts=acting
gap bc_plain.end.acting bc_plain --placement=end --parts=acting
gap untrained.end.acting "" --placement=end --parts=acting
gap bc_skill_end.end.decision4 bc_skill_end --placement=end --parts=decision --episodes=4
gap untrained.task_line.decision4 "" --placement=task_line --parts=decision --episodes=4
gap bc_plain.task_line.decision4 bc_plain --placement=task_line --parts=decision --episodes=4
gap bc_skill_end.end bc_skill_end --placement=end
gap bc_plain.end bc_plain --placement=end
warm_start bc_skill_task_line --config.bc.skill_fraction=1.0
gap bc_skill_task_line.task_line bc_skill_task_line --placement=task_line
# The games it cloned: what is left to teach there.
gap bc_skill_end.train_cloned bc_skill_end --placement=end --split=train --episodes=6
