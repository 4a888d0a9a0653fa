"""Does the policy's own hindsight skill state the puzzle's solution? (the `seed` arm)

  .venv/bin/python results/sokoban_learn/own_skill_plans.py results/sokoban_learn/seed/seed0 [...]

For every skill a run's policy wrote during RL (`analysis/iter_N.jsonl`), the plan it
states ("step 1: left, step 2: up": the oracle's format, learned in stage 1) against a
shortest solution of the same puzzle (`generator.solve`, the oracle's plan), split by the
episode's outcome: the plan equal to the solution, and its first move equal to the
solution's first move (4 moves: 25% by chance). Prints one JSON line per run.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# pylint: disable=wrong-import-position
from configs import sokoban as preset
from seed_jax.envs import sokoban
from seed_jax.envs.sokoban import generator

STEP = re.compile(r"step \d+: (\w+)")


def main(run_dirs: list[str]) -> None:
  cfg = preset.get_config("learn")
  tasks = {t.task_id: t for t in sokoban.load_tasks(cfg.env, "train")}

  def solution(task_id: str) -> list[str]:
    p = tasks[task_id].payload
    board, _ = generator.generate(p["seed"], height=p["height"], width=p["width"],
                                  num_boxes=p["num_boxes"],
                                  max_solution_steps=cfg.env.max_solution_steps)
    return generator.solve(board)

  for run in run_dirs:
    counts = {True: [0, 0, 0], False: [0, 0, 0]}  # won -> [skills, plan equal, first equal]
    for path in glob.glob(os.path.join(run, "analysis", "iter_*.jsonl")):
      with open(path) as f:
        for line in f:
          record = json.loads(line)
          if not record.get("skill"):
            continue
          plan, best = STEP.findall(record["skill"]), solution(record["task_id"])
          c = counts[bool(record["won"])]
          c[0] += 1
          c[1] += plan == best
          c[2] += bool(plan) and plan[0] == best[0]
    print(json.dumps({"run": run, **{
        ("won" if won else "failed"): {"skills": n, "plan_is_solution": round(eq / n, 3),
                                       "first_move_is_solution": round(first / n, 3)}
        for won, (n, eq, first) in counts.items() if n}}))


if __name__ == "__main__":
  main(sys.argv[1:])
