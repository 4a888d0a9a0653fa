"""Checkpoints with orbax: device state (params, optimizer, step) plus host state as JSON.

Each save is atomic: orbax writes into a temporary folder and renames it into place only
once everything is on disk, so a run killed mid-save leaves the previous checkpoint as
the latest one. The last `keep` checkpoints are kept.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


def abstract_like(tree: Any) -> Any:
  """Shapes, dtypes and shardings of `tree`'s arrays: the target of a sharded restore."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
      if hasattr(x, "shape") else x, tree)


class Checkpointer:
  """Saves and restores `(device_state, host_state)` pairs by step under `directory`."""

  def __init__(self, directory: str, keep: int = 3):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=False))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, device_state: Any, host_state: dict[str, Any]) -> None:
    """Writes checkpoint `step` (blocking until it is committed)."""
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(device_state), host=ocp.args.JsonSave(host_state)),
        force=True)
    self._manager.wait_until_finished()

  def restore(self, step: int, device_state_like: Any) -> tuple[Any, dict[str, Any]]:
    """Restores checkpoint `step` into the shapes and shardings of `device_state_like`."""
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_like(device_state_like)),
        host=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["host"])

  def close(self) -> None:
    self._manager.close()
