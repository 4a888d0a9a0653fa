"""Several hosts (JAX processes) driving one mesh, as on a TPU pod.

Every host runs the same program on the same host-side data, so each jitted call sees the
same global inputs and every host gets the same outputs (`fetch`). The one thing split
across hosts is environment stepping, the host-side work that grows with the batch:
`HostShardedPool` steps rows `i` with `i % num_hosts == host` locally and all-gathers the
results, so every host continues with the full, identical batch. With one process all of
this is the identity.

What is shown to a person comes from the primary host only (`print0`, `progress`), and a
SIGTERM is turned into a stop that every host agrees on (`PreemptionGuard`).
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from seed_jax.parallel.mesh import batch_sharding


def is_primary() -> bool:
  """True on the host that writes files (metrics, exports, plots, summaries)."""
  return jax.process_index() == 0


def print0(*args, **kwargs) -> None:
  """`print` on the primary host only: every host runs the same program and would print
  the same lines."""
  if is_primary():
    print(*args, **kwargs)


def progress(iterable=None, **kwargs) -> tqdm:
  """A tqdm progress bar drawn by the primary host only (every host still iterates)."""
  disable = kwargs.pop("disable", False)
  return tqdm(iterable, disable=disable or not is_primary(), **kwargs)


def primary_label(label: str) -> str | None:
  """`label` on the primary host, None on the others: for the progress bars that a None
  label turns off (`seed_jax.agent.loop.run_episodes`'s `desc`)."""
  return label if is_primary() else None


def any_host(flag: bool) -> bool:
  """True on every host if `flag` is true on any (a collective: every host must call it
  at the same point of the program)."""
  if jax.process_count() == 1:
    return bool(flag)
  flags = multihost_utils.process_allgather(np.asarray(bool(flag)))
  return bool(np.any(flags))


def _installable(handler) -> Any:
  """A handler `signal.signal` accepts: None (one installed from C) becomes the default."""
  return signal.SIG_DFL if handler is None else handler


class PreemptionGuard:
  """Turns SIGTERM (a preempted TPU VM, `kill PID`) into a request to stop at a safe point.

  `with PreemptionGuard() as guard:` installs a handler that only records the signal, and
  the program polls `guard.should_stop()` where stopping loses nothing it cannot redo.
  With several hosts the answer is agreed (`any_host`): hosts receive the signal at
  slightly different moments, and one host leaving while the others enter a collective
  would hang them. A second signal is not held back: it does what it did before the guard
  (by default, terminate). Outside the main thread, where Python cannot install signal
  handlers, the guard installs nothing and never asks to stop.

  Args:
    signals: the signals turned into a stop request.
    agree: `(local flag) -> agreed flag`, by default `any_host`.
  """

  def __init__(self, signals: Sequence[int] = (signal.SIGTERM,),
               agree: Callable[[bool], bool] = any_host):
    self.signals = tuple(signals)
    self.received: int | None = None  # the first signal caught
    self._agree = agree
    self._previous: dict[int, Any] = {}

  def _handle(self, signum: int, frame) -> None:  # pylint: disable=unused-argument
    # Only a flag: the main thread may be anywhere (inside a logging lock, a save), so
    # the stop itself happens at the next `should_stop()`.
    if self.received is None:
      self.received = signum
      return
    signal.signal(signum, _installable(self._previous.get(signum)))
    os.kill(os.getpid(), signum)

  def __enter__(self) -> "PreemptionGuard":
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, _installable(previous))
    self._previous = {}

  def should_stop(self) -> bool:
    """Whether to stop here (the same answer on every host)."""
    return self._agree(self.received is not None)


def fetch(tree: Any) -> Any:
  """Host numpy copies of a pytree of global arrays, on every host.

  An array sharded over devices of several hosts is not addressable from one of them;
  it is all-gathered first. On one host this is `jax.device_get`.
  """
  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(one, tree)


def put(array: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
  """A global array from host data that is the same on every host: each host fills only
  the shards of its own devices (jit refuses host arrays for shardings across hosts)."""
  array = np.asarray(array)
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def put_rows(batch: dict[str, np.ndarray], mesh  # LogicalMesh | Mesh | None
             ) -> dict[str, jax.Array | np.ndarray]:
  """Puts every `[B, ...]` array of `batch` with its rows by the mesh's "batch" rule (by
  default over ("data", "fsdp")); without a mesh the batch is returned as is."""
  if mesh is None:
    return batch
  return {k: put(v, batch_sharding(mesh, np.ndim(v))) for k, v in batch.items()}


def allgather_objects(obj: Any) -> list[Any]:
  """`[obj of host 0, obj of host 1, ...]` on every host (pickled, padded, all-gathered)."""
  if jax.process_count() == 1:
    return [obj]
  payload = np.frombuffer(pickle.dumps(obj), np.uint8)
  sizes = multihost_utils.process_allgather(np.array([payload.size], np.int64))
  padded = np.zeros((int(np.max(sizes)),), np.uint8)
  padded[:payload.size] = payload
  gathered = multihost_utils.process_allgather(padded)  # [hosts, longest]
  return [pickle.loads(gathered[h, :int(sizes[h][0])].tobytes())
          for h in range(jax.process_count())]


class HostShardedPool:
  """An env pool whose rows are spread over hosts; every host sees every row's result.

  Args:
    local_pool: this host's `EnvPool` (reset/step API), sized for its share of rows.
    host, num_hosts: this host's index and the host count (default: JAX's).
    gather: the all-gather of picklable objects (default `allgather_objects`).
  """

  def __init__(self, local_pool, host: int | None = None, num_hosts: int | None = None,
               gather: Callable[[Any], list[Any]] = allgather_objects):
    self.local_pool = local_pool
    self.host = jax.process_index() if host is None else host
    self.num_hosts = jax.process_count() if num_hosts is None else num_hosts
    self.gather = gather

  def _mine(self, rows: int) -> list[int]:
    return list(range(self.host, rows, self.num_hosts))

  def _merge(self, rows: int, local: Sequence[Any]) -> list[Any]:
    merged: list[Any] = [None] * rows
    for host, results in enumerate(self.gather(list(local))):
      for row, result in zip(range(host, rows, self.num_hosts), results):
        merged[row] = result
    return merged

  def reset(self, tasks, seeds=None):
    """Resets this host's rows; returns (observation, info) for every row."""
    mine = self._mine(len(tasks))
    local = self.local_pool.reset([tasks[i] for i in mine],
                                  None if seeds is None else [seeds[i] for i in mine])
    return self._merge(len(tasks), local)

  def step(self, actions):
    """Steps this host's rows; returns every row's result (None for rows passed None)."""
    mine = self._mine(len(actions))
    local = self.local_pool.step([actions[i] for i in mine]) if mine else []
    return self._merge(len(actions), local)

  def close(self) -> None:
    self.local_pool.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()
