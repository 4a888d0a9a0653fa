"""A plan's report: the table per program and per device against the device's memory, the
one-line verdict (fits, or which program does not), and the same as plain data for
`--json`."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from seed_jax.planning.programs import ProgramPlan
from seed_jax.planning.targets import GiB, Target
from seed_jax.train.spec import RunSpec


def gib(n: int) -> str:
  return f"{n / GiB:.2f}"


def format_plan(plans: Sequence[ProgramPlan], target: Target, header: str) -> str:
  """The table (per device) and one verdict line."""
  cols = ("program", "rows x tokens", "args", "out", "temp", "code", "other", "total",
          "HBM %", "TFLOP", "XLA TFLOP", "est. s", "tokens/s", "compile s")
  lines = []
  for p in plans:
    seconds = p.seconds(target)
    lines.append((
        p.name, p.shapes, gib(p.argument_bytes), gib(p.output_bytes - p.alias_bytes),
        gib(p.temp_bytes), gib(p.code_bytes), gib(p.held_bytes), gib(p.total_bytes),
        f"{100 * p.total_bytes / target.hbm_per_device:.0f}" if target.hbm_per_device else "-",
        f"{p.model_flops / 1e12:.2f}",
        f"{p.xla_flops / 1e12:.2f}" if p.xla_flops is not None else "-",
        f"{seconds:.3g}" if seconds else "-",
        f"{p.tokens / seconds:,.0f}" if seconds else "-", f"{p.compile_s:.0f}"))
  widths = [max(len(str(row[i])) for row in [cols, *lines]) for i in range(len(cols))]
  fmt = lambda row: "  ".join(str(v).ljust(w) if i < 2 else str(v).rjust(w)
                              for i, (v, w) in enumerate(zip(row, widths)))
  hbm = (f"{gib(target.hbm_per_device)} GiB HBM per device" if target.hbm_per_device
         else "device memory unknown")
  out = [header, f"target: {target.name}, {len(target.devices)} devices, {hbm}; "
         "bytes in GiB per device, TFLOP for the whole program", fmt(cols),
         *map(fmt, lines)]
  out.append(verdict(plans, target))
  return "\n".join(out)


def oversized(plans: Sequence[ProgramPlan], target: Target) -> list[ProgramPlan]:
  if not target.hbm_per_device:
    return [p for p in plans if p.compiler_error]
  return [p for p in plans if p.compiler_error or p.total_bytes > target.hbm_per_device]


def verdict(plans: Sequence[ProgramPlan], target: Target) -> str:
  """One line: fits (and the largest program), or each program that does not."""
  hbm = target.hbm_per_device
  too_big = oversized(plans, target)
  if too_big:
    capacity = f", the device has {gib(hbm)} GiB" if hbm else ""
    return "does not fit: " + "; ".join(
        f"{p.name} needs {gib(p.total_bytes)} GiB per device{capacity}"
        + (f" (compiler: {p.compiler_error})" if p.compiler_error else "") for p in too_big)
  if not hbm:
    return "fits: unknown (the runtime reports no device memory)"
  largest = max(plans, key=lambda p: p.total_bytes)
  return (f"fits: every program fits; the largest, {largest.name}, needs "
          f"{gib(largest.total_bytes)} of {gib(hbm)} GiB per device")


def plan_json(plans: Sequence[ProgramPlan], target: Target, spec: RunSpec | None = None,
              complete: bool = True) -> dict[str, Any]:
  """The plan as plain data (`--json`): one record per program, bytes per device;
  `complete` is False while programs are still being compiled."""
  run = {} if spec is None else {"model": spec.model.name, "mesh": dataclasses.asdict(
      spec.mesh) | {"rules": None}, "micro_batch_size": spec.rl.micro_batch_size}
  return {**run, "complete": complete, "target": target.name, "devices": len(target.devices),
          "hbm_per_device": target.hbm_per_device,
          "fits": not oversized(plans, target) if target.hbm_per_device else None,
          "programs": [dict(dataclasses.asdict(p), total_bytes=p.total_bytes,
                            est_seconds=p.seconds(target)) for p in plans]}

