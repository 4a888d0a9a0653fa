"""The host-side Sampler: buckets, compiled-function caches, stop tables and output assembly.

One Sampler serves acting and analysis from the same parameters; `update_params` swaps in
each RL iteration's parameters without recompiling (same shapes, dtypes and shardings).

Shapes that reach the compiler are bucketed: the prompt length P (powers of two by
default), the prompt batch Bp (powers of two), the output buffer N (max_new_tokens rounded
up to a power of two) and the stop-table rows (multiples of 32); the decode batch is
`max(2, Bp * num_samples)` (a one-row bf16 matmul is pathologically slow on XLA:CPU). The
cache length is `min(P + N, max_cache_len)`. On one device the prefill runs ~1k prompt
tokens at a time (a `lax.map` over prompt chunks), which XLA:CPU runs ~2x faster.
Sampling values (temperature, top_p, max_new_tokens, eos ids, the stop strings' table) are
traced, so they never recompile; only whether top-k / top-p filtering runs at all, and k,
are static.

Images (a `VisionLanguageModel`): each prompt may come with its `ImageInputs`
(`seed_jax.models.vision_language`), its placeholders already expanded in its ids. A request
with any image prefills in one pass with M-RoPE positions (replicated on a mesh), and
decoding continues each row from its `rope_deltas`; each new set of image grids (the
request's images, in order) compiles its own prefill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seed_jax.models.config import ModelConfig
from seed_jax.models.vision_language import (ImageInputs, concat_image_inputs,
                                             multimodal_positions)
from seed_jax.parallel import hosts
from seed_jax.parallel.mesh import as_logical_mesh, shard_params
from seed_jax.sampling import engine, stops

_MAX_EOS_IDS = 8  # eos ids are padded to this many (-1 never matches a token)
_PREFILL_TOKENS = 1024  # prompt tokens per prefill chunk (rows = this // prompt bucket)
_MAX_BANNED_IDS = 4  # a VLM's vision tokens: image, video, vision start and end
_KNOBS = ("temperature", "top_p", "max_new", "eos_ids", "banned_ids", "stop_table",
          "stop_match")
_REPLICATED_INPUTS = frozenset(_KNOBS)  # the same for every row


def _padded_ids(ids: tuple[int, ...], width: int, what: str) -> np.ndarray:
  """int32 `[width]`: `ids`, then -1 (no token's id: never matches). A fixed width keeps
  one compiled program for every set of ids."""
  if len(ids) > width:
    raise ValueError(f"at most {width} {what}, got {len(ids)}")
  return np.asarray(tuple(ids) + (-1,) * (width - len(ids)), np.int32)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to sample. temperature 0 is greedy; top_k 0 and top_p 1.0 disable filtering.

  stop_strings end a row once its generated text contains one (kept in text and tokens);
  stop_token_ids end it like end-of-sequence ids (which always stop unless ignore_eos).
  num_samples rows are drawn per prompt, returned consecutively (prompt i's samples are
  rows i*N .. i*N+N-1).
  """

  max_new_tokens: int = 128
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  stop_strings: tuple[str, ...] = ()
  stop_token_ids: tuple[int, ...] = ()
  ignore_eos: bool = False
  num_samples: int = 1

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0 or self.num_samples < 1:
      raise ValueError(f"need top_k >= 0 and num_samples >= 1, got {self.top_k}, "
                       f"{self.num_samples}")
    if isinstance(self.stop_strings, str):
      raise TypeError("stop_strings must be a tuple of strings, not one string")


@dataclasses.dataclass
class SampleOutput:
  """Per generated row (prompt i's samples are rows i*N .. i*N+N-1).

  tokens: generated ids, excluding the prompt, including the eos / stop-string tokens.
  logprobs: float32 `[len]` each, `log_softmax(raw logits)` of the sampled token at
    temperature 1 without top-k/top-p: exactly what the training forward computes (the
    PPO "old" log-probs).
  texts: the tokens decoded without special tokens, cut right after the first stop string
    (None without a tokenizer).
  prompt_index: the prompt each row continues.
  stop_reasons: "eos" | "stop_string" | "max_tokens".
  """

  tokens: list[list[int]]
  logprobs: list[np.ndarray]
  lengths: list[int]
  stop_reasons: list[str]
  texts: list[str] | None = None
  prompt_index: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class LoweredRequest:
  """`Sampler.lower`'s result: the request's padded sizes (prompt_len, batch, cache_len,
  max_new_bucket, decode_rows, ...), its lowered prefill, and `lower_decode(compiled
  prefill)`, since the decode program takes the prefill's output shardings."""
  shapes: dict[str, Any]
  prefill: jax.stages.Lowered
  lower_decode: Callable[[jax.stages.Compiled], jax.stages.Lowered]


def round_up(value: int, buckets: Sequence[int] | None, what: str) -> int:
  """The smallest bucket >= value (powers of two when buckets is None)."""
  if buckets is None:
    return 1 << max(0, math.ceil(math.log2(max(value, 1))))
  for bucket in sorted(buckets):
    if bucket >= value:
      return bucket
  raise ValueError(f"{what} {value} exceeds the largest bucket {max(buckets)}")


class Sampler:
  """Jitted KV-cache generation (see the module docstring for shapes and buckets).

  Args:
    graphdef, params: `nnx.split(model)` of a `Transformer`.
    cfg: the model's config (eos ids when no tokenizer, vocabulary size).
    tokenizer: optional; gives texts, eos ids and stop-string tables.
    mesh: optional `LogicalMesh` (or plain Mesh: the active rules); params, batch rows
      and the cache are placed by its rules (by default rows over (data, fsdp), heads
      over tensor).
    max_cache_len: most slots a row's cache may hold (prompt bucket + new tokens).
    prompt_buckets / batch_buckets: sorted sizes; None means powers of two.
    cache_dtype: KV cache dtype; defaults to the model's compute dtype.
  """

  def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, cfg: ModelConfig,
               tokenizer=None, mesh=None, max_cache_len: int = 4096,
               prompt_buckets: Sequence[int] | None = None,
               batch_buckets: Sequence[int] | None = None, cache_dtype=None):
    self.graphdef, self.cfg, self.tokenizer = graphdef, cfg, tokenizer
    self.mesh = as_logical_mesh(mesh)
    self.max_cache_len = max_cache_len
    self.prompt_buckets = tuple(sorted(prompt_buckets)) if prompt_buckets else None
    self.batch_buckets = tuple(sorted(batch_buckets)) if batch_buckets else None
    self.cache_dtype = jnp.dtype(cache_dtype) if cache_dtype is not None else None
    self.params = None
    self.update_params(params)
    self._stop_tables: dict[tuple[str, ...], tuple[np.ndarray, int]] = {}
    self._token_texts: list[str] | None = None
    self._prefill = jax.jit(engine.prefill, static_argnums=(0,),
                            static_argnames=("cache_len", "max_new_bucket", "num_samples",
                                             "decode_rows", "prefill_rows", "cache_dtype",
                                             "top_k", "use_top_p"))
    self._decode = jax.jit(engine.decode, static_argnums=(0,),
                           static_argnames=("prompt_len", "top_k", "use_top_p"),
                           donate_argnums=(2,))

  @classmethod
  def from_model(cls, model, **kwargs) -> Sampler:
    graphdef, params = nnx.split(model)
    return cls(graphdef, params, model.cfg, **kwargs)

  def update_params(self, params: nnx.State) -> None:
    """Uses `params` from now on; same shapes/dtypes/shardings means no recompile.
    Abstract params (`jax.ShapeDtypeStruct`s, for `lower`) are kept as they are."""
    abstract = all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))
    if self.mesh is not None and not abstract:
      params = shard_params(params, self.mesh)
    self.params = params

  # -- host helpers --------------------------------------------------------------------

  def _eos_ids(self, sampling: SamplingParams) -> np.ndarray:
    ids = () if sampling.ignore_eos else tuple(
        getattr(self.tokenizer, "eos_ids", None) or self.cfg.eos_token_ids)
    ids = tuple(dict.fromkeys(ids + tuple(sampling.stop_token_ids)))
    return _padded_ids(ids, _MAX_EOS_IDS, "eos/stop token ids")

  def _banned_ids(self) -> np.ndarray:
    """The ids no response may hold, padded with -1: a vision-language model's vision
    tokens (`ModelConfig.vision_token_ids`). Sampled, an image placeholder would make the
    next read of the row expect one more image patch than its image has."""
    return _padded_ids(self.cfg.vision_token_ids, _MAX_BANNED_IDS, "vision token ids")

  def _stop_table(self, stop_strings: tuple[str, ...]) -> tuple[np.ndarray, int]:
    if stop_strings and self.tokenizer is None:
      raise ValueError("stop_strings need a tokenizer; pass stop_token_ids instead")
    if stop_strings not in self._stop_tables:
      if stop_strings:
        if self._token_texts is None:
          self._token_texts = stops.token_texts_of(self.tokenizer, self.cfg.vocab_size)
        table, match = stops.build_stop_table(stop_strings, self._token_texts)
      else:
        table, match = stops.no_stop_table(self.cfg.vocab_size)
      self._stop_tables[stop_strings] = (table, match)
    return self._stop_tables[stop_strings]

  def _sharding(self, array, replicate: bool) -> jax.sharding.Sharding | None:
    """Rows by the mesh's "batch" rule, unless replicated or not divisible."""
    if self.mesh is None:
      return None
    if replicate or np.shape(array)[0] % self.mesh.batch_shards:
      return self.mesh.replicated()
    return self.mesh.batch_sharding(np.ndim(array))

  def _replicated(self) -> jax.sharding.Sharding | None:
    return None if self.mesh is None else self.mesh.replicated()

  def _put(self, array, replicate: bool = False):
    sharding = self._sharding(array, replicate)
    return jnp.asarray(array) if sharding is None else hosts.put(array, sharding)

  def _abstract(self, array, replicate: bool = False) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(np.shape(array), np.asarray(array).dtype,
                                sharding=self._sharding(array, replicate))

  def _shapes(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> dict[str, int]:
    longest = max(len(p) for p in prompt_ids)
    if longest > self.max_cache_len:
      raise ValueError(f"a prompt of {longest} tokens does not fit the cache "
                       f"(max_cache_len={self.max_cache_len})")
    prompt_len = min(round_up(longest, self.prompt_buckets, "prompt length"),
                     self.max_cache_len)
    # A bucket that would leave fewer slots than max_new_tokens shrinks to the largest
    # prompt length that still leaves them, when the prompts fit: the budget is honoured.
    room = self.max_cache_len - sampling.max_new_tokens + 1
    if longest <= room < prompt_len:
      prompt_len = room
    batch = round_up(len(prompt_ids), self.batch_buckets, "number of prompts")
    if self.mesh is not None:  # keep the batch divisible by the batch-sharded axes
      shards = self.mesh.batch_shards
      batch = -(-batch // shards) * shards
    max_new_bucket = round_up(sampling.max_new_tokens, None, "max_new_tokens")
    cache_len = min(prompt_len + max_new_bucket, self.max_cache_len)
    # Token i is written at slot P + i when fed back; the last token is never fed.
    max_new_bucket = min(max_new_bucket, cache_len - prompt_len + 1)
    # Prefill ~1k tokens at a time on one device (see engine.prefill); whole on a mesh,
    # where the batch is already split over devices.
    prefill_rows = batch
    if self.mesh is None:
      prefill_rows = min(batch, max(1, _PREFILL_TOKENS // prompt_len))
      while batch % prefill_rows:
        prefill_rows -= 1
    return dict(prompt_len=prompt_len, batch=batch, cache_len=cache_len,
                max_new_bucket=max_new_bucket, prefill_rows=prefill_rows,
                decode_rows=max(2, batch * sampling.num_samples))

  # -- generation ----------------------------------------------------------------------

  def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams,
               seed: int = 0, images: Sequence[ImageInputs | None] | None = None
               ) -> SampleOutput:
    """Samples `sampling.num_samples` continuations of each prompt (see `SampleOutput`).

    A run is reproducible for a given seed and request (each row's random stream depends
    on the seed, its row index and the step, not on batch padding). A row gets its
    `max_new_tokens` whenever prompt plus budget fit `max_cache_len + 1`; a longer prompt
    gets `max_cache_len - prompt_bucket + 1`, then stops as "max_tokens".

    Args:
      prompt_ids: token ids per prompt (at least one each, at most `max_cache_len`).
      sampling: see `SamplingParams`.
      seed: the PRNG seed (unused when greedy).
      images: per prompt its `ImageInputs` or None (a vision-language model only); a
        prompt's ids hold each image's placeholders (`chat_prompt_with_images`).
    """
    prompt_ids = [list(map(int, p)) for p in prompt_ids]
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
      raise ValueError("every prompt needs at least one token")
    arrays, static = self._request(prompt_ids, sampling, images)
    vision = arrays.pop("vision", None)
    placed = {k: self._put(v, replicate=k in _REPLICATED_INPUTS) for k, v in arrays.items()}
    if vision is not None:
      placed["vision"] = jax.tree.map(lambda a: self._put(a, replicate=True), vision)
    with self._mesh_context():
      state = self._prefill(self.graphdef, self.params,
                            *self._prefill_args(placed, jax.random.key(seed)),
                            **static["prefill"])
      state = self._decode(self.graphdef, self.params, state, self._knobs(placed),
                           **static["decode"])
      fetched = hosts.fetch({k: state[k] for k in
                             ("tokens", "logprobs", "lengths", "stop_reason")})
    return self._assemble(fetched, len(prompt_ids) * sampling.num_samples, sampling)

  def lower(self, num_prompts: int, prompt_len: int, sampling: SamplingParams,
            image_grid: tuple[int, int, int] | None = None) -> LoweredRequest:
    """The programs of a request of `num_prompts` prompts of `prompt_len` tokens, lowered
    without running (`seed_jax.plan` compiles them for a TPU slice). Parameters may be
    abstract (`jax.ShapeDtypeStruct`s with shardings). With `image_grid` (a
    vision-language model's), every prompt holds one image of that grid (t, h, w)."""
    prompts, images = [[0] * prompt_len] * num_prompts, None
    if image_grid is not None:
      t, h, w = image_grid
      tokens = t * h * w // self.cfg.vision.spatial_merge_size ** 2
      prompts = [[0] * (prompt_len - tokens) + [self.cfg.image_token_id] * tokens] * num_prompts
      one = ImageInputs(np.zeros((t * h * w, self.cfg.vision.patch_dim), np.float32),
                        (image_grid,))
      images = [one] * num_prompts
    arrays, static = self._request(prompts, sampling, images)
    vision = arrays.pop("vision", None)
    abstract = {k: self._abstract(v, replicate=k in _REPLICATED_INPUTS)
                for k, v in arrays.items()}
    if vision is not None:
      abstract["vision"] = jax.tree.map(lambda a: self._abstract(a, replicate=True), vision)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=self._replicated())
    with self._mesh_context():
      prefill = self._prefill.lower(self.graphdef, self.params,
                                    *self._prefill_args(abstract, key), **static["prefill"])

    def lower_decode(compiled_prefill: jax.stages.Compiled) -> jax.stages.Lowered:
      state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                           prefill.out_info, compiled_prefill.output_shardings)
      with self._mesh_context():
        return self._decode.lower(self.graphdef, self.params, state, self._knobs(abstract),
                                  **static["decode"])

    shapes = dict(static["prefill"], prompt_len=static["decode"]["prompt_len"],
                  batch=arrays["tokens"].shape[0])
    return LoweredRequest(shapes, prefill, lower_decode)

  def _request(self, prompt_ids: list[list[int]], sampling: SamplingParams,
               images: Sequence[ImageInputs | None] | None = None
               ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The host arrays of one request (padded prompts, sampling knobs and, with images,
    "vision": the prefill's `vision` argument) and the static arguments of its prefill and
    decode programs."""
    shapes = self._shapes(prompt_ids, sampling)
    p_len, batch = shapes["prompt_len"], shapes["batch"]
    tokens, mask = self.left_padded(prompt_ids, batch, p_len)
    valid = np.arange(batch) < len(prompt_ids)
    arrays = dict(tokens=tokens, mask=mask, valid=valid,
                  **self.knob_arrays(sampling, shapes["max_new_bucket"]))
    batch_images = self._batch_images(prompt_ids, images)
    if batch_images is not None:
      positions, rope_deltas = multimodal_positions(self.cfg, tokens, mask, batch_images)
      arrays["vision"] = dict(images=batch_images, positions=positions,
                              rope_deltas=rope_deltas)
    filtering = dict(top_k=sampling.top_k, use_top_p=sampling.top_p < 1.0)
    static = dict(
        prefill=dict(cache_len=shapes["cache_len"], max_new_bucket=shapes["max_new_bucket"],
                     num_samples=sampling.num_samples, decode_rows=shapes["decode_rows"],
                     prefill_rows=shapes["prefill_rows"], cache_dtype=self.cache_dtype,
                     **filtering),
        decode=dict(prompt_len=p_len, **filtering))
    return arrays, static

  def _batch_images(self, prompt_ids: list[list[int]],
                    images: Sequence[ImageInputs | None] | None) -> ImageInputs | None:
    """The request's images as one `ImageInputs` (None without any), checked against the
    model and the prompts."""
    if images is None or all(i is None for i in images):
      image_id = self.cfg.image_token_id
      if image_id is not None and any(image_id in p for p in prompt_ids):
        raise ValueError(f"the prompts hold image tokens (id {image_id}) but no images were "
                         f"given (Sampler.generate's images)")
      return None
    if len(images) != len(prompt_ids):
      raise ValueError(f"images: {len(images)} entries for {len(prompt_ids)} prompts "
                       f"(one ImageInputs or None per prompt)")
    batch_images = concat_image_inputs(images)
    if batch_images is None:
      return None
    if self.cfg.vision is None:
      raise ValueError(f"images given, but the model ({self.cfg.model_type}) has no vision "
                       f"tower")
    return batch_images

  def left_padded(self, prompt_ids: Sequence[Sequence[int]], rows: int, prompt_len: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """`(tokens, mask)` `[rows, prompt_len]`: each prompt's last `prompt_len` ids at the
    right end; rows past the prompts (padding) hold one masked-in token, so that no row
    attends to nothing."""
    pad_id = self.cfg.pad_token_id if self.cfg.pad_token_id is not None else 0
    tokens = np.full((rows, prompt_len), pad_id, np.int32)
    mask = np.zeros((rows, prompt_len), bool)
    for i, prompt in enumerate(prompt_ids):
      prompt = list(prompt)[-prompt_len:]
      tokens[i, prompt_len - len(prompt):] = prompt
      mask[i, prompt_len - len(prompt):] = True
    mask[len(prompt_ids):, -1] = True
    return tokens, mask

  def knob_arrays(self, sampling: SamplingParams, max_new_bucket: int
                  ) -> dict[str, np.ndarray]:
    """The traced sampling settings of `engine` (`_KNOBS`) as host arrays."""
    stop_table, stop_match = self._stop_table(tuple(sampling.stop_strings))
    return dict(temperature=np.float32(sampling.temperature),
                top_p=np.float32(sampling.top_p),
                max_new=np.int32(min(sampling.max_new_tokens, max_new_bucket)),
                eos_ids=self._eos_ids(sampling), banned_ids=self._banned_ids(),
                stop_table=stop_table,
                stop_match=np.int32(stop_match))

  @staticmethod
  def _knobs(arrays: dict[str, Any]) -> dict[str, Any]:
    return {k: arrays[k] for k in _KNOBS}

  def _prefill_args(self, arrays: dict[str, Any], key) -> tuple:
    return (arrays["tokens"], arrays["mask"], arrays["valid"], key, self._knobs(arrays),
            arrays.get("vision"))

  def _mesh_context(self):
    if self.mesh is None:
      return contextlib.nullcontext()
    return self.mesh.activate()

  def _assemble(self, fetched: dict[str, np.ndarray], rows: int,
                sampling: SamplingParams) -> SampleOutput:
    out = SampleOutput(tokens=[], logprobs=[], lengths=[], stop_reasons=[],
                       texts=[] if self.tokenizer is not None else None,
                       prompt_index=[r // sampling.num_samples for r in range(rows)])
    for r in range(rows):
      row_tokens, logprobs, reason, text = self.finish_row(
          fetched["tokens"][r], fetched["logprobs"][r], int(fetched["lengths"][r]),
          int(fetched["stop_reason"][r]), sampling)
      if out.texts is not None:
        out.texts.append(text)
      out.tokens.append(row_tokens)
      out.logprobs.append(logprobs)
      out.lengths.append(len(row_tokens))
      out.stop_reasons.append(reason)
    return out

  def finish_row(self, tokens: np.ndarray, logprobs: np.ndarray, length: int,
                 stop_reason: int, sampling: SamplingParams
                 ) -> tuple[list[int], np.ndarray, str, str | None]:
    """One row's `(tokens, log-probs, stop reason, text)` from its buffers: cut at its
    length, then (with a tokenizer) after the first stop string its text contains."""
    row_tokens = tokens[:length].tolist()
    reason, text = engine.REASON_NAMES[stop_reason], None
    if self.tokenizer is not None:
      row_tokens, text, found = stops.truncate_at_stop(row_tokens, self._decode_text,
                                                       sampling.stop_strings)
      if found:
        reason = "stop_string"
    return row_tokens, np.asarray(logprobs[:len(row_tokens)], np.float32), reason, text

  def _decode_text(self, ids: list[int]) -> str:
    return self.tokenizer.decode(ids, skip_special_tokens=True)

  def generate_text(self, prompts: Sequence[str | Sequence[dict[str, str]]],
                    sampling: SamplingParams, seed: int = 0) -> SampleOutput:
    """Text in, text out (needs a tokenizer): a prompt is a string, used as is, or a list
    of chat messages `{"role", "content"}`, rendered with the chat template and the
    generation prompt. This is what `python -m seed_jax.generate` calls."""
    if self.tokenizer is None:
      raise ValueError("generate_text needs a tokenizer")
    texts = [p if isinstance(p, str) else
             self.tokenizer.apply_chat_template(list(p), add_generation_prompt=True)
             for p in prompts]
    return self.generate([self.tokenizer.encode(t) for t in texts], sampling, seed)


def sampler_for(name_or_path: str, *, dtype: str = "bfloat16", mesh=None,
                **sampler_kwargs) -> Sampler:
  """A Sampler over `seed_jax.models.loader.load_model(name_or_path)` with its tokenizer.

  bfloat16 (weights, activations and cache; float32 accumulation, logits and softmax) is
  the fast choice on CPU and TPU; use "float32" when log-probs must match a float32
  training forward to 1e-4.
  """
  from seed_jax.models.loader import load_model  # pylint: disable=import-outside-toplevel
  model, tokenizer = load_model(name_or_path, dtype=dtype, mesh=mesh)
  return Sampler.from_model(model, tokenizer=tokenizer, mesh=mesh, **sampler_kwargs)
