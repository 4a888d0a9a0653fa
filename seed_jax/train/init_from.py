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
from seed_jax.models.lora import merge_trainable, split_trainable
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
  # Absolute: orbax reads no metadata from a relative step folder.
  folder = epath.Path(os.path.abspath(os.path.expanduser(path)))
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


def _saved_param_paths(step_folder: str) -> set[tuple]:
  """The parameter paths `train.params` holds in one checkpoint step (no array is read)."""
  metadata = ocp.PyTreeCheckpointer().metadata(epath.Path(step_folder) / "state")
  tree = metadata.item_metadata.tree["train"]["params"]
  paths = set()

  def walk(node, path):
    if isinstance(node, dict) and "value" not in node:
      for key, child in node.items():
        walk(child, path + (key,))
    else:
      paths.add(path)

  walk(tree, ())
  return paths


def _is_adapter(path: tuple) -> bool:
  return path[-1] in ("lora_a", "lora_b")


def checkpoint_params(step_folder: str, params_like: Any) -> Any:
  """The policy parameters of one checkpoint step, in `params_like`'s shapes and shardings.

  Only `train.params` is read (a partial restore): the optimizer state and the reference
  of the source run are left on disk, whatever their shapes. With LoRA (`params_like`
  holds adapters), a full checkpoint gives the base and the adapters start fresh, and a
  LoRA run's checkpoint (its adapters alone) gives the adapters on `params_like`'s base.
  """
  saved = _saved_param_paths(step_folder)
  like = dict(nnx.to_flat_state(params_like))
  extra_adapters = sorted(p for p in saved - like.keys() if _is_adapter(p))
  if extra_adapters:
    raise ValueError(f"{step_folder} holds LoRA adapters ({'.'.join(extra_adapters[0])}, "
                     "...): set config.model.lora.* as in the run that wrote it, or start "
                     "from that run's export/ (the merged model)")
  base = [p for p in like if not _is_adapter(p)]
  missing = [p for p in base if p not in saved]
  if missing and len(missing) < len(base):
    raise ValueError(f"{step_folder}: parameter {'.'.join(missing[0])} is missing")
  wanted = {p: v for p, v in like.items() if p in saved}
  target = {"train": {"params": abstract_like(nnx.from_flat_state(wanted))}}
  restored = ocp.PyTreeCheckpointer().restore(
      epath.Path(step_folder) / "state", args=ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
          partial_restore=True))
  like.update(nnx.to_flat_state(restored["train"]["params"]))
  return nnx.from_flat_state(like)


def hf_params(folder: str, cfg, mesh, params_like: Any = None) -> Any:
  """The parameters of an HF folder as `nnx.Param` state of a `cfg` model on `mesh` (so in
  the run's dtypes and shardings); a tensor of another shape fails naming it. With LoRA
  the folder gives the base, and the adapters are `params_like`'s (fresh)."""
  base = nnx.split(load_params(cfg.replace(lora_rank=0), SafetensorsSource(folder), mesh),
                   nnx.Param)[1]
  if not cfg.lora_rank:
    return base
  return merge_trainable(split_trainable(params_like)[0], base)


def initial_params(path: str, params_like: Any, cfg, mesh) -> Any:
  """`config.init_from`'s parameters, replacing `params_like` (the loaded model's): same
  structure, dtypes and shardings."""
  weights = find_weights(path)
  hosts.print0(f"Starting from the weights in {weights.path} (config.init_from)")
  if weights.kind == HF:
    return hf_params(weights.path, cfg, mesh, params_like)
  return checkpoint_params(weights.path, params_like)
