"""Evaluation results per split: success per task type and the env's scores.

A module of its own, pure and light, so that the trainer (which evaluates every
`eval.every` iterations) and `seed_jax.train.evaluate` (which drives the trainer to
evaluate a checkpoint) both import it without importing each other.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from seed_jax.envs.base import Task
from seed_jax.seed.batch import Trajectory


def split_results(split: str, tasks: Sequence[Task], trajs: Sequence[Trajectory],
                  stats: dict[str, float]) -> dict[str, float]:
  """`{split}/success`, `/mean_return`, `/invalid_action_rate`, `/ineffective_action_rate`
  (valid steps that changed nothing, over steps), one success rate per task
  type (for search, the task type is the dataset: exact match per dataset), and the mean of
  every `*_score` the env reported at the end of its episodes (e.g. WebShop's score)."""
  results = {f"{split}/{key}": stats[key]
             for key in ("success", "mean_return", "invalid_action_rate",
                         "ineffective_action_rate")}
  for task_type in sorted({t.task_type for t in tasks}):
    won = [traj.won for traj, task in zip(trajs, tasks) if task.task_type == task_type]
    results[f"{split}/{task_type}"] = float(np.mean(won))
  scores = sorted({k for traj in trajs for k in traj.info if k.endswith("_score")})
  for key in scores:
    values = [traj.info[key] for traj in trajs if key in traj.info]
    results[f"{split}/{key}"] = float(np.mean(values))
  return results
