"""Evaluation aggregates: success per task type and env scores."""

from __future__ import annotations

import pytest

from seed_jax.envs.base import Task
from seed_jax.seed.batch import Trajectory
from seed_jax.train.results import split_results
from seed_jax.train.tasks import TaskIterator


def test_success_per_task_type_and_scores():
  tasks = [Task("webshop", f"t{i}", "valid_seen", kind) for i, kind in
           enumerate(["beauty", "beauty", "shoes"])]
  trajs = [Trajectory("t0", "g", "a", True, 10.0, [], info={"webshop_score": 1.0}),
           Trajectory("t1", "g", "b", False, 0.0, [], info={"webshop_score": 0.5}),
           Trajectory("t2", "g", "c", False, 0.0, [], info={"webshop_score": 0.0})]
  stats = {"success": 1 / 3, "mean_return": 10 / 3, "invalid_action_rate": 0.25,
           "ineffective_action_rate": 0.5}
  results = split_results("valid_seen", tasks, trajs, stats)
  assert results == {"valid_seen/success": 1 / 3, "valid_seen/mean_return": 10 / 3,
                     "valid_seen/invalid_action_rate": 0.25,
                     "valid_seen/ineffective_action_rate": 0.5, "valid_seen/beauty": 0.5,
                     "valid_seen/shoes": 0.0, "valid_seen/webshop_score": pytest.approx(0.5)}


def test_task_iterator_resumes_from_its_cursor():
  tasks = list(range(5))
  straight = TaskIterator(tasks, seed=1).take(12)
  first = TaskIterator(tasks, seed=1)
  head = first.take(7)
  assert head + TaskIterator(tasks, seed=1, cursor=first.cursor).take(5) == straight
  assert sorted(straight[:5]) == tasks and sorted(straight[5:10]) == tasks  # whole epochs
