"""Small, exact statistics shared by every room: Prometheus-style histogram quantiles.

`histogram_quantile` follows Prometheus' own interpolation (promql/quantile.go), so a
kvscope percentile read off vLLM's buckets matches what a Grafana panel shows.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """The q-quantile of cumulative buckets [(upper bound `le`, count), ...].

    Buckets may come unsorted; the last must be +Inf. Returns NaN without observations,
    the highest finite bound when the rank falls in the +Inf bucket (as Prometheus does).
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    pairs = sorted(buckets)
    if len(pairs) < 2 or not math.isinf(pairs[-1][0]):
        return math.nan
    # Counts of a cumulative histogram never fall; scrape races can make them, so clamp.
    les = [le for le, _ in pairs]
    counts: list[float] = []
    for _, c in pairs:
        counts.append(max(c, counts[-1]) if counts else c)
    total = counts[-1]
    if total <= 0:
        return math.nan
    rank = q * total
    b = bisect.bisect_left(counts, rank)
    if b == len(pairs) - 1:
        return les[-2]
    if b == 0 and les[0] <= 0:
        return les[0]
    start, end, count = 0.0, les[b], counts[b]
    if b > 0:
        start = les[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count <= 0:
        return end
    return start + (end - start) * (rank / count)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated q-quantile (0..1) of raw values; NaN for an empty input."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Trend:
    """A least-squares line through samples: slope (y per x) and its standard error."""

    slope: float
    stderr: float
    n: int

    @property
    def significant(self) -> bool:
        """Whether the slope is more than two standard errors from zero (about 95%)."""
        return abs(self.slope) > 2 * self.stderr


def linear_trend(xs: Sequence[float], ys: Sequence[float]) -> Trend | None:
    """Ordinary least squares of ys on xs; None with fewer than 3 points or one x."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    n = len(x)
    sxx = float(((x - x.mean()) ** 2).sum()) if n else 0.0
    if n < 3 or sxx <= 0:
        return None
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    residuals = y - (y.mean() + slope * (x - x.mean()))
    stderr = math.sqrt(float((residuals**2).sum()) / (n - 2) / sxx)
    return Trend(slope, stderr, n)


def histogram_quantiles(q: float, les: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`histogram_quantile` for many histograms at once (one per row of `counts`).

    `les` are the sorted upper bounds (last +Inf); `counts[i, j]` the cumulative count of
    row i in bucket j. Rows without observations (or with NaN) give NaN.
    """
    counts = np.maximum.accumulate(np.asarray(counts, dtype=float), axis=1)
    n, k = counts.shape
    out = np.full(n, np.nan)
    if k < 2 or not math.isinf(les[-1]):
        return out
    total = counts[:, -1]
    valid = (total > 0) & ~np.isnan(counts).any(axis=1)
    rank = q * total
    # First bucket whose cumulative count reaches the rank.
    b = np.argmax(counts >= rank[:, None], axis=1)
    rows = np.arange(n)
    end = les[b]
    start = np.where(b > 0, les[np.maximum(b - 1, 0)], 0.0)
    below = np.where(b > 0, counts[rows, np.maximum(b - 1, 0)], 0.0)
    in_bucket = counts[rows, b] - below
    with np.errstate(divide="ignore", invalid="ignore"):
        interp = start + (end - start) * ((rank - below) / in_bucket)
    interp = np.where(in_bucket > 0, interp, end)
    interp = np.where(b == k - 1, les[-2], interp)
    interp = np.where((b == 0) & (les[0] <= 0), les[0], interp)
    out[valid] = interp[valid]
    return out
