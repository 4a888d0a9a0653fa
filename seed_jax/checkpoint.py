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

On a local disk each save first compares the free space with the size of the latest
checkpoint (the next one has the same arrays): too little fails the save with one line
saying how much is needed, before orbax would fail half-way in its background thread;
less than two checkpoints' worth is warned about while the run can still be helped.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import threading
import weakref
from typing import Any

import jax
import orbax.checkpoint as ocp

from seed_jax import paths

log = logging.getLogger(__name__)


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


def folder_bytes(folder: str) -> int:
  """The bytes of the files under `folder`, recursively."""
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(folder) for name in names)


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
    self._check_space(step)
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(device_state), host=ocp.args.JsonSave(host_state)),
        force=True)

  def _check_space(self, step: int) -> None:
    """Raises OSError if the free space under a local directory is less than the latest
    checkpoint's size; warns if it is less than twice that."""
    if "://" in self.directory:
      return
    previous = self._manager.latest_step()
    if previous is None:
      return
    needed = folder_bytes(os.path.join(self.directory, str(previous)))
    free = shutil.disk_usage(self.directory).free
    gigabytes = f"{needed / 1e9:.2f} GB needed, {free / 1e9:.2f} GB free under {self.directory}"
    if free < needed:
      raise OSError(f"no room for checkpoint {step}: {gigabytes}; free space and run the "
                    f"same command again to resume from checkpoint {previous}")
    if free < 2 * needed:
      log.warning("checkpoint %d fits, the next may not: %s", step, gigabytes)

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
