"""Model FLOPs from a config's shape: the one count that `seed_jax.plan` and the benchmarks
use for step-time estimates and for the fraction of peak (MFU).

XLA's `cost_analysis` is no substitute: it counts the body of a `lax.scan` once, so a
model whose layers are scanned reports a layer's FLOPs, not the model's.
"""

from __future__ import annotations

from seed_jax.models.config import ModelConfig, VisionConfig


def matmul_params(cfg: ModelConfig) -> int:
  """Weights of the layers' matmuls (embedding lookups and norms excluded)."""
  d, heads, kv, hd, inter = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                             cfg.intermediate_size)
  per_layer = d * heads * hd * 2 + d * kv * hd * 2 + 3 * d * inter
  return cfg.num_layers * per_layer


def attention_flops(cfg: ModelConfig, rows: int, length: int,
                    context: int | None = None) -> float:
  """Attention's QK^T and PV over `rows` x `length` tokens: over the causal half of the
  `[T, T]` scores, or, with `context` (decoding), over `context` cached slots for each of
  the `length` tokens."""
  attn_width = cfg.num_layers * cfg.num_heads * cfg.head_dim
  return rows * (2 * attn_width * length * length if context is None
                 else 4 * attn_width * length * context)


def forward_flops(cfg: ModelConfig, rows: int, length: int, unembedded: int,
                  context: int | None = None) -> float:
  """One forward pass of `rows` x `length` tokens, unembedding `unembedded` positions per
  row (the LM head): the projections, the LM head and `attention_flops`."""
  return (rows * (2 * matmul_params(cfg) * length
                  + 2 * cfg.hidden_size * cfg.vocab_size * unembedded)
          + attention_flops(cfg, rows, length, context))


def training_flops(cfg: ModelConfig, rows: int, length: int, unembedded: int
                   ) -> tuple[float, float]:
  """(model FLOPs, hardware FLOPs) of forward + backward (1 + 2 forwards: the gradients of
  the activations and of the weights). With LoRA (`cfg.lora_rank`) the frozen base's weight
  gradients are not computed (the adapters' own FLOPs, rank / width of the base's, are left
  out). The hardware count adds what the backward pass recomputes (`cfg.remat`): the whole
  forward under "full", attention's scores and mixing (`QK^T`, `PV`) under "projections",
  nothing under "none"; MFU is quoted from the model count."""
  forward = forward_flops(cfg, rows, length, unembedded)
  weight_grads = (rows * (2 * matmul_params(cfg) * length
                          + 2 * cfg.hidden_size * cfg.vocab_size * unembedded)
                  if cfg.lora_rank else 0)
  model = 3 * forward - weight_grads
  recomputed = {"full": forward, "projections": attention_flops(cfg, rows, length),
                "none": 0}[cfg.remat]
  return model, model + recomputed


def vision_forward_flops(vision: VisionConfig, images: int, patches: int) -> float:
  """One pass of the vision tower over `images` images of `patches` patches each: the patch
  embedding, every block's matmuls (fused qkv, output, gated MLP), attention within
  windows (`window_size`) or, in `fullatt_block_indexes`, over the whole image, and the
  merger (4 patches -> 1 token, two linears)."""
  h, inter, depth = vision.hidden_size, vision.intermediate_size, vision.depth
  window = min(patches, (vision.window_size // vision.patch_size) ** 2)
  full = len(vision.fullatt_block_indexes)
  per_patch = (2 * vision.patch_dim * h
               + depth * 2 * (4 * h * h + 3 * h * inter)
               + 4 * h * (window * (depth - full) + patches * full)
               # merger: [4h] -> [4h] -> [out] per merged token, a quarter of it per patch
               + 2 * (vision.merge_unit * h) * (vision.merge_unit * h + vision.out_hidden_size)
               / vision.merge_unit)
  return float(images * patches * per_patch)
