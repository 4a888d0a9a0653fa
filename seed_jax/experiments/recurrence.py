"""Does a task go better when it recurs? Each task's success at its first draw in a run
against its later draws, from the run's per-episode records.

An iteration's training success moves with the tasks it draws (in `:learn_listed` seed 1
from 0.12 to 0.75 with no learning behind it), so a first-quarter-to-last-quarter rise
needs many iterations to show through that noise. A task drawn twice in one run is
compared with itself: the difference between its later draws and its first is what the
run learned that helps on it (on it alone, or generally), with the task's difficulty
taken out. The tasks every episode lost at their first draw are counted apart: GRPO has
no signal there (the group's advantages are all zero), so whatever lifts them later came
from elsewhere (other tasks, or a teacher).
"""

from __future__ import annotations

import collections
import glob
import os
import re
from typing import Any, Sequence

import numpy as np

from seed_jax import metrics


def iteration_records(workdir: str, folder: str) -> dict[int, list[dict[str, Any]]]:
  """iteration -> the records of `workdir/folder/iter_N.jsonl` (a torn last line, from a
  run killed mid-write, is left out); {} when the folder has none."""
  by_iteration = {}
  for path in glob.glob(os.path.join(workdir, folder, "iter_*.jsonl")):
    iteration = int(re.search(r"iter_(\d+)\.jsonl$", path).group(1))
    by_iteration[iteration] = metrics.read_metrics(path)
  return dict(sorted(by_iteration.items()))


def read_episode_records(workdir: str,
                         analysis: dict[int, list[dict[str, Any]]] | None = None
                         ) -> list[dict[str, Any]]:
  """A run's per-episode records in iteration order: `episodes/iter_N.jsonl`, or for a run
  that predates that file the OPD arms' `analysis/iter_N.jsonl` (the same head fields;
  `analysis`, `iteration_records` of that folder, when the caller has read them already);
  [] when it has neither."""
  by_iteration = iteration_records(workdir, "episodes")
  if not by_iteration:
    by_iteration = iteration_records(workdir, "analysis") if analysis is None else analysis
  return [record for records in by_iteration.values() for record in records]


def task_draws(records: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
  """task_id -> its success rate at each iteration that drew it, in iteration order (the
  episodes of one task in one iteration, its GRPO group, are one draw). A record without
  its task, iteration or outcome is left out rather than costing the page."""
  won: dict[tuple[str, int], list[bool]] = collections.defaultdict(list)
  for record in records:
    if not all(key in record for key in ("task_id", "iteration", "won")):
      continue
    won[(record["task_id"], int(record["iteration"]))].append(bool(record["won"]))
  draws: dict[str, list[float]] = collections.defaultdict(list)
  for (task, _), outcomes in sorted(won.items(), key=lambda item: item[0][1]):
    draws[task].append(float(np.mean(outcomes)))
  return dict(draws)


def recurrence(records: Sequence[dict[str, Any]]) -> dict[str, float] | None:
  """Over the tasks drawn at least twice: how many (`tasks`), the mean success at their
  first draw (`first`) and over their later draws (`later`: each task's later draws
  averaged, then the tasks), the rise `later - first`; the tasks lost by every episode at
  their first draw (`lost_first`) and their later success (`lost_first_later`, NaN when
  there are none). None when no task recurs."""
  recurring = [d for d in task_draws(records).values() if len(d) >= 2]
  if not recurring:
    return None
  first = np.array([d[0] for d in recurring])
  later = np.array([np.mean(d[1:]) for d in recurring])
  lost = first == 0.0
  return {"tasks": float(len(recurring)), "first": float(first.mean()),
          "later": float(later.mean()), "rise": float((later - first).mean()),
          "lost_first": float(lost.sum()),
          "lost_first_later": float(later[lost].mean()) if lost.any() else float("nan")}
