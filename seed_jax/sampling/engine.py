"""Prefill and decode as pure functions over pytrees (the Sampler jits them).

Layout. Prompts are left-padded to `P` (a bucket) so the last prompt token of every row sits
at slot `P - 1`; positions come from the mask (`cumsum(mask) - 1`), as in the training
forward. The cache holds `S` slots: prompt slots `[0, P)` and generated token `i` (0-based)
at slot `P + i`, written when it is fed back to produce token `i + 1`. `kv_mask [R, S]`
marks slots that hold real tokens.

Fan-out. `prefill` runs once per distinct prompt (`[Bp, P]`) and then repeats rows of the
cache so that decode row `r` starts from prompt `r // num_samples` (a GRPO group shares one
prefill, as in levanter; rows at or past `Bp * num_samples` are padding, done from the
start). Sampling the first token happens after the fan-out, with per-row keys, so the N
samples of a group diverge from their first token.

Decode is one `lax.while_loop` that feeds the last token, samples the next and stops when
every row is done or `max_new` tokens were drawn. Its state (cache included) is donated.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from seed_jax.models.transformer import init_cache
from seed_jax.parallel.rules import constrain
from seed_jax.sampling.logits import ban_tokens, sample_tokens, token_logprobs

Array = jax.Array
DecodeState = dict[str, Any]

# Stop reasons as stored on device; the host maps them to strings.
RUNNING, EOS, STOP_STRING, MAX_TOKENS = 0, 1, 2, 3
REASON_NAMES = {EOS: "eos", STOP_STRING: "stop_string", MAX_TOKENS: "max_tokens"}
_CACHE_AXES = ("batch", "kv_heads", "length", None)


def _choose_and_record(state: DecodeState, logits: Array, knobs: dict[str, Array], *,
                       top_k: int, use_top_p: bool) -> DecodeState:
  """Samples each live row's token number `row_step [R]` from `logits [R, V]` (its key:
  the row's key folded with that number), records it with its raw log-prob, and updates
  done / stop reason / length / stop-automaton state. Rows already done keep everything."""
  steps, done = state["row_step"], state["done"]
  keys = jax.vmap(jax.random.fold_in)(state["row_keys"], steps)
  token = sample_tokens(keys, ban_tokens(logits, knobs["banned_ids"]), knobs["temperature"],
                        knobs["top_p"], top_k=top_k, use_top_p=use_top_p)
  logprob = token_logprobs(logits, token)
  rows = jnp.arange(steps.shape[0])
  column = jnp.minimum(steps, state["tokens"].shape[1] - 1)
  record = lambda buffer, new: buffer.at[rows, column].set(
      jnp.where(done, buffer[rows, column], new))

  is_eos = jnp.any(token[:, None] == knobs["eos_ids"][None, :], axis=-1)
  stop_state = knobs["stop_table"][state["stop_state"], token]
  hit_stop = stop_state == knobs["stop_match"]
  hit_max = steps + 1 >= knobs["max_new"]
  newly_done = ~done & (is_eos | hit_stop | hit_max)
  reason = jnp.where(is_eos, EOS, jnp.where(hit_stop, STOP_STRING, MAX_TOKENS))
  return dict(
      state,
      tokens=record(state["tokens"], token),
      logprobs=record(state["logprobs"], logprob),
      last_token=jnp.where(done, state["last_token"], token),
      stop_state=jnp.where(done, state["stop_state"], stop_state),
      stop_reason=jnp.where(newly_done, reason.astype(jnp.int32), state["stop_reason"]),
      lengths=jnp.where(done, state["lengths"], steps + 1),
      row_step=jnp.where(done, steps, steps + 1),
      done=done | newly_done,
  )


def _fresh_rows(rows: int, max_new_bucket: int) -> DecodeState:
  """The per-row record of responses not begun: empty buffers `[rows, N]`, counters 0."""
  zeros = lambda *shape, dtype=jnp.int32: jnp.zeros(shape, dtype)
  return dict(tokens=zeros(rows, max_new_bucket),
              logprobs=zeros(rows, max_new_bucket, dtype=jnp.float32),
              last_token=zeros(rows), stop_state=zeros(rows), stop_reason=zeros(rows),
              lengths=zeros(rows), row_step=zeros(rows))


def _fan_out(x: Array, num_samples: int, rows: int) -> Array:
  """`[Bp, ...]` -> `[rows, ...]`: row r is `x[r // num_samples]`, and rows past
  `Bp * num_samples` (padding) repeat row 0.

  A repeat keeps each device's prompts on that device: the batch-sharded rows of prompt
  `p` become decode rows `p * N ... p * N + N - 1`, in the same shard. The gather
  `x[rows // N]` this replaced made XLA all-gather every layer's cache onto every device
  (a TPU prefill of the embedded model's 128 x 2,048-token acting batch held 0.24 GiB a
  layer a chip for it).
  """
  out = x if num_samples == 1 else jnp.repeat(x, num_samples, axis=0)
  if out.shape[0] < rows:
    padding = jnp.broadcast_to(x[:1], (rows - out.shape[0], *x.shape[1:]))
    out = jnp.concatenate([out, padding])
  return out


def prefill(graphdef: nnx.GraphDef, params: nnx.State, prompt_tokens: Array,
            prompt_mask: Array, prompt_valid: Array, key: Array, knobs: dict[str, Array],
            vision: dict[str, Any] | None = None, *, cache_len: int, max_new_bucket: int,
            num_samples: int, decode_rows: int, prefill_rows: int, cache_dtype: Any,
            top_k: int, use_top_p: bool) -> DecodeState:
  """Runs the prompts through the model, fans out the cache and samples token 0.

  Args:
    graphdef, params: the split `Transformer` (or `VisionLanguageModel`).
    prompt_tokens: int32 `[Bp, P]` left-padded. prompt_mask: bool `[Bp, P]`.
    prompt_valid: bool `[Bp]`, False for batch-padding prompts.
    key: a typed PRNG key for the whole request.
    knobs: traced sampling settings (see `Sampler`): temperature, top_p, max_new, eos_ids
      `[E]`, banned_ids `[N]` (never drawn), stop_table `[Rs, V]`, stop_match.
    vision: None for text-only prompts; else (a `VisionLanguageModel`'s prompts with
      images) {"images": the batch's `ImageInputs`, "positions": int32 `[3, Bp, P]` and
      "rope_deltas": int32 `[Bp]` from `multimodal_positions`}. Decoded tokens then
      continue at `real tokens + rope_deltas`, and the prompts run in one pass.
    cache_len: S (static). max_new_bucket: columns of the output buffers (static).
    num_samples: decode rows per prompt (static). decode_rows: R >= Bp * num_samples.
    prefill_rows: prompts per prefill chunk (static; a divisor of Bp, or >= Bp for one
      pass).
  Returns:
    The decode state for `R` rows, with token 0 sampled.
  """
  model = nnx.merge(graphdef, params)
  batch, prompt_len = prompt_tokens.shape
  kv_mask = jnp.zeros((batch, cache_len), bool).at[:, :prompt_len].set(prompt_mask)
  next_position = jnp.sum(prompt_mask, axis=-1, dtype=jnp.int32)

  def run_rows(tokens, positions, kv_mask, **images):
    cache = init_cache(model.cfg, tokens.shape[0], cache_len, cache_dtype)
    cache = jax.tree.map(lambda c: constrain(c, _CACHE_AXES), cache)
    hidden, cache = model.forward_with_cache(tokens, positions, kv_mask, cache, 0, **images)
    return hidden[:, -1], cache  # left padding: the last slot is every row's last token

  if vision is not None:
    # One pass: the images' rows are scattered over the whole batch in order.
    last_hidden, cache = run_rows(prompt_tokens, vision["positions"], kv_mask,
                                  images=vision["images"])
    next_position = next_position + vision["rope_deltas"]
  else:
    positions = jnp.maximum(jnp.cumsum(prompt_mask.astype(jnp.int32), axis=-1) - 1, 0)
    if prefill_rows >= batch:
      last_hidden, cache = run_rows(prompt_tokens, positions, kv_mask)
    else:
      # A few rows at a time keeps the working set in the CPU's caches: on XLA:CPU a b32 x
      # 512-token prefill ran ~2x faster in 2-row chunks than as one batch.
      chunks = batch // prefill_rows
      split = lambda x: x.reshape(chunks, prefill_rows, *x.shape[1:])
      merge = lambda x: x.reshape(batch, *x.shape[2:])
      last_hidden, cache = jax.lax.map(lambda args: run_rows(*args),
                                       (split(prompt_tokens), split(positions), split(kv_mask)))
      last_hidden, cache = merge(last_hidden), jax.tree.map(merge, cache)

  rows = jnp.arange(decode_rows)
  fan_out = lambda x: _fan_out(x, num_samples, decode_rows)
  cache = jax.tree.map(lambda c: constrain(fan_out(c), _CACHE_AXES), cache)
  logits = model.unembed(fan_out(last_hidden))  # [R, V] float32, last position only
  valid = fan_out(prompt_valid) & (rows < batch * num_samples)

  state = dict(
      cache=cache,
      kv_mask=fan_out(kv_mask),
      next_position=fan_out(next_position),
      row_keys=jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, rows),
      done=~valid,
      **_fresh_rows(decode_rows, max_new_bucket),
  )
  state = _choose_and_record(state, logits, knobs, top_k=top_k, use_top_p=use_top_p)
  return dict(state, step=jnp.ones((), jnp.int32))  # tokens drawn so far, every row


def decode(graphdef: nnx.GraphDef, params: nnx.State, state: DecodeState,
           knobs: dict[str, Array], *, prompt_len: int, top_k: int,
           use_top_p: bool) -> DecodeState:
  """Generates until every row is done or `knobs["max_new"]` tokens were drawn.

  Args:
    state: from `prefill` (donated by the caller's jit).
    prompt_len: P, the padded prompt length (static): token i is fed at slot P + i.
  Returns:
    The final state; `tokens`/`logprobs` `[R, N]` are valid up to `lengths [R]`.
  """
  model = nnx.merge(graphdef, params)
  max_steps = jnp.minimum(knobs["max_new"], state["tokens"].shape[1])

  def cond(state):
    return (state["step"] < max_steps) & ~jnp.all(state["done"])

  def body(state):
    slot = prompt_len + state["step"] - 1  # where the previous token goes
    kv_mask = jax.lax.dynamic_update_slice(
        state["kv_mask"], jnp.ones((state["kv_mask"].shape[0], 1), bool), (0, slot))
    hidden, cache = model.forward_with_cache(
        state["last_token"][:, None], state["next_position"][:, None], kv_mask,
        state["cache"], slot)
    cache = jax.tree.map(lambda c: constrain(c, _CACHE_AXES), cache)
    logits = model.unembed(hidden[:, 0])
    state = dict(state, cache=cache, kv_mask=kv_mask, next_position=state["next_position"] + 1)
    state = _choose_and_record(state, logits, knobs, top_k=top_k, use_top_p=use_top_p)
    return dict(state, step=state["step"] + 1)

  return jax.lax.while_loop(cond, body, state)


# -- continuous batching ---------------------------------------------------------------
#
# A fixed set of R decode slots whose rows come and go: a row whose response is complete
# leaves (the host takes its tokens), and a new prompt is prefilled and inserted into its
# slot while the other rows keep their caches (JetStream's prefill / insert / generate).
# The cache is a ring of S slots with one write pointer for every row: each decode step
# writes every row's fed token at slot `ptr % S`; an inserted prompt of P slots goes just
# before the pointer, at `[ptr - P, ptr) mod S`. A row therefore needs P + its response
# <= S, and no slot order is assumed anywhere (attention reads `kv_mask`; keys carry their
# positions). Each row samples with its own key (`insert`'s `row_keys`, folded with the
# token's number), so a response does not depend on which rows share the batch.


def empty_slots(cfg, rows: int, cache_len: int, max_new_bucket: int, cache_dtype: Any
                ) -> DecodeState:
  """R empty slots (every row done, nothing to take) over a ring cache of S slots."""
  key = jax.random.key(0)
  cache = init_cache(cfg, rows, cache_len, cache_dtype)
  return dict(
      cache=jax.tree.map(lambda c: constrain(c, _CACHE_AXES), cache),
      kv_mask=jnp.zeros((rows, cache_len), bool),
      next_position=jnp.zeros((rows,), jnp.int32),
      row_keys=jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(rows)),
      done=jnp.ones((rows,), bool),
      ptr=jnp.zeros((), jnp.int32),
      **_fresh_rows(rows, max_new_bucket),
  )


def insert(graphdef: nnx.GraphDef, params: nnx.State, state: DecodeState,
           prompt_tokens: Array, prompt_mask: Array, sources: Array, slots: Array,
           row_keys: Array, knobs: dict[str, Array], *, top_k: int, use_top_p: bool
           ) -> DecodeState:
  """Prefills `u` distinct prompts and puts `k` rows of them into `slots`, with token 0
  sampled.

  Args:
    state: the slots (`empty_slots`, then the output of `insert` / `generate`; donated).
    prompt_tokens: int32 `[u, P]` left-padded. prompt_mask: bool `[u, P]`.
    sources: int32 `[k]`, the prompt each entering row starts from.
    slots: int32 `[k]` distinct rows to fill (a slot past R, for padding rows, is
      dropped).
    row_keys: typed keys `[k]`: each response's own random stream.
  """
  model = nnx.merge(graphdef, params)
  k, prompt_len = sources.shape[0], prompt_tokens.shape[1]
  cache_len = state["kv_mask"].shape[1]
  positions = jnp.maximum(jnp.cumsum(prompt_mask.astype(jnp.int32), axis=-1) - 1, 0)
  cache = init_cache(model.cfg, prompt_tokens.shape[0], prompt_len,
                     state["cache"][0]["k"].dtype)
  hidden, cache = model.forward_with_cache(prompt_tokens, positions, prompt_mask, cache, 0)
  rows_of = lambda x: jnp.take(x, sources, axis=0)
  cache, prompt_mask = jax.tree.map(rows_of, cache), rows_of(prompt_mask)
  fresh = dict(_fresh_rows(k, state["tokens"].shape[1]), done=jnp.zeros((k,), bool),
               row_keys=row_keys)
  fresh = _choose_and_record(fresh, model.unembed(rows_of(hidden[:, -1])), knobs, top_k=top_k,
                             use_top_p=use_top_p)

  # The prompt's P slots end just before the write pointer, around the ring.
  shift = (state["ptr"] - prompt_len) % cache_len
  place = lambda x, axis: jnp.roll(
      jnp.pad(x, [(0, 0)] * axis + [(0, cache_len - prompt_len)] + [(0, 0)] * (x.ndim - axis - 1)),
      shift, axis=axis)
  put = lambda buffer, rows: buffer.at[slots].set(rows, mode="drop")
  new_cache = [{name: put(layer[name], place(prompt_layer[name], 2)) for name in ("k", "v")}
               for layer, prompt_layer in zip(state["cache"], cache)]
  state = dict(state, cache=jax.tree.map(lambda c: constrain(c, _CACHE_AXES), new_cache),
               kv_mask=put(state["kv_mask"], place(prompt_mask, 1)),
               next_position=put(state["next_position"],
                                 jnp.sum(prompt_mask, axis=-1, dtype=jnp.int32)))
  return dict(state, **{name: put(state[name], value) for name, value in fresh.items()})


def generate(graphdef: nnx.GraphDef, params: nnx.State, state: DecodeState,
             knobs: dict[str, Array], *, max_steps: int, top_k: int, use_top_p: bool
             ) -> DecodeState:
  """Decodes every live row until one of them finishes, none is left or `max_steps`
  steps were taken; the host then takes the finished rows and refills their slots."""
  model = nnx.merge(graphdef, params)
  cache_len = state["kv_mask"].shape[1]
  start_done = state["done"]

  def cond(carry):
    state, steps = carry
    return (steps < max_steps) & ~jnp.all(state["done"]) & ~jnp.any(state["done"] & ~start_done)

  def body(carry):
    state, steps = carry
    slot = state["ptr"] % cache_len
    live = ~state["done"]
    kv_mask = jax.lax.dynamic_update_slice(state["kv_mask"], live[:, None], (0, slot))
    hidden, cache = model.forward_with_cache(
        state["last_token"][:, None], state["next_position"][:, None], kv_mask,
        state["cache"], slot)
    cache = jax.tree.map(lambda c: constrain(c, _CACHE_AXES), cache)
    state = dict(state, cache=cache, kv_mask=kv_mask, ptr=state["ptr"] + 1,
                 next_position=state["next_position"] + live)
    state = _choose_and_record(state, model.unembed(hidden[:, 0]), knobs, top_k=top_k,
                               use_top_p=use_top_p)
    return state, steps + 1

  return jax.lax.while_loop(cond, body, (state, jnp.zeros((), jnp.int32)))[0]
