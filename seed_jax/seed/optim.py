"""The optimizer: global-norm clipping then AdamW on a warm-up schedule."""

from __future__ import annotations

import dataclasses

import optax

from seed_jax.checks import (fraction, non_negative, non_negative_int, one_of, positive,
                             require)

SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW hyper-parameters; defaults follow the paper / public SEED code (verl actor).

  Attributes:
    learning_rate: peak learning rate (paper 1e-6; stage-1 SFT 5e-6).
    warmup_steps: linear warm-up from 0 to the peak over this many updates (RL 0; SFT
      uses 10 % of its steps).
    schedule: "constant" after warm-up (RL) or "cosine" decay to 0 at `total_steps` (SFT).
    total_steps: length of the cosine schedule, warm-up included (ignored for constant).
    b1, b2, eps: Adam moments (verl (0.9, 0.999); the SFT stage uses b2 0.95).
    weight_decay: decoupled weight decay (0.01).
    grad_clip: clip gradients to this global norm (1.0); 0 disables clipping.
  """
  learning_rate: float = 1e-6
  warmup_steps: int = 0
  schedule: str = "constant"
  total_steps: int = 0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.01
  grad_clip: float = 1.0

  def __post_init__(self):
    # A zero or negative rate trains nothing or ascends the loss: refused, not run.
    require(self, "learning_rate", positive, "a positive number")
    require(self, ("warmup_steps", "total_steps"), non_negative_int, "a non-negative integer")
    require(self, "schedule", one_of(SCHEDULES), f"one of {SCHEDULES}")
    require(self, "total_steps", lambda n: self.schedule != "cosine" or n > self.warmup_steps,
            f"more than warmup_steps ({self.warmup_steps}) for a cosine schedule")
    require(self, ("b1", "b2"), fraction, "in [0, 1)")  # 1 would never forget a gradient
    require(self, "eps", positive, "a positive number")
    require(self, ("weight_decay", "grad_clip"), non_negative, "a non-negative number")


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
  """Learning rate as a function of the update count."""
  if cfg.schedule == "constant":
    if cfg.warmup_steps <= 0:
      return optax.constant_schedule(cfg.learning_rate)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps),
         optax.constant_schedule(cfg.learning_rate)], [cfg.warmup_steps])
  if cfg.schedule == "cosine":
    if cfg.total_steps <= cfg.warmup_steps:
      raise ValueError(f"optim.total_steps ({cfg.total_steps}) must exceed "
                       f"optim.warmup_steps ({cfg.warmup_steps}) for a cosine schedule")
    return optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, cfg.warmup_steps,
                                              cfg.total_steps, end_value=0.0)
  raise ValueError(f"optim.schedule must be 'constant' or 'cosine', got {cfg.schedule!r}")


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
  """`clip_by_global_norm(grad_clip)` then `adamw(schedule)`."""
  adamw = optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                      weight_decay=cfg.weight_decay)
  if cfg.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw)
  return adamw
