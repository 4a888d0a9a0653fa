"""Weights to start a new run from (`config.init_from`): verl's `resume_from_path`, MaxText's
`load_parameters_path`. Only the parameters are taken; the optimizer starts afresh.

`config.init_from` names either
  * a checkpoint: a run folder or its `checkpoints/` folder (both: the latest step), or one
    step's folder (`checkpoints/N`);
  * a Hugging Face folder (`model.safetensors`), e.g. a run's `export/`.
Its parameters must have the shapes of `config.model.name`'s architecture, which still
gives the tokenizer and the dtypes. They replace the loaded model's right after it is
built, before anything else. A workdir that already holds checkpoints resumes from its own
last one instead: resuming takes precedence over `init_from`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from seed_jax.checkpoint import abstract_like
from seed_jax.models.weights import SafetensorsSource, load_params
from seed_jax.parallel import hosts

CHECKPOINT, HF = "checkpoint", "hf"

_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


@dataclasses.dataclass(frozen=True)
class Weights:
  """Where `config.init_from`'s parameters are: one checkpoint step's folder, or an HF
  folder."""
  kind: str  # CHECKPOINT | HF
  path: str


def saved_steps(checkpoints: str | os.PathLike) -> list[int]:
  """The committed checkpoint steps in a `checkpoints/` folder, ascending ([] for none or
  a missing folder). A save killed before its commit does not count."""
  return sorted(ocp.utils.checkpoint_steps(checkpoints))


def find_weights(path: str) -> Weights:
  """Resolves `path` (see the module docstring) to the step folder or HF folder to read.

  Raises:
    ValueError: the path does not exist, holds neither kind of weights, or is a
      checkpoints folder without a committed step; the message says which.
  """
  folder = epath.Path(os.path.expanduser(path))
  if not folder.exists():
    raise ValueError(f"no such path {path!r}")
  if any((folder / name).exists() for name in _HF_WEIGHTS):
    return Weights(HF, os.fspath(folder))
  if (folder / "state").is_dir():  # one step's folder: `state` (arrays) and `host` (JSON)
    return Weights(CHECKPOINT, os.fspath(folder))
  checkpoints = folder / "checkpoints" if (folder / "checkpoints").is_dir() else folder
  steps = saved_steps(checkpoints)
  if steps:
    return Weights(CHECKPOINT, os.fspath(checkpoints / str(steps[-1])))
  raise ValueError(f"{path!r} holds no weights: neither a checkpoint (a run folder, its "
                   f"checkpoints/ or one step's folder) nor a Hugging Face folder "
                   f"({' or '.join(_HF_WEIGHTS)})")


def checkpoint_params(step_folder: str, params_like: Any) -> Any:
  """The policy parameters of one checkpoint step, in `params_like`'s shapes and shardings.

  Only `train.params` is read (a partial restore): the optimizer state and the reference
  of the source run are left on disk, whatever their shapes.
  """
  target = {"train": {"params": abstract_like(params_like)}}
  restored = ocp.PyTreeCheckpointer().restore(
      epath.Path(step_folder) / "state", args=ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
          partial_restore=True))
  return restored["train"]["params"]


def hf_params(folder: str, cfg, mesh) -> Any:
  """The parameters of an HF folder as `nnx.Param` state of a `cfg` model on `mesh` (so in
  the run's dtypes and shardings); a tensor of another shape fails naming it."""
  return nnx.split(load_params(cfg, SafetensorsSource(folder), mesh), nnx.Param)[1]


def initial_params(path: str, params_like: Any, cfg, mesh) -> Any:
  """`config.init_from`'s parameters, replacing `params_like` (the loaded model's): same
  structure, dtypes and shardings."""
  weights = find_weights(path)
  hosts.print0(f"Starting from the weights in {weights.path} (config.init_from)")
  if weights.kind == HF:
    return hf_params(weights.path, cfg, mesh)
  return checkpoint_params(weights.path, params_like)
