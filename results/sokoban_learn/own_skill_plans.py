"""Does the policy's own hindsight skill state the puzzle's solution? (the `seed` arm)

  .venv/bin/python results/sokoban_learn/own_skill_plans.py results/sokoban_learn/seed/seed0 [...]

For every skill a run's policy wrote during RL (`analysis/iter_N.jsonl`), the plan it
states ("step 1: left, step 2: up": the oracle's format, learned in stage 1) against a
shortest solution of the same puzzle (`generator.solve`, the oracle's plan), split by the
episode's outcome: the plan equal to the solution, and its first move equal to the
solution's first move (4 moves: 25% by chance). And what group hindsight
(`analyzer.group_hindsight`, the `seed_group` arm) gives a failed episode whose group of
the same puzzle holds a won one: the plan of that won sibling (the fewest steps), on the
same two measures (`failed_with_won_sibling`). And per iteration, the plan the policy wrote
most often for its failed episodes, its share of them, their number and the puzzles they
played (`failed_modal_plan`: one plan for the failures of several puzzles says the plans
stopped depending on the puzzle). Prints one JSON line per run.
"""

from __future__ import annotations

import glob
import collections
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

  def score(plan: list[str], task_id: str) -> tuple[int, int]:
    best = solution(task_id)
    return int(plan == best), int(bool(plan) and plan[0] == best[0])

  for run in run_dirs:
    # won -> [skills, plan equal, first equal]; "sibling" -> the won sibling's plan
    counts = {True: [0, 0, 0], False: [0, 0, 0], "sibling": [0, 0, 0]}
    modal = {}  # iteration -> [the failed episodes' most frequent plan, its share, their
    # number, the puzzles they played]
    for path in glob.glob(os.path.join(run, "analysis", "iter_*.jsonl")):
      failed_plans, failed_puzzles = collections.Counter(), set()
      groups = collections.defaultdict(list)
      with open(path) as f:
        for line in f:
          record = json.loads(line)
          groups[record["group_id"]].append(record)
      for group in groups.values():
        wins = sorted((r for r in group if r["won"] and r.get("skill")),
                      key=lambda r: r["num_steps"])
        for record in group:
          if record.get("skill"):
            plan = STEP.findall(record["skill"])
            if not record["won"]:
              failed_plans[" ".join(plan)] += 1
              failed_puzzles.add(record["task_id"])
            c = counts[bool(record["won"])]
            c[0] += 1
            for k, hit in enumerate(score(plan, record["task_id"])):
              c[k + 1] += hit
          if not record["won"] and wins:
            c = counts["sibling"]
            c[0] += 1
            for k, hit in enumerate(score(STEP.findall(wins[0]["skill"]), record["task_id"])):
              c[k + 1] += hit
      if failed_plans:
        plan, n = failed_plans.most_common(1)[0]
        iteration = int(re.search(r"iter_(\d+)\.jsonl$", path).group(1))
        total = sum(failed_plans.values())
        modal[iteration] = [plan, round(n / total, 3), total, len(failed_puzzles)]
    names = {True: "won", False: "failed", "sibling": "failed_with_won_sibling"}
    print(json.dumps({"run": run, **{
        names[key]: {"skills": n, "plan_is_solution": round(eq / n, 3),
                     "first_move_is_solution": round(first / n, 3)}
        for key, (n, eq, first) in counts.items() if n},
        "failed_modal_plan": dict(sorted(modal.items()))}))


if __name__ == "__main__":
  main(sys.argv[1:])
