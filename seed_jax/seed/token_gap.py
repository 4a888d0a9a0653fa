"""The teacher gap on the sampled tokens: where the skill-conditioned teacher moves, and how far.

SEED's signal is the shift `delta = lp_skill - lp` of each sampled response token and the
OPD gate `sigmoid(beta_opd * delta)`. Whether the teacher knows more than the student shows
in where that shift sits: on the action span (the env command the response commits to, the
decision) or on the rest (the reasoning before it, the format), and whether it differs
between won and failed trajectories. Means hide a teacher that raises a few decisive tokens
and lowers many others, so every split reports quantiles and the shares of clearly
endorsed (gate > 0.6) and clearly opposed (gate < 0.4) tokens too.

Host side, numpy. The figures are at theta_old: `delta = teacher_logprobs - old_logprobs`,
the skill-conditioned and the plain score of the tokens under the parameters that sampled
them, as `seed_jax.seed.batch.trajectory_gate_stats` does. Only the "precomputed" teacher
mode scores the teacher on the host at theta_old; in the "joint" and "separate" modes the
teacher is scored inside the train step and these figures are absent.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from seed_jax.envs.agent_format import action_char_span, decision_char_span
from seed_jax.seed.batch import Trajectory

GATE_HIGH, GATE_LOW = 0.6, 0.4  # a gate this far from 0.5 is a clear teacher opinion
QUANTILES = (10, 50, 90)
# The splits of `token_gap_stats`: metric-key prefix -> which OPD-active tokens.
SPLITS = ("all", "action", "rest", "decision", "won", "failed", "decision_won",
          "decision_failed")
SpanOf = Callable[[str], "tuple[int, int] | None"]  # decoded response -> character span


def action_token_mask(tokenizer, response_ids: Sequence[int],
                      span_of: SpanOf = action_char_span) -> np.ndarray:
  """Bool `[len(response_ids)]`: the tokens whose decoded characters overlap the action
  block (`span_of` of the decoded response: `action_char_span`, or `decision_char_span`
  for where the response first names its action); all False without a span.

  Token i covers the characters `[L(i), L(i + 1))` with `L(i) = len(decode(ids[:i]))`, which
  grows with i, so each end of the span is found by binary search over prefixes: O(log n)
  decodes, not one per token. A token straddling a tag's edge (e.g. `"><"`) counts as in.
  """
  ids = list(response_ids)
  return _span_token_mask(tokenizer, ids, span_of(tokenizer.decode(ids)))


def _span_token_mask(tokenizer, ids: list[int], span: tuple[int, int] | None) -> np.ndarray:
  """Bool `[len(ids)]`: the tokens overlapping the character span of `decode(ids)`."""
  mask = np.zeros(len(ids), bool)
  if span is None:
    return mask
  start, end = span

  def first_prefix(reaches: int, strictly: bool) -> int:
    """The smallest k in [0, n] with L(k) > reaches (strictly) or L(k) >= reaches."""
    lo, hi = 0, len(ids)
    while lo < hi:
      mid = (lo + hi) // 2
      length = len(tokenizer.decode(ids[:mid]))
      if length > reaches or (not strictly and length >= reaches):
        hi = mid
      else:
        lo = mid + 1
    return lo

  # First token: the first whose end passes `start`; last: the last that starts before `end`.
  first = first_prefix(start, strictly=True) - 1
  last = first_prefix(end, strictly=False) - 1
  mask[max(first, 0):last + 1] = True
  return mask


def response_span_masks(trajectories: Sequence[Trajectory], response_len: int, tokenizer,
                        num_rows: int | None = None,
                        spans: Sequence[SpanOf] = (action_char_span, decision_char_span)
                        ) -> tuple[np.ndarray, ...]:
  """One bool `[B, R]` over `build_batch`'s rows per entry of `spans`: True at the response
  tokens of that span of each step (`action_token_mask`); by default the action block and
  the decision (`decision_char_span`). Each response is decoded once for all spans.

  Rows follow `build_batch`: every step of every trajectory in turn, a response's token r
  in column r, responses longer than R cut to their first R tokens (a span is found in the
  whole response, then cut). `num_rows` (default: the step count) adds all-False rows for
  build_batch's padding rows.
  """
  steps = [step for traj in trajectories for step in traj.steps]
  rows = len(steps) if num_rows is None else num_rows
  if rows < len(steps):
    raise ValueError(f"{rows} rows for {len(steps)} steps")
  out = tuple(np.zeros((rows, response_len), bool) for _ in spans)
  for row, step in enumerate(steps):
    ids = list(step.response_ids)
    text = tokenizer.decode(ids)
    for masks, span_of in zip(out, spans):
      mask = _span_token_mask(tokenizer, ids, span_of(text))[:response_len]
      masks[row, :len(mask)] = mask
  return out


def gap_summary(delta: np.ndarray, beta: float, prefix: str = "") -> dict[str, float]:
  """Figures of a 1-D array of token shifts `delta [N]` and their gates `sigmoid(beta*delta)`.

  Returns `{prefix}tokens`, `{prefix}delta_mean`, `{prefix}delta_q10 / _q50 / _q90` (linear
  interpolation), `{prefix}gate_mean`, `{prefix}gate_above_0.6` and `{prefix}gate_below_0.4`
  (shares of the tokens); with no token only `{prefix}tokens: 0` (no NaN in JSON).
  """
  delta = np.asarray(delta, np.float64).reshape(-1)
  out = {f"{prefix}tokens": int(delta.size)}
  if not delta.size:
    return out
  gate = 1.0 / (1.0 + np.exp(-beta * delta))
  out[f"{prefix}delta_mean"] = float(delta.mean())
  for q, value in zip(QUANTILES, np.percentile(delta, QUANTILES)):
    out[f"{prefix}delta_q{q}"] = float(value)
  out[f"{prefix}gate_mean"] = float(gate.mean())
  out[f"{prefix}gate_above_{GATE_HIGH}"] = float(np.mean(gate > GATE_HIGH))
  out[f"{prefix}gate_below_{GATE_LOW}"] = float(np.mean(gate < GATE_LOW))
  return out


def _won_rows(trajectories: Sequence[Trajectory], num_rows: int) -> np.ndarray:
  """Bool `[B]`: the rows of won trajectories (build_batch's padding rows: False)."""
  won = np.zeros(num_rows, bool)
  won[:sum(len(t.steps) for t in trajectories)] = np.repeat(
      [bool(t.won) for t in trajectories], [len(t.steps) for t in trajectories])
  return won


def _padded_rows(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
  """A token mask with fewer rows than the batch (no padding rows), padded with False."""
  out = np.zeros(shape, bool)
  out[:mask.shape[0]] = mask
  return out


def _active_and_delta(batch: dict[str, np.ndarray], teacher_logprobs: np.ndarray,
                      action_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(active bool `[B, R]`, delta float64 `[B, R]`, action bool `[B, R]`)."""
  active = (batch["response_mask"] * batch["opd_mask"][:, None]) > 0
  delta = np.asarray(teacher_logprobs, np.float64) - batch["old_logprobs"]
  return active, delta, _padded_rows(action_mask, active.shape)


def token_gap_stats(trajectories: Sequence[Trajectory], batch: dict[str, np.ndarray],
                    teacher_logprobs: np.ndarray, beta: float, action_mask: np.ndarray,
                    decision_mask: np.ndarray | None = None) -> dict[str, float]:
  """The teacher gap of one batch at theta_old, over its OPD-active tokens.

  Args:
    trajectories: the batch's episodes, in `build_batch`'s row order.
    batch: `build_batch`'s output (`old_logprobs`, `response_mask [B, R]`, `opd_mask [B]`).
    teacher_logprobs: `[B, R]` under the skill-augmented prompts at theta_old (the
      "precomputed" teacher mode's; the other modes have none on the host).
    beta: the OPD gate's `beta_opd`.
    action_mask: bool `[B, R]` (or `[steps, R]`), `response_span_masks`' first.
    decision_mask: the same for the decision (its second), or None (no such split).
  Returns:
    `gap_summary` of the tokens of each split, under the prefixes `gap_all_`,
    `gap_action_` (the action block), `gap_rest_` (the rest of the response),
    `gap_decision_` (where the response first names its action; with `decision_mask`),
    `gap_won_` and `gap_failed_` (the tokens of won / failed trajectories), and
    `gap_decision_won_` / `gap_decision_failed_` (the decisions of each: a teacher that
    knows the outcome raises the won episodes' moves and lowers the failed ones').
  """
  active, delta, action = _active_and_delta(batch, teacher_logprobs, action_mask)
  won = _won_rows(trajectories, active.shape[0])[:, None]
  # Padding rows hold no active token, so `~won` picks the failed trajectories' tokens.
  splits = {"all": active, "action": active & action, "rest": active & ~action,
            "won": active & won, "failed": active & ~won}
  if decision_mask is not None:
    decision = active & _padded_rows(decision_mask, active.shape)
    splits.update(decision=decision, decision_won=decision & won,
                  decision_failed=decision & ~won)
  out: dict[str, float] = {}
  for name in SPLITS:
    if name in splits:
      out.update(gap_summary(delta[splits[name]], beta, f"gap_{name}_"))
  return out


def trajectory_token_gaps(trajectories: Sequence[Trajectory], batch: dict[str, np.ndarray],
                          teacher_logprobs: np.ndarray, beta: float, action_mask: np.ndarray
                          ) -> list[dict[str, float] | None]:
  """Per trajectory, `gap_summary` of its OPD-active tokens on the action block
  (`gap_action_*`) and on the rest (`gap_rest_*`): the analysis file's split figures. None
  for a trajectory without OPD-active tokens (no skill). Arguments as `token_gap_stats`.
  """
  active, delta, action = _active_and_delta(batch, teacher_logprobs, action_mask)
  out, row = [], 0
  for traj in trajectories:
    rows = slice(row, row + len(traj.steps))
    row += len(traj.steps)
    if not active[rows].any():
      out.append(None)
      continue
    on_action = active[rows] & action[rows]
    out.append({**gap_summary(delta[rows][on_action], beta, "gap_action_"),
                **gap_summary(delta[rows][active[rows] & ~action[rows]], beta, "gap_rest_")})
  return out
