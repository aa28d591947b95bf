"""The Cost page weighs scaling on demand against a reserve with the engine's own measured
cold start (its last time from start to healthy), or says it is an estimate."""

from __future__ import annotations

import time

from sqlalchemy import Engine

from probes.engine.spec import embedded_spec
from storage import queries as q
from storage.dashboards import measured_cold_starts
from storage.settings import Settings
from tests.storage.test_slo_reports import SLO, _records
from tests.support.pages import run_page


def test_the_measured_cold_start_enters_the_cost_frame(store: Engine, settings: Settings) -> None:
    at = run_page("cost")
    assert any("no managed engine has started yet" in m.value for m in at.markdown)
    spec = embedded_spec(settings)
    q.save_engine_spec(store, spec.name, spec.model_dump())
    q.put_state(
        store, "engine:embedded", {"name": "embedded", "facts": {"time_to_healthy_s": 24.0}}
    )
    assert measured_cold_starts(store) == {"embedded": 24.0}
    at = run_page("cost")
    (line,) = [m.value for m in at.markdown if "serves nobody for" in m.value]
    assert "engine embedded's last start took 24 s" in line
    # 36,000 req/h over 2 base replicas: 5 req/s a replica, 24 s: 120 requests a surge.
    assert "about 120 requests a surge" in line


def test_the_cost_page_shows_what_retries_do_to_the_load(store: Engine) -> None:
    at = run_page("cost")
    shown = {m.label: m.value for m in at.metric}
    # Defaults: 20% fail, 3 retries, budget 0.1: 1.248x unbounded, 1.10x with the budget.
    assert shown["Load without a budget"] == "1.25x" and shown["Load with the budget"] == "1.10x"
    assert any("The budget binds" in c.value for c in at.caption)


def test_the_slos_page_shows_retries_at_the_share_outside_the_slo(store: Engine) -> None:
    """Without data it starts at 20% failing; with an SLO 40% outside, at 40%."""
    at = run_page("slos")
    shown = {m.label: m.value for m in at.metric}
    assert shown["Load without a budget"] == "1.25x" and shown["Load with the budget"] == "1.10x"
    tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:1"})).id
    q.save_slo(store, "chat", SLO, None)
    _records(store, tid, time.time() - 60, 10, bad=4, gaps_ms=[50.0] * 4)
    at = run_page("slos")
    (fail,) = [n.value for n in at.number_input if n.label == "Share of requests that fail"]
    assert fail == 0.4
    shown = {m.label: m.value for m in at.metric}
    assert shown["Load without a budget"] == "1.62x"  # 1 + .4 + .16 + .064
