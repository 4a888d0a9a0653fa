"""Metrics a researcher can plot: `workdir/metrics.jsonl`, TensorBoard, PNG curves, a table.

Every record is one JSON line `{"step": int, "phase": str, ...scalars}`; lists of numbers
(e.g. the OPD gate histogram) are kept in the JSON line and go to TensorBoard as
histograms. On resume, records after the restored step are dropped so that curves never
hold two versions of the same step.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from typing import Any

import numpy as np


def _plain(value: Any) -> Any:
  """JSON-safe python values from numpy / jax scalars and arrays."""
  if hasattr(value, "tolist"):
    value = value.tolist()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


class MetricsWriter:
  """Appends metric records to metrics.jsonl (flushed and fsynced) and TensorBoard.

  `enabled=False` (hosts other than the primary) keeps the API and writes nothing.
  """

  def __init__(self, workdir: str, tensorboard: bool = True, enabled: bool = True):
    self.enabled = enabled
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if enabled:
      os.makedirs(workdir, exist_ok=True)
    if tensorboard and enabled:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def truncate_after(self, step: int) -> None:
    """Drops records with `step` greater than `step` (used when resuming)."""
    if not self.enabled:
      return
    records = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      for r in records:
        f.write(json.dumps(r) + "\n")
    os.replace(tmp, self.path)

  def write(self, step: int, phase: str, metrics: dict[str, Any]) -> dict[str, Any]:
    record = {"step": int(step), "phase": phase,
              **{k: _plain(v) for k, v in sorted(metrics.items())}}
    if not self.enabled:
      return record
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
      f.flush()
      os.fsync(f.fileno())
    if self._tb is not None:
      for key, value in record.items():
        if key in ("step", "phase") or value is None:
          continue
        tag = f"{phase}/{key}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
          self._tb.add_scalar(tag, value, step)
        elif isinstance(value, list) and value and all(
            isinstance(v, (int, float)) for v in value):
          self._tb.add_histogram(tag, np.asarray(value, np.float64), step)
      self._tb.flush()
    return record

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(path: str) -> list[dict[str, Any]]:
  """All records of a metrics.jsonl; a torn last line (killed mid-write) is ignored."""
  if not os.path.exists(path):
    return []
  records = []
  with open(path) as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return records


def plot_curves(workdir: str, keys_by_phase: dict[str, list[str]]) -> list[str]:
  """One PNG per phase with a panel per metric key, from metrics.jsonl. Returns paths."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  paths = []
  for phase, keys in keys_by_phase.items():
    rows = [r for r in records if r.get("phase") == phase]
    keys = [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows)]
    if not keys:
      continue
    cols = min(3, len(keys))
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
      points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
      ax.plot(*zip(*points), marker="o", markersize=3)
      ax.set_title(key, fontsize=9)
      ax.set_xlabel("iteration")
      ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
      ax.axis("off")
    fig.tight_layout()
    path = os.path.join(workdir, f"curves_{phase}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
  return paths


def write_summary(workdir: str, summary: dict[str, Any]) -> str:
  """Writes summary.json and summary.txt (the table) into `workdir`; returns the table."""
  table = format_table(list(summary.items()), "summary")
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  with open(os.path.join(workdir, "summary.txt"), "w") as f:
    f.write(table + "\n")
  return table


def format_table(rows: list[tuple[str, Any]], title: str) -> str:
  """A plain two-column text table for the end-of-run summary."""
  width = max([len(k) for k, _ in rows] + [len(title)])
  lines = [title, "-" * (width + 14)]
  for key, value in rows:
    shown = f"{value:.4g}" if isinstance(value, float) else str(value)
    lines.append(f"{key:<{width}}  {shown}")
  return "\n".join(lines)


class Timer:
  """Accumulates wall time per phase: `with timer("rollout"): ...`."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str):
    start = time.perf_counter()
    yield
    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
