"""Weights & Biases for the metric records of `seed_jax.metrics` (`log.wandb=True`).

The same scalars as TensorBoard, each under `<phase>/<key>` against its phase's own step
(`<phase>/step`: behaviour-cloning and SFT steps, RL iterations and evaluations count
separately, as in metrics.jsonl); lists of numbers go as histograms (the OPD gate's
`gate_hist` as its bins on [0, 1]). The run's config is the W&B run's config. The run id
is kept in `workdir/wandb_run_id`, so a resumed run continues the same W&B run (records
after the restored step are logged again; W&B keeps both versions of such a step).

W&B is a convenience, never a reason for a run to fail: a missing `wandb` package, an
unreachable server or an error while logging is one warning, and the run goes on with
metrics.jsonl and TensorBoard. `WANDB_MODE=offline` writes the run under
`workdir/wandb/` for a later `wandb sync`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import uuid
from typing import Any

import numpy as np

from seed_jax import paths

log = logging.getLogger(__name__)

RUN_ID_FILE = "wandb_run_id"


@dataclasses.dataclass(frozen=True)
class WandbSettings:
  """`log.wandb_*`: the project, entity (user or team; "" for the default), run name ("" for
  the workdir's name) and group ("" for none; the experiment runner groups its arms)."""
  project: str = "seed_jax"
  entity: str = ""
  name: str = ""
  group: str = ""


class WandbSink:
  """Sends `MetricsWriter` records to one W&B run (create it on the primary host only)."""

  def __init__(self, workdir: paths.PathLike, settings: WandbSettings,
               config: dict[str, Any] | None = None):
    self._run = None
    self._wandb = None
    self._phases: set[str] = set()
    try:
      import wandb  # pylint: disable=import-outside-toplevel
    except ImportError:
      log.warning("log.wandb=True but the wandb package is not installed (pip install "
                  "wandb): W&B is off; metrics.jsonl and TensorBoard have every record")
      return
    workdir = paths.run_path(workdir)
    local = (tempfile.mkdtemp(prefix="seed_jax_wandb_") if paths.is_remote(workdir)
             else os.fspath(workdir))
    try:
      run_id = _run_id(workdir)
      self._run = wandb.init(
          project=settings.project, entity=settings.entity or None,
          name=settings.name or os.path.basename(os.fspath(workdir).rstrip("/")),
          group=settings.group or None, id=run_id, resume="allow", dir=local,
          config=config or {})
      self._wandb = wandb
    except Exception as error:  # pylint: disable=broad-except
      log.warning("W&B is off: wandb.init failed (%s); metrics.jsonl and TensorBoard "
                  "have every record", error)
      self._run = None

  @property
  def active(self) -> bool:
    return self._run is not None

  def log(self, record: dict[str, Any]) -> None:
    """One metrics.jsonl record (`{"step", "phase", ...}`) as one W&B log call."""
    if self._run is None:
      return
    phase, step = record["phase"], record["step"]
    try:
      if phase not in self._phases:
        self._run.define_metric(f"{phase}/step")
        self._run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
        self._phases.add(phase)
      data: dict[str, Any] = {f"{phase}/step": step}
      for key, value in record.items():
        if key in ("step", "phase") or value is None or isinstance(value, bool):
          continue
        if isinstance(value, (int, float)):
          data[f"{phase}/{key}"] = value
        elif isinstance(value, list) and value and all(
            isinstance(v, (int, float)) for v in value):
          data[f"{phase}/{key}"] = self._histogram(key, value)
      self._run.log(data)
    except Exception as error:  # pylint: disable=broad-except
      log.warning("W&B is off from here: logging failed (%s)", error)
      self._run = None

  def _histogram(self, key: str, values: list[float]):
    if key == "gate_hist":  # bin weights on [0, 1], not samples
      edges = np.linspace(0.0, 1.0, len(values) + 1)
      return self._wandb.Histogram(np_histogram=(np.asarray(values, np.float64), edges))
    return self._wandb.Histogram(np.asarray(values, np.float64))

  def close(self) -> None:
    if self._run is not None:
      try:
        self._run.finish()
      except Exception as error:  # pylint: disable=broad-except
        log.warning("W&B: finishing the run failed (%s)", error)
      self._run = None


def _run_id(workdir) -> str:
  """The workdir's W&B run id, made and kept on first use."""
  path = workdir / RUN_ID_FILE
  if path.exists():
    return path.read_text().strip()
  run_id = uuid.uuid4().hex[:12]
  workdir.mkdir(parents=True, exist_ok=True)
  paths.write_text(path, run_id + "\n")
  return run_id
