"""Several hosts (JAX processes) driving one mesh, as on a TPU pod.

Every host runs the same program on the same host-side data, so each jitted call sees the
same global inputs and every host gets the same outputs (`fetch`). The one thing split
across hosts is environment stepping, the host-side work that grows with the batch:
`HostShardedPool` steps rows `i` with `i % num_hosts == host` locally and all-gathers the
results, so every host continues with the full, identical batch. With one process all of
this is the identity.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from seed_jax.parallel.mesh import batch_sharding


def is_primary() -> bool:
  """True on the host that writes files (metrics, exports, plots, summaries)."""
  return jax.process_index() == 0


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
