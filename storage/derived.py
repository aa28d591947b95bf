"""Query-time derivations: gauges on a time grid, reset-aware rates, sliding-window quantiles.

Stored values are carried forward to each grid point (last observation, as long as it is
no older than a staleness bound), counters are corrected for resets first (an engine
restart starts them at zero), and label sets are combined per the metric's rule. This is
Prometheus' `rate()` and `histogram_quantile(sum by (le)(increase(...)))`, on our store.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sqlalchemy import Engine

from planner.stats import histogram_quantiles
from storage.ingest import STALE_S
from storage.names import METRICS, QUANTILES, Kind
from storage.queries.series import series_arrays

RAW_MAX_WINDOW_S = 6 * 3600
MINUTE_MAX_WINDOW_S = 2 * 86400
MAX_POINTS = 720
STALE_RAW_S = STALE_S


def choose_resolution(window_s: float) -> int:
    """Raw samples up to 6 h, 1-minute rollups up to 2 days, 1-hour rollups beyond."""
    if window_s <= RAW_MAX_WINDOW_S:
        return 0
    if window_s <= MINUTE_MAX_WINDOW_S:
        return 60
    return 3600


@dataclass(frozen=True)
class Grid:
    """Evaluation times for a chart: `points` ends at `end`, `step` apart."""

    start: float
    end: float
    step: float
    resolution: int

    @property
    def points(self) -> np.ndarray:
        n = max(1, math.floor((self.end - self.start) / self.step) + 1)
        return self.end - self.step * np.arange(n)[::-1]

    @property
    def stale_s(self) -> float:
        return STALE_RAW_S if self.resolution == 0 else 2.5 * self.resolution


def make_grid(
    start: float, end: float, min_step: float = 2.0, max_points: int = MAX_POINTS
) -> Grid:
    """A grid for [start, end] at the resolution chosen from the window length."""
    if end <= start:
        raise ValueError("window end must be after its start")
    res = choose_resolution(end - start)
    step = max(float(res), min_step, (end - start) / max_points)
    return Grid(start, end, step, res)


def point_grid(at: float, window_s: float) -> Grid:
    """A one-point grid: the value at `at` over a trailing window (for summaries)."""
    return Grid(at, at, max(window_s, 1.0), choose_resolution(window_s))


# --- loading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Series:
    labels_key: str
    ts: np.ndarray
    values: np.ndarray


def _load(
    store: Engine,
    target_id: int,
    name: str,
    grid: Grid,
    lookback: float,
    cumulative: bool,
    stat: str = "avg",
) -> list[_Series]:
    """The stored points of every label set of one series name, reset-corrected if cumulative."""
    res = grid.resolution
    loaded = series_arrays(
        store, target_id, name, grid.start - lookback - grid.stale_s, grid.end, res
    )
    out = []
    for lk, g in loaded:
        if res == 0:
            ts, v = g["ts"], g["value"]
        else:  # a rollup holds the state at the end of its bucket
            ts = g["ts"] + res
            if cumulative and not np.isnan(g["increase"]).any():
                # The increases already count a reset inside a bucket; lasts alone would not.
                # The running total is 0 at the first bucket's start, so its increase counts.
                total = np.concatenate([[0.0], np.cumsum(g["increase"])])
                starts = np.concatenate([[ts[0] - res], ts])
                out.append(_Series(lk, starts, total))
                continue
            v = g["last" if cumulative else stat]
        if cumulative and len(v) > 1:
            drops = np.diff(v) < 0
            v = v + np.concatenate([[0.0], np.cumsum(np.where(drops, v[:-1], 0.0))])
        out.append(_Series(lk, ts, v))
    return out


def _at(series: _Series, times: np.ndarray, stale: float) -> np.ndarray:
    """Last value at or before each time, NaN where none is fresh enough."""
    idx = np.searchsorted(series.ts, times, side="right") - 1
    ok = idx >= 0
    vals = np.full(len(times), np.nan)
    vals[ok] = series.values[idx[ok]]
    too_old = np.zeros(len(times), dtype=bool)
    too_old[ok] = times[ok] - series.ts[idx[ok]] > stale
    vals[too_old] = np.nan
    return vals


def _increase(
    series: _Series, times: np.ndarray, w: float, stale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Increase of a reset-corrected counter over (t - w, t], and the span it covers.

    The base is the value carried to t - w; when the series starts inside the window, its
    first sample there is the base (so a new target has rates before a full window passed).
    """
    end = _at(series, times, stale)
    base = _at(series, times - w, stale)
    base_ts = times - w
    missing = np.isnan(base)
    if missing.any():
        first = np.searchsorted(series.ts, times[missing] - w, side="right")
        inside = first < len(series.ts)
        idx = np.where(inside, first, 0)
        ok = inside & (series.ts[idx] <= times[missing])
        fill = np.full(missing.sum(), np.nan)
        fill[ok] = series.values[idx[ok]]
        base[missing] = fill
        fill_ts = np.full(missing.sum(), np.nan)
        fill_ts[ok] = series.ts[idx[ok]]
        base_ts[missing] = fill_ts
    return end - base, times - base_ts


def _combine(stack: list[np.ndarray], how: str) -> np.ndarray:
    arr = np.vstack(stack)
    present = ~np.isnan(arr)
    any_present = present.any(axis=0)
    if how == "max":
        return np.where(any_present, np.where(present, arr, -np.inf).max(axis=0), np.nan)
    total = np.where(present, arr, 0.0).sum(axis=0)
    if how == "mean":
        total = total / np.maximum(present.sum(axis=0), 1)
    return np.where(any_present, total, np.nan)


# --- derivations ---------------------------------------------------------------------------


def gauge(store: Engine, target_id: int, metric: str, grid: Grid, stat: str = "avg") -> pd.Series:
    """A gauge on the grid, label sets combined (KV usage averaged, queues summed).

    Read from rollups, `stat` picks the bucket's time-weighted "avg" or its "max" (the peak
    an average would hide); from raw samples both are the value.
    """
    m = METRICS[metric]
    if m.kind is not Kind.GAUGE:
        raise ValueError(f"{metric} is not a gauge")
    times = grid.points
    peak = stat == "max" and grid.resolution > 0
    loaded = _load(store, target_id, metric, grid, grid.step if peak else 0.0, False, stat)
    if not loaded:
        return pd.Series(np.full(len(times), np.nan), index=times, name=metric)
    if peak:
        picked = [_peak(s, times, grid.stale_s, grid.step) for s in loaded]
    else:
        picked = [_at(s, times, grid.stale_s) for s in loaded]
    vals = _combine(picked, m.combine)
    return pd.Series(vals, index=times, name=metric)


def _peak(series: _Series, times: np.ndarray, stale: float, step: float) -> np.ndarray:
    """The highest value of the buckets ending in (t - step, t] at each time: a grid coarser
    than the buckets must not step over a spike. Where none ends there, the carried value."""
    out = _at(series, times, stale)
    lo = np.searchsorted(series.ts, times - step, side="right")
    hi = np.searchsorted(series.ts, times, side="right")
    for i in np.nonzero(hi > lo)[0]:
        out[i] = series.values[lo[i] : hi[i]].max()
    return out


def rate_window(grid: Grid) -> float:
    """The trailing window a rate is taken over: at least 4 raw steps or one rollup step."""
    return max(grid.step, 30.0) if grid.resolution == 0 else grid.step


def rate(
    store: Engine, target_id: int, counter: str, grid: Grid, window_s: float | None = None
) -> pd.Series:
    """Per-second increase of a counter over a trailing window at each grid point."""
    if METRICS[counter].kind is not Kind.COUNTER:
        raise ValueError(f"{counter} is not a counter")
    w = window_s or rate_window(grid)
    times = grid.points
    loaded = _load(store, target_id, counter, grid, w, cumulative=True)
    if not loaded:
        return pd.Series(np.full(len(times), np.nan), index=times, name=counter)
    pairs = [_increase(s, times, w, grid.stale_s) for s in loaded]
    inc = _combine([p[0] for p in pairs], "sum")
    span = np.fmax.reduce(np.vstack([p[1] for p in pairs]), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(span > 0, np.maximum(inc, 0.0) / span, np.nan)
    return pd.Series(value, index=times, name=counter)


def quantiles(
    store: Engine,
    target_id: int,
    histogram: str,
    grid: Grid,
    window_s: float | None = None,
    qs: tuple[float, ...] = QUANTILES,
) -> pd.DataFrame:
    """p50/p95/p99 (and p99/p50 ratio, request count) over a trailing window at each point.

    Buckets of every label set are summed per `le` before the quantile, as
    `histogram_quantile(q, sum by (le) (increase(h_bucket[w])))` does.
    """
    if METRICS[histogram].kind is not Kind.HISTOGRAM:
        raise ValueError(f"{histogram} is not a histogram")
    w = window_s or max(300.0, grid.step)
    times = grid.points
    cols = [f"p{round(q * 100)}" for q in qs]
    frame = pd.DataFrame(index=times, columns=[*cols, "ratio", "count"], dtype=float)
    les, counts = bucket_increases(store, target_id, histogram, grid, w)
    if not len(les):
        return frame
    for q, col in zip(qs, cols, strict=True):
        frame[col] = histogram_quantiles(q, les, counts)
    frame["count"] = counts[:, -1]
    if "p99" in frame and "p50" in frame:
        with np.errstate(divide="ignore", invalid="ignore"):
            frame["ratio"] = frame["p99"] / frame["p50"]
    return frame


def bucket_increases(
    store: Engine, target_id: int, histogram: str, grid: Grid, window_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each bucket's increase over (t - window, t] at each grid point, label sets summed
    per `le`: the bucket bounds, and a (points x buckets) matrix. Empty without a +Inf
    bucket (a histogram the engine did not expose in full)."""
    times = grid.points
    by_le: dict[float, list[np.ndarray]] = {}
    for s in _load(store, target_id, f"{histogram}_bucket", grid, window_s, cumulative=True):
        le = float(json.loads(s.labels_key)["le"])
        by_le.setdefault(le, []).append(_increase(s, times, window_s, grid.stale_s)[0])
    if not by_le or math.inf not in by_le:
        return np.array([]), np.empty((len(times), 0))
    les = np.array(sorted(by_le))
    return les, np.column_stack([_combine(by_le[le], "sum") for le in les])


def histogram_increase(
    store: Engine, target_id: int, histogram: str, at: float, window_s: float
) -> list[tuple[float, float]]:
    """Each bucket's increase over (at - window, at], label sets summed: the window's own
    histogram as [(le, count)], the input of bucket-based compliance."""
    grid = point_grid(at, window_s)
    out: dict[float, float] = {}
    for s in _load(store, target_id, f"{histogram}_bucket", grid, window_s, cumulative=True):
        inc, _ = _increase(s, grid.points, window_s, grid.stale_s)
        if not np.isnan(inc[-1]):
            le = float(json.loads(s.labels_key)["le"])
            out[le] = out.get(le, 0.0) + float(inc[-1])
    return sorted(out.items())


def increase(
    store: Engine,
    target_id: int,
    name: str,
    grid: Grid,
    window_s: float,
    keep: Callable[[dict[str, str]], bool] | None = None,
) -> pd.Series:
    """Increase of a stored cumulative series (a counter, or a histogram's `_sum` or
    `_count`) over (t - window, t] at each grid point, label sets kept by `keep` summed."""
    times = grid.points
    loaded = _load(store, target_id, name, grid, window_s, cumulative=True)
    picked = [s for s in loaded if keep is None or keep(json.loads(s.labels_key))]
    if not picked:
        return pd.Series(np.full(len(times), np.nan), index=times, name=name)
    inc = _combine([_increase(s, times, window_s, grid.stale_s)[0] for s in picked], "sum")
    return pd.Series(np.maximum(inc, 0.0), index=times, name=name)


def gauge_window(
    store: Engine, target_id: int, name: str, grid: Grid, window_s: float
) -> pd.DataFrame:
    """Time-weighted mean and the maximum of a gauge over (t - window, t] at each grid
    point (label sets combined by the metric's rule), where raw samples are a step function
    (each value holds until the next, for at most the staleness bound) and rollups hold
    each bucket's average and peak."""
    times = grid.points
    how = METRICS[name].combine if name in METRICS else "mean"
    loaded = _load(store, target_id, name, grid, window_s, cumulative=False)
    tops: dict[str, _Series] = {}
    if grid.resolution:  # each bucket's peak, read once for every label set
        tops = {
            s.labels_key: s
            for s in _load(store, target_id, name, grid, window_s, cumulative=False, stat="max")
        }
    means, peaks = [], []
    for s in loaded:
        if grid.resolution:
            empty = _Series(s.labels_key, np.array([]), np.array([]))
            m, p = _bucket_window(s, tops.get(s.labels_key, empty), times, window_s)
        else:
            m, p = _step_window(s, times, window_s, grid.stale_s)
        means.append(m)
        peaks.append(p)
    frame = pd.DataFrame(index=times, columns=["mean", "max"], dtype=float)
    if loaded:
        frame["mean"] = _combine(means, how)
        frame["max"] = _combine(peaks, "max" if how == "mean" else how)
    return frame


def _step_window(
    series: _Series, times: np.ndarray, w: float, stale: float
) -> tuple[np.ndarray, np.ndarray]:
    means = np.full(len(times), np.nan)
    peaks = np.full(len(times), np.nan)
    for i, t in enumerate(times):
        first = np.searchsorted(series.ts, t - w, side="right")
        last = np.searchsorted(series.ts, t, side="right")
        edges = np.concatenate([[t - w], series.ts[first:last], [t]])
        values = np.concatenate([_at(series, np.array([t - w]), stale), series.values[first:last]])
        known = ~np.isnan(values)
        # A value holds until the next, but past the staleness bound it is a gap.
        weight = np.where(known, np.minimum(np.diff(edges), stale), 0.0)
        if weight.sum() > 0:
            means[i] = float((weight * np.where(known, values, 0.0)).sum() / weight.sum())
            peaks[i] = float(values[known].max())
    return means, peaks


def _bucket_window(
    avg: _Series, peak: _Series, times: np.ndarray, w: float
) -> tuple[np.ndarray, np.ndarray]:
    means = np.full(len(times), np.nan)
    peaks = np.full(len(times), np.nan)
    for i, t in enumerate(times):
        inside = (avg.ts > t - w) & (avg.ts <= t)
        if inside.any():
            means[i] = float(np.nanmean(avg.values[inside]))
        inside_p = (peak.ts > t - w) & (peak.ts <= t)
        if inside_p.any():
            peaks[i] = float(np.nanmax(peak.values[inside_p]))
    return means, peaks
