"""The statistics of an experiment's page (seed_jax/experiments/stats.py), against figures
worked by hand and t quantiles from printed tables."""

from __future__ import annotations

import math

import numpy as np
import pytest

from seed_jax.experiments import stats


def test_mean_std_is_the_sample_standard_deviation():
  mean, std = stats.mean_std([0.0, 0.5, 1.0])
  assert mean == 0.5 and np.isclose(std, 0.5)
  assert stats.mean_std([0.3]) == (0.3, 0.0)


def test_the_paired_interval_is_students_t_of_the_mean_difference():
  # Differences 1, 2, 3: mean 2, sd 1; t(0.975, 2 df) = 4.303 (printed tables).
  diff = stats.paired_difference([1.5, 2.0, 3.25], [0.5, 0.0, 0.25])
  assert diff.n == 3 and diff.mean == pytest.approx(2.0)
  assert diff.high - diff.mean == pytest.approx(4.303 / math.sqrt(3), abs=1e-3)
  assert diff.mean - diff.low == pytest.approx(diff.high - diff.mean)
  assert not diff.excludes_zero  # 2 - 2.484 < 0
  # Five pairs, t(0.975, 4 df) = 2.776: differences 1, 1.5, 2, 2.5, 3, sd 0.7906.
  five = stats.paired_difference([1, 1.5, 2, 2.5, 3], [0] * 5)
  assert five.low == pytest.approx(2 - 2.776 * 0.7906 / math.sqrt(5), abs=1e-3)
  assert five.excludes_zero
  # Negative differences exclude zero from below.
  assert stats.paired_difference([0, 0, 0], [1, 1.1, 0.9]).excludes_zero


def test_one_pair_has_no_interval_and_none_no_mean():
  one = stats.paired_difference([0.5], [0.25])
  assert one.mean == 0.25 and math.isnan(one.low) and math.isnan(one.high)
  assert not one.excludes_zero
  assert stats.paired_difference([], []).n == 0
  with pytest.raises(ValueError, match="as many values"):
    stats.paired_difference([0.5, 0.5], [0.25])


def test_pooled_rate_weighs_each_rate_by_its_count():
  assert stats.pooled_rate([0.5, 0.0], [4, 12]) == 0.125  # 2 wins of 16


def test_curve_mean_is_the_trapezoid_area_over_the_width():
  # A ramp from 0 to 1 over 16 episodes, then flat at 1 for 16: (8 + 16) / 32.
  assert stats.curve_mean([0, 16, 32], [0, 1, 1]) == 0.75
