"""Checkpoints with orbax: device state (params, optimizer, step) plus host state as JSON.

Saves are asynchronous: `save` returns once the arrays are copied off the devices (so the
caller may go on to donate or overwrite them) and orbax writes and commits the checkpoint
in a background thread while training continues. A pending save is waited for before the
next one, before anything reads the directory (`latest_step`, `all_steps`, `restore`), by
`wait()` and `close()`, and at interpreter exit, so a program that ends normally never
loses its last save.

Each save is atomic: orbax writes into a temporary folder and renames it into place only
once everything is on disk, so a run killed mid-save leaves the previous checkpoint as
the latest one. The last `keep` checkpoints are kept. The directory may be local or a
URI such as `gs://bucket/run/checkpoints`.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import weakref
from typing import Any

import jax
import orbax.checkpoint as ocp

from seed_jax import paths


def abstract_like(tree: Any) -> Any:
  """Shapes, dtypes and shardings of `tree`'s arrays: the target of a sharded restore."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
      if hasattr(x, "shape") else x, tree)


def _register_exit_hook(hook) -> None:
  try:
    threading._register_atexit(hook)  # pylint: disable=protected-access
  except (AttributeError, RuntimeError):  # another Python; or already shutting down
    atexit.register(hook)


class Checkpointer:
  """Saves and restores `(device_state, host_state)` pairs by step under `directory`."""

  def __init__(self, directory: paths.PathLike, keep: int = 3):
    self.directory = os.fspath(paths.run_path(directory))
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=True))
    # Closing waits for a pending save: on `close()`, when this object is collected, and at
    # exit for a caller that never closes. At exit it must run before Python shuts down
    # the thread pools orbax's background save still needs, i.e. among threading's exit
    # hooks (run before the `atexit` ones, latest registered first), not in `atexit`.
    self._close = weakref.finalize(self, self._manager.close)
    self._close.atexit = False
    _register_exit_hook(self._close)

  def wait(self) -> None:
    """Blocks until the pending save (if any) is committed."""
    self._manager.wait_until_finished()

  def latest_step(self) -> int | None:
    self.wait()
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    self.wait()
    return list(self._manager.all_steps())

  def save(self, step: int, device_state: Any, host_state: dict[str, Any]) -> None:
    """Starts writing checkpoint `step` and returns once the arrays are off the devices;
    `host_state` is copied now, so the caller may change it at once."""
    host_state = json.loads(json.dumps(host_state))  # also: not JSON fails here, not later
    self.wait()
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(device_state), host=ocp.args.JsonSave(host_state)),
        force=True)

  def restore(self, step: int, device_state_like: Any) -> tuple[Any, dict[str, Any]]:
    """Restores checkpoint `step` into the shapes and shardings of `device_state_like`."""
    self.wait()
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_like(device_state_like)),
        host=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["host"])

  def close(self) -> None:
    """Waits for the pending save and releases orbax's threads (once; later calls do
    nothing)."""
    self._close()
