"""Supervised fine-tuning with NLL on target tokens only: stage-1 skill SFT and the
behaviour-cloning warm start share it.

Rows use the train step's layout: prompt left-padded to P, target right-padded to R, so
the loss is the negative log-likelihood of the last R positions under an explicit mask.
With `pack_rows` k, a step's rows are laid end to end in batch_size / k sequences instead
(`seed_jax.seed.packing`: each example its own segment), so that the padding between a
short prompt and the run's longest costs no FLOPs; the loss is the same token sum.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from seed_jax.checks import (fraction, non_negative, non_negative_int, positive,
                             positive_int, require)
from seed_jax.parallel import hosts
from seed_jax.parallel.mesh import (LogicalMesh, as_logical_mesh, batch_sharding, in_mesh,
                                    replicated)
from seed_jax.seed import optim, packing
from seed_jax.seed.batch import place_row
from seed_jax.seed.logprobs import packed_response_logprobs, response_logprobs
from seed_jax.seed.train_step import (TrainState, apply_gradients, trainable_value_and_grad,
                                      init_train_state, train_state_shardings)


@dataclasses.dataclass(frozen=True)
class FineTuneSpec:
  """Hyper-parameters of one NLL fine-tuning phase (stage-1 SFT or behaviour cloning).

  Attributes:
    epochs, batch_size: passes over the examples and examples per step.
    learning_rate: peak of the cosine schedule, reached after `warmup_fraction` of the steps.
    b2, weight_decay: AdamW (stage 1: 0.95 and 0.01, as the public SFT recipe).
    grad_clip: global-norm clip (0: none).
    max_tokens: prompt + target tokens per row; longer prompts keep their last tokens.
    holdout_fraction: examples kept out of training and scored once at the end.
    chunk: response positions unembedded at a time.
    pack_rows: 0: one row per example. k > 0: each step's examples packed end to end into
      batch_size / k sequences (must divide batch_size).
  """
  epochs: int
  batch_size: int
  learning_rate: float
  max_tokens: int
  warmup_fraction: float = 0.0
  b2: float = 0.95
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  holdout_fraction: float = 0.0
  chunk: int = 512
  pack_rows: int = 0

  def __post_init__(self):
    require(self, ("epochs", "pack_rows"), non_negative_int, "a non-negative integer")
    require(self, "pack_rows", lambda k: k == 0 or self.batch_size % k == 0,
            f"a divisor of the batch size ({self.batch_size}) or 0")
    require(self, ("batch_size", "max_tokens", "chunk"), positive_int, "a positive integer")
    require(self, "learning_rate", positive, "a positive number")
    require(self, ("warmup_fraction", "holdout_fraction"), fraction, "in [0, 1)")
    require(self, ("weight_decay", "grad_clip"), non_negative, "a non-negative number")


@dataclasses.dataclass(frozen=True)
class SFTExample:
  """A prompt (after the chat template) and the target the model must produce."""

  prompt_ids: Sequence[int]
  target_ids: Sequence[int]


def padded_lengths(examples: Sequence[SFTExample], *, max_len: int, bucket: int = 64
                   ) -> tuple[int, int]:
  """(P, R): the longest prompt and target rounded up to `bucket`, R at most half of
  `max_len` and P the rest."""
  round_up = lambda n, m: -(-max(n, 1) // m) * m
  resp_len = min(round_up(max(len(e.target_ids) for e in examples), bucket), max_len // 2)
  prompt_len = min(round_up(max(len(e.prompt_ids) for e in examples), bucket),
                   max_len - resp_len)
  return prompt_len, resp_len


def pack_examples(examples: Sequence[SFTExample], *, pad_id: int, max_len: int,
                  bucket: int = 64, rows_multiple: int = 1,
                  lengths: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
  """Pads examples into `tokens`/`mask` `[B, P + R]` and `target_mask` `[B, R]`.

  (P, R) are `lengths`, else `padded_lengths(examples)`; a prompt longer than P keeps its
  last tokens. Padding rows (to `rows_multiple`) have zero target masks.
  """
  prompt_len, resp_len = lengths or padded_lengths(examples, max_len=max_len, bucket=bucket)
  rows = -(-len(examples) // rows_multiple) * rows_multiple
  tokens = np.full((rows, prompt_len + resp_len), pad_id, np.int32)
  mask = np.zeros(tokens.shape, bool)
  target_mask = np.zeros((rows, resp_len), np.float32)
  for i, example in enumerate(examples):
    target = list(example.target_ids)[:resp_len]
    place_row(tokens, mask, i, example.prompt_ids, target, prompt_len)
    target_mask[i, :len(target)] = 1.0
  mask[len(examples):, -1] = True  # padding rows attend to one token; no loss
  return {"tokens": tokens, "mask": mask, "target_mask": target_mask}


def _as_turn_rows(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """`pack_examples`' rows under the names `seed_jax.seed.packing` reads (a student side
  with targets for responses)."""
  return {"student_tokens": rows["tokens"], "student_mask": rows["mask"],
          "response_mask": rows["target_mask"]}


def plan_sequences(rows: dict[str, np.ndarray], num_sequences: int) -> packing.PackPlan:
  """Which of `num_sequences` sequences each example of `rows` goes to (longest first, to
  the emptiest; padding rows left out)."""
  return packing.plan_packing(_as_turn_rows(rows), num_sequences)


def pack_sequences(rows: dict[str, np.ndarray], plan: packing.PackPlan,
                   widths: tuple[int, int, int], pad_id: int) -> dict[str, np.ndarray]:
  """`rows` (`pack_examples`') laid end to end as `plan` says, at `widths`
  (`packing.packed_widths` of every plan of the run, so that one step compiles).

  Returns:
    tokens, segments (0 at padding, k for the k-th example), positions (restarting per
    example): int32 `[N, L]`; predict int32 `[N, Rp]`, the position whose hidden state
    predicts each target slot; target_mask float32 `[N, Rp]`.
  """
  packed = packing.pack_batch(_as_turn_rows(rows), plan, widths, pad_id)
  return {"tokens": packed["student_tokens"], "segments": packed["student_segments"],
          "positions": packed["student_positions"], "predict": packed["student_predict"],
          "target_mask": packed["response_mask"]}


def token_fill(batch: dict[str, np.ndarray]) -> float:
  """Real tokens over computed tokens of a batch in either layout."""
  real = batch["segments"] > 0 if "segments" in batch else batch["mask"]
  return float(real.mean())


def _nll_sums(graphdef, params, batch, chunk, max_segment_len=None):
  """(NLL summed over the target tokens, their count) of a batch in either layout."""
  model = nnx.merge(graphdef, params)
  if "segments" in batch:
    logprobs, _ = packed_response_logprobs(model, batch["tokens"], batch["segments"],
                                           batch["positions"], batch["predict"], chunk,
                                           max_segment_len)
  else:
    resp_len = batch["target_mask"].shape[1]
    logprobs, _ = response_logprobs(model, batch["tokens"], batch["mask"], resp_len, chunk)
  mask = batch["target_mask"]
  return -(logprobs * mask).sum(), mask.sum()


def make_nll_step(graphdef, optim_cfg: optim.OptimConfig,
                  mesh: LogicalMesh | Mesh | None = None,
                  state_shardings: TrainState | None = None, chunk: int = 128,
                  max_segment_len: int | None = None
                  ) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
  """Jitted `(state, batch) -> (state, {"nll", "target_tokens", "grad_norm"})`, donating
  the state; the loss is the token mean of the NLL over the batch's target tokens. The
  batch is rows (`pack_examples`) or packed sequences (`pack_sequences`), whose attention
  reads keys only `max_segment_len` back (no example is longer; None: the whole row)."""
  optimizer = optim.make_optimizer(optim_cfg)

  def step(state: TrainState, batch):
    def loss_fn(params):
      total, count = _nll_sums(graphdef, params, batch, chunk, max_segment_len)
      return total / jnp.maximum(count, 1.0), count
    (loss, count), grads = trainable_value_and_grad(loss_fn, has_aux=True)(state.params)
    new_state, _, grad_norm = apply_gradients(optimizer, state, grads, loss)
    return new_state, {"nll": loss, "target_tokens": count, "grad_norm": grad_norm}

  if mesh is None:
    return jax.jit(step, donate_argnums=0)
  return in_mesh(jax.jit(step, in_shardings=(state_shardings, batch_sharding(mesh, 1)),
                         out_shardings=(state_shardings, replicated(mesh)),
                         donate_argnums=0), mesh)


def make_nll_eval(graphdef, mesh: LogicalMesh | Mesh | None = None, chunk: int = 128
                  ) -> Callable[[object, dict], tuple[float, float]]:
  """Jitted `(params, batch) -> (nll sum, target token count)` for held-out data."""
  return in_mesh(jax.jit(lambda params, batch: _nll_sums(graphdef, params, batch, chunk)),
                 mesh)


def iterate_batches(examples: Sequence[SFTExample], batch_size: int, epochs: int, seed: int
                    ) -> list[list[SFTExample]]:
  """Mini-batches over `epochs` shuffled passes, reproducible from `seed`.

  The passes are chained before cutting, so only the very last batch may be short (a
  short batch costs a full one: rows are padded to the compiled shape).
  """
  order = np.concatenate([np.random.default_rng([seed, epoch]).permutation(len(examples))
                          for epoch in range(epochs)]) if epochs else np.zeros(0, int)
  return [[examples[i] for i in order[start:start + batch_size]]
          for start in range(0, len(order), batch_size)]


def fine_tune_optim(spec: FineTuneSpec, num_steps: int) -> optim.OptimConfig:
  """AdamW on a cosine schedule over `num_steps`, warming up for `warmup_fraction`."""
  warmup = int(num_steps * spec.warmup_fraction)
  return optim.OptimConfig(learning_rate=spec.learning_rate, schedule="cosine",
                           warmup_steps=warmup, total_steps=max(num_steps, warmup + 1),
                           b2=spec.b2, weight_decay=spec.weight_decay,
                           grad_clip=spec.grad_clip)


@dataclasses.dataclass
class StepBatches:
  """A fine-tuning run's batches on the host, in the layout its step compiles for.

  Attributes:
    batches: the examples of every step (`iterate_batches`).
    rows: `pack_examples` at the run's one (P, R), padded to the data-parallel shards.
    host_batch: `i -> ` the arrays of step i (rows, or `pack_sequences` at the run's one
      width).
    max_segment_len: the packed step's attention window (P + R: no example is longer);
      None for rows.
  """
  batches: list[list[SFTExample]]
  rows: Callable[[Sequence[SFTExample]], dict[str, np.ndarray]]
  host_batch: Callable[[int], dict[str, np.ndarray]]
  max_segment_len: int | None


def step_batches(examples: Sequence[SFTExample], holdout: Sequence[SFTExample], *,
                 spec: FineTuneSpec, data_parallel: int, pad_id: int, seed: int
                 ) -> StepBatches:
  """Cuts `examples` into the steps of `spec` and lays each out as its step reads it."""
  batch_size = spec.batch_size
  batches = iterate_batches(examples, batch_size, spec.epochs, seed)
  # One (P, R) for every batch: one compiled step instead of one per length bucket.
  lengths = padded_lengths(list(examples) + list(holdout), max_len=spec.max_tokens)
  rows = functools.partial(pack_examples, pad_id=pad_id, max_len=spec.max_tokens,
                           lengths=lengths,
                           rows_multiple=data_parallel * -(-batch_size // data_parallel))
  if not spec.pack_rows:
    return StepBatches(batches, rows, lambda i: rows(batches[i]), None)
  sequences = data_parallel * -(-(batch_size // spec.pack_rows) // data_parallel)
  plans = [plan_sequences(rows(batch), sequences) for batch in batches]
  widths = packing.packed_widths(plans, bucket=64, shared=False)
  return StepBatches(batches, rows,
                     lambda i: pack_sequences(rows(batches[i]), plans[i], widths, pad_id),
                     sum(lengths))


def fine_tune(graphdef, params, examples: Sequence[SFTExample],
              holdout: Sequence[SFTExample] = (), *, spec: FineTuneSpec, mesh: LogicalMesh,
              pad_id: int, seed: int, log: Callable[..., object], desc: str = "sft"):
  """NLL fine-tuning with AdamW on a cosine schedule; returns the new parameters.

  `log(step, metrics)` receives every step's metrics (with `fill`, the share of computed
  tokens that are real) and, with `holdout`, `log(steps, {"nll", "examples"}, "_holdout")`
  once at the end.
  """
  data_parallel = as_logical_mesh(mesh).batch_shards  # rows are split by the "batch" rule
  run = step_batches(examples, holdout, spec=spec, data_parallel=data_parallel,
                     pad_id=pad_id, seed=seed)
  optim_cfg = fine_tune_optim(spec, len(run.batches))
  shardings = train_state_shardings(params, mesh, optim_cfg)
  state = init_train_state(params, optim_cfg, shardings)
  step_fn = make_nll_step(graphdef, optim_cfg, mesh, shardings, spec.chunk,
                          max_segment_len=run.max_segment_len)
  for i in hosts.progress(range(len(run.batches)), desc=desc, unit="step"):
    host_batch = run.host_batch(i)
    state, metrics = step_fn(state, hosts.put_rows(host_batch, mesh))
    log(i, {**{k: float(v) for k, v in metrics.items()}, "fill": token_fill(host_batch)})
  if holdout:
    evaluate = make_nll_eval(graphdef, mesh, spec.chunk)
    total, count = 0.0, 0.0
    for start in range(0, len(holdout), spec.batch_size):
      s, c = evaluate(state.params,
                      hosts.put_rows(run.rows(holdout[start:start + spec.batch_size]), mesh))
      total, count = total + float(s), count + float(c)
    log(len(run.batches), {"nll": total / max(count, 1.0), "examples": len(holdout)},
        "_holdout")
  return state.params
