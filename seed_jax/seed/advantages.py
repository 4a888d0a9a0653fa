"""Outcome scores and group-relative advantages (host side, numpy).

Two ways to score and normalise, both from the paper's description:

* "step" (default, matches the public SEED code): one sample per environment step; its
  score is the episode reward minus the invalid-action penalty if *that* step was invalid
  ("step-local"; likewise the optional penalty of a step that changed nothing); mean and
  unbiased std are taken over all step-samples of the group (the N trajectories of one
  task), so longer trajectories weigh more.
* "trajectory": one score per trajectory, the episode reward minus the sum of its steps'
  penalties; mean and unbiased std over the N trajectories; every step of the trajectory
  gets its trajectory's advantage.

`A = (score - mean) / (std + eps)`, or `score - mean` without std normalisation (WebShop).
A group holding a single sample gets mean 0 and std 1, as in verl.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np


# "step": the public code's per-step scores normalised over the group's step-samples;
# "trajectory": one score per trajectory normalised over the group (module docstring).
ADVANTAGE_MODES = ("step", "trajectory")


def step_penalties(
    step_valid: Sequence[Sequence[bool]],
    invalid_penalty: float,
    step_effective: Sequence[Sequence[bool]] | None = None,
    ineffective_penalty: float = 0.0,
) -> list[np.ndarray]:
  """What each step is charged: `invalid_penalty` where the response broke the format,
  else `ineffective_penalty` where the env said the action changed nothing (a Sokoban
  move into a wall); one charge a step, never both.

  Args:
    step_valid: per trajectory, `[T_n]` whether each step's action was valid.
    step_effective: per trajectory, `[T_n]` whether each step changed the env's state
      (None: every step did).
  Returns:
    per trajectory, float64 `[T_n]`.
  """
  if step_effective is None:
    step_effective = [[True] * len(valid) for valid in step_valid]
  return [np.where(np.asarray(valid, dtype=bool), ineffective_penalty
                   * (1.0 - np.asarray(effective, dtype=np.float64)), invalid_penalty)
          for valid, effective in zip(step_valid, step_effective)]


def step_scores(
    episode_rewards: Sequence[float],
    penalties: Sequence[Sequence[float]],
) -> list[np.ndarray]:
  """Per-step scores with the step-local penalties.

  Args:
    episode_rewards: `[N]` one reward per trajectory.
    penalties: per trajectory, `[T_n]` each step's charge (`step_penalties`).
  Returns:
    per trajectory, float64 `[T_n]`: reward - the step's penalty.
  """
  return [float(reward) - np.asarray(penalty, dtype=np.float64)
          for reward, penalty in zip(episode_rewards, penalties)]


def group_normalize(
    scores: np.ndarray, group_ids: Sequence[Hashable], *, norm_by_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
  """`(score - mean_g) / (std_g + eps)` within each group g (unbiased std).

  Args:
    scores: float `[S]`, one per sample.
    group_ids: `[S]` the group of each sample.
  Returns:
    float32 `[S]`.
  """
  scores = np.asarray(scores, dtype=np.float64)
  _, inverse = np.unique(np.asarray([str(g) for g in group_ids]), return_inverse=True)
  out = np.empty_like(scores)
  for group in np.unique(inverse):
    members = inverse == group
    values = scores[members]
    if values.size == 1:
      mean, std = 0.0, 1.0
    else:
      mean, std = values.mean(), values.std(ddof=1)
    centred = values - mean
    out[members] = centred / (std + eps) if norm_by_std else centred
  return out.astype(np.float32)


def step_advantages(
    episode_rewards: Sequence[float],
    penalties: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    *,
    mode: str = "step",
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> list[np.ndarray]:
  """Advantage of every step of every trajectory.

  Args:
    episode_rewards: `[N]` per trajectory (e.g. 10 x won).
    penalties: per trajectory `[T_n]` each step's charge (`step_penalties`).
    group_ids: `[N]` the GRPO group (task) of each trajectory.
    mode: "step" (public code) or "trajectory" (see the module docstring).
  Returns:
    per trajectory, float32 `[T_n]`.
  """
  if mode not in ADVANTAGE_MODES:
    raise ValueError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
  lengths = [len(p) for p in penalties]
  if mode == "step":
    scores = np.concatenate(step_scores(episode_rewards, penalties) or [[]])
    sample_groups = [g for g, n in zip(group_ids, lengths) for _ in range(n)]
    flat = group_normalize(scores, sample_groups, norm_by_std=norm_by_std, eps=eps)
    return np.split(flat, np.cumsum(lengths)[:-1]) if lengths else []
  scores = (np.asarray(episode_rewards, np.float64)
            - np.asarray([np.sum(p, dtype=np.float64) for p in penalties]))
  per_traj = group_normalize(scores, group_ids, norm_by_std=norm_by_std, eps=eps)
  return [np.full(n, a, dtype=np.float32) for a, n in zip(per_traj, lengths)]
