"""GGUF files (llama.cpp): config, dequantised tensors under HF names, and the tokenizer.

The `gguf` package reads the file and dequantises F32, F16, BF16, Q8_0, Q4_0, Q4_1 and the
K-quants. Two llama.cpp conventions are undone here:
  * tensor names (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`);
  * for the llama architecture, the converter permutes the rows of the Q and K projections
    per head into an interleaved rotary layout; we use HF's rotate-half layout, so those rows
    are permuted back.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from seed_jax.models.config import ModelConfig
from seed_jax.models.weights import ArraySource

_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
                   "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def hf_name_of_gguf(name: str, path: str) -> str:
  """Maps a GGUF tensor name to its HF name; unknown names are an error naming both."""
  if name in _GLOBAL_TENSORS:
    return _GLOBAL_TENSORS[name]
  match = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
  if match and match.group(2) in _LAYER_TENSORS:
    return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}"
  raise ValueError(f"{path}: GGUF tensor {name!r} has no counterpart in the decoder family")


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's per-head Q/K row permutation.

  llama.cpp stores rows of head h as `reshape(2, D/2).swapaxes` of HF's, i.e. the pairs of
  rotate-half are interleaved. Rows `[num_heads * D, ...]` -> same shape in HF order.
  """
  rows = weight.shape[0]
  head_dim = rows // num_heads
  rest = weight.shape[1:]
  return (weight.reshape(num_heads, head_dim // 2, 2, *rest).swapaxes(1, 2)
          .reshape(rows, *rest))


def gguf_field(reader, key: str, path: str, default: Any = ...) -> Any:
  """A GGUF metadata value; a missing key is an error naming the file, unless a default."""
  field = reader.fields.get(key)
  if field is None:
    if default is ...:
      raise KeyError(f"{path}: GGUF metadata key {key!r} is missing")
    return default
  return field.contents()


def read_gguf(path: str | os.PathLike, **config_overrides
              ) -> tuple[ModelConfig, ArraySource, Any]:
  """Reads a GGUF file.

  Returns:
    (config, tensors as an `ArraySource` under HF names in float32, the GGUFReader for
    the tokenizer).
  """
  import gguf  # pylint: disable=import-outside-toplevel
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"GGUF file not found: {path}")
  try:
    reader = gguf.GGUFReader(path)
  except Exception as e:  # the gguf package raises ValueError/struct errors on bad files
    raise ValueError(f"{path}: not a readable GGUF file ({e})") from e
  arch = gguf_field(reader, "general.architecture", path)
  if arch not in _ARCHITECTURES:
    raise ValueError(f"{path}: general.architecture {arch!r} is not supported; "
                     f"supported: {', '.join(_ARCHITECTURES)}")
  num_heads = int(gguf_field(reader, f"{arch}.attention.head_count", path))
  num_kv_heads = int(gguf_field(reader, f"{arch}.attention.head_count_kv", path, num_heads))
  hidden = int(gguf_field(reader, f"{arch}.embedding_length", path))
  shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
  names = set(shapes)
  if "token_embd.weight" not in shapes:
    raise KeyError(f"{path}: GGUF tensor 'token_embd.weight' is missing")
  vocab = int(gguf_field(reader, f"{arch}.vocab_size", path, shapes["token_embd.weight"][-1]))
  cfg = ModelConfig(
      model_type=_ARCHITECTURES[arch],
      vocab_size=vocab,
      hidden_size=hidden,
      intermediate_size=int(gguf_field(reader, f"{arch}.feed_forward_length", path)),
      num_layers=int(gguf_field(reader, f"{arch}.block_count", path)),
      num_heads=num_heads,
      num_kv_heads=num_kv_heads,
      head_dim=int(gguf_field(reader, f"{arch}.attention.key_length", path, hidden // num_heads)),
      rope_theta=float(gguf_field(reader, f"{arch}.rope.freq_base", path, 10000.0)),
      rms_norm_eps=float(gguf_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", path)),
      tie_word_embeddings="output.weight" not in names,
      qkv_bias="blk.0.attn_q.bias" in names,
      o_bias="blk.0.attn_output.bias" in names,
      qk_norm="blk.0.attn_q_norm.weight" in names,
      max_position_embeddings=int(gguf_field(reader, f"{arch}.context_length", path, 8192)),
      bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id", path, None),
      eos_token_id=gguf_field(reader, "tokenizer.ggml.eos_token_id", path, None),
      pad_token_id=gguf_field(reader, "tokenizer.ggml.padding_token_id", path, None),
      **config_overrides)
  if gguf_field(reader, f"{arch}.rope.scaling.type", path, "none") not in ("none", "default"):
    raise ValueError(f"{path}: {arch}.rope.scaling.type is not supported for GGUF import")

  tensors = {}
  for tensor in reader.tensors:
    name = hf_name_of_gguf(tensor.name, path)
    try:
      value = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except (NotImplementedError, ValueError, KeyError) as e:
      raise ValueError(f"{path}: tensor {tensor.name!r} uses quantisation "
                       f"{tensor.tensor_type.name}, which cannot be read ({e})") from e
    value = np.asarray(value, np.float32).reshape(tuple(reversed(
        [int(d) for d in tensor.shape])))
    if arch == "llama" and re.search(r"attn_(q|k)\.(weight|bias)$", tensor.name):
      heads = num_heads if ".attn_q." in tensor.name else num_kv_heads
      value = unpermute_rotary_rows(value, heads)
    tensors[name] = value
  return cfg, ArraySource(tensors, path), reader
