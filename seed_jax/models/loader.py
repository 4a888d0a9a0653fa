"""One entry point to get a model and its tokenizer: `load_model(name_or_path)`.

Accepts the name of an embedded model ("smollm2-135m-instruct", or the generated
"tiny-random-qwen2.5-vl": `seed_jax.models.embedded`), a local HF folder (config.json +
safetensors + tokenizer files) or a `.gguf` file. Never uses the network.
A Qwen2.5-VL folder (`model_type` "qwen2_5_vl") gives a `VisionLanguageModel`.
Model shapes (`seed_jax.models.shapes`) name architectures without weights: they have a
config (`model_config`) but cannot be loaded.
"""

from __future__ import annotations

from jax.sharding import Mesh

from seed_jax.models.config import LORA_TARGETS, ModelConfig
from seed_jax.models.embedded import EMBEDDED_MODELS, embedded_model_dir
from seed_jax.models.shapes import MODEL_SHAPES, existing_model_path
from seed_jax.models.lora import with_adapters
from seed_jax.models.tokenizer import Tokenizer, load_tokenizer, tokenizer_from_gguf
from seed_jax.models.transformer import Transformer
from seed_jax.models.vision_language import VisionLanguageModel
from seed_jax.models.weights import SafetensorsSource, load_params, load_vision_language_params
from seed_jax.parallel.mesh import (LogicalMesh, as_logical_mesh, param_shardings,
                                    single_device_mesh)
from seed_jax.parallel.rules import Rules

DEFAULT_MODEL = "smollm2-135m-instruct"


def resolve_model_path(name_or_path: str) -> str:
  """An embedded model's folder (made on first use), or the given path if it exists."""
  if name_or_path in EMBEDDED_MODELS:
    return embedded_model_dir(name_or_path)
  if name_or_path in MODEL_SHAPES:
    raise FileNotFoundError(
        f"model {name_or_path!r} is a shape without weights (for seed_jax.plan and tests); "
        f"point config.model.name at a local Hugging Face folder of its weights")
  return existing_model_path(name_or_path)


def load_model(name_or_path: str = DEFAULT_MODEL, *, dtype: str = "float32",
               param_dtype: str | None = None, mesh: LogicalMesh | Mesh | None = None,
               rules: Rules | None = None, remat: str = "full", lora_rank: int = 0,
               lora_alpha: float = 16.0, lora_targets: tuple[str, ...] = LORA_TARGETS,
               seed: int = 0) -> tuple[Transformer | VisionLanguageModel, Tokenizer]:
  """Loads weights (streamed into `mesh`'s shardings) and the tokenizer.

  Args:
    name_or_path: embedded model name, HF folder, or `.gguf` file.
    dtype: compute dtype ("float32" or "bfloat16"); param_dtype defaults to it.
    mesh: target mesh (a `LogicalMesh` from `make_mesh` carries the rules); None places
      everything on the first device.
    rules: only needed with a plain Mesh; with a `LogicalMesh` they must equal its own.
    remat: what the backward pass keeps of each layer (`ModelConfig.remat`).
    lora_rank, lora_alpha, lora_targets: with a rank > 0, fresh low-rank adapters on the
      loaded weights (`seed_jax.models.lora`; `seed` draws their `A`).
  """
  path = resolve_model_path(name_or_path)
  overrides = dict(dtype=dtype, param_dtype=param_dtype or dtype, remat=remat)
  if path.endswith(".gguf"):
    from seed_jax.models.gguf_io import read_gguf  # pylint: disable=import-outside-toplevel
    cfg, source, reader = read_gguf(path, **overrides)
    tokenizer = tokenizer_from_gguf(reader, path)
  else:
    cfg = ModelConfig.from_hf_file(path, **overrides)
    source = SafetensorsSource(path)
    tokenizer = load_tokenizer(path, eos_ids=cfg.eos_token_ids)
  if cfg.vision is not None:
    model = load_vision_language_params(cfg, source, mesh, rules)
  else:
    model = load_params(cfg, source, mesh, rules)
  if lora_rank:
    placement = as_logical_mesh(mesh or single_device_mesh(), rules)
    model = with_adapters(model, lora_rank, lora_alpha, lora_targets,
                          lambda state: param_shardings(state, placement), seed)
  return model, tokenizer
