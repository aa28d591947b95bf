"""Each monitoring page renders from a seeded store without exceptions (Streamlit AppTest)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from storage import queries as q
from tests.support.pages import run_page
from tests.support.seed import seed


@pytest.fixture
def seeded(store: Engine) -> Engine:
    seed(store, minutes=4)
    return store


def test_overview_lists_targets_and_warns_without_a_worker(seeded: Engine) -> None:
    at = run_page("overview")
    assert any("no worker has run" in w.value for w in at.warning)
    table = at.dataframe[0].value
    assert table["target"].tolist() == ["demo"]
    assert 0.0 <= table["KV usage"].iloc[0] <= 1.0
    assert table["TTFT p99 s (5 min)"].iloc[0] > 0


def test_live_page_draws_its_six_charts(seeded: Engine) -> None:
    at = run_page("live")
    charts = at.get("plotly_chart")
    assert len(charts) == 6
    assert "raw samples" in at.caption[0].value


def test_tail_page_draws_quantiles_and_the_ratio(seeded: Engine) -> None:
    at = run_page("tail")
    assert len(at.get("plotly_chart")) == 6  # ratio + TTFT, ITL, TPOT, E2E, queue
    table = at.dataframe[0].value
    ttft = table[table["metric"] == "Time to first token"].iloc[0]
    assert ttft["p50"] <= ttft["p95"] <= ttft["p99"]


def test_pages_without_targets_say_what_to_do(store: Engine) -> None:
    for name in ("live", "tail"):
        at = run_page(name)
        assert any("No targets yet" in i.value for i in at.info)


def test_targets_page_adds_and_refuses_bad_input(
    store: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_ALLOWED_HOSTS", "10.0.0.0/8")
    at = run_page("targets")
    at.text_input[0].input("bad name!")
    at.text_input[1].input("http://10.0.0.1:8000")
    at.button[0].click().run()
    assert any("name must be" in e.value for e in at.error)
    at.text_input[0].input("edge")
    at.text_input[1].input("gopher://x")
    at.button[0].click().run()
    assert any("must start with http:// or https://" in e.value for e in at.error)
    at.text_input[1].input("http://10.0.0.1:8000")
    at.button[0].click().run()
    assert [t.name for t in q.list_targets(store)] == ["edge"]
    # The page queued a check for the worker instead of calling the engine itself.
    runs = q.list_runs(store)
    assert [(r.kind, r.status) for r in runs] == [("check_target", "queued")]


def _label(store: Engine, name: str, **labels: str) -> None:
    row = q.get_target(store, name)
    spec = q.parse_target({"name": name, "base_url": row.base_url, "labels": labels})
    q.update_target(store, name, spec)


@pytest.fixture
def fleet_store(store: Engine) -> Engine:
    for i, (name, pool) in enumerate((("a1", "chat"), ("a2", "chat"), ("b1", "batch"))):
        seed(store, name, minutes=2, seed_value=i)
        _label(store, name, pool=pool, region="eu")
    return store


def test_fleet_page_sets_replicas_side_by_side_in_pools(fleet_store: Engine) -> None:
    at = run_page("fleet")
    assert [s.value for s in at.subheader] == ["All replicas selected"]
    assert at.dataframe[0].value["replica"].tolist() == ["a1", "a2", "b1"]
    assert any("The hot one" in w.value for w in at.warning)
    assert len(at.get("plotly_chart")) == 1
    at.selectbox(key="fleet_by").set_value("pool").run()
    assert [s.value for s in at.subheader] == ["pool = batch", "pool = chat"]
    assert [len(d.value) for d in at.dataframe] == [1, 2]
    at.text_input(key="fleet_selector").input("pool=chat").run()
    assert [s.value for s in at.subheader] == ["pool = chat"]
    at.text_input(key="fleet_selector").input("pool").run()
    assert any("give it as name=value" in e.value for e in at.error)


def test_overview_groups_targets_by_a_label(fleet_store: Engine) -> None:
    at = run_page("overview")
    assert len(at.dataframe) == 2  # the targets, the events
    at.selectbox(key="overview_group_by").set_value("pool").run()
    tables = [d.value for d in at.dataframe if "target" in d.value]
    assert [t["target"].tolist() for t in tables] == [["b1"], ["a1", "a2"]]
    assert any("pool = chat" in m.value and "2 replicas" in m.value for m in at.markdown)
