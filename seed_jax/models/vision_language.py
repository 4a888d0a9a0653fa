"""Qwen2.5-VL (`model_type` "qwen2_5_vl"): the vision tower + the Qwen2 text decoder.

A prompt holds each image as `<|vision_start|>`, then one `<|image_pad|>`
(`cfg.image_token_id`) per token the tower makes of it (`image_token_counts`), then
`<|vision_end|>`. The forward embeds the tokens, puts the tower's output rows in place of
the placeholders (in order: row 0's images first), and runs the text model with
multimodal RoPE: positions `[3, B, T]` from `multimodal_positions` (host-side, as the
image positions depend on the data). Text after an image continues from the image's
positions, so the sequence's positions end `rope_deltas` away from its token count; a
decoded token sits at `real index + rope_deltas` on all three axes, where M-RoPE equals
plain RoPE, so decoding feeds ordinary `[B, 1]` positions.

`VisionLanguageModel` exposes the text model's interface (`__call__`, `forward_with_cache`,
`unembed`, `cfg`) with optional `images` (`ImageInputs`: the batch's patches and static
grids); without images it is exactly the text model (positions `[B, T]` or `[3, B, T]`).

Host side: `multimodal_positions` (positions and deltas, checking that image tokens and
grids agree), `expand_image_tokens` and `chat_prompt_with_images` (prompts as transformers'
Qwen2.5-VL processor builds them), `concat_image_inputs` (per-prompt images -> a batch's).
Weights: `seed_jax.models.weights.load_vision_language_params` (the checkpoint's `visual.*`
tensors to the tower, the rest to the text model) and `export_hf`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seed_jax.models.config import ModelConfig
from seed_jax.models.transformer import KVCache, Transformer
from seed_jax.models.vision.image_processor import ImageProcessorConfig, preprocess_images
from seed_jax.models.vision.mrope import mrope_position_ids
from seed_jax.models.vision.tower import Grid, VisionTower, as_grids, image_token_counts


@dataclasses.dataclass(frozen=True)
class ImageInputs:
  """The images of a request or a batch, as the tower reads them.

  pixel_values: `[N, C*T*P*P]` float32, every image's patches (`preprocess_images`),
    image after image in the order their placeholders appear (row 0's first).
  grids: `((t, h, w), ...)` in patches, one per image: static (a pytree's metadata), so
    each new set of grids compiles once.
  """

  pixel_values: jax.Array | np.ndarray
  grids: tuple[Grid, ...]

  def __post_init__(self):
    object.__setattr__(self, "grids", as_grids(self.grids))
    if not isinstance(self.pixel_values, (np.ndarray, jax.Array)):
      return  # a pytree of something else (abstract values, shardings)
    patches = sum(t * h * w for t, h, w in self.grids)
    if self.pixel_values.ndim != 2 or self.pixel_values.shape[0] != patches:
      raise ValueError(f"pixel_values has shape {np.shape(self.pixel_values)}; the grids "
                       f"{self.grids} need {patches} rows of patches")


jax.tree_util.register_dataclass(ImageInputs, data_fields=["pixel_values"],
                                 meta_fields=["grids"])


def concat_image_inputs(per_prompt: Sequence[ImageInputs | None]) -> ImageInputs | None:
  """One `ImageInputs` for a batch from each prompt's (None: a prompt without images), in
  prompt order; None when no prompt has images."""
  present = [images for images in per_prompt if images is not None and images.grids]
  if not present:
    return None
  return ImageInputs(np.concatenate([np.asarray(i.pixel_values, np.float32) for i in present]),
                     tuple(g for i in present for g in i.grids))


def scatter_image_rows(embeddings: jax.Array, is_image: jax.Array, image_rows: jax.Array
                       ) -> jax.Array:
  """The `k`-th placeholder (row-major over the batch) replaced by `image_rows[k]`.

  Args:
    embeddings: `[B, T, E]`. is_image: `[B, T]` bool. image_rows: `[N, E]`, with N the
      number of placeholders (`multimodal_positions` checks it on the host).
  Returns:
    `[B, T, E]`. A gather rather than a scatter: its gradient flows back to `image_rows`
    (a scatter-add) and every shape is static.
  """
  index = jnp.cumsum(is_image.reshape(-1)) - 1
  gathered = image_rows[jnp.clip(index, 0, image_rows.shape[0] - 1)]
  return jnp.where(is_image[..., None], gathered.reshape(embeddings.shape), embeddings)


def scatter_row_images(embeddings: jax.Array, is_image: jax.Array, row_images: jax.Array
                       ) -> jax.Array:
  """Each row's `k`-th placeholder replaced by `row_images[row, k]`: one image per row
  (the train step's turn rows), so every row reads only its own image rows and the
  scatter stays local to a batch shard.

  Args:
    embeddings: `[B, T, E]`. is_image: `[B, T]` bool, each row holding n placeholders or
      none (a padding row). row_images: `[B, n, E]`.
  Returns:
    `[B, T, E]`.
  """
  index = jnp.clip(jnp.cumsum(is_image, axis=1) - 1, 0, row_images.shape[1] - 1)  # [B, T]
  gathered = jnp.take_along_axis(row_images, index[..., None], axis=1)
  return jnp.where(is_image[..., None], gathered.astype(embeddings.dtype), embeddings)


def encode_each(tower: VisionTower, patches: jax.Array, grid: Grid) -> jax.Array:
  """`[k, t*h*w, D]` patches of k images of one grid -> `[k, t*h*w / 4, E]`, each image
  through the tower alone (vmapped)."""
  graphdef, state = nnx.split(tower)
  return jax.vmap(lambda p: nnx.merge(graphdef, state)(p, (grid,)))(patches)


class VisionLanguageModel(nnx.Module):
  """Qwen2.5-VL: `tower` (a `VisionTower`) and `text` (the `Transformer` decoder, whose
  attention applies M-RoPE for `[3, B, T]` positions). `cfg` is the text model's config,
  with `cfg.vision` the tower's: code written for a `Transformer` (samplers, train steps)
  runs unchanged on text-only input.

  Parts not given are initialised randomly from `rngs` (loading passes both).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs | None = None,
               text: Transformer | None = None, tower: VisionTower | None = None):
    if cfg.vision is None:
      raise ValueError(f"model_type {cfg.model_type!r} has no vision tower; use Transformer")
    self.cfg = cfg
    self.tower = tower if tower is not None else VisionTower(cfg.vision, rngs=rngs)
    self.text = text if text is not None else Transformer(cfg, rngs=rngs)

  def embed(self, tokens: jax.Array, images: ImageInputs | None = None,
            row_images: jax.Array | None = None) -> jax.Array:
    """`[B, T]` ids -> `[B, T, E]` input embeddings: the token embeddings, with image rows
    in place of the `cfg.image_token_id` placeholders: the tower's rows for `images` (any
    images, in placeholder order over the batch), or `row_images` `[B, n, E]`
    (`encode_row_images`: one image per row, already encoded)."""
    x = self.text.embed_tokens(tokens)
    is_image = tokens == self.cfg.image_token_id
    if row_images is not None:
      return scatter_row_images(x, is_image, row_images)
    if images is None:
      return x
    return scatter_image_rows(x, is_image, self.encode_images(images).astype(x.dtype))

  def encode_images(self, images: ImageInputs) -> jax.Array:
    """`[N / 4, E]` the tower's rows of every image, image after image. Each image is
    encoded on its own, those of one grid together (`_encode_each`): the tower's attention
    is dense over the patches it is given, so encoding a batch's images as one sequence
    would cost the square of the whole batch's patches (at 128 prompts of 324 patches, a
    `[16, 41472, 41472]` score tensor)."""
    pixels = jnp.asarray(images.pixel_values)
    starts = np.cumsum([0] + [t * h * w for t, h, w in images.grids])
    encoded = [None] * len(images.grids)
    for grid in dict.fromkeys(images.grids):
      index = [i for i, g in enumerate(images.grids) if g == grid]
      rows = self._encode_each(jnp.stack([pixels[starts[i]:starts[i + 1]] for i in index]),
                               grid)
      for k, i in enumerate(index):
        encoded[i] = rows[k]
    return jnp.concatenate(encoded)

  def encode_row_images(self, patches: jax.Array) -> jax.Array:
    """The tower over one image per row (the train step's turn rows).

    Args:
      patches: `[B, h, w, C*T*P*P]` every row's image patches in the processor's order,
        held `[h, w]` so that the shape is the grid `(1, h, w)`.
    Returns:
      `[B, h * w / merge^2, E]` in the compute dtype.
    """
    batch, h, w, dim = patches.shape
    return self._encode_each(patches.reshape(batch, h * w, dim), (1, h, w))

  def _encode_each(self, patches: jax.Array, grid: Grid) -> jax.Array:
    return encode_each(self.tower, patches, grid)

  def __call__(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
               images: ImageInputs | None = None, row_images: jax.Array | None = None
               ) -> jax.Array:
    """`Transformer.__call__` with images in the prompts (`embed`): positions
    `[3, B, T]` from `multimodal_positions` then (`[B, T]` is fine for text-only rows).
    -> `[B, T, E]`."""
    return self.text.forward_embeddings(self.embed(tokens, images, row_images), positions,
                                        attention_mask)[0]

  def forward_with_cache(self, tokens: jax.Array, positions: jax.Array, kv_mask: jax.Array,
                         cache: KVCache, cache_index: jax.Array | int,
                         images: ImageInputs | None = None) -> tuple[jax.Array, KVCache]:
    """`Transformer.forward_with_cache` with `images` (a prefill's; positions `[3, B, T]`).
    Decode steps feed `[B, 1]` positions continuing at `real tokens + rope_deltas`."""
    return self.text.forward_embeddings(self.embed(tokens, images), positions, kv_mask,
                                        cache, cache_index)

  def unembed(self, hidden: jax.Array) -> jax.Array:
    return self.text.unembed(hidden)


def build_model(cfg: ModelConfig, rngs: nnx.Rngs) -> Transformer | VisionLanguageModel:
  """The model `cfg` describes: a `VisionLanguageModel` when it has a vision tower."""
  if cfg.vision is not None:
    return VisionLanguageModel(cfg, rngs=rngs)
  return Transformer(cfg, rngs=rngs)


# -- host side: prompts and positions ------------------------------------------------------


def multimodal_positions(cfg: ModelConfig, tokens: np.ndarray, attention_mask: np.ndarray,
                         images: ImageInputs | None) -> tuple[np.ndarray, np.ndarray]:
  """M-RoPE positions of a batch of prompts and their images.

  Args:
    tokens: `[B, T]` ids (left or right padded). attention_mask: `[B, T]`, True/1 at real
      tokens. images: the batch's (`concat_image_inputs`), or None.
  Returns:
    positions: `[3, B, T]` int32 (padding slots 0).
    rope_deltas: `[B]` int32: the token at real index `i` after the prompt sits at
      position `i + rope_deltas` (0 for a text-only row).
  Raises:
    ValueError: the image tokens and the grids disagree (count, or an image's tokens not
      consecutive), naming the row.
  """
  tokens = np.asarray(tokens)
  grids = images.grids if images is not None else ()
  counts = image_token_counts(grids, cfg.vision.spatial_merge_size) if grids else []
  placeholders = int(np.sum(tokens == cfg.image_token_id))
  if placeholders != sum(counts):
    raise ValueError(f"the prompts hold {placeholders} image tokens (id {cfg.image_token_id}) "
                     f"but the images' grids {grids} make {sum(counts)} ({counts} per image)")
  positions, deltas = mrope_position_ids(
      tokens, attention_mask, grids or None, image_token_id=cfg.image_token_id,
      spatial_merge_size=cfg.vision.spatial_merge_size)
  return positions.astype(np.int32), deltas[:, 0].astype(np.int32)


def expand_image_tokens(ids: Sequence[int], counts: Sequence[int], image_token_id: int
                        ) -> list[int]:
  """`ids` with the `k`-th `image_token_id` repeated `counts[k]` times: a chat template
  renders one placeholder per image, the tower makes `counts[k]` tokens of it (what
  transformers' processor does to the text)."""
  ids = list(ids)
  found = ids.count(image_token_id)
  if found != len(counts):
    raise ValueError(f"the prompt has {found} image placeholders (id {image_token_id}) for "
                     f"{len(counts)} image(s)")
  out, k = [], 0
  for token in ids:
    if token == image_token_id:
      out.extend([token] * counts[k])
      k += 1
    else:
      out.append(token)
  return out


def chat_ids_with_images(tokenizer, cfg: ModelConfig, parts: Sequence[str | ImageInputs],
                         system: str | None = None) -> list[int]:
  """One user message of `parts` (text and images, in order) in the tokenizer's chat
  template with the generation prompt, each image's placeholder repeated for the tokens
  the tower makes of it: what transformers' Qwen2.5-VL processor builds from the content
  items `{"type": "text", ...}` / `{"type": "image"}`. `system`: a system message first.

  Args:
    tokenizer: a `seed_jax.models.tokenizer.Tokenizer` whose template renders an image
      content item as `<|vision_start|><|image_pad|><|vision_end|>` (Qwen2-VL's does).
    parts: strings and `ImageInputs` of one image each (`preprocess_images`).
  """
  content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"}
             for p in parts]
  messages = [{"role": "user", "content": content}]
  if system is not None:
    messages.insert(0, {"role": "system", "content": system})
  counts = [n for p in parts if not isinstance(p, str)
            for n in image_token_counts(p.grids, cfg.vision.spatial_merge_size)]
  return expand_image_tokens(tokenizer.encode(tokenizer.apply_chat_template(messages)), counts,
                             cfg.image_token_id)


def chat_prompt_with_images(tokenizer, cfg: ModelConfig, processor: ImageProcessorConfig,
                            images: Sequence, text: str) -> tuple[list[int], ImageInputs]:
  """One user message holding `images` then `text` (`chat_ids_with_images`).

  Args:
    images: PIL images or uint8 arrays `[H, W, 3]`, sized by `processor`.
  Returns:
    (prompt ids, the prompt's `ImageInputs`; None without images).
  """
  each = [ImageInputs(*preprocess_images([image], processor)) for image in images]
  return chat_ids_with_images(tokenizer, cfg, [*each, text]), concat_image_inputs(each)
