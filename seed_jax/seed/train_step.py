"""The SEED train step: `(train_state, batch) -> (train_state, outputs)`, jitted and sharded.

The outputs carry the batch's raw metric sums, not means: `update_metrics` folds the steps
of an update on the host and turns the sums into means once.

Teacher log-probs (`teacher_mode`):
* "joint": student and teacher rows are concatenated along the batch axis and go through
  the model in one forward pass; the teacher half is under stop_gradient.
* "separate": a no-grad teacher pass with the current parameters, before the student's
  value-and-grad (no teacher activations are kept for the backward pass).
* "precomputed": `batch["teacher_logprobs"]`, scored once per iteration with theta_old by
  `make_score_fn` (the public SEED code's behaviour).
The reference model is never held by the step: when `kl_coef > 0` the batch carries
`ref_logprobs`, scored once per iteration by `make_score_fn` with the reference parameters
(as verl does), so the reference forward runs only when the KL weight is non-zero.

Batch (from batch.py; B rows, Ts = P + R): student_tokens / student_mask `[B, Ts]`,
response_mask / old_logprobs `[B, R]`, advantages / opd_mask `[B]`, and as needed
teacher_tokens / teacher_mask `[B, Tt]` (Tt = Ts in "joint" mode, which concatenates the
rows), teacher_logprobs `[B, R]`, ref_logprobs `[B, R]`; rows that show images add
image_patches `[B, h, w, D]` (one image per row, encoded once for both sides) and
student_positions / teacher_positions `[B, 3, T]` (multimodal RoPE). Or the same turns packed into
sequences (`seed_jax.seed.packing`: `*_segments`, `*_positions`, `*_predict`, every
response quantity `[N, Rp]`), which the step reads alike: its loss is a sum over tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from seed_jax.checks import one_of, positive_int, require
from seed_jax.models.lora import merge_trainable, split_trainable
from seed_jax.parallel.mesh import LogicalMesh, as_logical_mesh, in_mesh, param_shardings
from seed_jax.seed import losses
from seed_jax.seed import optim
from seed_jax.seed.logprobs import packed_response_logprobs, response_logprobs

Batch = dict[str, jax.Array]
TEACHER_MODES = ("joint", "separate", "precomputed")


@dataclasses.dataclass(frozen=True)
class TrainStepConfig:
  """How one update is computed.

  Attributes:
    teacher_mode: "joint" | "separate" | "precomputed" (module docstring). Default
      "precomputed", the public code's: the teacher is scored with theta_old once per
      iteration. The paper writes theta: "separate" scores it in a no-grad pass of the
      step (measured at the SmolLM2-135M shape on CPU, a little faster than "joint" and
      half its temporary memory, since "joint" keeps teacher activations for a zero
      backward), "joint" in the student's batched forward.
    micro_batches: k, the batch is split into k micro-batches whose gradients are summed
      (token means stay exact: every part is divided by the whole batch's token count).
    logprob_chunk: response positions unembedded at a time (memory vs. launch overhead).
    loss: the loss weights.
  """
  teacher_mode: str = "precomputed"
  micro_batches: int = 1
  logprob_chunk: int = 128
  loss: losses.LossConfig = losses.LossConfig()

  def __post_init__(self):
    require(self, "teacher_mode", one_of(TEACHER_MODES), f"one of {TEACHER_MODES}")
    require(self, ("micro_batches", "logprob_chunk"), positive_int, "a positive integer")


@flax.struct.dataclass
class TrainState:
  """Everything an update changes. `params` is the whole model; `opt_state` holds moments
  for its trainable part only (`lora.split_trainable`: the adapters when the model has
  them). `skipped` counts updates dropped for a non-finite loss."""
  params: Any
  opt_state: Any
  step: jax.Array
  skipped: jax.Array


def new_train_state(params, optim_cfg: optim.OptimConfig) -> TrainState:
  """A fresh state (traceable: `init_train_state` jits it, `seed_jax.plan` shapes it): the
  optimizer's moments for the trainable part of `params` only."""
  optimizer = optim.make_optimizer(optim_cfg)
  return TrainState(params=params, opt_state=optimizer.init(split_trainable(params)[0]),
                    step=jnp.zeros((), jnp.int32), skipped=jnp.zeros((), jnp.int32))


def init_train_state(params, optim_cfg: optim.OptimConfig,
                     shardings: TrainState | None = None) -> TrainState:
  """A fresh state; with `shardings` (train_state_shardings) it is created in place."""
  return jax.jit(lambda p: new_train_state(p, optim_cfg), out_shardings=shardings)(params)


def train_state_shardings(params, mesh: LogicalMesh | Mesh, optim_cfg: optim.OptimConfig
                          ) -> TrainState:
  """Shardings of the state on `mesh`: each parameter by its logical axes and the mesh's
  rules (wherever it sits now), each optimizer moment like its parameter, counters and
  scalars replicated."""
  mesh = as_logical_mesh(mesh)
  shardings = param_shardings(params, mesh)
  replicated = mesh.replicated()
  optimizer = optim.make_optimizer(optim_cfg)
  trainable = split_trainable(params)[0]
  opt_shardings = optax.tree_map_params(
      optimizer, lambda _, s: s, jax.eval_shape(optimizer.init, trainable),
      split_trainable(shardings)[0], transform_non_params=lambda _: replicated)
  return TrainState(params=shardings, opt_state=opt_shardings, step=replicated,
                    skipped=replicated)


def trainable_value_and_grad(loss_fn: Callable, has_aux: bool = False) -> Callable:
  """`loss_fn(params, *args)` -> `(params, *args) -> (value, grads)` with the gradients of
  the trainable part of `params` only (`lora.split_trainable`): with adapters, the frozen
  base is a constant of the differentiation, so no base gradient is ever computed."""

  def value_and_grad(params, *args):
    trainable, frozen = split_trainable(params)
    return jax.value_and_grad(lambda t: loss_fn(merge_trainable(t, frozen), *args),
                              has_aux=has_aux)(trainable)

  return value_and_grad


_PACKED_PARTS = ("tokens", "segments", "positions", "predict")
# The teacher's model inputs, in either layout: dropped from the batch unless the "joint"
# step runs the teacher inside the differentiated forward.
_TEACHER_INPUTS = tuple(f"teacher_{part}" for part in ("mask",) + _PACKED_PARTS)


def side_inputs(batch: Batch, side: str) -> dict[str, jax.Array]:
  """The model inputs of one side ("student" or "teacher") of either layout: `tokens` and
  `mask` of rows (with `positions [B, 3, T]` when the rows show images), or the four
  arrays of packed sequences (`seed_jax.seed.packing`). A row's image patches are the
  batch's `image_patches`, the same for both sides (`row_images`)."""
  if f"{side}_segments" in batch:
    parts = _PACKED_PARTS
  else:
    parts = ("tokens", "mask") + (("positions",) if f"{side}_positions" in batch else ())
  return {part: batch[f"{side}_{part}"] for part in parts}


def row_images(model, batch: Batch) -> jax.Array | None:
  """`[B, n, E]` the tower's rows of each row's image (`image_patches [B, h, w, D]`),
  encoded once for the student and the teacher rows that show it; None without images."""
  if "image_patches" not in batch:
    return None
  return model.encode_row_images(batch["image_patches"])


def _score_side(model, inputs: dict[str, jax.Array], response_len: int, chunk: int,
                images: jax.Array | None = None, max_segment_len: int | None = None
                ) -> tuple[jax.Array, jax.Array]:
  """(logprobs, entropy) `[B, R]` of the response tokens of `side_inputs`' output, with
  `images` (`row_images`) in the rows' image placeholders; packed sequences attend within
  `max_segment_len` (`packed_response_logprobs`)."""
  if "segments" in inputs:
    return packed_response_logprobs(model, *(inputs[part] for part in _PACKED_PARTS), chunk,
                                    max_segment_len)
  return response_logprobs(model, inputs["tokens"], inputs["mask"], response_len, chunk,
                           positions=inputs.get("positions"), row_images=images)


def make_score_fn(graphdef, chunk: int = 128, mesh: LogicalMesh | Mesh | None = None
                  ) -> Callable:
  """Jitted `(params, inputs, response_len) -> logprobs [B, R]`: `inputs` holds the rows'
  `tokens` / `mask` `[B, T]`, and for rows that show images their `positions [B, 3, T]`
  and `image_patches [B, h, w, D]` (`side_inputs` of one side plus the patches).

  For the once-per-iteration teacher ("precomputed") and reference log-probs.
  """

  def score(params, inputs, response_len):
    model = nnx.merge(graphdef, params)
    return _score_side(model, inputs, response_len, chunk, row_images(model, inputs))[0]

  return in_mesh(jax.jit(score, static_argnums=2), mesh)


def make_loss_and_grad_fn(graphdef, cfg: TrainStepConfig,
                          mesh: LogicalMesh | Mesh | None = None) -> Callable:
  """`(params, batch, max_segment_len=None) -> (loss, grads, sums)`: the accumulated loss
  of the whole batch, the float32 gradients of the trainable parameters and the metric
  sums (not jitted; the train step jits it). `max_segment_len` (static): the longest turn
  of packed sequences (`packing.max_segment_len`), or None."""
  loss_cfg = cfg.loss
  chunk = cfg.logprob_chunk
  mesh = as_logical_mesh(mesh)
  with_opd = bool(loss_cfg.lambda_opd)

  def micro_batch_loss(params, mb, teacher_lp, tokens, opd_tokens, max_segment_len):
    resp_len = mb["response_mask"].shape[1]
    rows = mb["student_tokens"].shape[0]
    model = nnx.merge(graphdef, params)
    student, images = side_inputs(mb, "student"), row_images(model, mb)
    if teacher_lp is None and "teacher_tokens" in mb:  # joint
      concat = lambda s, t: jnp.concatenate([s, t])
      both = jax.tree.map(concat, student, side_inputs(mb, "teacher"))
      # The tower runs once: both halves read the same images.
      lp, entropy = _score_side(model, both, resp_len, chunk,
                                None if images is None else concat(images, images),
                                max_segment_len)
      lp, entropy, teacher_lp = lp[:rows], entropy[:rows], jax.lax.stop_gradient(lp[rows:])
    else:
      lp, entropy = _score_side(model, student, resp_len, chunk, images, max_segment_len)
    sums = losses.seed_loss_sums(lp, entropy, mb, teacher_lp, mb.get("ref_logprobs"), loss_cfg)
    return losses.total_loss(sums, tokens, opd_tokens, loss_cfg), sums

  grad_fn = trainable_value_and_grad(micro_batch_loss, has_aux=True)

  def micro_step(params, mb, tokens, opd_tokens, max_segment_len):
    teacher_lp = None
    if loss_cfg.lambda_opd:
      if cfg.teacher_mode == "precomputed":
        teacher_lp = mb["teacher_logprobs"]
      elif cfg.teacher_mode == "separate":
        # A no-grad pass: its own tower run (the student's is inside the differentiation).
        model = nnx.merge(graphdef, params)
        teacher_lp = jax.lax.stop_gradient(_score_side(
            model, side_inputs(mb, "teacher"), mb["response_mask"].shape[1], chunk,
            row_images(model, mb), max_segment_len)[0])
    if not (loss_cfg.lambda_opd and cfg.teacher_mode == "joint"):
      mb = {k: v for k, v in mb.items() if k not in _TEACHER_INPUTS}
    (loss, sums), grads = grad_fn(params, mb, teacher_lp, tokens, opd_tokens,
                                  max_segment_len)
    return loss, jax.tree.map(lambda g: g.astype(jnp.float32), grads), sums

  def loss_and_grad(params, batch: Batch, max_segment_len: int | None = None):
    if loss_cfg.kl_coef and "ref_logprobs" not in batch:
      raise ValueError("kl_coef > 0 needs batch['ref_logprobs'] (make_score_fn with the "
                       "reference params); set kl_coef=0 to train without a reference")
    if not loss_cfg.kl_coef:
      batch = {k: v for k, v in batch.items() if k != "ref_logprobs"}
    needed = "teacher_logprobs" if cfg.teacher_mode == "precomputed" else "teacher_tokens"
    if loss_cfg.lambda_opd and needed not in batch:
      raise ValueError(f"lambda_opd > 0 with teacher_mode={cfg.teacher_mode!r} needs "
                       f"batch[{needed!r}]; set lambda_opd=0 for plain GRPO")
    tokens = jnp.sum(losses.outcome_token_mask(batch))
    opd_tokens = jnp.sum(losses.opd_token_mask(batch))
    k = cfg.micro_batches
    micro_step_at = functools.partial(micro_step, max_segment_len=max_segment_len)  # static
    if k == 1:
      return micro_step_at(params, batch, tokens, opd_tokens)
    micro = jax.tree.map(lambda x: _split_micro(x, k, mesh), batch)
    first = jax.tree.map(lambda x: x[0], micro)
    _, grads_shape, sums_shape = jax.eval_shape(micro_step_at, params, first, tokens,
                                                opd_tokens)

    def accumulate(carry, mb):
      loss, grads, sums = carry
      mb_loss, mb_grads, mb_sums = micro_step_at(params, mb, tokens, opd_tokens)
      return (loss + mb_loss, jax.tree.map(jnp.add, grads, mb_grads),
              losses.combine_sums(sums, mb_sums))

    def body(carry, mb):
      # A micro-batch with no token any loss term counts (rows of groups that all scored
      # alike, without a skill) would add zero loss, zero gradient and the sums' identity:
      # it is skipped, not run. `micro_batch_row_order` gathers such rows into whole
      # micro-batches.
      live = losses.signal_tokens(mb, with_opd) > 0
      return jax.lax.cond(live, accumulate, lambda carry, _: carry, carry, mb), None

    init = (jnp.zeros((), jnp.float32),
            jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), grads_shape),
            {key: jnp.full(s.shape, _identity(key), s.dtype) for key, s in sums_shape.items()})
    (loss, grads, sums), _ = jax.lax.scan(body, init, micro)
    return loss, grads, sums

  return loss_and_grad


def _identity(key: str) -> float:
  if key.endswith("_max"):
    return -jnp.inf
  if key.endswith("_min"):
    return jnp.inf
  return 0.0


def _split_micro(x: jax.Array, k: int, mesh: LogicalMesh | None) -> jax.Array:
  """`[B, ...] -> [k, B/k, ...]`, micro-batch j = rows j, j+k, ...: strided, so every
  device keeps an equal share of each micro-batch under batch sharding."""
  if x.shape[0] % k:
    raise ValueError(f"batch of {x.shape[0]} rows does not split into {k} micro-batches")
  split = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
  if mesh is not None:
    rows = mesh.batch_sharding(1).spec[0]
    split = jax.lax.with_sharding_constraint(
        split, NamedSharding(mesh.mesh, PartitionSpec(None, rows)))
  return split


def micro_batch_row_order(live: np.ndarray, micro_batches: int) -> np.ndarray:
  """A row order `[M]` for a mini-batch of M rows that puts the rows some loss term counts
  (`live [M]` bool, `losses.signal_token_mask` summed over tokens) into the first of its
  `micro_batches` micro-batches, the other rows after them, each group in batch order.

  The train step skips a micro-batch without such a row; spread over every micro-batch
  (as `batch.spread_row_order` leaves them: GRPO's rows of groups that all scored alike
  are most of a batch), they would make it run them all. Rows are independent, so the
  order changes the gradient only by the order of its float sums. Written for
  `_split_micro`'s strided layout: micro-batch j holds positions j, j + k, ...
  """
  rows = live.shape[0]
  if rows % micro_batches:
    raise ValueError(f"mini-batch of {rows} rows does not split into {micro_batches} "
                     "micro-batches")
  per_micro = rows // micro_batches
  ranked = np.concatenate([np.flatnonzero(live), np.flatnonzero(~live)])
  position = np.arange(rows)
  order = np.empty(rows, np.int64)
  # The i-th ranked row goes to micro-batch i // per_micro, its slot i % per_micro.
  order[(position % per_micro) * micro_batches + position // per_micro] = ranked
  return order


def apply_gradients(optimizer: optax.GradientTransformation, state: TrainState, grads,
                    loss: jax.Array, has_signal: jax.Array | bool = True
                    ) -> tuple[TrainState, jax.Array, jax.Array]:
  """One optimizer update; a non-finite loss or gradient leaves params and moments
  untouched and is counted in `skipped`; so does a batch without `has_signal` (no token
  any loss term counts), which is not counted: AdamW would otherwise take a full step on
  decay and stale moments alone. `grads` are those of the trainable parameters
  (`trainable_value_and_grad`). Returns (new state, finite, grad norm)."""
  grad_norm = optax.global_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  apply = finite & has_signal
  trainable, frozen = split_trainable(state.params)
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, trainable)
  updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(apply, n, o), new, old)
  # The frozen base passes through untouched (no select over it).
  params = merge_trainable(keep(optax.apply_updates(trainable, updates), trainable), frozen)
  new_state = TrainState(params=params,
                         opt_state=keep(opt_state, state.opt_state),
                         step=state.step + apply.astype(jnp.int32),
                         skipped=state.skipped + (~finite).astype(jnp.int32))
  return new_state, finite, grad_norm


def make_train_step(graphdef, optim_cfg: optim.OptimConfig, cfg: TrainStepConfig,
                    mesh: LogicalMesh | Mesh | None = None,
                    state_shardings: TrainState | None = None
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
  """The jitted update with donated state.

  Args:
    graphdef: from `nnx.split(model, nnx.Param)`.
    mesh, state_shardings: with a mesh (a `LogicalMesh`, whose rules place everything),
      explicit shardings (`train_state_shardings`); batch rows by the "batch" rule,
      metrics replicated. Without, plain jit.
  Returns:
    `step(state, batch[, max_segment_len]) -> (state, outputs)`; `max_segment_len`
    (static and positional; packed sequences only): the longest turn they hold
    (`packing.max_segment_len`), so that attention skips the keys no turn can reach.
    Outputs hold `sums` (the batch's raw metric sums, `losses.seed_loss_sums` accumulated
    over micro-batches) and the float32 scalars `loss`, `grad_norm`, `learning_rate`,
    `update_skipped` (non-finite), `update_empty`
    (no token left in any loss term: e.g. every group's advantages zero under
    `skip_zero_advantage_groups`, and no OPD row), `skipped_total`.
    `update_metrics` turns the outputs of an update's steps into its metrics.
    `step.lower(state, batch[, max_segment_len])` compiles ahead of time under the same
    mesh and rules.
  """
  optimizer = optim.make_optimizer(optim_cfg)
  schedule = optim.make_schedule(optim_cfg)
  loss_and_grad = make_loss_and_grad_fn(graphdef, cfg, mesh)

  def step(state: TrainState, batch: Batch, max_segment_len: int | None = None):
    loss, grads, sums = loss_and_grad(state.params, batch, max_segment_len)
    has_signal = losses.signal_tokens(batch, bool(cfg.loss.lambda_opd)) > 0
    new_state, finite, grad_norm = apply_gradients(optimizer, state, grads, loss, has_signal)
    # Raw sums, not means: an update of several steps folds them exactly (update_metrics).
    outputs = dict(sums=sums, loss=loss, grad_norm=grad_norm,
                   learning_rate=schedule(state.step),
                   update_skipped=(~finite).astype(jnp.float32),
                   update_empty=(~has_signal).astype(jnp.float32),
                   skipped_total=new_state.skipped.astype(jnp.float32))
    return new_state, outputs

  if mesh is None:
    return jax.jit(step, donate_argnums=0, static_argnums=2)
  if state_shardings is None:
    raise ValueError("make_train_step with a mesh needs state_shardings "
                     "(train_state_shardings(params, mesh, optim_cfg))")
  mesh = as_logical_mesh(mesh)
  rows = mesh.batch_sharding(1)  # a prefix: every batch array
  jitted = jax.jit(step, in_shardings=(state_shardings, rows),
                   out_shardings=(state_shardings, mesh.replicated()), donate_argnums=0,
                   static_argnums=2)  # positional: pjit takes no kwargs with in_shardings
  return in_mesh(jitted, mesh)


def _last(values: np.ndarray) -> np.ndarray:
  return values[-1]


# How an update folds its steps' outputs that are not token sums: the loss and gradient
# norm are per step (mean), the rate applied last is where the schedule stands (last), the
# update counts the steps it skipped and those left without signal (sum), and
# `skipped_total` is a running count (last).
_STEP_FOLDS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "loss": np.mean, "grad_norm": np.mean, "learning_rate": _last, "update_skipped": np.sum,
    "update_empty": np.sum, "skipped_total": _last}


def update_metrics(steps: Sequence[dict[str, Any]], loss_cfg: losses.LossConfig
                   ) -> dict[str, float | list]:
  """One update's metrics from the host copies of its optimizer steps' outputs.

  The token statistics come from the steps' raw sums, added up (`losses.combine_sums`) and
  turned into means once (`losses.finalize_metrics`): every mean, spread and extreme is
  over all the update's tokens, and `tokens` / `opd_tokens` are the update's counts. The
  other outputs fold as `_STEP_FOLDS` says. Values are python floats (`gate_hist` a list).
  """
  sums = functools.reduce(losses.combine_sums, [step["sums"] for step in steps])
  out = losses.finalize_metrics(sums, loss_cfg)
  out.update({key: fold(np.array([float(step[key]) for step in steps]))
              for key, fold in _STEP_FOLDS.items()})
  return {key: np.asarray(value, np.float64).tolist() for key, value in out.items()}
