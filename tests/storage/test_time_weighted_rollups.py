"""Rollups as the readers see the data: values hold until the next one (time-weighted), a
counter's reset inside a bucket is counted, a gap stays a gap, a stepped clock is re-rolled,
and retention never drops what is not rolled up yet."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine, text

from storage import derived as d
from storage import queries as q
from storage.ingest import Point, SampleWriter
from storage.rollups import expire, run_rollups
from storage.settings import Retention

T0 = 1_800_000_000.0  # a round minute and hour


def _target(store: Engine) -> int:
    return q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"})).id


def _minutes(store: Engine, tid: int, metric: str) -> dict[float, dict[str, float]]:
    frame = q.series_points(store, tid, [metric], 0, T0 + 99_999, resolution=60)
    return {float(r["ts"]) - T0: dict(r) for _, r in frame.iterrows()}


def test_a_gauge_rolls_up_by_the_time_each_value_held(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store)  # as the scraper stores: a value again only after 30 s
    for t, v in [(0, 0.9), (10, 0.9), (20, 0.9), (30, 0.9), (40, 0.9)]:
        w.write(tid, [Point("kv_usage", {}, v)], T0 + t)
    for t in (50, 52, 54, 56, 58):
        w.write(tid, [Point("kv_usage", {}, 0.1 if t < 58 else 0.1000001)], T0 + t)
    w.write(tid, [Point("kv_usage", {}, 0.1)], T0 + 60)  # the next minute begins at 0.1
    run_rollups(store, now=T0 + 600)
    first = _minutes(store, tid, "kv_usage")[0.0]
    # 50 s at 0.9 and 10 s at 0.1: 0.77, where averaging the stored values gives 0.33.
    assert first["avg"] == pytest.approx((0.9 * 50 + 0.1 * 10) / 60, abs=1e-6)
    assert first["min"] == pytest.approx(0.1) and first["max"] == 0.9
    # A 6-hour window reads minute rollups: the peak band keeps the 0.9.
    grid = d.Grid(T0 + 60, T0 + 60, 60.0, 60)
    assert d.gauge(store, tid, "kv_usage", grid, stat="max").iloc[-1] == 0.9


def test_a_counter_reset_inside_a_bucket_is_counted(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store, heartbeat_s=0)
    values = [0, 20, 40, 60, 80, 100, 110, 120, 5, 15, 25, 35]  # restarted at T0+80
    for i, v in enumerate(values):
        w.write(tid, [Point("preemptions_total", {}, float(v), kind="counter")], T0 + 10 * i)
    run_rollups(store, now=T0 + 600)
    minutes = _minutes(store, tid, "preemptions_total")
    assert minutes[0.0]["increase"] == 100.0
    assert minutes[60.0]["increase"] == 10 + 10 + 5 + 10 + 10 + 10  # 55, the reset counted
    raw = d.rate(store, tid, "preemptions_total", d.Grid(T0 + 110, T0 + 110, 1, 0), 110.0)
    rolled = d.rate(store, tid, "preemptions_total", d.Grid(T0 + 120, T0 + 120, 60, 60), 120.0)
    assert raw.iloc[-1] * 110 == pytest.approx(155.0)
    assert rolled.iloc[-1] * 120 == pytest.approx(155.0)  # the last value alone gives 35


def test_a_gap_stays_a_gap(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store)
    w.write(tid, [Point("running", {}, 3.0)], T0 + 10)  # then the target went away
    w.write(tid, [Point("running", {}, 5.0)], T0 + 300)  # and came back
    run_rollups(store, now=T0 + 600)
    minutes = _minutes(store, tid, "running")
    # 3 held 75 s (the staleness bound), then nothing until 5 arrived.
    assert sorted(minutes) == [0.0, 60.0, 300.0, 360.0]
    assert minutes[0.0]["covered_s"] == 50.0 and minutes[60.0]["covered_s"] == 25.0
    assert minutes[300.0]["avg"] == 5.0


def test_a_clock_stepped_back_lands_in_its_bucket(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store, heartbeat_s=0)
    for t in range(0, 180, 10):
        w.write(tid, [Point("running", {}, 1.0)], T0 + t)
    run_rollups(store, now=T0 + 240)
    assert _minutes(store, tid, "running")[60.0]["max"] == 1.0
    # The worker's clock stepped back two minutes: a sample for a bucket already rolled up.
    w.write(tid, [Point("running", {}, 9.0)], T0 + 75)
    run_rollups(store, now=T0 + 250)
    assert _minutes(store, tid, "running")[60.0]["max"] == 9.0
    # A clock stepped forward leaves a gap, not a value held across it.
    w.write(tid, [Point("running", {}, 2.0)], T0 + 3600)
    run_rollups(store, now=T0 + 3700)
    assert not any(1000.0 < m < 3600.0 for m in _minutes(store, tid, "running"))


def test_retention_reaches_everything_but_keeps_what_is_not_rolled_up(store: Engine) -> None:
    tid = _target(store)
    now = time.time()
    day = 86400.0
    w = SampleWriter(store, heartbeat_s=0)
    w.write(tid, [Point("running", {}, 1.0)], now - 3 * day)  # older than raw retention
    q.record_event(store, "old", "an old event", target_id=tid)
    q.record_event(store, "new", "a new event", target_id=tid)
    old_run = q.start_run(store, "latency", {}, tid)
    q.update_run(store, old_run.id, status="done", finished_at=now - 200 * day)
    new_run = q.start_run(store, "latency", {}, tid)
    q.update_run(store, new_run.id, status="done", finished_at=now - 40 * day)
    retention = Retention(raw_hours=48, events_days=90, runs_days=180, records_days=30)
    with store.begin() as conn:
        conn.execute(text("UPDATE events SET ts = :ts WHERE kind = 'old'"), {"ts": now - 91 * day})
    # Nothing rolled up yet: the old sample stays whatever its age; the rest goes by age.
    first = expire(store, retention, now=now)
    assert first["samples"] == 0 and q.count_samples(store, tid) == 1
    assert first["events"] == 1 and "old" not in [e.kind for e in q.events(store, 0, now + 1)]
    assert first["runs"] == 1 and [r.id for r in q.list_runs(store)] == [new_run.id]
    run_rollups(store, now=now)
    assert expire(store, retention, now=now)["samples"] == 1  # rolled up: now it may go
    assert q.count_samples(store, tid) == 0


def test_the_live_page_keeps_the_peaks_a_rollup_average_hides(store: Engine) -> None:
    from app.charts.timeseries import timeseries
    from storage.dashboards import live

    tid = _target(store)
    w = SampleWriter(store)
    now = time.time() // 60 * 60
    for i in range(0, 3600, 10):  # an hour at 0.2 with a 20 s spike to 1.0 every 10 minutes
        w.write(tid, [Point("kv_usage", {}, 1.0 if i % 600 < 20 else 0.2)], now - 3600 + i)
    run_rollups(store, now=now + 120)
    frame = live(store, tid, now - 24 * 3600, now)  # a day: read from minute rollups
    assert frame.attrs["resolution"] == 60
    assert frame["kv_usage"].max() < 0.5 and frame["kv_usage_max"].max() == 1.0
    fig = timeseries(frame, {"kv_usage": "KV usage"}, "KV", "used", percent=True)
    assert [t.name for t in fig.data] == ["KV usage", "KV usage (peak)"]
