"""Metrics a researcher can plot: `workdir/metrics.jsonl`, TensorBoard, PNG curves, a table
(and Weights & Biases through a sink, `seed_jax.wandb_sink`).

Every record is one JSON line `{"step": int, "phase": str, ...scalars}`; lists of numbers
(e.g. the OPD gate histogram) are kept in the JSON line and go to TensorBoard as
histograms. On resume, records after the restored step are dropped so that curves never
hold two versions of the same step. The workdir may be a local folder or a URI such as
`gs://bucket/run` (files go through `etils.epath`, see `seed_jax.paths`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import time
from typing import Any

import numpy as np

from seed_jax import paths

log = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
  """JSON-safe python values from numpy / jax scalars and arrays."""
  if hasattr(value, "tolist"):
    value = value.tolist()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


def _jsonl(records: list[dict[str, Any]]) -> str:
  return "".join(json.dumps(r) + "\n" for r in records)


def tensorboard_writer(logdir: paths.PathLike):
  """A tensorboardX `SummaryWriter` for `logdir`, or None (with a warning) for a URI its
  installed extras cannot write (gs:// needs `google-cloud-storage`, s3:// `boto3`)."""
  from tensorboardX import SummaryWriter, record_writer  # pylint: disable=import-outside-toplevel
  logdir = os.fspath(logdir)
  if paths.is_remote(logdir):
    scheme = logdir.split("://", 1)[0]
    supported = {"gs": record_writer.GCS_ENABLED, "s3": record_writer.S3_ENABLED}
    if not supported.get(scheme, False):
      log.warning("TensorBoard is off: tensorboardX cannot write %s (gs:// needs "
                  "google-cloud-storage, s3:// boto3); metrics.jsonl has every record", logdir)
      return None
  return SummaryWriter(logdir)


class MetricsWriter:
  """Appends metric records to `workdir/metrics.jsonl` and TensorBoard.

  A local file is appended to, flushed and fsynced at every record. An object store
  cannot append, so for a `gs://` workdir the records are kept in memory and the whole
  file is rewritten at most every `flush_every_s` seconds, on `flush()` and on `close()`
  (the trainer flushes with every checkpoint, so a resumed run finds them).
  `enabled=False` (hosts other than the primary) keeps the API and writes nothing.
  `sinks` receive every record too (`log(record)`, `close()`), e.g. a `WandbSink`.
  """

  def __init__(self, workdir: paths.PathLike, tensorboard: bool = True, enabled: bool = True,
               flush_every_s: float = 30.0, sinks: tuple = ()):
    self.enabled = enabled
    self._sinks = tuple(sinks) if enabled else ()
    workdir = paths.run_path(workdir)
    self.path = workdir / "metrics.jsonl"
    self._remote = paths.is_remote(workdir)
    self._flush_every_s = flush_every_s
    self._last_flush = time.monotonic()
    self._records: list[dict[str, Any]] = []  # remote only: the file's whole content
    self._tb = None
    if not enabled:
      return
    workdir.mkdir(parents=True, exist_ok=True)
    if self._remote:
      self._records = read_metrics(self.path)
    if tensorboard:
      self._tb = tensorboard_writer(workdir / "tensorboard")

  def truncate_after(self, step: int) -> None:
    """Drops records with `step` greater than `step` (used when resuming)."""
    if not self.enabled:
      return
    if self._remote:
      self._records = [r for r in self._records if r.get("step", 0) <= step]
      self.flush()
      return
    records = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
    paths.write_text(self.path, _jsonl(records))

  def write(self, step: int, phase: str, metrics: dict[str, Any]) -> dict[str, Any]:
    record = {"step": int(step), "phase": phase,
              **{k: _plain(v) for k, v in sorted(metrics.items())}}
    if not self.enabled:
      return record
    if self._remote:
      self._records.append(record)
      if time.monotonic() - self._last_flush >= self._flush_every_s:
        self.flush()
    else:
      with self.path.open("a") as f:
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
      if not self._remote:  # remote event files are uploaded whole at every flush
        self._tb.flush()
    for sink in self._sinks:
      sink.log(record)
    return record

  def flush(self) -> None:
    """Makes every record so far durable (a no-op for a local file: each already is)."""
    if not self.enabled:
      return
    if self._remote:
      self.path.write_text(_jsonl(self._records))  # an object appears whole on close
      if self._tb is not None:
        self._tb.flush()
    self._last_flush = time.monotonic()

  def close(self) -> None:
    self.flush()
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    for sink in self._sinks:
      sink.close()
    self._sinks = ()


def read_metrics(path: paths.PathLike) -> list[dict[str, Any]]:
  """All records of a metrics.jsonl; a torn last line (killed mid-write) is ignored."""
  path = paths.run_path(path)
  if not path.exists():
    return []
  records = []
  with path.open("r") as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return records


def plot_curves(workdir: paths.PathLike, keys_by_phase: dict[str, list[str]]) -> list[str]:
  """One PNG per phase with a panel per metric key, from metrics.jsonl. Returns paths."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  workdir = paths.run_path(workdir)
  records = read_metrics(workdir / "metrics.jsonl")
  written = []
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
    png = io.BytesIO()  # matplotlib writes local files only; epath writes anywhere
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    path = workdir / f"curves_{phase}.png"
    path.write_bytes(png.getvalue())
    written.append(os.fspath(path))
  return written


def write_summary(workdir: paths.PathLike, summary: dict[str, Any]) -> str:
  """Writes summary.json and summary.txt (the table) into `workdir`; returns the table."""
  table = format_table(list(summary.items()), "summary")
  workdir = paths.run_path(workdir)
  paths.write_text(workdir / "summary.json", json.dumps(summary, indent=2))
  paths.write_text(workdir / "summary.txt", table + "\n")
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
