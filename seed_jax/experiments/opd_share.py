"""Does the teacher's knowledge reach the update? The OPD term's share of the gradient.

A teacher that knows more than its student changes the policy only through
`lambda_opd * L_opd` beside GRPO's outcome terms (paper: lambda_opd 0.01). This measures, at
a policy's weights, how large that term's gradient is beside theirs: on the first
iteration of a run (the same games and sampling seeds the run plays first), for every
mini-batch the update would step on, the gradient of the outcome terms `G_outcome`
(policy gradient, KL, entropy bonus) and of the weighted OPD term `G_opd` (the step's
gradient is their sum).

Figures per mini-batch: `outcome_norm = |G_outcome|`, `opd_norm = |G_opd|` and the
`cosine` between the two; over the mini-batches where the outcome terms have a signal,
`opd_share = sum |G_opd| / sum |G_outcome|` and the mean cosine (does the teacher pull the
way the outcome does); `opd_only` counts the mini-batches where the OPD term is the whole
step (every group's episodes scored alike, so `rl.skip_zero_advantage_groups` leaves no
outcome token). The KL term's reference is the weights measured, as at the start of RL
(its gradient is then zero). Gradient clipping and AdamW scale the sum, not its parts, so
the share is about the OPD term's share of the step (AdamW's per-coordinate scale can
weigh it more or less; momentum favours the term whose direction persists across steps).
`opd_norm / lambda_opd` is the term's gradient at weight 1: how far `lambda_opd` would
have to rise for the teacher to pull as hard as the outcome.

Where in the response does the OPD term pull? Its gradient is split once more, into the
part of the decision tokens (where the response first names its action:
`token_gap.response_span_masks`), which the teacher's knowledge of the move can change, and
the part of every other token (the format, the action block repeating the move), where
teacher and student mostly agree and a gate of 0.5 only sharpens what the policy writes.
The decision part is the OPD term over the decision tokens alone times their share of the
mini-batch's OPD tokens (the term is a token mean over them, so the parts add up to
`G_opd`); the rest is `G_opd` minus it (the parts are of one size: no rounding issue).
Figures: `opd_decision_norm`, `opd_rest_norm`, `decision_tokens` of `opd_tokens`; folded over
every mini-batch with an OPD row: `decision_token_share` and `decision_share` = sum
|G_decision| / sum |G_opd| (above 1 where the two parts pull against each other).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from seed_jax.envs.agent_format import decision_char_span
from seed_jax.parallel import hosts
from seed_jax.parallel.mesh import in_mesh
from seed_jax.seed import losses
from seed_jax.seed.token_gap import response_span_masks
from seed_jax.seed.train_step import make_loss_and_grad_fn
from seed_jax.train.tasks import TaskIterator


def _norm(tree) -> jax.Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def split_gradient_figures(grad_outcome, grad_opd, grad_decision=None
                           ) -> dict[str, jax.Array]:
  """`outcome_norm`, `opd_norm` and their `dot` product, of the outcome terms' and the OPD
  term's gradient pytrees; with `grad_decision` (the decision tokens' part of `grad_opd`)
  also `opd_decision_norm` and `opd_rest_norm` (of `grad_opd - grad_decision`)."""
  figures = {"outcome_norm": _norm(grad_outcome), "opd_norm": _norm(grad_opd),
             "dot": sum(jnp.sum(a * b) for a, b in zip(jax.tree.leaves(grad_opd),
                                                      jax.tree.leaves(grad_outcome)))}
  if grad_decision is not None:
    figures["opd_decision_norm"] = _norm(grad_decision)
    figures["opd_rest_norm"] = _norm(jax.tree.map(jnp.subtract, grad_opd, grad_decision))
  return figures


def cosine(figures: dict[str, float]) -> float | None:
  """The cosine of one mini-batch's two gradients; None where either is zero."""
  norms = figures["outcome_norm"] * figures["opd_norm"]
  return figures["dot"] / norms if norms > 0 else None


def fold(rows: list[dict[str, float]]) -> dict[str, Any]:
  """The run's figures from its mini-batches' `split_gradient_figures` (as floats)."""
  both = [r for r in rows if r["outcome_norm"] > 0]
  cosines = [c for c in map(cosine, both) if c is not None]
  outcome = sum(r["outcome_norm"] for r in both)
  folded = {"mini_batches": len(rows), "opd_only": len(rows) - len(both),
            "outcome_norm": outcome / len(both) if both else None,
            "opd_norm": sum(r["opd_norm"] for r in both) / len(both) if both else None,
            "opd_share": sum(r["opd_norm"] for r in both) / outcome if outcome > 0 else None,
            "cosine": float(np.mean(cosines)) if cosines else None}
  if rows and all("opd_decision_norm" in r for r in rows):
    opd = sum(r["opd_norm"] for r in rows)
    tokens = sum(r["opd_tokens"] for r in rows)
    folded.update({
        "opd_decision_norm": sum(r["opd_decision_norm"] for r in rows) / len(rows),
        "opd_rest_norm": sum(r["opd_rest_norm"] for r in rows) / len(rows),
        "decision_share": sum(r["opd_decision_norm"] for r in rows) / opd if opd else None,
        "decision_token_share": (sum(r["decision_tokens"] for r in rows) / tokens
                                 if tokens else None)})
  return folded


def make_split_gradient_fn(graphdef, train_step_cfg, mesh=None) -> Callable:
  """Jitted `(params, mini_batch, max_segment_len) -> split_gradient_figures` of one
  mini-batch at `params`, under `mesh` (the trainer's) when given.

  Each term's gradient is taken apart, not as a difference of two whole gradients (the OPD
  part can be a hundredth of the rest, below float32's rounding of a difference): the
  outcome terms' with `lambda_opd = 0`; the OPD term's (weighted) with every row out of the
  outcome terms (`outcome_mask` 0, which keeps OPD's rows and its token count)."""
  without_opd = dataclasses.replace(
      train_step_cfg, loss=dataclasses.replace(train_step_cfg.loss, lambda_opd=0.0))
  grad_outcome = make_loss_and_grad_fn(graphdef, without_opd, mesh)
  grad_whole = make_loss_and_grad_fn(graphdef, train_step_cfg, mesh)

  def opd_only(mini):
    return {**mini, "outcome_mask": jnp.zeros_like(mini["advantages"])}

  def opd_tokens(mini):  # the OPD term's token-mean denominator (the train step's)
    return jnp.sum(losses.opd_token_mask(mini))

  def figures(params, mini, decision_mini=None, max_segment_len=None):
    grad_opd = grad_whole(params, opd_only(mini), max_segment_len)[1]
    grad_decision, counts = None, {}
    if decision_mini is not None:
      all_tokens, decision_tokens = opd_tokens(mini), opd_tokens(decision_mini)
      scale = jnp.where(all_tokens > 0, decision_tokens / jnp.maximum(all_tokens, 1), 0.0)
      grad_decision = jax.tree.map(
          lambda g: scale * g, grad_whole(params, opd_only(decision_mini), max_segment_len)[1])
      counts = {"decision_tokens": decision_tokens, "opd_tokens": all_tokens}
    return {**split_gradient_figures(grad_outcome(params, mini, max_segment_len)[1],
                                     grad_opd, grad_decision), **counts}

  return in_mesh(jax.jit(figures, static_argnums=3), mesh)


def first_mini_batches(trainer) -> tuple[list[dict[str, np.ndarray]],
                                         list[dict[str, np.ndarray]], int | None]:
  """The mini-batches with an OPD row that the run's first update would step on, at the
  trainer's weights (its first iteration's games and sampling seeds, skills attached,
  teacher and reference scored); the same mini-batches with only their decision tokens in
  `response_mask`; and their `max_segment_len` (packed rows) or None."""
  spec = trainer.spec
  if spec.rl.kl and trainer.ref_trainable is None:
    trainer.take_reference()  # RL's reference is its starting weights: these
  first = TaskIterator(trainer.rl_tasks(), spec.seed).take(spec.rl.tasks_per_batch)
  trajs, _ = trainer.rollout(first, 0)
  trainer.attach_skills(trajs)
  batch, _ = trainer.scored_batch(trajs)
  rows, response_len = batch["response_mask"].shape
  (decisions,) = response_span_masks(trajs, response_len, trainer.tokenizer, num_rows=rows,
                                     spans=(decision_char_span,))
  minis, window = trainer.mini_batches(batch)
  # The same rows in the same mini-batches: the row order depends on outcome_mask alone.
  decision_minis, _ = trainer.mini_batches(
      {**batch, "response_mask": batch["response_mask"] * decisions})
  # A mini-batch without a skill row has no OPD term to compare.
  keep = [i for i, m in enumerate(minis) if np.any(np.asarray(m["opd_mask"]) > 0)]
  return [minis[i] for i in keep], [decision_minis[i] for i in keep], window


def measure(trainer) -> dict[str, Any]:
  """The figures of the module docstring at `trainer`'s weights, for its run's first
  iteration. `trainer`: a `seed_jax.train.trainer.Trainer` of an algorithm with OPD; its
  parameters are read, never updated.

  Returns a JSON-serialisable dict: `lambda_opd`, `fold`'s figures over the mini-batches
  the update would step on (`per_mini_batch`: each one's norms, dot product and token
  counts), and `opd_norm_per_lambda`.
  """
  spec = trainer.spec
  lam = spec.train_step.loss.lambda_opd
  if not (spec.rl.opd and lam > 0):
    raise ValueError(f"algorithm {spec.algorithm!r} has no OPD term (rl.opd with "
                     "lambda_opd > 0): nothing to split")
  if spec.train_step.teacher_mode != "precomputed":
    raise ValueError("the OPD share is measured with train_step.teacher_mode='precomputed' "
                     f"(the teacher scored once at the weights), not "
                     f"{spec.train_step.teacher_mode!r}")
  minis, decision_minis, window = first_mini_batches(trainer)
  figures_of = make_split_gradient_fn(trainer.graphdef, spec.train_step, trainer.mesh)
  rows = []
  for mini, decision_mini in hosts.progress(list(zip(minis, decision_minis)),
                                            desc="OPD share", unit="mini-batch",
                                            leave=False):
    figures = hosts.fetch(figures_of(trainer.state.params,
                                     hosts.put_rows(mini, trainer.mesh),
                                     hosts.put_rows(decision_mini, trainer.mesh), window))
    rows.append({k: float(v) for k, v in figures.items()})
  folded = fold(rows)
  return {"lambda_opd": lam, **folded, "per_mini_batch": rows,
          "opd_norm_per_lambda": (None if folded["opd_norm"] is None
                                  else folded["opd_norm"] / lam)}
