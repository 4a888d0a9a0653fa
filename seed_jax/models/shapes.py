"""Model shapes without weights: the paper's models as named architectures.

Each file `shapes/NAME.json` is the model's Hugging Face `config.json`, verbatim, so memory
planning (`seed_jax.plan`) and tests can build abstract parameters with `nnx.eval_shape`
without downloading gigabytes. `model_config` answers the same question for anything
`load_model` accepts (embedded name, HF folder, `.gguf` file), still without reading weights.

The folder sits beside this module under the same name; Python imports `shapes.py` as the
module (a plain file wins over a folder without `__init__.py`), and the JSON files are found
through `__file__`, so they work from a checkout without any package-data setup.
"""

from __future__ import annotations

import json
import os
from typing import Any

from seed_jax.models.config import ModelConfig
from seed_jax.models.embedded import EMBEDDED_MODELS, embedded_model_config

SHAPES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shapes")


def _shape_names() -> tuple[str, ...]:
  return tuple(sorted(file[:-len(".json")] for file in os.listdir(SHAPES_DIR)
                      if file.endswith(".json")))


# Dropping a config.json into shapes/ under a new name is all it takes to add a shape.
MODEL_SHAPES: tuple[str, ...] = _shape_names()


def shape_hf_dict(name: str) -> dict[str, Any]:
  """The Hugging Face `config.json` dict of a named shape."""
  if name not in MODEL_SHAPES:
    raise ValueError(f"unknown model shape {name!r}; known: {', '.join(MODEL_SHAPES)}")
  with open(os.path.join(SHAPES_DIR, f"{name}.json")) as f:
    return json.load(f)


def shape_config(name: str, **overrides) -> ModelConfig:
  """The `ModelConfig` of a named shape; `overrides` replace fields (dtype, num_layers, ...)."""
  return ModelConfig.from_hf_dict(shape_hf_dict(name), source=f"model shape {name!r}",
                                  **overrides)


def existing_model_path(name_or_path: str) -> str:
  """`name_or_path` with `~` expanded if it exists; else an error listing every known name."""
  path = os.path.expanduser(name_or_path)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"model {name_or_path!r} is neither an embedded model ({', '.join(EMBEDDED_MODELS)}), "
        f"a model shape ({', '.join(MODEL_SHAPES)}) nor an existing path")
  return path


def model_config(name_or_path: str, **overrides) -> ModelConfig:
  """The config of any model `load_model` accepts, or of a shape name, without its weights.

  Args:
    name_or_path: a shape name (`MODEL_SHAPES`), an embedded model name, a local HF folder
      (its `config.json` is read) or a `.gguf` file.
    **overrides: `ModelConfig` fields to replace, e.g. dtype="bfloat16".
  """
  if name_or_path in MODEL_SHAPES:
    return shape_config(name_or_path, **overrides)
  if name_or_path in EMBEDDED_MODELS:  # its folder may not exist yet
    return embedded_model_config(name_or_path, **overrides)
  path = existing_model_path(name_or_path)
  if path.endswith(".gguf"):
    # Imported here: reading GGUF needs the gguf package, HF folders do not.
    from seed_jax.models.gguf_io import read_gguf  # pylint: disable=import-outside-toplevel
    # read_gguf also dequantises the tensors; fine for the embedded 135M model, slow for
    # a multi-GB file (a metadata-only reader in gguf_io would avoid it).
    cfg, _, _ = read_gguf(path, **overrides)
    return cfg
  return ModelConfig.from_hf_file(path, **overrides)
