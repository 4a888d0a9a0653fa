"""Meshes and batches for the paper's models on common TPU slices, checked with
`python -m seed_jax.plan` (README: "Planning for a TPU slice" has the plan's figures).

A preset is `MODEL@SLICE` after the config file's colon:

  python -m seed_jax.plan --config=configs/alfworld.py:qwen2.5-7b-instruct@v5p-8 --topology=v5p-8
  python -m seed_jax.main --config=configs/alfworld.py:qwen2.5-7b-instruct@v5p-8 \
      --config.model.name=/path/to/Qwen2.5-7B-Instruct --multihost

It sets the model's shape (point `model.name` at the weights' folder to train), bfloat16
compute, the mesh, and the micro-batch (rows per forward/backward; the mini-batch of 256
rows per update, the paper's, is unchanged). Every other key keeps the paper's value.
"""

from __future__ import annotations

import dataclasses

import ml_collections


@dataclasses.dataclass(frozen=True)
class PodLayout:
  """How one model is laid out on one slice. fsdp -1: every device not used by tensor."""
  fsdp: int = -1
  tensor: int = 1
  micro_batch_size: int = 16
  param_dtype: str = "float32"


MODELS = ("smollm2-135m-instruct", "qwen2.5-1.5b-instruct", "qwen2.5-3b-instruct",
          "qwen2.5-7b-instruct", "qwen3-8b", "llama-3.1-8b-instruct")
SLICES = ("v5e-4", "v5e-16", "v5p-8", "v5p-64", "v4-8")

# (model, slice) -> layout. Fully-sharded data parallelism over the whole slice fits every
# model here; pairs not listed did not fit (README's table says what the plan needs).
# A micro-batch needs a row for every device it is split over (32 on v5p-64).
LAYOUTS: dict[tuple[str, str], PodLayout] = {
    (model, slice_): PodLayout(micro_batch_size=32 if slice_ == "v5p-64" else 16)
    for model in MODELS for slice_ in SLICES
}


def apply_pod(c: ml_collections.ConfigDict, preset: str) -> ml_collections.ConfigDict:
  """Applies `MODEL@SLICE` to the config `c`."""
  model, _, slice_ = preset.partition("@")
  if (model, slice_) not in LAYOUTS:
    known = ", ".join(f"{m}@{s}" for m, s in sorted(LAYOUTS))
    raise ValueError(f"unknown pod preset {preset!r}; known: {known}")
  layout = LAYOUTS[(model, slice_)]
  c.model.name = model
  c.model.dtype = "bfloat16"
  c.model.param_dtype = layout.param_dtype
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, layout.fsdp, layout.tensor
  c.rl.micro_batch_size = layout.micro_batch_size
  return c
