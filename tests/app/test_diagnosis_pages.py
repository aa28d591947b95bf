"""The diagnosis where people look: the Overview says why a target's tail broke, the SLOs
page names the cause of each window that broke an SLO, the Tail page shades those windows."""

from __future__ import annotations

import json
import time

import plotly.graph_objects as go
from sqlalchemy import Engine

from app.charts.timeseries import cause_bands
from storage import queries as q
from tests.storage.test_diagnosis import _target, _write, queueing, quiet
from tests.support.pages import run_page


def _queue_now(store: Engine) -> None:
    now = time.time()
    tid = _target(store)
    _write(store, tid, quiet, now - 900, now - 600, seed=1)
    _write(store, tid, queueing, now - 600 + 2, now, seed=2)


def test_the_overview_says_why(store: Engine) -> None:
    _queue_now(store)
    rule = q.save_rule(store, {"name": "queue", "kind": "queue_depth"})
    q.fire_alert(store, rule, 1, "warning", 20.0, "20 requests waiting", time.time())
    at = run_page("overview")
    (why,) = [w.value for w in at.warning if w.value.startswith("**t**, last 5 min")]
    assert why.startswith("**t**, last 5 min: **queueing**: requests waited in the queue")
    assert "queue share of TTFT 0.8" in why and "Runner-up:" in why
    (alert,) = [w.value for w in at.warning if w.value.startswith("**queue** on t")]
    assert alert.endswith("20 requests waiting Likely cause now: **queueing**.")


def test_the_slos_page_names_the_cause_of_each_broken_window(store: Engine) -> None:
    _queue_now(store)
    slo = {"name": "chat", "ttft_s": 1.0, "tpot_s": 0.1, "share": 0.9, "window_s": 86400}
    q.save_slo(store, "chat", slo, None)
    at = run_page("slos")
    assert any(s.value == "Why the SLO broke (last 6 hours)" for s in at.subheader)
    table = next(d.value for d in at.dataframe if "cause" in d.value)
    # The last ten minutes (a third window when the page ran late by a few seconds).
    assert set(table["cause"]) == {"queueing"} and len(table) in (2, 3)
    assert table["evidence"].iloc[0].startswith("queue share of TTFT")


def test_the_slos_page_without_a_broken_window_shows_none(store: Engine) -> None:
    now = time.time()
    _write(store, _target(store), quiet, now - 900, now)
    slo = {"name": "chat", "ttft_s": 1.0, "tpot_s": 0.1, "share": 0.9, "window_s": 86400}
    q.save_slo(store, "chat", slo, None)
    at = run_page("slos")
    assert not any("Why the SLO broke" in s.value for s in at.subheader)


def test_the_tail_page_shades_the_windows_that_name_a_cause(store: Engine) -> None:
    _queue_now(store)
    at = run_page("tail")
    # The last ten minutes: two windows, three when the page ran a few seconds late.
    (shown,) = [c.value for c in at.caption if c.value.startswith("Shaded: the ")]
    n = int(shown.split()[2])
    assert n in (2, 3) and shown.startswith(f"Shaded: the {n} of 12 windows of 5 min")
    ratio = json.loads(at.get("plotly_chart")[0].proto.spec)
    shaded = [s for s in ratio["layout"]["shapes"] if s.get("fillcolor")]
    notes = [a["text"] for a in ratio["layout"]["annotations"]]
    assert len(shaded) == n and notes.count("queueing") == n


def test_cause_bands_shade_causes_only() -> None:
    fig = cause_bands(go.Figure(), [(0, 300, "none"), (300, 600, "kv_pressure")])
    (shape,) = fig.layout.shapes
    assert shape.fillcolor == "#9333ea" and fig.layout.annotations[0].text == "kv_pressure"
