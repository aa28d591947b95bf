"""The Cost page's queueing view compares like with like: Kingman's service time leaves
out the engine's queue wait, and the wait it predicts (a mean) stands beside the engine's
measured mean queue time, taken exactly from its histogram's sum and count."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from probes.kinds.context import histogram_delta
from probes.vllm.metrics import parse_metrics
from storage import queries as q
from storage.dashboards import queue_inputs
from storage.db import transaction
from storage.tables import RequestRecord

QUEUE = "vllm:request_queue_time_seconds"


def _page(count: int, total: float) -> str:
    return (
        f"# TYPE {QUEUE} histogram\n"
        f'{QUEUE}_bucket{{le="0.1",model_name="m"}} {count // 2}\n'
        f'{QUEUE}_bucket{{le="+Inf",model_name="m"}} {count}\n'
        f'{QUEUE}_sum{{model_name="m"}} {total}\n{QUEUE}_count{{model_name="m"}} {count}\n'
    )


def test_the_engines_mean_queue_time_comes_from_its_sum_and_count() -> None:
    before, after = parse_metrics(_page(10, 1.0)), parse_metrics(_page(30, 5.0))
    delta = histogram_delta(before, after, "queue_time")
    assert delta.count == 20 and delta.mean == pytest.approx(4.0 / 20)


def _latency_run(store: Engine, queue_mean: float | None) -> int:
    engine = {} if queue_mean is None else {"engine": {"queue_time": {"mean": queue_mean}}}
    run = q.start_run(store, "latency", {}, None)
    q.update_run(store, run.id, status="done", summary=engine | {"ttft_s": {"p50": 0.2}})
    with transaction(store) as s:
        for seq in range(50):  # one a second, each 0.5 s from send to the last token
            t = 100.0 + seq
            s.add(
                RequestRecord(
                    run_id=run.id, seq=seq, scheduled_ts=t, sent_ts=t, first_token_ts=t + 0.2,
                    end_ts=t + 0.5, output_tokens=8, status="ok",
                )
            )  # fmt: skip
    return run.id


def test_service_time_leaves_out_the_engines_queue_wait(store: Engine) -> None:
    m = queue_inputs(store, _latency_run(store, queue_mean=0.1))
    assert m.service_s == pytest.approx(0.4) and m.engine_queue_mean_s == pytest.approx(0.1)
    assert m.rate == pytest.approx(1.0) and "less the engine's mean queue time" in m.service_note
    # Without the engine's figure the stay is all there is, and the note says so.
    m = queue_inputs(store, _latency_run(store, queue_mean=None))
    assert m.service_s == pytest.approx(0.5) and m.engine_queue_mean_s is None
    assert "so it is inside" in m.service_note
