"""The Probes page on runs the real probes produced against the loopback stand-in."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from app.charts import probes as charts
from probes.kinds import KINDS, StoredRun, get_kind, parse_params
from probes.kinds.batch_sweep import Result as SweepResult
from probes.kinds.context import SamplePoint, stored
from probes.kinds.kv_usage import timeline_chart
from probes.kinds.latency import Result as LatencyResult
from probes.kinds.oom import Frontier
from probes.kinds.oom import Result as OomResult
from probes.vllm.client import Target
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


_CAP_STEP: dict[str, Any] = {"trustworthy": True, "requests": 20, "errors": 0}
_CAP_STEP |= {"requests_per_s": 4.0, "ttft_s": {"p50": 0.2}, "tpot_s": {"p50": 0.05}}


@pytest.fixture
def runs(store: Engine) -> dict[str, int]:
    """One finished run of each kind (two of latency), stored as the worker stores them."""
    out: dict[str, int] = {}
    with serve(FakeConfig(max_model_len=1200, metrics=True, itl_s=0.001)) as fake:
        tid = q.add_target(store, q.parse_target({"name": "fake", "base_url": fake.url})).id
        for kind, data in [*CASES.items(), ("latency", CASES["latency"])]:
            params = parse_params(kind, data)
            run = q.start_run(store, kind, params.model_dump(), tid)
            outcome = StoredRun(store, run.id).run(
                get_kind(kind), params, Target(fake.url), managed=True
            )
            q.update_run(store, run.id, status="done", progress=1.0, summary=stored(outcome.result))
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
                {**_CAP_STEP, "rate": 4, "slo_share": 0.95, "passed": True},
                {**_CAP_STEP, "rate": 8, "slo_share": 0.5, "passed": False},
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
    assert any("type the target's name (t) to confirm" in e.value for e in at.error)
    at.text_input(key="oom_confirm").set_value("not-t").run()
    next(b for b in at.button if b.key == "probe_start").click().run()
    assert len(q.list_runs(store)) == 1
    at.text_input(key="oom_confirm").set_value("t").run()
    at.checkbox(key="oom_external").check().run()
    next(b for b in at.button if b.key == "probe_start").click().run()
    oom = [r for r in q.list_runs(store) if r.kind == "oom"]
    assert len(oom) == 1 and oom[0].requested_by == "local (admin, console)"


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
    oom = OomResult.model_validate(q.get_run(store, runs["oom"]).summary)
    frontier = Frontier(context=1000, max_model_len=1200, num_blocks=64, block_size=32, why="")
    fig = charts.figure(get_kind("oom").chart(oom.model_copy(update={"predicted": frontier})))
    assert any("rejected_too_long" in (t.name or "") for t in fig.data)
    assert len(fig.layout.shapes) == 2  # measured failure and planner frontier
    sweep = SweepResult.model_validate(q.get_run(store, runs["batch_sweep"]).summary)
    fig = charts.figure(get_kind("batch_sweep").chart(sweep))
    assert len(fig.data) == 3 and fig.data[1].yaxis == "y2"
    assert fig.layout.xaxis.type == "log"
    records = q.run_records(store, runs["latency"])
    latency = LatencyResult.model_validate(q.get_run(store, runs["latency"]).summary)
    assert len(records) == latency.requests and records["ttft_s"].notna().all()
    cdf = charts.cdf_chart({"TTFT": records["ttft_s"].tolist()}, "t")
    assert cdf.data[0].y[-1] == 1.0
    per = charts.figure(get_kind("latency").chart(latency))
    assert per.data[0].x[0] == "TTFT p50" and per.data[0].y[0] == latency.ttft_s.p50


def test_compare_table_lines_up_two_runs(runs: dict[str, int], store: Engine) -> None:
    from app.views.probes import compare_table, result_of

    a, b = (
        result_of(q.get_run(store, runs["latency"])),
        result_of(q.get_run(store, runs["latency2"])),
    )
    assert a is not None and b is not None
    table = compare_table(a, b, 1, 2)
    assert {"requests", "ttft_s.p50", "e2e_s.p99"} <= set(table["figure"])


def test_kv_timeline_shows_free_blocks_on_hover() -> None:
    timeline = [
        SamplePoint(t=0.0, ts=0.0, kv_usage=0.5, free_blocks=255, preemptions_total=2.0),
        SamplePoint(t=1.0, ts=1.0, kv_usage=0.75, free_blocks=128, preemptions_total=5.0),
    ]
    fig = charts.figure(timeline_chart(timeline, (0.0, 1.0)))
    assert list(fig.data[0].text) == [
        "50.0% used, 255.0 blocks free",
        "75.0% used, 128.0 blocks free",
    ]
    assert list(fig.data[1].y) == [0.0, 3.0]  # preemptions counted from the start
    assert fig.data[0].line.shape == "hv" and len(fig.layout.shapes) == 1  # the load window


def test_form_defaults_are_the_probes_own() -> None:
    for name, kind in KINDS.items():
        fields = kind.params.model_fields
        for f in kind.form:
            own = fields[f.name].default
            # Either the probe's default is used, or it has none and the form supplies one.
            assert (f.default is None) == isinstance(own, int | float), (name, f.name)


def test_a_run_stored_before_typed_results_still_reads() -> None:
    from app.views.probes import result_of
    from storage.schemas import RunRow

    old = {  # the latency summary as kvscope stored it before results were typed
        "rate": 1.0, "requests": 2, "ok": 2, "errors": 0, "cancelled": 0, "duration_s": 2.0,
        "ttft_s": {"p50": 0.1, "p95": 0.1, "p99": 0.1, "mean": 0.1},
        "itl_s": {"p50": 0.01, "p95": 0.01, "p99": 0.01, "mean": 0.01},
        "tpot_s": {"p50": 0.01, "p95": 0.01, "p99": 0.01, "mean": 0.01},
        "e2e_s": {"p50": 0.5, "p95": 0.5, "p99": 0.5, "mean": 0.5},
        "lateness_s": {"p50": 0.0, "p99": 0.001, "max": 0.001},
        "output_tokens_per_s": 10.0, "requests_per_s": 1.0, "slo_share": None,
        "trustworthy": True, "reason": None,
        "p99_over_p50": {"ttft_s": 1.0, "itl_s": 1.0, "tpot_s": 1.0, "e2e_s": 1.0},
        "planned": 2, "stopped": "done",
        "ttft_from_send_s": {"p50": 0.1, "p95": 0.1, "p99": 0.1, "mean": 0.1},
        "engine": {"ttft": {"count": 2}, "itl": {"count": 2}, "tpot": {"count": 2},
                   "e2e": {"count": 2}, "queue_time": {"count": 2}, "preemptions": {"count": 3}},
        "queue_time_s": {"count": 2}, "cancelled_flag_of_old": True, "model": "m",
    }  # fmt: skip
    row = RunRow(
        id=1,
        kind="latency",
        target_id=None,
        params={},
        status="done",
        progress=1.0,
        summary=old,
        error=None,
        cancel_requested=False,
        created_at=0.0,
        started_at=0.0,
        finished_at=2.0,
    )
    result = result_of(row)
    assert isinstance(result, LatencyResult)
    assert result.engine is not None and result.engine.preemptions == 3


def test_sweep_and_capacity_draw_the_tail_against_the_rate(
    runs: dict[str, int], store: Engine
) -> None:
    from probes.kinds.capacity import Result as CapacityResult
    from probes.kinds.capacity import Slo, Step
    from probes.load.generator import Percentiles

    sweep = SweepResult.model_validate(q.get_run(store, runs["batch_sweep"]).summary)
    (tail,) = get_kind("batch_sweep").more_charts(sweep)
    fig = charts.figure(tail)
    assert [t.name for t in fig.data] == ["TTFT p50", "TTFT p99", "ITL p50", "ITL p99"]
    assert list(fig.data[0].x) == sorted(s.requests_per_s for s in sweep.steps)
    assert fig.layout.yaxis.type == "log"

    def step(rate: float, ttft: tuple[float, float], passed: bool) -> Step:
        p = Percentiles(p50=ttft[0], p99=ttft[1])
        tpot = Percentiles(p50=0.02, p99=0.05)
        return Step(
            rate=rate, slo_share=0.99 if passed else 0.5, passed=passed, trustworthy=True,
            requests=10, errors=0, ttft_s=p, tpot_s=tpot, requests_per_s=rate,
        )  # fmt: skip

    result = CapacityResult(
        capacity_rps=4.0,
        first_failing_rps=8.0,
        slo=Slo(ttft_s=1.0, tpot_s=0.1, share=0.9),
        steps=[step(8.0, (0.6, 3.0), False), step(4.0, (0.2, 0.8), True)],
        message="",
    )
    (tail,) = get_kind("capacity").more_charts(result)
    fig = charts.figure(tail)
    assert list(fig.data[1].x) == [4.0, 8.0] and list(fig.data[1].y) == [0.8, 3.0]
    shapes = [(s.x0, s.y0) for s in fig.layout.shapes]
    assert len(shapes) == 3  # the capacity, the TTFT bound and the TPOT bound
