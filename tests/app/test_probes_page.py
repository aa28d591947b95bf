"""The Probes page on runs the real probes produced against the loopback stand-in."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from app.charts import probes as charts
from probes.runner import StoredRun, parse_params
from storage import queries as q
from tests.support.fake_openai import FakeConfig, serve
from tests.support.pages import run_page

CASES: dict[str, dict[str, Any]] = {
    "latency": {"rate": 40, "duration_s": 0.5, "prompt_tokens": 16, "output_tokens": 6},
    "batch_sweep": {
        "concurrencies": [1, 2],
        "requests_per_step": 4,
        "prompt_tokens": 16,
        "output_tokens": 4,
    },
    "oom": {"confirm": True, "batch": 2, "start_context": 512, "step": 768, "output_tokens": 4},
    "kv_usage": {
        "rate": 10,
        "duration_s": 1,
        "baseline_s": 0.2,
        "cooldown_s": 0.5,
        "sample_every_s": 0.2,
        "prompt_tokens": 32,
        "prefix_tokens": 16,
        "output_tokens": 4,
    },
}


@pytest.fixture
def runs(store: Engine) -> dict[str, int]:
    """One finished run of each kind (two of latency), stored as the worker stores them."""
    out: dict[str, int] = {}
    with serve(FakeConfig(max_model_len=1200, metrics=True, itl_s=0.001)) as fake:
        tid = q.add_target(store, q.parse_target({"name": "fake", "base_url": fake.url})).id
        for kind, data in [*CASES.items(), ("latency", CASES["latency"])]:
            params = parse_params(kind, data)
            run = q.start_run(store, kind, params.model_dump(), tid)
            summary = StoredRun(store, run.id).run(kind, params, fake.url, managed=True)
            q.update_run(store, run.id, status="done", progress=1.0, summary=summary)
            out[kind if kind not in out else "latency2"] = run.id
    cap = q.start_run(store, "capacity", {"share": 0.9}, tid)
    q.update_run(
        store,
        cap.id,
        status="done",
        summary={
            "capacity_rps": 4,
            "first_failing_rps": 8,
            "slo": {"ttft_s": 1, "tpot_s": 0.1, "share": 0.9},
            "steps": [
                {"rate": 4, "slo_share": 0.95, "passed": True},
                {"rate": 8, "slo_share": 0.5, "passed": False},
            ],
            "message": "capacity 4 req/s",
        },
    )
    out["capacity"] = cap.id
    return out


def test_history_and_every_result_view(runs: dict[str, int]) -> None:
    at = run_page("probes")
    history = at.dataframe[0].value
    assert sorted(history["run"]) == sorted(runs.values())
    assert (
        history[history["run"] == runs["oom"]]["result"]
        .iloc[0]
        .startswith("2 sequences: fine at 512 tokens, rejected_too_long at 1280 tokens")
    )
    select = next(s for s in at.selectbox if s.key == "result_run")
    for kind, run_id in runs.items():
        index = next(i for i, o in enumerate(select.options) if o.startswith(f"{run_id} "))
        select.select_index(index)
        at.run()
        assert not at.exception, (kind, [e.message for e in at.exception])
        assert len(at.get("plotly_chart")) >= 1, kind


def test_starting_a_probe_queues_it_and_oom_needs_consent(store: Engine) -> None:
    q.add_target(store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:1"}))
    at = run_page("probes")
    next(b for b in at.button if b.key == "probe_start").click().run()
    queued = q.list_runs(store)
    assert [(r.kind, r.status, r.params["rate"]) for r in queued] == [("latency", "queued", 1.0)]
    at.selectbox(key="probe_kind").set_value("oom").run()
    next(b for b in at.button if b.key == "probe_start").click().run()
    assert any("confirm to run it" in e.value for e in at.error)
    assert len(q.list_runs(store)) == 1


def test_a_running_probe_shows_progress_and_can_be_cancelled(store: Engine) -> None:
    tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:1"})).id
    run = q.start_run(store, "batch_sweep", {}, tid)
    q.update_run(store, run.id, progress=0.4, summary={"partial": {"phase": "concurrency 4"}})
    at = run_page("probes")
    bar = at.get("progress")[0].proto
    assert bar.value == 40 and "concurrency 4" in bar.text
    next(b for b in at.button if b.key == f"cancel_{run.id}").click().run()
    assert q.get_run(store, run.id).cancel_requested


def test_charts_draw_what_the_probes_produce(runs: dict[str, int], store: Engine) -> None:
    oom = q.get_run(store, runs["oom"]).summary
    fig = charts.oom_chart(oom["steps"], oom["failure"], {"context": 1000})
    assert any("rejected_too_long" in (t.name or "") for t in fig.data)
    assert len(fig.layout.shapes) == 2  # measured failure and planner frontier
    sweep = q.get_run(store, runs["batch_sweep"]).summary
    assert len(charts.sweep_chart(sweep["steps"], 2).data) == 3
    records = q.run_records(store, runs["latency"])
    summary = q.get_run(store, runs["latency"]).summary
    assert len(records) == summary["requests"] and records["ttft_s"].notna().all()
    cdf = charts.cdf_chart({"TTFT": records["ttft_s"].tolist()}, "t")
    assert cdf.data[0].y[-1] == 1.0


def test_compare_table_lines_up_two_runs(runs: dict[str, int], store: Engine) -> None:
    from app.views.probes import compare_table

    a, b = q.get_run(store, runs["latency"]), q.get_run(store, runs["latency2"])
    table = compare_table(a, b)
    assert {"requests", "ttft_s.p50", "e2e_s.p99"} <= set(table["figure"])


def test_kv_timeline_shows_free_blocks_on_hover() -> None:
    timeline = [
        {"t": 0.0, "kv_usage": 0.5, "free_blocks": 255, "preemptions_total": 2.0},
        {"t": 1.0, "kv_usage": 0.75, "free_blocks": 128, "preemptions_total": 5.0},
    ]
    fig = charts.kv_timeline_chart(timeline, [0.0, 1.0])
    assert list(fig.data[0].customdata) == [255, 128]
    assert list(fig.data[1].y) == [0.0, 3.0]  # preemptions counted from the start


def test_form_defaults_are_the_probes_own() -> None:
    from app.views.probes import FIELDS
    from probes.runner import PROBES

    for kind, fields in FIELDS.items():
        params = PROBES[kind].Params.model_fields
        for name, _, fallback in fields:
            own = params[name].default
            # Either the probe's default is used, or it has none and the form supplies one.
            assert (fallback is None) == isinstance(own, int | float), (kind, name)
