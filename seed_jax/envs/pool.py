"""Steps many environments in parallel worker processes, surviving crashes and hangs.

`EnvPool` owns `num_workers` processes; row `i` of a batch lives on worker `i % num_workers`
(several envs per worker). Every call sends each worker its list of operations, then
collects one reply per operation with a deadline per operation, so a hung env is found
within its timeout and a dead worker as soon as its pipe closes.

When a worker crashes or hangs, it is killed and restarted. The episode it was working on
ends: done=True, won=False, `info["failed"]` = the reason. The other episodes that lived on
that worker are restored on the new worker by replaying their reset and actions (the envs
are deterministic given the task, seed and actions), so the rest of the batch goes on and
no episode record is lost. Every result carries `info["elapsed_s"]`, the wall time since
the episode's reset, and `info["step_s"]`, the env's own time for this step.

`InProcessPool` has the same API and failure semantics without processes (an env that
raises fails its episode only): for `play --workers=0` and tests.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import signal
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from seed_jax.envs.base import Env, StepResult, Task, check_info

_START_TIMEOUT_S = 300.0  # a fresh worker imports its env stack (textworld, ...)


def failed_info(task: Task, reason: str) -> dict[str, Any]:
  """The info of an episode that failed (its env crashed, hung or raised)."""
  return {"won": False, "action_valid": False, "admissible_actions": None,
          "task_type": task.task_type, "failed": reason}


def _reply(conn: Connection, message: tuple) -> bool:
  """Sends a reply; False when the trainer's end of the pipe is gone (it died mid-step)."""
  try:
    conn.send(message)
    return True
  except (BrokenPipeError, ConnectionResetError):
    return False


def _worker_main(conn: Connection, env_name: str, config: Any, with_expert: bool,
                 env_factory: Callable[[], Env] | None) -> None:
  """Worker loop: runs operation lists, replies once per operation, in order."""
  # A VM being shut down sends SIGTERM to every process: the trainer decides when to stop
  # (hosts.PreemptionGuard) and closes its workers; they must not die mid-episode first.
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  if env_factory is None:
    from seed_jax.envs.registry import get_env_module  # pylint: disable=g-import-not-at-top
    module = get_env_module(env_name)
    env_factory = lambda: module.make_env(config, with_expert=with_expert)
  envs: dict[int, Env] = {}
  trainer_alive = _reply(conn, ("ready",))
  while trainer_alive:
    try:
      message = conn.recv()
    except EOFError:  # the trainer died without a "close" (killed): end as that would
      break
    if message[0] == "close":
      break
    for op in message[1]:
      kind, row = op[0], op[1]
      start = time.perf_counter()
      try:
        if kind == "step":
          output = envs[row].step(op[2])
        else:  # "reset" or "restore": reset, then replay the actions taken so far
          if row not in envs:
            envs[row] = env_factory()
          env = envs[row]
          output = env.reset(op[2], op[3])
          for action in op[4] if kind == "restore" else ():
            output = env.step(action)
        # In the try: an output that cannot be pickled is reported as the env's error.
        trainer_alive = _reply(conn, ("ok", row, output, time.perf_counter() - start))
      except Exception:  # pylint: disable=broad-except  (reported; the episode fails)
        trainer_alive = _reply(conn, ("error", row, traceback.format_exc(limit=5),
                                      time.perf_counter() - start))
      if not trainer_alive:
        break
  for env in envs.values():
    try:
      env.close()
    except Exception:  # pylint: disable=broad-except
      pass
  conn.close()


@dataclasses.dataclass
class _Episode:
  task: Task
  seed: int
  started: float
  actions: list[str] = dataclasses.field(default_factory=list)
  done: bool = False


@dataclasses.dataclass
class _Worker:
  process: Any
  conn: Connection
  ready: bool = False


class EnvPool:
  """A batch of environments of one family, stepped in parallel worker processes.

  Args:
    env_name: an env family of `seed_jax.envs.registry` (ignored when env_factory is given).
    config: that family's config (`module.default_config()`, possibly overridden).
    num_workers: worker processes; row i runs on worker i % num_workers.
    step_timeout_s: a step taking longer counts as a hang: the worker is restarted and the
      episode fails.
    with_expert: infos also hold "expert_action".
    seed: base of the per-episode seeds when `reset` gets none.
    reset_timeout_s: the same for resets (loading a game is slower than a step).
    env_factory: a picklable callable returning an Env, instead of the registry (tests).
    start_method: multiprocessing start method; "spawn" or "forkserver" keep workers free
      of the parent's threads (JAX).
  """

  def __init__(self, env_name: str, config: Any, num_workers: int, step_timeout_s: float = 60.0,
               with_expert: bool = False, seed: int = 0, reset_timeout_s: float | None = None,
               env_factory: Callable[[], Env] | None = None, start_method: str = "spawn"):
    if num_workers < 1:
      raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    self._worker_args = (env_name, config, with_expert, env_factory)
    self._context = multiprocessing.get_context(start_method)
    self.step_timeout_s = step_timeout_s
    self.reset_timeout_s = reset_timeout_s or max(120.0, 2 * step_timeout_s)
    self.seed = seed
    self._episodes_started = 0
    self._episodes: list[_Episode | None] = []
    self._workers = [self._start_worker() for _ in range(num_workers)]
    self.restarts = 0  # how many times a worker was replaced

  # ---------------------------------------------------------------- public API

  def reset(self, tasks: list[Task], seeds: list[int] | None = None
            ) -> list[tuple[str, dict[str, Any]]]:
    """Starts one episode per task (row i = tasks[i]); returns (observation, info) per row.

    A reset that fails returns ("", info) with info["failed"] set and its row done.
    """
    if seeds is None:
      seeds = [self.seed + self._episodes_started + i for i in range(len(tasks))]
    if len(seeds) != len(tasks):
      raise ValueError(f"{len(tasks)} tasks but {len(seeds)} seeds")
    self._episodes_started += len(tasks)
    now = time.perf_counter()
    self._episodes = [_Episode(task, int(seed), now) for task, seed in zip(tasks, seeds)]
    ops = {row: ("reset", row, ep.task, ep.seed, ()) for row, ep in enumerate(self._episodes)}
    replies = self._run(ops)
    results = []
    for row, episode in enumerate(self._episodes):
      status, payload, seconds = replies[row]
      if status == "ok":
        observation, info = payload
        info = dict(check_info(info, f"{episode.task.env}.reset"))
      else:
        episode.done = True
        observation, info = "", failed_info(episode.task, payload)
      info.update(elapsed_s=time.perf_counter() - episode.started, step_s=seconds)
      results.append((observation, info))
    return results

  def step(self, actions: list[str | None]) -> list[StepResult | None]:
    """Steps every row whose action is not None; rows with None (done) give None back."""
    if len(actions) != len(self._episodes):
      raise ValueError(f"{len(actions)} actions for {len(self._episodes)} envs")
    ops = {}
    for row, action in enumerate(actions):
      if action is None:
        continue
      if self._episodes[row].done:
        raise ValueError(f"row {row} is done; pass None for it")
      ops[row] = ("step", row, action)
    replies = self._run(ops)
    results: list[StepResult | None] = [None] * len(actions)
    for row, (status, payload, seconds) in replies.items():
      episode = self._episodes[row]
      if status == "ok":
        result: StepResult = payload
        check_info(result.info, f"{episode.task.env}.step")
      else:
        episode.done = True
        result = StepResult("", 0.0, True, failed_info(episode.task, payload))
      result.info.update(elapsed_s=time.perf_counter() - episode.started, step_s=seconds)
      results[row] = result
    return results

  def close(self) -> None:
    """Stops every worker (killing those that do not stop within a few seconds)."""
    for worker in self._workers:
      try:
        worker.conn.send(("close",))
      except (OSError, ValueError):
        pass
    for worker in self._workers:
      worker.process.join(timeout=5)
      if worker.process.is_alive():
        worker.process.kill()
        worker.process.join()
      worker.conn.close()
    self._workers = []

  def __enter__(self) -> EnvPool:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  @property
  def num_workers(self) -> int:
    return len(self._workers)

  # ---------------------------------------------------------------- internals

  def _start_worker(self) -> _Worker:
    parent_conn, child_conn = self._context.Pipe()
    process = self._context.Process(target=_worker_main, args=(child_conn, *self._worker_args),
                                    daemon=True)
    process.start()
    child_conn.close()
    return _Worker(process, parent_conn)

  def _timeout(self, op: tuple) -> float:
    if op[0] == "step":
      return self.step_timeout_s
    return self.reset_timeout_s + self.step_timeout_s * len(op[4])

  def _run(self, ops: dict[int, tuple]) -> dict[int, tuple[str, Any, float]]:
    """Runs one operation per row on the rows' workers; returns (status, payload, seconds).

    status "ok": payload is the env's output; "failed": payload is the reason. Workers that
    crash or hang are replaced (their other live episodes restored) before this returns.
    """
    pending: dict[int, list[tuple]] = {w: [] for w in range(len(self._workers))}
    for row in sorted(ops):
      pending[row % len(self._workers)].append(ops[row])
    deadlines = {}
    for w, worker_ops in pending.items():
      if worker_ops:
        self._send(w, worker_ops, deadlines)
    replies: dict[int, tuple[str, Any, float]] = {}
    while any(pending.values()):
      busy = [w for w in pending if pending[w]]
      timeout = max(0.0, min(deadlines[w] for w in busy) - time.perf_counter())
      ready = wait([self._workers[w].conn for w in busy], timeout=timeout)
      for w in busy:
        worker = self._workers[w]
        if worker.conn in ready:
          try:
            message = worker.conn.recv()
          except (EOFError, OSError):
            worker.process.join(timeout=1)
            reason = f"worker crashed (exit code {worker.process.exitcode})"
            self._replace_worker(w, pending, deadlines, replies, reason)
            continue
          if message[0] == "ready":  # startup over: the first op's own timeout starts now
            worker.ready = True
            deadlines[w] = time.perf_counter() + self._timeout(pending[w][0])
            continue
          status, row, payload, seconds = message
          op = pending[w].pop(0)
          assert op[1] == row, (op, row)
          if pending[w]:
            deadlines[w] = time.perf_counter() + self._timeout(pending[w][0])
          if op[0] == "restore":  # internal: a restored episode; its own op follows
            if status != "ok":
              self._fail_row(row, f"restore after worker restart failed: {payload}", replies)
          elif row in replies:  # its restore failed; this op ran on no env
            pass
          elif status != "ok":
            self._fail_row(row, f"env raised: {payload}", replies, seconds)
          else:
            if op[0] == "step":  # book-keep now: a later restart this call replays it
              self._episodes[row].actions.append(op[2])
              self._episodes[row].done = payload.done
            replies[row] = ("ok", payload, seconds)
        elif time.perf_counter() >= deadlines[w]:
          seconds = self._timeout(pending[w][0])
          reason = f"{pending[w][0][0]} timed out after {seconds:.1f}s; worker restarted"
          self._replace_worker(w, pending, deadlines, replies, reason)
    return replies

  def _send(self, w: int, worker_ops: list[tuple], deadlines: dict[int, float]) -> None:
    worker = self._workers[w]
    startup = 0.0 if worker.ready else _START_TIMEOUT_S
    deadlines[w] = time.perf_counter() + startup + self._timeout(worker_ops[0])
    worker.conn.send(("ops", list(worker_ops)))

  def _fail_row(self, row: int, reason: str, replies: dict, seconds: float = 0.0) -> None:
    self._episodes[row].done = True
    replies[row] = ("failed", reason, seconds)

  def _replace_worker(self, w: int, pending: dict[int, list[tuple]],
                      deadlines: dict[int, float], replies: dict, reason: str) -> None:
    """Kills worker w, fails the episode it was on, restores its other live episodes."""
    worker = self._workers[w]
    if worker.process.is_alive():
      worker.process.kill()
    worker.process.join()
    worker.conn.close()
    self.restarts += 1
    self._workers[w] = self._start_worker()

    culprit = pending[w].pop(0)
    if culprit[0] == "restore":
      self._fail_row(culprit[1], f"restore after worker restart failed: {reason}", replies)
      remaining = [op for op in pending[w] if op[1] != culprit[1]]
    else:
      self._fail_row(culprit[1], reason, replies)
      remaining = pending[w]
    # Every other episode of this worker lost its env state: replay it on the new worker,
    # except rows about to be reset anyway and episodes already over.
    resetting = {op[1] for op in remaining if op[0] in ("reset", "restore")}
    restores = []
    for row in range(w, len(self._episodes), len(self._workers)):
      episode = self._episodes[row]
      if row in resetting or row == culprit[1] or episode.done:
        continue
      restores.append(("restore", row, episode.task, episode.seed, list(episode.actions)))
    pending[w] = restores + [op for op in remaining if op[1] not in replies]
    if pending[w]:
      self._send(w, pending[w], deadlines)


class InProcessPool:
  """`EnvPool`'s reset/step API over envs in this process (row i: env i), no workers.

  An env that raises fails its episode (done, `info["failed"]` names the error) and leaves
  the other rows alone, as `EnvPool` does; a hang is not caught. An info that breaks the
  env contract raises, as in `EnvPool`.

  Args:
    env_factory: returns a fresh Env (e.g. `lambda: module.make_env(config, with_expert)`).
  """

  def __init__(self, env_factory: Callable[[], Env]):
    self._env_factory = env_factory
    self._envs: list[Env] = []
    self._episodes: list[_Episode] = []

  def reset(self, tasks: list[Task], seeds: list[int]) -> list[tuple[str, dict[str, Any]]]:
    """Starts one episode per task; a reset that raises gives ("", failed info)."""
    if len(seeds) != len(tasks):
      raise ValueError(f"{len(tasks)} tasks but {len(seeds)} seeds")
    while len(self._envs) < len(tasks):
      self._envs.append(self._env_factory())
    self._episodes = [_Episode(task, int(seed), time.perf_counter())
                      for task, seed in zip(tasks, seeds)]
    results = []
    for env, episode in zip(self._envs, self._episodes):
      start = time.perf_counter()
      try:
        observation, info = env.reset(episode.task, episode.seed)
      except Exception as error:  # pylint: disable=broad-except  (the episode fails)
        episode.done = True
        observation, info = "", failed_info(episode.task, f"env raised: {error!r}")
      info = dict(check_info(info, f"{episode.task.env}.reset"))
      info.update(elapsed_s=time.perf_counter() - episode.started,
                  step_s=time.perf_counter() - start)
      results.append((observation, info))
    return results

  def step(self, actions: list[str | None]) -> list[StepResult | None]:
    """Steps every row whose action is not None; rows with None (done) give None back."""
    if len(actions) != len(self._episodes):
      raise ValueError(f"{len(actions)} actions for {len(self._episodes)} envs")
    results: list[StepResult | None] = []
    for row, action in enumerate(actions):
      episode = self._episodes[row]
      if action is None:
        results.append(None)
        continue
      if episode.done:
        raise ValueError(f"row {row} is done; pass None for it")
      start = time.perf_counter()
      try:
        result = self._envs[row].step(action)
      except Exception as error:  # pylint: disable=broad-except  (the episode fails)
        result = StepResult("", 0.0, True, failed_info(episode.task, f"env raised: {error!r}"))
      check_info(result.info, f"{episode.task.env}.step")
      episode.actions.append(action)
      episode.done = result.done
      result.info.update(elapsed_s=time.perf_counter() - episode.started,
                         step_s=time.perf_counter() - start)
      results.append(result)
    return results

  def close(self) -> None:
    for env in self._envs:
      env.close()
    self._envs = []

  def __enter__(self) -> InProcessPool:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
