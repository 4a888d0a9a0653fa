"""Where a run ran and what weights it started from: `provenance.json` in its workdir.

An experiment that resumes across machines (`seed_jax.experiment`) computes a warm start
again wherever its checkpoint is gone, and two kinds of CPU do not compute bf16 training
bitwise alike: the warm start computed again is close to the first, not equal. So each
start of a run appends a segment (the machine, the checkpoint it resumes from and the
fingerprint of the weights it starts from: the base model's, `init_from`'s, or that
checkpoint's, as for an experiment's arm resuming from the warm start's copied
checkpoint), and the end of the run records the fingerprint of its final weights. An arm
started from its warm start has its first fingerprint equal to the warm start's final
one; wall times compare between runs on one machine kind only, and, where the segments
measured it, of alike speed (`seed_jax.machine_speed`; `seed_jax.experiments.aggregate`).

The fingerprint is exact and independent of the machine and the sharding: each leaf's bits
as unsigned integers, weighted by their position, summed modulo 2**32 (integer sums do not
depend on the order of the reduction), then the leaves' sums and paths hashed on the host.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seed_jax import machine_speed, paths

PROVENANCE_FILE = "provenance.json"

_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}
_GOLDEN = np.uint32(2654435761)  # Knuth's multiplicative hash constant


def _leaf_digest(x: jax.Array) -> jax.Array:
  """One leaf `[...]` -> a uint32 scalar: sum_i bits_i * (i * GOLDEN + 1) mod 2**32, over its
  elements' bit patterns (8-byte types as two 32-bit words)."""
  if x.dtype.itemsize == 8:
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
  else:
    bits = jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])
  bits = bits.reshape(-1).astype(jnp.uint32)
  position = jnp.arange(bits.shape[0], dtype=jnp.uint32)
  return jnp.sum(bits * (position * _GOLDEN + np.uint32(1)), dtype=jnp.uint32)


_leaf_digests = jax.jit(lambda leaves: [_leaf_digest(x) for x in leaves])


def params_fingerprint(params: Any) -> str:
  """A 16-hex-digit fingerprint of a pytree of arrays: equal for bitwise equal trees (the
  same paths, dtypes, shapes and bits) on any machine and under any sharding."""
  with_paths, _ = jax.tree_util.tree_flatten_with_path(params)
  digests = jax.device_get(_leaf_digests([leaf for _, leaf in with_paths]))
  hasher = hashlib.sha256()
  for (path, leaf), digest in zip(with_paths, digests):
    hasher.update(f"{jax.tree_util.keystr(path)}|{leaf.dtype}|{leaf.shape}|{int(digest)}\n"
                  .encode())
  return hasher.hexdigest()[:16]


def cpu_model() -> str:
  """The CPU's model name (from /proc/cpuinfo; the platform's processor string elsewhere)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
  """This process's machine: the CPU, the cores it may use, the accelerator, and its
  measured `speed` (`machine_speed.quick_speed`: machines of one name have differed 2x)."""
  device = jax.devices()[0]
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count())
  return {"cpu": cpu_model(), "cores": cores, "platform": device.platform,
          "device_kind": device.device_kind, "devices": jax.device_count(),
          "speed": machine_speed.quick_speed()}


def machine_kind(description: dict[str, Any]) -> str:
  """The part of `machine()` that decides speed, as one comparable string."""
  return (f"{description.get('cpu')} x{description.get('cores')} / "
          f"{description.get('devices')} {description.get('device_kind')}")


def read(workdir: paths.PathLike) -> dict[str, Any] | None:
  """A run's provenance, or None when it has none (runs from before it was recorded)."""
  path = paths.run_path(workdir) / PROVENANCE_FILE
  if not path.exists():
    return None
  return json.loads(path.read_text())


def _write(workdir: paths.PathLike, record: dict[str, Any]) -> None:
  paths.write_text(paths.run_path(workdir) / PROVENANCE_FILE, json.dumps(record, indent=2))


def record_start(workdir: paths.PathLike, resumed_from: int | None,
                 initial_fingerprint: str) -> None:
  """Appends a segment: this machine, the checkpoint the run resumes from (None: a fresh
  start) and the fingerprint of the weights it starts from (`params_fingerprint`, which
  every host computes; one writes). Segments that began at that point or later are
  dropped, since nothing they did survives: a start stopped before its next checkpoint,
  or a run begun again on a new machine where its checkpoints are gone."""
  def begins(segment: dict[str, Any]) -> int:
    return -1 if segment["resumed_from"] is None else segment["resumed_from"]
  record = read(workdir) or {"segments": []}
  segment = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds"), "resumed_from": resumed_from, "machine": machine(),
             "initial_params": initial_fingerprint}
  record["segments"] = [s for s in record["segments"] if begins(s) < begins(segment)]
  record["segments"].append(segment)
  _write(workdir, record)


def record_end(workdir: paths.PathLike, final_fingerprint: str) -> None:
  """The fingerprint of the run's final weights."""
  record = read(workdir) or {"segments": []}
  record["final_params"] = final_fingerprint
  _write(workdir, record)


def initial_params(record: dict[str, Any] | None) -> str | None:
  """The fingerprint a run started from (its first segment's), if recorded."""
  segments = (record or {}).get("segments", [])
  return segments[0].get("initial_params") if segments else None


def segment_speeds(record: dict[str, Any] | None) -> list[dict[str, float] | None]:
  """Each segment's measured machine speed (`machine()["speed"]`; None where a segment
  predates the measurement)."""
  return [segment["machine"].get("speed") for segment in (record or {}).get("segments", [])]


def machine_kinds(record: dict[str, Any] | None) -> list[str]:
  """The distinct machine kinds a run's segments ran on, in order."""
  kinds: list[str] = []
  for segment in (record or {}).get("segments", []):
    kind = machine_kind(segment["machine"])
    if kind not in kinds:
      kinds.append(kind)
  return kinds
