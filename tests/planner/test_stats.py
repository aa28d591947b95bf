"""Histogram quantiles exactly as Prometheus' histogram_quantile computes them; trend lines."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from planner.stats import histogram_quantile, histogram_quantiles, linear_trend, percentile

INF = math.inf


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # 10 in (0, 0.1], 10 in (0.1, 0.2]: median is the top of the first bucket.
        (0.5, [(0.1, 10), (0.2, 20), (INF, 20)], 0.1),
        # rank 15 of 20 -> halfway through (0.1, 0.2]
        (0.75, [(0.1, 10), (0.2, 20), (INF, 20)], 0.15),
        # rank falls into +Inf: the highest finite bound
        (0.99, [(1.0, 0), (2.0, 50), (INF, 100)], 2.0),
        # lower bound of the first bucket is 0
        (0.5, [(4.0, 8), (INF, 8)], 2.0),
        # unsorted input, non-monotonic counts are clamped
        (0.5, [(INF, 10), (0.2, 9), (0.1, 10)], 0.05),
        # no observations
        (0.5, [(0.1, 0), (INF, 0)], math.nan),
        # no +Inf bucket: invalid
        (0.5, [(0.1, 3), (0.2, 4)], math.nan),
    ],
)
def test_histogram_quantile(q: float, buckets: list[tuple[float, float]], expected: float) -> None:
    got = histogram_quantile(q, buckets)
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(expected)


def test_out_of_range_q() -> None:
    assert histogram_quantile(-0.1, [(1, 1), (INF, 1)]) == -INF
    assert histogram_quantile(1.1, [(1, 1), (INF, 1)]) == INF


def test_vectorised_version_agrees_with_the_scalar_one() -> None:
    rng = random.Random(7)
    les = np.array([0.01, 0.05, 0.1, 0.5, 1.0, 5.0, INF])
    rows = np.array(
        [np.cumsum([rng.choice([0, 0, 1, 4, 20]) for _ in les]) for _ in range(300)], dtype=float
    )
    for q in (0.0, 0.5, 0.9, 0.95, 0.99, 1.0):
        vec = histogram_quantiles(q, les, rows)
        ref = np.array([histogram_quantile(q, list(zip(les, r, strict=True))) for r in rows])
        assert np.allclose(np.nan_to_num(vec, nan=-1.0), np.nan_to_num(ref, nan=-1.0))


def test_percentile_of_raw_values() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.99) == 5.0
    assert math.isnan(percentile([], 0.5))


def test_linear_trend_against_a_hand_computed_fit() -> None:
    # x̄ = 1.5, ȳ = 1.25, Sxx = 5, Sxy = 4.5: slope 0.9; residuals 0.1, 0.2, -0.7, 0.4,
    # SSR 0.7, so the slope's standard error is sqrt(0.7 / 2 / 5) = sqrt(0.07).
    line = linear_trend([0, 1, 2, 3], [0, 1, 1, 3])
    assert line is not None
    assert line.slope == pytest.approx(0.9)
    assert line.stderr == pytest.approx(math.sqrt(0.07))
    assert line.n == 4 and line.significant  # 0.9 > 2 x 0.265


def test_linear_trend_needs_three_points_and_two_xs() -> None:
    assert linear_trend([0, 1], [0, 1]) is None
    assert linear_trend([2, 2, 2], [0, 1, 2]) is None
    flat = linear_trend([0, 1, 2, 3], [5, 5, 5, 5])
    assert flat is not None and flat.slope == 0 and not flat.significant
