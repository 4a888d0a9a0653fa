"""A task's success at its later draws against its first: learning with the draw's
difficulty taken out (seed_jax/experiments/recurrence.py), from the per-episode records."""

import json
import math
import os
import random

import pytest

from seed_jax.experiments import recurrence


def episodes(task, iteration, outcomes):
  return [{"iteration": iteration, "task_id": task, "won": won} for won in outcomes]


# task a: 1/4 at iteration 1, 2/4 at 3, 4/4 at 5; task b: 0/4 at 2, 1/4 at 4; task c once.
RECORDS = (episodes("a", 1, [1, 0, 0, 0]) + episodes("c", 1, [1, 1, 0, 0])
           + episodes("b", 2, [0, 0, 0, 0]) + episodes("a", 3, [1, 1, 0, 0])
           + episodes("b", 4, [1, 0, 0, 0]) + episodes("a", 5, [1, 1, 1, 1]))


def test_each_task_is_compared_with_itself_over_the_tasks_that_recur():
  figures = recurrence.recurrence(RECORDS)
  # first draws: a 0.25, b 0.0; later: a (0.5 + 1.0) / 2, b 0.25; c drew once: left out.
  assert figures["tasks"] == 2
  assert figures["first"] == pytest.approx(0.125)
  assert figures["later"] == pytest.approx((0.75 + 0.25) / 2)
  assert figures["rise"] == pytest.approx(0.375)
  # b: every episode lost at its first draw (no GRPO signal), 0.25 later.
  assert figures["lost_first"] == 1 and figures["lost_first_later"] == pytest.approx(0.25)


def test_the_draws_follow_the_iterations_not_the_order_of_the_records():
  shuffled = list(RECORDS)
  random.Random(0).shuffle(shuffled)
  assert recurrence.task_draws(shuffled) == {"a": [0.25, 0.5, 1.0], "b": [0.0, 0.25],
                                             "c": [0.5]}
  assert recurrence.recurrence(shuffled) == recurrence.recurrence(RECORDS)


def test_a_run_where_no_task_recurs_or_none_was_lost_says_so():
  assert recurrence.recurrence(episodes("a", 1, [1, 0]) + episodes("b", 2, [0, 0])) is None
  assert recurrence.recurrence([{"iteration": 1, "won": True}] * 2) is None  # no task named
  figures = recurrence.recurrence(episodes("a", 1, [1, 0]) + episodes("a", 2, [1, 1]))
  assert figures["lost_first"] == 0 and math.isnan(figures["lost_first_later"])


def write_jsonl(path, records):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


def test_a_run_is_read_from_its_episodes_files_else_its_analysis_files(tmp_path):
  run = str(tmp_path)
  assert recurrence.read_episode_records(run) == []
  for it in (2, 10, 1):  # numbered, not sorted as text (iter_10 after iter_2)
    write_jsonl(f"{run}/analysis/iter_{it}.jsonl", episodes("a", it, [0]))
  assert [r["iteration"] for r in recurrence.read_episode_records(run)] == [1, 2, 10]
  write_jsonl(f"{run}/episodes/iter_1.jsonl", episodes("b", 1, [1, 1]))
  assert recurrence.read_episode_records(run) == episodes("b", 1, [1, 1])


def test_a_run_killed_mid_write_loses_only_its_torn_last_line(tmp_path):
  run = str(tmp_path)
  write_jsonl(f"{run}/episodes/iter_3.jsonl", episodes("a", 3, [1, 0]))
  with open(f"{run}/episodes/iter_3.jsonl", "a") as f:
    f.write('{"iteration": 3, "task_id": "a", "wo')
  assert recurrence.iteration_records(run, "episodes") == {3: episodes("a", 3, [1, 0])}
  assert recurrence.iteration_records(run, "analysis") == {}
