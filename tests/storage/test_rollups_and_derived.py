"""Rollups, retention and query-time derivations against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sqlalchemy import Engine

from storage import derived as d
from storage import queries as q
from storage.ingest import Point, SampleWriter
from storage.rollups import expire, run_rollups
from storage.settings import Retention

T0 = 1_800_000_000.0  # a round minute and hour


def _target(store: Engine) -> int:
    return q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"})).id


def test_minute_and_hour_rollups(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store, heartbeat_s=0)
    for i in range(120):  # two minutes, one sample every second: values 0..119
        w.write(tid, [Point("running", {}, float(i))], T0 + i)
    result = run_rollups(store, now=T0 + 3 * 3600)
    frame = q.series_points(store, tid, ["running"], 0, T0 + 9999, resolution=60)
    # The last value (119 at T0+119) holds as readers carry it: 75 s, into two more minutes.
    assert frame["ts"].tolist() == [T0, T0 + 60, T0 + 120, T0 + 180]
    first = frame.iloc[0]
    assert (first["min"], first["max"], first["avg"], first["last"], first["count"]) == (
        0.0,
        59.0,
        29.5,
        59.0,
        60,
    )
    assert first["covered_s"] == 60.0
    assert frame["covered_s"].tolist() == [60.0, 60.0, 60.0, 14.0]
    assert frame["count"].tolist() == [60, 60, 0, 0]
    hour = q.series_points(store, tid, ["running"], 0, T0 + 9999, resolution=3600).iloc[0]
    held = (sum(range(120)) + 119 * 74) / 194  # every value for its second, 119 for 74 s more
    assert (hour["min"], hour["max"], hour["last"], hour["count"]) == (0.0, 119.0, 119.0, 120)
    assert hour["avg"] == pytest.approx(held)
    # Complete minutes only: the last one ends before now minus the lag.
    assert result.watermark == {60: T0 + 3 * 3600 - 60, 3600: T0 + 2 * 3600}
    # A second pass (which rolls the last few buckets again) changes nothing.
    again = run_rollups(store, now=T0 + 3 * 3600)
    assert again.watermark == result.watermark
    assert q.series_points(store, tid, ["running"], 0, T0 + 9999, resolution=60).equals(frame)


def test_incomplete_buckets_wait(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store, heartbeat_s=0)
    w.write(tid, [Point("running", {}, 1.0)], T0 + 10)
    run_rollups(store, now=T0 + 30)  # the minute is not over yet
    assert q.series_points(store, tid, ["running"], 0, T0 + 999, resolution=60).empty
    run_rollups(store, now=T0 + 75)
    assert len(q.series_points(store, tid, ["running"], 0, T0 + 999, resolution=60)) == 1


def test_retention_drops_only_what_is_old(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store, heartbeat_s=0)
    now = T0 + 100 * 86400
    w.write(tid, [Point("running", {}, 1.0)], now - 49 * 3600)
    w.write(tid, [Point("running", {}, 2.0)], now - 47 * 3600)
    run_rollups(store, now=now)
    deleted = expire(store, Retention(raw_hours=48, minute_days=2, hour_days=365), now=now)
    assert deleted["samples"] == 1
    assert q.series_points(store, tid, ["running"], 0, now)["value"].tolist() == [2.0]
    # The minute 49 h ago and the next (its value held into it) are older than 2 days.
    assert deleted["rollups_60"] == 2
    assert len(q.series_points(store, tid, ["running"], 0, now, resolution=3600)) == 2


def test_resolution_follows_the_window() -> None:
    assert d.choose_resolution(900) == 0
    assert d.choose_resolution(6 * 3600) == 0
    assert d.choose_resolution(86400) == 60
    assert d.choose_resolution(30 * 86400) == 3600
    grid = d.make_grid(0, 30 * 86400)
    assert grid.resolution == 3600 and len(grid.points) == 721


def test_rate_handles_a_counter_reset(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store, heartbeat_s=0)
    # 10 preemptions per second; the engine restarts just after T0+48 and counts from 0.
    for i in range(0, 100, 2):
        v = 10.0 * i if i < 50 else 10.0 * (i - 48)
        w.write(tid, [Point("preemptions_total", {}, v, kind="counter")], T0 + i)
    grid = d.Grid(T0 + 40, T0 + 98, 2.0, 0)
    r = d.rate(store, tid, "preemptions_total", grid, window_s=20)
    assert np.allclose(r.to_numpy(), 10.0)  # steady through the reset, never negative


def test_rate_sums_label_sets_and_is_nan_without_data(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store, heartbeat_s=0)
    for i in range(0, 61, 1):
        w.write(
            tid,
            [
                Point(
                    "requests_finished_total", {"finished_reason": "stop"}, 2.0 * i, kind="counter"
                ),
                Point(
                    "requests_finished_total",
                    {"finished_reason": "length"},
                    1.0 * i,
                    kind="counter",
                ),
            ],
            T0 + i,
        )
    grid = d.Grid(T0 + 30, T0 + 60, 5.0, 0)
    assert np.allclose(d.rate(store, tid, "requests_finished_total", grid, 30).to_numpy(), 3.0)
    assert np.isnan(d.rate(store, tid, "preemptions_total", grid, 30).to_numpy()).all()


def test_gauge_mean_of_engines_and_staleness_gap(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store, heartbeat_s=0)
    w.write(
        tid, [Point("kv_usage", {"engine": "0"}, 0.2), Point("kv_usage", {"engine": "1"}, 0.6)], T0
    )
    grid = d.Grid(T0, T0 + 200, 100.0, 0)
    g = d.gauge(store, tid, "kv_usage", grid).to_numpy()
    assert g[0] == pytest.approx(0.4)  # KV usage of two engines: the mean
    assert np.isnan(g[-1])  # 200 s later the value is stale: a gap, not a flat line


def _histogram_points(buckets: dict[float, float]) -> list[Point]:
    pts = [
        Point("ttft_bucket", {"le": "+Inf" if math.isinf(le) else str(le)}, c, kind="bucket")
        for le, c in buckets.items()
    ]
    pts.append(Point("ttft_count", {}, buckets[math.inf], kind="count"))
    return pts


def test_sliding_window_quantiles_match_hand_computed_values(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store, heartbeat_s=0)
    # Before the window: 1000 fast requests (all <= 0.1 s) that must not count.
    w.write(tid, _histogram_points({0.1: 1000, 0.5: 1000, 1.0: 1000, math.inf: 1000}), T0)
    # In the window: 100 more, 50 in (0, 0.1], 40 in (0.1, 0.5], 9 in (0.5, 1], 1 above 1 s.
    w.write(tid, _histogram_points({0.1: 1050, 0.5: 1090, 1.0: 1099, math.inf: 1100}), T0 + 300)
    frame = d.quantiles(store, tid, "ttft", d.Grid(T0 + 300, T0 + 300, 300.0, 0), 300.0)
    row = frame.iloc[-1]
    assert row["count"] == 100
    # p50: rank 50 -> top of bucket (0, 0.1] = 0.1
    assert row["p50"] == pytest.approx(0.1)
    # p95: rank 95 -> bucket (0.5, 1], 5 of its 9 -> 0.5 + 0.5 * 5/9
    assert row["p95"] == pytest.approx(0.5 + 0.5 * 5 / 9)
    # p99: rank 99 -> 9th of 9 in (0.5, 1] -> 1.0
    assert row["p99"] == pytest.approx(1.0)
    assert row["ratio"] == pytest.approx(10.0)
