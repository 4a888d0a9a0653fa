"""Meshes and batches for the paper's models on common TPU slices, checked with
`python -m seed_jax.plan` (README: "Planning for a TPU slice" has the plan's figures).

A preset is `MODEL@SLICE` after the config file's colon:

  python -m seed_jax.plan --config=configs/alfworld.py:qwen2.5-7b-instruct@v5p-8 --topology=v5p-8
  python -m seed_jax.main --config=configs/alfworld.py:qwen2.5-7b-instruct@v5p-8 \
      --config.model.name=/path/to/Qwen2.5-7B-Instruct --multihost

It sets the model's shape (point `model.name` at the weights' folder to train), bfloat16
compute, the mesh, the micro-batch (rows per forward/backward; the mini-batch of 256 rows
per update, the paper's, is unchanged) and, where the plan asked for it, how many analyzer
transcripts are decoded at a time and the stage-1 SFT batch. Every other key keeps the
paper's value.
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
  analyzer_decode_batch: int = 0  # 0: every transcript in one request
  sft_batch_size: int = 8  # the paper's


MODELS = ("smollm2-135m-instruct", "qwen2.5-1.5b-instruct", "qwen2.5-3b-instruct",
          "qwen2.5-7b-instruct", "qwen3-8b", "llama-3.1-8b-instruct",
          "qwen2.5-vl-3b-instruct")  # the visual benchmarks' (configs/sokoban_visual.py)
SLICES = ("v5e-4", "v5e-16", "v5p-8", "v5p-64", "v4-8")

_EIGHT_B = ("qwen2.5-7b-instruct", "qwen3-8b", "llama-3.1-8b-instruct")

# The weights, AdamW moments and reference weights alone (float32) fill more than half of
# a device: 7B / 8B 28-30 GiB on v5e-4 and 14-15 GiB on v4-8 (16 GiB devices), 3B 11.5 GiB
# on v5e-4 (tests/train/test_plan.py derives this set from the shapes).
STATE_TOO_BIG = {(m, s) for m in _EIGHT_B for s in ("v5e-4", "v4-8")} | {
    ("qwen2.5-3b-instruct", "v5e-4"), ("qwen2.5-vl-3b-instruct", "v5e-4")}
# The plan's verdict: the 7B train step needs 22.9 GiB per v5e device (the TPU compiler
# refuses it); Qwen3-8B and Llama-3.1-8B are larger.
# Qwen2.5-VL-3B on v5e-16: the acting prefill takes all 128 prompts' images in one pass,
# their patches replicated on every chip: 16.7 GiB a chip
# (docs/plans/qvl3_sokoban_visual_v5e16.txt).
PLANNED_TOO_BIG = {(m, "v5e-16") for m in _EIGHT_B} | {("qwen2.5-vl-3b-instruct", "v5e-16")}
TOO_SMALL = STATE_TOO_BIG | PLANNED_TOO_BIG

# (model, slice) -> layout. A micro-batch needs a row for every device it is split over
# (32 on v5p-64).
LAYOUTS: dict[tuple[str, str], PodLayout] = {
    (model, slice_): PodLayout(micro_batch_size=32 if slice_ == "v5p-64" else 16)
    for model in MODELS for slice_ in SLICES if (model, slice_) not in TOO_SMALL
}
# 7B / 8B on v5p-8 (4 chips), from the plan (before the prefill fixes): decoding all 128
# analyzer transcripts of 16k tokens at once needed 115 GiB per chip, and stage-1 SFT rows
# of 16,896 tokens two a chip 105 GiB; a quarter of the transcripts at a time and one SFT
# row a chip. With these, after the fixes, the 7B's largest program is the train step at
# 61.7 GiB a chip (docs/plans/q7_v5p8_preset.json).
for _model in _EIGHT_B:
  LAYOUTS[(_model, "v5p-8")] = PodLayout(analyzer_decode_batch=32, sft_batch_size=4)
# The small models on 16 GiB chips, from the plan: the analyzer's KV cache for all 128
# transcripts of 16k tokens fills a v5e chip (the embedded model on v5e-4: 32 rows a chip,
# 11.6 GiB of cache alone); at 32 transcripts the embedded model's analysis prefill needs
# 11.3 GiB a chip and Qwen2.5-1.5B's on v5e-16 9.7 (docs/plans/embedded_v5e4_preset.json,
# q15_v5e16_preset_analysis.json).
for _model, _slice in (("smollm2-135m-instruct", "v5e-4"), ("qwen2.5-1.5b-instruct", "v5e-16")):
  LAYOUTS[(_model, _slice)] = PodLayout(analyzer_decode_batch=32)
# v4-8 shows its 8 TensorCores as devices of 16 GiB: one row a device per micro-batch (the
# 3B step needs 17.1 GiB a device at two).
for _model in MODELS[:3] + ("qwen2.5-vl-3b-instruct",):
  LAYOUTS[(_model, "v4-8")] = PodLayout(micro_batch_size=8)


def apply_pod(c: ml_collections.ConfigDict, preset: str) -> ml_collections.ConfigDict:
  """Applies `MODEL@SLICE` to the config `c`."""
  model, _, slice_ = preset.partition("@")
  if (model, slice_) in TOO_SMALL:
    raise ValueError(f"pod preset {preset!r}: the model does not fit the devices of "
                     f"{slice_} (configs/pods.py); plan a larger slice (python -m seed_jax.plan)")
  if (model, slice_) not in LAYOUTS:
    known = ", ".join(f"{m}@{s}" for m, s in sorted(LAYOUTS))
    raise ValueError(f"unknown pod preset {preset!r}; known: {known}")
  layout = LAYOUTS[(model, slice_)]
  c.model.name = model
  c.model.dtype = "bfloat16"
  c.model.param_dtype = layout.param_dtype
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, layout.fsdp, layout.tensor
  c.rl.micro_batch_size = layout.micro_batch_size
  c.analyzer.decode_batch = layout.analyzer_decode_batch
  c.sft.batch_size = layout.sft_batch_size
  return c
