"""Model configuration for the decoder family, read from and written to HF `config.json`.

One dataclass covers Llama 3 / SmolLM2, Qwen2 / Qwen2.5 and Qwen3; the differences are
flags (q/k/v bias, q/k RMSNorm, tied head, rope scaling), not subclasses. Qwen2.5-VL
(`qwen2_5_vl`) is its Qwen2 text model plus `vision` (the tower's `VisionConfig`, also
here), the image token ids and `mrope_section` (multimodal RoPE):
`seed_jax.models.vision_language`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

# HF `model_type` -> our architecture name. Each one differs only in the flags below.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen2_5_vl")
VISION_LANGUAGE_TYPES = ("qwen2_5_vl",)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
REMAT_POLICIES = ("full", "projections", "none")
# HF's ACT2FN names the vision tower implements (`seed_jax.models.vision.tower.ACTIVATIONS`).
SUPPORTED_VISION_ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "quick_gelu")
DEFAULT_MROPE_SECTION = (16, 24, 24)  # transformers' default when the config has none


class _NamedDtypes:
  """The jnp dtypes of a config's `dtype` (compute) and `param_dtype` (storage) names."""
  dtype: str
  param_dtype: str

  @property
  def jnp_dtype(self):
    return DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    return DTYPES[self.param_dtype]


@dataclasses.dataclass(frozen=True)
class VisionConfig(_NamedDtypes):
  """Shape and numerics of the Qwen2.5-VL vision tower (defaults: Qwen2.5-VL-3B/7B).

  `window_size` is in pixels: 112 px = 8 patches of 14 = 4 merged tokens per window side.
  `dtype` is the compute dtype, `param_dtype` the storage dtype (as `ModelConfig`).
  `remat` "full" recomputes each block in the backward pass (only its input is kept per
  layer); "none" keeps every residual.
  """

  depth: int = 32
  hidden_size: int = 1280
  intermediate_size: int = 3420
  num_heads: int = 16
  out_hidden_size: int = 2048
  patch_size: int = 14
  spatial_merge_size: int = 2
  temporal_patch_size: int = 2
  window_size: int = 112
  fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
  in_channels: int = 3
  hidden_act: str = "silu"
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6  # hard-coded in transformers' vision RMSNorms
  tokens_per_second: int = 4  # videos' temporal position spacing: read and written only
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "full"

  def __post_init__(self):
    object.__setattr__(self, "fullatt_block_indexes", tuple(self.fullatt_block_indexes))
    for key in ("dtype", "param_dtype"):
      if getattr(self, key) not in DTYPES:
        raise ValueError(f"{key} must be one of {sorted(DTYPES)}, got {getattr(self, key)!r}")
    if self.hidden_act not in SUPPORTED_VISION_ACTIVATIONS:
      raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; "
                       f"supported: {', '.join(SUPPORTED_VISION_ACTIVATIONS)}")
    if self.remat not in ("full", "none"):
      raise ValueError(f"remat must be 'full' or 'none', got {self.remat!r}")
    if self.hidden_size % self.num_heads or self.head_dim % 4:
      raise ValueError(f"hidden_size {self.hidden_size} / num_heads {self.num_heads} must be "
                       f"a multiple of 4 (the 2-D rotary splits each head in four)")
    if self.window_merged < 1:
      raise ValueError(f"window_size {self.window_size} px is smaller than one merged token "
                       f"({self.patch_size * self.spatial_merge_size} px)")
    bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
    if bad:
      raise ValueError(f"fullatt_block_indexes {bad} are outside [0, depth={self.depth})")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    """Length of one flattened patch: C * T * P * P."""
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  @property
  def merge_unit(self) -> int:
    """Patches merged into one output token (4)."""
    return self.spatial_merge_size ** 2

  @property
  def window_merged(self) -> int:
    """Window side in merged tokens (transformers' `vit_merger_window_size`)."""
    return self.window_size // self.spatial_merge_size // self.patch_size

  def replace(self, **changes) -> VisionConfig:
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], **overrides) -> VisionConfig:
    """From a Qwen2.5-VL `config.json` dict (its "vision_config") or the vision dict
    itself. Older checkpoints spell `in_channels` "in_chans"; the rotary base lives in
    `rope_parameters.rope_theta` (transformers 5) and defaults to 10000."""
    if hf.get("model_type") in ("qwen2_vl",) or "embed_dim" in hf.get("vision_config", hf):
      raise ValueError("this is a Qwen2-VL config (LayerNorm blocks, no windows); only the "
                       "Qwen2.5-VL vision tower is implemented")
    vision = hf.get("vision_config", hf)
    rope = vision.get("rope_parameters") or {}
    fields = dict(
        depth=vision["depth"], hidden_size=vision["hidden_size"],
        intermediate_size=vision["intermediate_size"], num_heads=vision["num_heads"],
        out_hidden_size=vision["out_hidden_size"], patch_size=vision.get("patch_size", 14),
        spatial_merge_size=vision.get("spatial_merge_size", 2),
        temporal_patch_size=vision.get("temporal_patch_size", 2),
        window_size=vision.get("window_size", 112),
        fullatt_block_indexes=tuple(vision.get("fullatt_block_indexes", (7, 15, 23, 31))),
        in_channels=vision.get("in_channels", vision.get("in_chans", 3)),
        hidden_act=vision.get("hidden_act", "silu"),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        tokens_per_second=vision.get("tokens_per_second", 4))
    fields.update(overrides)
    return cls(**fields)

  def to_hf_dict(self) -> dict[str, Any]:
    """The "vision_config" dict of a Qwen2.5-VL `config.json` (transformers 5's keys)."""
    return {
        "model_type": "qwen2_5_vl_vision", "depth": self.depth,
        "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
        "num_heads": self.num_heads, "out_hidden_size": self.out_hidden_size,
        "patch_size": self.patch_size, "spatial_merge_size": self.spatial_merge_size,
        "temporal_patch_size": self.temporal_patch_size, "window_size": self.window_size,
        "fullatt_block_indexes": list(self.fullatt_block_indexes),
        "in_channels": self.in_channels, "hidden_act": self.hidden_act,
        "tokens_per_second": self.tokens_per_second,
        "rope_parameters": {"rope_type": "axial", "rope_theta": self.rope_theta},
    }

  @classmethod
  def tiny(cls, **overrides) -> VisionConfig:
    """A tiny config for tests: 4 blocks of width 32, windows of 2x2 merged tokens."""
    base = dict(depth=4, hidden_size=32, intermediate_size=40, num_heads=2, out_hidden_size=48,
                window_size=56, fullatt_block_indexes=(1, 3))
    base.update(overrides)
    return cls(**base)


def mrope_section_from_hf(hf: dict[str, Any]) -> tuple[int, ...]:
  """`mrope_section` from a Qwen2(.5)-VL `config.json` dict: in `rope_parameters`
  (transformers 5) or `rope_scaling` (older files), at the top level or in
  `text_config`; transformers' default (16, 24, 24) when absent."""
  for scope in (hf.get("text_config") or {}, hf):
    for key in ("rope_parameters", "rope_scaling"):
      section = (scope.get(key) or {}).get("mrope_section")
      if section:
        return tuple(int(s) for s in section)
  return DEFAULT_MROPE_SECTION


@dataclasses.dataclass(frozen=True)
class ModelConfig(_NamedDtypes):
  """Shape and numerics of a decoder-only transformer.

  `dtype` is the activation/compute dtype, `param_dtype` the storage dtype of weights.
  Matmuls in bfloat16 always accumulate in float32; logits and softmax are float32.
  `remat` (one of `REMAT_POLICIES`) decides what the backward pass keeps of each layer:
  "full" keeps only the layer's input and recomputes the rest (activation memory flat in
  depth, one more forward); "projections" keeps the outputs of the q/k/v, attention and
  gate/up projections and recomputes only attention's scores and the elementwise ops (no
  weight matmul twice; `[B, T, ~2E + 2F]` a layer); "none" keeps every residual of the
  layer (its norms', attention's and the MLP's). It changes no value, only memory and time
  (measure with bench/train_step.py --remat=...).
  `lora_rank` > 0 adds a low-rank adapter (`seed_jax.models.lora`) of that rank to each
  projection named in `lora_targets` (q, k, v, o, gate, up, down), scaled by
  `lora_alpha / lora_rank`; 0 means none.

  Vision-language models (`model_type` "qwen2_5_vl") also set `vision` (the tower's
  `seed_jax.models.vision.VisionConfig`; its dtype, param_dtype and remat follow this
  config's), `mrope_section` (the rotary frequencies per M-RoPE axis: positions may then
  be `[3, B, T]`) and the ids of the image placeholder and the vision start / end tokens.
  `video_token_id` is only carried for export (videos are not implemented).
  """

  model_type: str = "llama"
  vocab_size: int = 49152
  hidden_size: int = 576
  intermediate_size: int = 1536
  num_layers: int = 30
  num_heads: int = 9
  num_kv_heads: int = 3
  head_dim: int = 64
  rope_theta: float = 100000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None  # sorted items of the HF dict
  rms_norm_eps: float = 1e-5
  tie_word_embeddings: bool = True
  qkv_bias: bool = False
  o_bias: bool = False
  qk_norm: bool = False
  max_position_embeddings: int = 8192
  bos_token_id: int | None = 1
  eos_token_id: int | tuple[int, ...] | None = 2
  pad_token_id: int | None = 2
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "full"
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = LORA_TARGETS
  vision: VisionConfig | None = None
  mrope_section: tuple[int, ...] | None = None
  image_token_id: int | None = None
  video_token_id: int | None = None
  vision_start_token_id: int | None = None
  vision_end_token_id: int | None = None

  def __post_init__(self):
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"model_type {self.model_type!r} is not supported; "
                       f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    for key in ("dtype", "param_dtype"):
      if getattr(self, key) not in DTYPES:
        raise ValueError(f"{key} must be one of {sorted(DTYPES)}, got {getattr(self, key)!r}")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
    if not (isinstance(self.lora_rank, int) and self.lora_rank >= 0):
      raise ValueError(f"lora_rank must be a non-negative integer, got {self.lora_rank!r}")
    unknown = [t for t in self.lora_targets if t not in LORA_TARGETS]
    if unknown or not self.lora_targets:
      raise ValueError(f"lora_targets must be a non-empty selection of {LORA_TARGETS}, "
                       f"got {self.lora_targets!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_attention_heads ({self.num_heads}) must be a multiple of "
                       f"num_key_value_heads ({self.num_kv_heads})")
    rope_type = self.rope_scaling_dict.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
      raise ValueError(f"rope_scaling.rope_type {rope_type!r} is not supported; "
                       f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    self._check_vision()

  def _check_vision(self) -> None:
    """A vision-language config is complete and agrees with itself; its tower computes in
    the text model's dtypes (one place to set them)."""
    if self.model_type not in VISION_LANGUAGE_TYPES:
      if self.vision is not None or self.mrope_section is not None:
        raise ValueError(f"vision and mrope_section need a vision-language model_type "
                         f"({', '.join(VISION_LANGUAGE_TYPES)}), not {self.model_type!r}")
      return
    missing = [k for k in ("vision", "mrope_section", "image_token_id") if getattr(self, k) is None]
    if missing:
      raise ValueError(f"model_type {self.model_type!r} needs {', '.join(missing)}")
    object.__setattr__(self, "mrope_section", tuple(int(s) for s in self.mrope_section))
    if sum(self.mrope_section) != self.head_dim // 2:
      raise ValueError(f"mrope_section {self.mrope_section} must sum to head_dim / 2 = "
                       f"{self.head_dim // 2}")
    if self.vision.out_hidden_size != self.hidden_size:
      raise ValueError(f"vision out_hidden_size {self.vision.out_hidden_size} must equal the "
                       f"text hidden_size {self.hidden_size}")
    vision_remat = "none" if self.remat == "none" else "full"
    object.__setattr__(self, "vision", self.vision.replace(
        dtype=self.dtype, param_dtype=self.param_dtype, remat=vision_remat))

  @property
  def rope_scaling_dict(self) -> dict[str, Any]:
    return dict(self.rope_scaling or ())

  def lora_scale(self, target: str) -> float:
    """The adapter scale `alpha / rank` of projection `target`, or 0.0 without one."""
    if not self.lora_rank or target not in self.lora_targets:
      return 0.0
    return self.lora_alpha / self.lora_rank

  @property
  def eos_token_ids(self) -> tuple[int, ...]:
    if self.eos_token_id is None:
      return ()
    if isinstance(self.eos_token_id, int):
      return (self.eos_token_id,)
    return tuple(self.eos_token_id)

  @property
  def vision_token_ids(self) -> tuple[int, ...]:
    """The vision tokens' ids (image placeholder, video placeholder, vision start and end)
    that the config sets: markup of the prompt's images, never text a response may hold."""
    ids = (self.image_token_id, self.video_token_id, self.vision_start_token_id,
           self.vision_end_token_id)
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))

  def replace(self, **changes) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  @classmethod
  def tiny(cls, **overrides) -> ModelConfig:
    """A tiny random-weights config for tests: 2 layers, 4 heads over 2 KV heads."""
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0,
                max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    base.update(overrides)
    return cls(**base)

  # -- Hugging Face config.json ----------------------------------------------------------

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json", **overrides
                   ) -> ModelConfig:
    """Builds a config from the dict of an HF `config.json`; errors name `source` and key."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"{source}: model_type {model_type!r} is not supported; "
                       f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")

    outer = hf
    vision_language = model_type in VISION_LANGUAGE_TYPES
    if vision_language:
      # transformers 5 nests the text model's fields in "text_config"; older files (and
      # the Hub's) keep them at the top level. Read either, the nested ones first.
      hf = {**outer, **(outer.get("text_config") or {})}

    def need(key):
      if key not in hf:
        raise KeyError(f"{source}: missing required key {key!r} for model_type {model_type!r}")
      return hf[key]

    num_heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    # transformers 5 moved rope settings into `rope_parameters`; older files use
    # `rope_theta` + `rope_scaling`. Accept both.
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope_theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    if "type" in rope and "rope_type" not in rope:
      rope["rope_type"] = rope.pop("type")
    # Qwen2-VL's multimodal RoPE: older files call it rope type "mrope", transformers 5
    # "default"; its frequencies are plain, only their positions are 3-D (mrope_section).
    has_section = rope.pop("mrope_section", None) is not None
    if has_section and not vision_language:
      raise ValueError(f"{source}: mrope_section is only supported for "
                       f"{', '.join(VISION_LANGUAGE_TYPES)}, not {model_type!r}")
    if rope.get("rope_type", "default") in ("default", "mrope"):
      rope = {}
    qwen2_family = model_type in ("qwen2", "qwen2_5_vl")
    tied = (bool(outer.get("tie_word_embeddings") or hf.get("tie_word_embeddings"))
            if vision_language else bool(hf.get("tie_word_embeddings", model_type == "llama")))
    kwargs = dict(
        model_type=model_type,
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or hidden // num_heads),
        rope_theta=rope_theta,
        rope_scaling=tuple(sorted(rope.items())) or None,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=tied,
        # Qwen2 always has q/k/v bias; Llama and Qwen3 only when attention_bias is set.
        qkv_bias=qwen2_family or bool(hf.get("attention_bias", False)),
        # Llama's and Qwen3's attention_bias also biases o_proj; Qwen2's o_proj has none.
        o_bias=not qwen2_family and bool(hf.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=(tuple(hf["eos_token_id"]) if isinstance(hf.get("eos_token_id"), list)
                      else hf.get("eos_token_id")),
        pad_token_id=hf.get("pad_token_id"),
    )
    if vision_language:
      if "vision_config" not in outer:
        raise KeyError(f"{source}: missing required key 'vision_config' for model_type "
                       f"{model_type!r}")
      kwargs.update(vision=VisionConfig.from_hf_dict(outer),
                    mrope_section=mrope_section_from_hf(outer),
                    **{key: outer.get(key) for key in (
                        "image_token_id", "video_token_id", "vision_start_token_id",
                        "vision_end_token_id")})
    if model_type == "llama" and hf.get("mlp_bias"):
      raise ValueError(f"{source}: mlp_bias=true is not supported")
    kwargs.update(overrides)
    return cls(**kwargs)

  @classmethod
  def from_hf_file(cls, path: str | os.PathLike, **overrides) -> ModelConfig:
    path = os.fspath(path)
    if os.path.isdir(path):
      path = os.path.join(path, "config.json")
    if not os.path.exists(path):
      raise FileNotFoundError(f"model config not found: {path}")
    with open(path) as f:
      try:
        hf = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    return cls.from_hf_dict(hf, source=path, **overrides)

  def to_hf_dict(self) -> dict[str, Any]:
    """The HF `config.json` dict that transformers loads into the same architecture."""
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
            "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}[self.model_type]
    rope = {"rope_type": "default", **self.rope_scaling_dict, "rope_theta": self.rope_theta}
    hf = {
        "architectures": [arch],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rope_theta": self.rope_theta,
        "rope_scaling": None if not self.rope_scaling else self.rope_scaling_dict,
        "rope_parameters": rope,
        "rms_norm_eps": self.rms_norm_eps,
        "tie_word_embeddings": self.tie_word_embeddings,
        "max_position_embeddings": self.max_position_embeddings,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": (list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
                         else self.eos_token_id),
        "pad_token_id": self.pad_token_id,
        "torch_dtype": self.param_dtype,
    }
    if self.model_type == "llama":
      hf["attention_bias"] = self.qkv_bias
      hf["mlp_bias"] = False
    if self.model_type == "qwen3":
      hf["attention_bias"] = self.qkv_bias
    if self.model_type in VISION_LANGUAGE_TYPES:
      return self._vision_language_hf_dict(hf)
    return hf

  def _vision_language_hf_dict(self, text: dict[str, Any]) -> dict[str, Any]:
    """transformers 5's layout of a Qwen2.5-VL config.json: the text model's fields in
    "text_config" (with `mrope_section` in its rope parameters), the tower's in
    "vision_config", the token ids and the tied head at the top level."""
    outer_keys = ("architectures", "model_type", "tie_word_embeddings", "torch_dtype")
    text = {k: v for k, v in text.items()
            if k not in outer_keys + ("rope_scaling", "rope_theta")}
    text.update(model_type="qwen2_5_vl_text",
                rope_parameters={**text["rope_parameters"],
                                 "mrope_section": list(self.mrope_section)})
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": self.model_type,
        "text_config": text,
        "vision_config": self.vision.to_hf_dict(),
        "image_token_id": self.image_token_id,
        "video_token_id": self.video_token_id,
        "vision_start_token_id": self.vision_start_token_id,
        "vision_end_token_id": self.vision_end_token_id,
        "tie_word_embeddings": self.tie_word_embeddings,
        "torch_dtype": self.param_dtype,
    }
