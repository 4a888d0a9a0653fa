"""Supervised fine-tuning with NLL on target tokens only: stage-1 skill SFT and the
behaviour-cloning warm start share it.

Rows use the train step's layout: prompt left-padded to P, target right-padded to R, so
the loss is the negative log-likelihood of the last R positions under an explicit mask.
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
from seed_jax.seed import optim
from seed_jax.seed.batch import place_row
from seed_jax.seed.logprobs import response_logprobs
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

  def __post_init__(self):
    require(self, "epochs", non_negative_int, "a non-negative integer")
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


def _nll_sums(graphdef, params, batch, chunk):
  model = nnx.merge(graphdef, params)
  resp_len = batch["target_mask"].shape[1]
  logprobs, _ = response_logprobs(model, batch["tokens"], batch["mask"], resp_len, chunk)
  mask = batch["target_mask"]
  return -(logprobs * mask).sum(), mask.sum()


def make_nll_step(graphdef, optim_cfg: optim.OptimConfig,
                  mesh: LogicalMesh | Mesh | None = None,
                  state_shardings: TrainState | None = None, chunk: int = 128
                  ) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
  """Jitted `(state, batch) -> (state, {"nll", "target_tokens", "grad_norm"})`, donating
  the state; the loss is the token mean of the NLL over the batch's target tokens."""
  optimizer = optim.make_optimizer(optim_cfg)

  def step(state: TrainState, batch):
    def loss_fn(params):
      total, count = _nll_sums(graphdef, params, batch, chunk)
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


def fine_tune(graphdef, params, examples: Sequence[SFTExample],
              holdout: Sequence[SFTExample] = (), *, spec: FineTuneSpec, mesh: LogicalMesh,
              pad_id: int, seed: int, log: Callable[..., object], desc: str = "sft"):
  """NLL fine-tuning with AdamW on a cosine schedule; returns the new parameters.

  `log(step, metrics)` receives every step's metrics and, with `holdout`,
  `log(steps, {"nll", "examples"}, "_holdout")` once at the end.
  """
  batch_size, max_tokens, chunk = spec.batch_size, spec.max_tokens, spec.chunk
  batches = iterate_batches(examples, batch_size, spec.epochs, seed)
  optim_cfg = fine_tune_optim(spec, len(batches))
  shardings = train_state_shardings(params, mesh, optim_cfg)
  state = init_train_state(params, optim_cfg, shardings)
  step_fn = make_nll_step(graphdef, optim_cfg, mesh, shardings, chunk)
  data_parallel = as_logical_mesh(mesh).batch_shards  # rows are split by the "batch" rule
  # One (P, R) for every batch: one compiled step instead of one per length bucket.
  lengths = padded_lengths(list(examples) + list(holdout), max_len=max_tokens)
  pack = functools.partial(pack_examples, pad_id=pad_id, max_len=max_tokens, lengths=lengths,
                           rows_multiple=data_parallel * -(-batch_size // data_parallel))
  for i, batch in enumerate(hosts.progress(batches, desc=desc, unit="step")):
    state, metrics = step_fn(state, hosts.put_rows(pack(batch), mesh))
    log(i, {k: float(v) for k, v in metrics.items()})
  if holdout:
    evaluate = make_nll_eval(graphdef, mesh, chunk)
    total, count = 0.0, 0.0
    for start in range(0, len(holdout), batch_size):
      s, c = evaluate(state.params, hosts.put_rows(pack(holdout[start:start + batch_size]),
                                                   mesh))
      total, count = total + float(s), count + float(c)
    log(len(batches), {"nll": total / max(count, 1.0), "examples": len(holdout)}, "_holdout")
  return state.params
