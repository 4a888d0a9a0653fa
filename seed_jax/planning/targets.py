"""The devices a plan is for: the chip table (HBM, bf16 peak, HBM bandwidth), Cloud
accelerator types, and a `Target` from a TPU topology name (described by libtpu, no TPU
needed) or from the devices this process sees."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Sequence

import jax

GiB = 1 << 30


class PlanError(ValueError):
  """A topology, model or configuration that cannot be planned."""


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-chip figures from the vendor's pages: HBM, bf16 peak, HBM bandwidth."""
  name: str
  hbm_bytes: int
  peak_flops: float  # bf16 FLOP/s
  hbm_bytes_per_s: float


CHIPS = {  # keyed by jax's device_kind
    "TPU v4": Chip("v4", 32 * GiB, 275e12, 1.2e12),
    "TPU v5 lite": Chip("v5e", 16 * GiB, 197e12, 0.82e12),
    "TPU v5": Chip("v5p", 95 * GiB, 459e12, 2.76e12),
    "TPU v6 lite": Chip("v6e", 32 * GiB, 918e12, 1.64e12),
    "NVIDIA H100 80GB HBM3": Chip("H100", 80 * GiB, 989e12, 3.35e12),
    "NVIDIA H200": Chip("H200", 141 * 10**9, 989e12, 4.8e12),
}

# Cloud accelerator types -> topology names. v4 and v5p count TensorCores (2 a chip):
# v5p-8 is 4 chips.
ACCELERATOR_TYPES = {
    "v4-8": "v4:2x2x1", "v4-16": "v4:2x2x2", "v4-32": "v4:2x2x4", "v4-64": "v4:2x4x4",
    "v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2", "v5p-32": "v5p:2x2x4",
    "v5p-64": "v5p:2x4x4", "v5p-128": "v5p:4x4x4",
    **{f"{gen}-{n}": f"{gen}:{shape}" for gen in ("v5e", "v6e") for n, shape in
       ((4, "2x2"), (8, "2x4"), (16, "4x4"), (32, "4x8"), (64, "8x8"), (128, "8x16"),
        (256, "16x16"))},
}
_TOPOLOGY_NAME = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")


@dataclasses.dataclass(frozen=True)
class Target:
  """The devices to plan for, and each device's share of its chip."""
  name: str
  devices: Sequence[Any]
  chip: Chip | None  # None: unknown peak (a CPU); memory from the runtime if it says
  hbm_per_device: int | None
  peak_per_device: float | None
  bandwidth_per_device: float | None


def topology_target(name: str) -> Target:
  """The target for a topology name, an accelerator type, or "local"."""
  if name == "local":
    return _local_target()
  topology = ACCELERATOR_TYPES.get(name, name)
  match = _TOPOLOGY_NAME.match(topology)
  if not match:
    raise PlanError(
        f"--topology={name!r}: not a TPU topology (e.g. v5e:2x2, v5p:2x2x2, v4:2x2x1, "
        f"v6e:4x4), an accelerator type ({', '.join(sorted(ACCELERATOR_TYPES)[:6])}, ...) "
        "or 'local'")
  if not _libtpu_installed():
    raise PlanError(f"--topology={name!r}: compiling for a TPU needs libtpu; install it "
                    "with `bash launch/install.sh --tpu` (or --test)")
  # Describing a slice uses no TPU, so a second process (a test beside a plan, a plan on a
  # TPU VM that is training) may load libtpu too.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
  except Exception as e:  # pylint: disable=broad-except
    raise PlanError(f"--topology={name!r}: {str(e).splitlines()[0]}") from None
  chips = math.prod(int(n) for n in match.group(2).split("x"))
  chip = CHIPS[devices[0].device_kind]
  share = chips / len(devices)  # v4 shows each TensorCore as a device
  return Target(topology, devices, chip, int(chip.hbm_bytes * share),
                chip.peak_flops * share, chip.hbm_bytes_per_s * share)


def _libtpu_installed() -> bool:
  try:
    import libtpu  # pylint: disable=import-outside-toplevel,unused-import
    return True
  except ImportError:
    return False


def _local_target() -> Target:
  devices = jax.devices()
  chip = CHIPS.get(devices[0].device_kind)
  stats = getattr(devices[0], "memory_stats", lambda: None)() or {}
  hbm = stats.get("bytes_limit") or (chip.hbm_bytes if chip else None)
  if hbm is None and devices[0].platform == "cpu":  # CPU devices share the host's memory
    hbm = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // len(devices)
  return Target(f"local ({len(devices)} x {devices[0].device_kind})", devices, chip, hbm,
                chip.peak_flops if chip else None, chip.hbm_bytes_per_s if chip else None)

