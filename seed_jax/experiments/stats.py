"""Statistics of an experiment's figures over seeds: mean and spread, paired differences
with their t interval, and areas under success curves (numpy; scipy for t quantiles).

A paired difference compares two arms run with the same seed (the same warm start, the
same games, the same sampling seeds), so the seed-to-seed variation both arms share cancels:
the interval is the Student-t interval of the mean of the per-seed differences.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats as scipy_stats


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for a single value)."""
  values = np.asarray(values, np.float64)
  return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


@dataclasses.dataclass(frozen=True)
class PairedDifference:
  """The mean of per-seed differences `a - b` and its two-sided t interval.

  Attributes:
    n: the number of pairs (seeds where both arms have the figure).
    mean: the mean difference (nan without pairs).
    low, high: the interval's bounds (nan with fewer than 2 pairs: no spread to scale).
  """
  n: int
  mean: float
  low: float
  high: float

  @property
  def excludes_zero(self) -> bool:
    return self.n > 1 and (self.low > 0 or self.high < 0)


def paired_difference(a: Sequence[float], b: Sequence[float],
                      confidence: float = 0.95) -> PairedDifference:
  """`a[i] - b[i]` over the pairs, `mean ± t_{(1+confidence)/2, n-1} * sd / sqrt(n)`.

  Args:
    a, b: `[n]` one figure per seed, in the same seed order.
  """
  if len(a) != len(b):
    raise ValueError(f"paired figures need as many values on each side ({len(a)} != {len(b)})")
  diffs = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  n = len(diffs)
  if n == 0:
    return PairedDifference(0, math.nan, math.nan, math.nan)
  mean = float(diffs.mean())
  if n == 1:
    return PairedDifference(1, mean, math.nan, math.nan)
  half = float(scipy_stats.t.ppf((1 + confidence) / 2, n - 1) * diffs.std(ddof=1)
               / math.sqrt(n))
  return PairedDifference(n, mean, mean - half, mean + half)


def pooled_rate(rates: Sequence[float], counts: Sequence[float]) -> float:
  """The rate over everything counted: `sum(rate * count) / sum(count)`. For per-iteration
  success rates and episode counts, the success rate over all episodes played, the area
  under the success-against-episodes step curve divided by its width."""
  counts = np.asarray(counts, np.float64)
  return float(np.dot(np.asarray(rates, np.float64), counts) / counts.sum())


def curve_mean(x: Sequence[float], y: Sequence[float]) -> float:
  """The mean height of the piecewise-linear curve through `(x, y)` (x increasing): its
  trapezoid area divided by its width."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0]))
