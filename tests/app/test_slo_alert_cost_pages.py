"""The SLOs, Alerts and Cost pages, and the Overview's open alerts (AppTest)."""

from __future__ import annotations

import itertools
import time

import pytest
from sqlalchemy import Engine

from planner.slo import get_preset
from probes.alerting.evaluate import AlertEvaluator
from probes.alerting.rules import DEFAULT_RULES
from storage import queries as q
from storage.ingest import Point, SampleWriter
from tests.support.pages import run_page
from tests.support.seed import seed


@pytest.fixture
def busy(store: Engine) -> int:
    """A seeded target (histograms for the SLO page) and a `busy` one whose KV cache has
    been 97% full for two minutes, with the default rules evaluated once."""
    seed(store, minutes=3)
    tid = q.add_target(store, q.parse_target({"name": "busy", "base_url": "http://h:1"})).id
    w = SampleWriter(store, heartbeat_s=0)
    now = time.time()
    for i in range(31):
        w.write(tid, [Point("kv_usage", {"engine": "0"}, 0.97)], now - 120 + i * 4)
    q.ensure_rules(store, [r.model_dump() for r in DEFAULT_RULES])
    AlertEvaluator(store).run(now)
    return tid


def test_open_alerts_on_the_alerts_page_and_the_overview(busy: int) -> None:
    at = run_page("alerts")
    firing = at.dataframe[0].value
    assert "KV cache nearly full" in firing["rule"].tolist()
    rules = at.dataframe[1].value
    assert len(rules) == len(DEFAULT_RULES)
    overview = run_page("overview")
    shown = [e.value for e in overview.error] + [w.value for w in overview.warning]
    assert any("KV cache nearly full" in str(v) and "busy" in str(v) for v in shown)


def test_editing_a_rule_refuses_nonsense(busy: int, store: Engine) -> None:
    at = run_page("alerts")
    pick = at.selectbox(key="rule_pick")
    index = next(i for i, o in enumerate(pick.options) if o == "KV cache nearly full")
    pick.select_index(index).run()
    at.number_input[0].set_value(90.0)  # a share of the cache, not a percentage
    next(b for b in at.button if b.label == "Save rule").click().run()
    assert any("threshold from 0 to 1" in e.value for e in at.error)
    stored = dict(q.list_rules(store))
    assert all(r["threshold"] <= 1 for r in stored.values() if r["kind"] == "kv_level")


def test_slos_page_adds_a_preset_and_reports_compliance(busy: int, store: Engine) -> None:
    at = run_page("slos")
    assert any("No SLO yet" in i.value for i in at.info)
    at.selectbox(key="slo_preset").set_value("mlperf-server-llama-3.1-8b").run()
    next(b for b in at.button if b.label == "Save SLO").click().run()
    assert not at.exception
    [(_, _, _, spec)] = q.list_slos(store)
    assert spec["ttft_s"] == get_preset("mlperf-server-llama-3.1-8b").ttft_s
    at = run_page("slos")
    table = at.dataframe[0].value
    report = table[table["target"] == "demo"].iloc[0]
    lo, hi = report["engine histograms, at least"], report["engine histograms, at most"]
    assert 0 <= lo <= hi <= 1  # seeded histograms: a bounded reading
    assert report["requests"] == 0  # no probe requests: the exact column is empty


def test_cost_page_draws_the_frame_with_a_model_and_records_it(store: Engine) -> None:
    seed(store, minutes=1)
    at = run_page("cost")
    assert len(at.get("plotly_chart")) == 1
    costs = at.dataframe[0].value
    assert costs["cheapest"].tolist().count("★") == 1
    assert "model" in at.get("plotly_chart")[0].proto.spec  # the source is labelled
    next(b for b in at.button if b.key == "cost_record").click().run()
    assert "default" in q.cost_frames(store)


def test_cost_page_takes_shares_from_the_simulator_where_nothing_was_measured(
    store: Engine,
) -> None:
    at = run_page("cost")  # no target, no measurement
    at.radio(key="cost_stand_in").set_value("simulator").run()
    assert not at.exception and not at.error
    assert any(c.value.startswith("Shares simulated (roofline") for c in at.caption)
    shares = at.dataframe[0].value["share outside SLO"].tolist()
    # More reserve, less load per replica: never a larger share outside.
    assert all(a >= b for a, b in itertools.pairwise(shares)) and min(shares) >= 0


def test_saving_a_rule_keeps_what_the_form_does_not_show(busy: int, store: Engine) -> None:
    rule_id, slope = next((i, r) for i, r in q.list_rules(store) if r["kind"] == "kv_slope")
    q.save_rule(store, slope | {"stable_rate": 0.5}, rule_id)
    at = run_page("alerts")
    pick = at.selectbox(key="rule_pick")
    pick.select_index(next(i for i, o in enumerate(pick.options) if o == slope["name"])).run()
    at.number_input[0].set_value(0.05)  # the threshold, edited
    next(b for b in at.button if b.label == "Save rule").click().run()
    assert not at.error
    saved = dict(q.list_rules(store))[rule_id]
    assert saved["threshold"] == 0.05 and saved["stable_rate"] == 0.5


def test_a_rule_can_watch_only_labelled_targets(busy: int, store: Engine) -> None:
    at = run_page("alerts")
    pick = at.selectbox(key="rule_pick")
    pick.select_index(next(i for i, o in enumerate(pick.options) if o == "KV cache nearly full"))
    pick.run()
    field = next(t for t in at.text_input if t.label == "Only targets labelled")
    field.input("pool")
    next(b for b in at.button if b.label == "Save rule").click().run()
    assert any("give it as name=value" in e.value for e in at.error)
    field = next(t for t in at.text_input if t.label == "Only targets labelled")
    field.input("pool=chat")
    next(b for b in at.button if b.label == "Save rule").click().run()
    assert not at.error
    saved = next(r for _, r in q.list_rules(store) if r["name"] == "KV cache nearly full")
    assert saved["labels"] == {"pool": "chat"}
