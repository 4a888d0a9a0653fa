"""SEED losses: PPO-clipped GRPO, k3 KL, entropy bonus and the gated OPD term.

Every loss is returned as a `(sum, count)` pair over tokens, never as a mean: the train
step divides by the token count of the whole (mini-)batch, which it knows before the
forward pass, so the token mean stays exact when the batch is split into micro-batches.

Conventions: all per-token arrays are float32 `[B, R]` over response positions; `mask`
is the explicit response-token loss mask (1 at action tokens, 0 at padding).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from seed_jax.checks import non_negative, positive_int, require, unit_interval

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Loss hyper-parameters; defaults follow the paper / public SEED code.

  Attributes:
    clip_low: PPO ratio clip below 1 (paper 0.2).
    clip_high: PPO ratio clip above 1 (paper 0.2; set higher for asymmetric "clip-higher").
    dual_clip: c > 1 of dual-clip PPO, caps the loss of negative-advantage tokens at
      `-A * c` (public code 3.0); 0 disables it.
    kl_coef: weight of the k3 ("low_var_kl") KL to the reference (paper 0.01, search
      0.001); 0 disables the reference entirely.
    kl_clamp: the k3 estimate is clamped to [-kl_clamp, kl_clamp] (public code 10).
    entropy_coef: entropy bonus, subtracted from the loss (public code 0.001, search 0).
    lambda_opd: weight of the OPD term (paper 0.01; 0 gives plain GRPO).
    beta_opd: gate sharpness in `sigmoid(beta_opd * delta)` (paper 5.0).
    opd_gate_baseline: b in the OPD weight `gate - b` (paper 0: every sampled token is
      pulled up by its gate, about 0.5 where the teacher agrees with the student, so the
      term is also a policy gradient with reward `gate` and no baseline, which sharpens
      whatever was sampled). At 0.5, the gate where the two agree, a token is pulled up
      only where the teacher prefers it more than the student does and pushed down where
      it prefers it less (a variant to test that reading; not the paper's).
    log_ratio_clamp: `lp - old_lp` is clamped to +-this before exp, as verl does, so a
      single badly off token cannot overflow the ratio.
    gate_bins: number of equal bins on [0, 1] of the gate histogram metric.
  """
  clip_low: float = 0.2
  clip_high: float = 0.2
  dual_clip: float = 3.0
  kl_coef: float = 0.01
  kl_clamp: float = 10.0
  entropy_coef: float = 0.001
  lambda_opd: float = 0.01
  beta_opd: float = 5.0
  opd_gate_baseline: float = 0.0
  log_ratio_clamp: float = 20.0
  gate_bins: int = 10

  def __post_init__(self):
    require(self, ("clip_low", "clip_high", "kl_coef", "kl_clamp", "entropy_coef",
                   "lambda_opd", "beta_opd", "log_ratio_clamp"), non_negative,
            "a non-negative number")
    # The ratio is clipped below at 1 - clip_low; past 1 that bound would be negative.
    require(self, "clip_low", lambda c: c <= 1, "in [0, 1]")
    require(self, "dual_clip", lambda c: c == 0 or (non_negative(c) and c > 1),
            "0 (off) or a bound greater than 1")
    require(self, "gate_bins", positive_int, "a positive integer")
    require(self, "opd_gate_baseline", unit_interval, "in [0, 1]")


def masked_sum(values: Array, mask: Array) -> tuple[Array, Array]:
  """(sum of values * mask, sum of mask) over all axes."""
  mask = mask.astype(jnp.float32)
  return jnp.sum(values * mask), jnp.sum(mask)


def ppo_clip_token_loss(
    logprobs: Array, old_logprobs: Array, advantages: Array, cfg: LossConfig,
) -> tuple[Array, Array, Array]:
  """Per-token PPO-clipped policy loss with optional dual clip.

  Args:
    logprobs, old_logprobs: `[B, R]` under the trained and the sampling policy.
    advantages: `[B, R]` (or broadcastable, e.g. `[B, 1]`).
  Returns:
    (loss, clipped, dual_clipped): `[B, R]` float32; `clipped` is 1 where the clipped
    branch was taken (the usual clip fraction), `dual_clipped` where the dual clip bound.
  """
  log_ratio = jnp.clip(logprobs - old_logprobs, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
  ratio = jnp.exp(log_ratio)
  unclipped = -advantages * ratio
  clipped = -advantages * jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
  loss = jnp.maximum(unclipped, clipped)
  clip_taken = (clipped > unclipped).astype(jnp.float32)
  if not cfg.dual_clip:
    return loss, clip_taken, jnp.zeros_like(loss)
  dual_bound = -advantages * cfg.dual_clip
  dual_taken = ((advantages < 0) & (loss > dual_bound)).astype(jnp.float32)
  loss = jnp.where(advantages < 0, jnp.minimum(loss, dual_bound), loss)
  return loss, clip_taken, dual_taken


def k3_kl(logprobs: Array, ref_logprobs: Array, clamp: float) -> Array:
  """k3 ("low_var_kl") estimate of KL(pi || ref) per token, clamped to +-clamp.

  `k3 = exp(ref - lp) - (ref - lp) - 1`, with `ref - lp` itself clamped like verl.
  """
  diff = jnp.clip(ref_logprobs - logprobs, -20.0, 20.0)
  return jnp.clip(jnp.exp(diff) - diff - 1.0, -clamp, clamp)


def opd_token_terms(
    logprobs: Array, teacher_logprobs: Array, beta: float, gate_baseline: float = 0.0,
) -> tuple[Array, Array, Array]:
  """The gated on-policy distillation term per token.

  `delta = sg(lp_skill - lp)`, `gate = sigmoid(beta * delta)`,
  `term = (gate - gate_baseline) * (sg(lp_skill) - lp)`. Only `lp` carries gradient:
  `d term / d lp = -(gate - gate_baseline)` (the paper: baseline 0).

  Returns:
    (term, gate, delta): `[B, R]` float32.
  """
  teacher = jax.lax.stop_gradient(teacher_logprobs)
  delta = jax.lax.stop_gradient(teacher - logprobs)
  gate = jax.nn.sigmoid(beta * delta)
  return (gate - gate_baseline) * (teacher - logprobs), gate, delta


def per_token(values: Array) -> Array:
  """A per-row quantity `[B]` as `[B, 1]`, to broadcast over the row's tokens; one that is
  already per token `[B, R]` (packed sequences, `seed_jax.seed.packing`) as it is."""
  return values[:, None] if values.ndim == 1 else values


# `rl.opd_span`: the response tokens the OPD term counts. "response": all of them (the
# paper's); "decision": where the response first names its action, marked per token by the
# batch's `OPD_SPAN_KEY` array `[B, R]` (`Trainer.scored_batch`).
OPD_SPANS = ("response", "decision")
OPD_SPAN_KEY = "opd_span"


def outcome_token_mask(batch: dict[str, Array]) -> Array:
  """`[B, R]` float32: the response tokens of the rows whose outcome terms count
  (`response_mask`, times `outcome_mask` where the batch has one)."""
  mask = batch["response_mask"].astype(jnp.float32)
  if "outcome_mask" in batch:
    mask = mask * per_token(batch["outcome_mask"]).astype(jnp.float32)
  return mask


def opd_token_mask(batch: dict[str, Array]) -> Array:
  """`[B, R]` float32: the response tokens of the rows with a valid skill (`opd_mask`),
  where the OPD term counts, and of those only the span `opd_span [B, R]` marks where the
  batch has one (`rl.opd_span` "decision"); its sum is the term's token-mean denominator."""
  mask = batch["response_mask"].astype(jnp.float32) * per_token(
      batch["opd_mask"]).astype(jnp.float32)
  if OPD_SPAN_KEY in batch:
    mask = mask * batch[OPD_SPAN_KEY].astype(jnp.float32)
  return mask


def signal_token_mask(batch: dict[str, Array], with_opd: bool) -> Array:
  """`[B, R]` float32: the response tokens some loss term counts: the outcome tokens and,
  with OPD on, the OPD term's (each token once). A row without one adds nothing to the
  loss, its gradient or its metric sums."""
  counted = outcome_token_mask(batch)
  if with_opd:
    counted = jnp.maximum(counted, opd_token_mask(batch))
  return counted


def signal_tokens(batch: dict[str, Array], with_opd: bool) -> Array:
  """How many response tokens some loss term counts (`signal_token_mask`). Zero means an
  update would have nothing to follow (`train_step.apply_gradients` then leaves the state
  as it is)."""
  return jnp.sum(signal_token_mask(batch, with_opd))


def seed_loss_sums(
    logprobs: Array,
    entropy: Array,
    batch: dict[str, Array],
    teacher_logprobs: Array | None,
    ref_logprobs: Array | None,
    cfg: LossConfig,
) -> dict[str, Array]:
  """All loss parts and metric statistics of one (micro-)batch as sums and counts.

  Args:
    logprobs, entropy: `[B, R]` of the trained policy at response tokens.
    batch: holds `response_mask [B, R]`, `old_logprobs [B, R]` (the sampler's),
      `advantages [B]` and `opd_mask [B]` (1 where the row has a valid skill); optionally
      `outcome_mask [B]` (0 takes a row out of every term but OPD, `tokens` included) and
      `opd_span [B, R]` (1 at the tokens the OPD term counts; without it, all of them).
      The three per-row arrays may be given per token, `[B, R]` (packed sequences).
    teacher_logprobs: `[B, R]` under the skill-augmented prompt, or None without OPD.
    ref_logprobs: `[B, R]` under the reference, or None without KL.
  Returns:
    a flat dict of scalar sums (keys ending `_sum`) and counts (`tokens`, `opd_tokens`)
    plus max/min reducers (keys ending `_max` / `_min`) and `gate_hist [gate_bins]`.
  """
  mask = outcome_token_mask(batch)
  advantages = per_token(batch["advantages"])
  out = {"tokens": jnp.sum(mask)}
  pg, clip_taken, dual_taken = ppo_clip_token_loss(
      logprobs, batch["old_logprobs"], advantages, cfg)
  out["pg_sum"] = jnp.sum(pg * mask)
  out["clipfrac_sum"] = jnp.sum(clip_taken * mask)
  out["dual_clipfrac_sum"] = jnp.sum(dual_taken * mask)
  out["entropy_sum"] = jnp.sum(entropy * mask)
  gap = jax.lax.stop_gradient(logprobs) - batch["old_logprobs"]
  out["logprob_gap_abs_sum"] = jnp.sum(jnp.abs(gap) * mask)
  out["logprob_gap_abs_max"] = jnp.max(jnp.abs(gap) * mask)
  if ref_logprobs is not None:
    out["kl_sum"] = jnp.sum(k3_kl(logprobs, ref_logprobs, cfg.kl_clamp) * mask)
  if teacher_logprobs is not None:
    opd_mask = opd_token_mask(batch)
    term, gate, delta = opd_token_terms(logprobs, teacher_logprobs, cfg.beta_opd,
                                         cfg.opd_gate_baseline)
    active = opd_mask > 0
    out["opd_tokens"] = jnp.sum(opd_mask)
    out["opd_sum"] = jnp.sum(term * opd_mask)
    out["gate_sum"] = jnp.sum(gate * opd_mask)
    out["delta_sum"] = jnp.sum(delta * opd_mask)
    out["delta_sq_sum"] = jnp.sum(jnp.square(delta) * opd_mask)
    out["delta_max"] = jnp.max(jnp.where(active, delta, -jnp.inf))
    out["delta_min"] = jnp.min(jnp.where(active, delta, jnp.inf))
    bins = jnp.clip((gate * cfg.gate_bins).astype(jnp.int32), 0, cfg.gate_bins - 1)
    one_hot = jax.nn.one_hot(bins, cfg.gate_bins, dtype=jnp.float32)
    out["gate_hist"] = jnp.sum(one_hot * opd_mask[..., None], axis=(0, 1))
  return out


def total_loss(sums: dict[str, Array], tokens: Array, opd_tokens: Array,
               cfg: LossConfig) -> Array:
  """`pg + lambda_opd * opd + kl_coef * kl - entropy_coef * entropy`, each a token mean.

  Args:
    sums: the output of `seed_loss_sums` for one micro-batch.
    tokens, opd_tokens: the token counts of the WHOLE batch being accumulated (all
      micro-batches), so that summing this over micro-batches gives the exact mean.
  """
  denom = jnp.maximum(tokens, 1.0)
  loss = sums["pg_sum"] / denom
  if cfg.entropy_coef:
    loss = loss - cfg.entropy_coef * sums["entropy_sum"] / denom
  if "kl_sum" in sums and cfg.kl_coef:
    loss = loss + cfg.kl_coef * sums["kl_sum"] / denom
  if "opd_sum" in sums and cfg.lambda_opd:
    loss = loss + cfg.lambda_opd * sums["opd_sum"] / jnp.maximum(opd_tokens, 1.0)
  return loss


def finalize_metrics(sums: dict[str, Array], cfg: LossConfig) -> dict[str, Array]:
  """Turn accumulated sums and counts into means (float32 scalars; `gate_hist` a vector).

  Called once per update, on the sums of all its steps (`train_step.update_metrics`).
  """
  tokens = jnp.maximum(sums["tokens"], 1.0)
  m = {
      "pg_loss": sums["pg_sum"] / tokens,
      "clipfrac": sums["clipfrac_sum"] / tokens,
      "dual_clipfrac": sums["dual_clipfrac_sum"] / tokens,
      "entropy": sums["entropy_sum"] / tokens,
      "logprob_gap_abs_mean": sums["logprob_gap_abs_sum"] / tokens,
      "logprob_gap_abs_max": sums["logprob_gap_abs_max"],
      "tokens": sums["tokens"],
  }
  if "kl_sum" in sums:
    m["kl"] = sums["kl_sum"] / tokens
  if "opd_sum" in sums:
    opd_tokens = jnp.maximum(sums["opd_tokens"], 1.0)
    delta_mean = sums["delta_sum"] / opd_tokens
    m.update(
        opd_loss=sums["opd_sum"] / opd_tokens,
        opd_tokens=sums["opd_tokens"],
        gate_mean=sums["gate_sum"] / opd_tokens,
        delta_mean=delta_mean,
        delta_std=jnp.sqrt(jnp.maximum(sums["delta_sq_sum"] / opd_tokens - delta_mean**2, 0.0)),
        # No OPD-active token leaves the extremes at -+inf: report 0 instead.
        delta_max=jnp.where(sums["opd_tokens"] > 0, sums["delta_max"], 0.0),
        delta_min=jnp.where(sums["opd_tokens"] > 0, sums["delta_min"], 0.0),
        gate_hist=sums["gate_hist"] / opd_tokens,
    )
  return m


# How each statistic combines across micro-batches and across an update's steps.
def combine_sums(a: dict[str, Array], b: dict[str, Array]) -> dict[str, Array]:
  """Merge two `seed_loss_sums` outputs: add sums and counts, max/min the extremes."""
  out = {}
  for key, value in a.items():
    if key.endswith("_max"):
      out[key] = jnp.maximum(value, b[key])
    elif key.endswith("_min"):
      out[key] = jnp.minimum(value, b[key])
    else:
      out[key] = value + b[key]
  return out
