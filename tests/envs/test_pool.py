"""The env pool: parallel workers that survive crashes and hangs without losing episodes."""

from __future__ import annotations

import functools
import os
import time

import pytest

from seed_jax.envs.base import StepResult, Task
from seed_jax.envs.pool import EnvPool


class ScriptedEnv:
  """A deterministic toy env whose task payload can make it crash or hang at a given step.

  Observations echo the task, seed and actions, so a restored episode can be told apart
  from a fresh one. The episode is won by the action "win" and ends after 5 steps.
  """

  def reset(self, task, seed):
    if task.payload.get("crash_on_reset"):
      os._exit(4)
    self.task, self.seed, self.actions = task, seed, []
    return self._observation(), self._info(won=False)

  def step(self, action):
    self.actions.append(action)
    step = len(self.actions)
    if self.task.payload.get("crash_at") == step:
      os._exit(3)  # like a segfault in native engine code: no exception, no reply
    if self.task.payload.get("hang_at") == step:
      time.sleep(600)
    if self.task.payload.get("slow_at") == step:
      time.sleep(1.0)
    if self.task.payload.get("raise_at") == step:
      raise RuntimeError("engine error")
    won = action == "win"
    return StepResult(self._observation(), 1.0 if won else 0.0, won or step >= 5,
                      self._info(won=won))

  def close(self):
    pass

  def _observation(self):
    return f"{self.task.task_id} seed={self.seed} actions={','.join(self.actions)}"

  def _info(self, won):
    return {"won": won, "action_valid": True, "admissible_actions": ["go", "win"],
            "task_type": self.task.task_type}


def make_task(name, **payload):
  return Task(env="scripted", task_id=name, split="train", task_type="toy", payload=payload)


def make_pool(num_workers=2, step_timeout_s=5.0):
  return EnvPool("scripted", None, num_workers=num_workers, step_timeout_s=step_timeout_s,
                 reset_timeout_s=10.0, env_factory=functools.partial(ScriptedEnv))


@pytest.fixture(scope="module")
def pool():
  with make_pool() as shared_pool:
    yield shared_pool


def test_rows_step_in_parallel_and_report_elapsed_time(pool):
  tasks = [make_task(f"t{i}") for i in range(5)]
  first = pool.reset(tasks, seeds=[10, 11, 12, 13, 14])
  assert [obs for obs, _ in first] == [f"t{i} seed={10 + i} actions=" for i in range(5)]
  results = pool.step(["go", "win", "go", None, "go"])
  assert results[3] is None
  assert results[1].done and results[1].info["won"] and results[1].reward == 1.0
  assert results[0].observation == "t0 seed=10 actions=go"
  assert all(r.info["elapsed_s"] >= r.info["step_s"] >= 0 for r in results if r)
  with pytest.raises(ValueError, match="row 1 is done"):
    pool.step(["go", "go", "go", None, "go"])


def test_default_seeds_are_reproducible():
  with make_pool(num_workers=1) as a, make_pool(num_workers=1) as b:
    tasks = [make_task("x"), make_task("y")]
    assert a.reset(tasks)[1][0] == b.reset(tasks)[1][0] == "y seed=1 actions="


def test_a_crashed_worker_fails_its_episode_and_the_batch_goes_on(pool):
  # Rows 0, 2, 4 share worker 0; row 2 kills it at its second step.
  tasks = [make_task("a"), make_task("b"), make_task("c", crash_at=2), make_task("d"),
           make_task("e")]
  pool.reset(tasks, seeds=[0] * 5)
  pool.step(["go"] * 5)
  restarts = pool.restarts
  results = pool.step(["go"] * 5)
  assert pool.restarts == restarts + 1
  crashed = results[2]
  assert crashed.done and not crashed.info["won"]
  assert "worker crashed (exit code 3)" in crashed.info["failed"]
  # The neighbours on the dead worker were restored by replay and stepped normally.
  for row, name in ((0, "a"), (4, "e"), (1, "b"), (3, "d")):
    assert results[row].observation == f"{name} seed=0 actions=go,go", row
    assert "failed" not in results[row].info
  after = pool.step(["win", "go", None, "go", "go"])
  assert after[0].info["won"] and after[0].observation == "a seed=0 actions=go,go,win"
  assert after[4].observation == "e seed=0 actions=go,go,go"


def test_a_hung_step_times_out_and_the_worker_is_back_for_the_next_episode():
  with make_pool(num_workers=1, step_timeout_s=1.0) as pool:
    pool.reset([make_task("slow", hang_at=1), make_task("fine")], seeds=[0, 0])
    start = time.perf_counter()
    results = pool.step(["go", "go"])
    assert time.perf_counter() - start < 30
    assert results[0].done and "timed out" in results[0].info["failed"]
    assert results[1].observation == "fine seed=0 actions=go"  # replayed on the new worker
    assert pool.step([None, "win"])[1].info["won"]
    # The replaced worker serves the next episodes.
    assert pool.reset([make_task("next"), make_task("again")], seeds=[1, 2])[0][0] == (
        "next seed=1 actions=")
    assert not pool.step(["go", "go"])[0].done


def test_an_env_exception_fails_only_that_episode(pool):
  pool.reset([make_task("bad", raise_at=1), make_task("good")], seeds=[0, 0])
  restarts = pool.restarts
  results = pool.step(["go", "go"])
  assert "RuntimeError: engine error" in results[0].info["failed"] and results[0].done
  assert results[1].observation == "good seed=0 actions=go"
  assert pool.restarts == restarts  # an exception needs no restart


def test_mismatched_inputs_are_rejected(pool):
  pool.reset([make_task("a")], seeds=[0])
  with pytest.raises(ValueError, match="1 envs"):
    pool.step(["go", "go"])
  with pytest.raises(ValueError, match="seeds"):
    pool.reset([make_task("a")], seeds=[0, 1])


def test_a_crash_during_reset_fails_only_that_episode(pool):
  tasks = [make_task("a"), make_task("b"), make_task("boom", crash_on_reset=True), make_task("d")]
  first = pool.reset(tasks, seeds=[0] * 4)
  obs, info = first[2]
  assert obs == "" and "worker crashed (exit code 4)" in info["failed"] and not info["won"]
  assert [o for o, _ in first[:2]] == ["a seed=0 actions=", "b seed=0 actions="]
  results = pool.step(["go", "go", None, "go"])
  assert results[2] is None and results[0].observation == "a seed=0 actions=go"


def test_workers_outlive_a_sigterm_sent_to_every_process():
  """A VM shutting down signals every process; the trainer, not the env, decides to stop."""
  import signal
  with make_pool(num_workers=1) as pool:
    pool.reset([make_task("a")], seeds=[0])
    for worker in pool._workers:  # pylint: disable=protected-access
      os.kill(worker.process.pid, signal.SIGTERM)
    time.sleep(0.2)
    [result] = pool.step(["go"])
    assert result.observation == "a seed=0 actions=go" and pool.restarts == 0


def test_a_worker_whose_trainer_died_ends_quietly(capfd):
  """A trainer killed outright never sends "close": its workers find the pipe closed and
  end as a close would end them (envs closed, exit status 0), with no traceback."""
  with make_pool(num_workers=1) as pool:
    pool.reset([make_task("a")], seeds=[0])
    [worker] = pool._workers  # pylint: disable=protected-access
    worker.conn.close()  # what the trainer's death does to the pipe
    worker.process.join(timeout=10)
    assert worker.process.exitcode == 0
  assert "Traceback" not in capfd.readouterr().err


def test_a_worker_whose_trainer_died_mid_step_ends_quietly(capfd):
  """The trainer dies while a worker is inside a step: the step's reply finds the pipe
  broken, and the worker ends as a close would end it (exit status 0, no traceback)."""
  with make_pool(num_workers=1) as pool:
    pool.reset([make_task("a", slow_at=1)], seeds=[0])
    [worker] = pool._workers  # pylint: disable=protected-access
    worker.conn.send(("ops", [("step", 0, "go")]))  # sleeps 1 s before it replies
    worker.conn.close()  # what the trainer's death does to the pipe
    worker.process.join(timeout=10)
    assert worker.process.exitcode == 0
  assert "Traceback" not in capfd.readouterr().err
