"""The order in which training tasks are handed out, resumable from one integer."""

from __future__ import annotations

import numpy as np


class TaskIterator:
  """Endless epochs over the train tasks, each shuffled from (seed, epoch); the whole
  state is `cursor`, the number of tasks handed out so far."""

  def __init__(self, tasks, seed: int, cursor: int = 0):
    if not tasks:
      raise ValueError("the train split has no tasks")
    self.tasks, self.seed, self.cursor = list(tasks), seed, cursor

  def take(self, n: int) -> list:
    out = []
    for _ in range(n):
      epoch, index = divmod(self.cursor, len(self.tasks))
      order = np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))
      out.append(self.tasks[order[index]])
      self.cursor += 1
    return out
