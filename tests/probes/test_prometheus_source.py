"""Targets read from a Prometheus server that scrapes the engine: the answer turned back
into the engine's page (both vLLM spellings), refusals that say what to fix, and a real
Prometheus beside a scraped target of the same engine."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from planner.errors import InvalidInput, TargetError
from probes.vllm import prometheus as promql
from probes.vllm.metrics import parse_metrics
from probes.worker import Worker
from storage import queries as q
from storage.dashboards.monitor import series_view
from storage.schemas import parse_selector
from storage.settings import Settings
from tests.support.fake_vllm import FakeVllm, serve
from tests.support.prometheus import prometheus, wait_scraped
from tests.support.waiting import wait_until

SELECTOR = '{job="vllm",instance="10.0.0.5:8000"}'


def _as_prometheus(text: str, **target: str) -> list[dict[str, Any]]:
    """An instant query's result for every sample of a page, as Prometheus returns it."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            labels = {"__name__": s.name, **s.labels, **target}
            out.append({"metric": labels, "value": [1.0, repr(float(s.value))]})
    return out


def _up(value: str = "1", **target: str) -> list[dict[str, Any]]:
    return [{"metric": {"__name__": "up", **target}, "value": [1.0, value]}]


def _canonical(text: str) -> set[tuple[str, str, float]]:
    return {(s.series, s.labels_key, s.value) for s in parse_metrics(text).samples}


@pytest.mark.parametrize("style", ["v1", "v0"])
def test_prometheus_answers_become_the_engines_own_page(style: str) -> None:
    fake = FakeVllm(style=style, kv_usage=0.375, running=3, waiting=1, preemptions=4)
    fake.ttft.observe(0.15, 40)
    page = fake.text()
    target = {"job": "vllm", "instance": "10.0.0.5:8000"}
    text = promql.instant_text(_up(**target), _as_prometheus(page, **target), SELECTOR, "P")
    assert _canonical(text) == _canonical(page)
    assert parse_metrics(text).cache_info == parse_metrics(page).cache_info
    assert "instance=" not in text and "job=" not in text


def test_refusals_say_what_to_fix() -> None:
    one = {"job": "vllm", "instance": "a:1"}
    with pytest.raises(TargetError, match=r"no `up` series for .*check the selector"):
        promql.instant_text([], [], SELECTOR, "http://p")
    two = _up(**one) + _up(job="vllm", instance="b:1")
    with pytest.raises(TargetError, match=r"matches 2 scrape targets .*a:1, b:1.*narrow it"):
        promql.instant_text(two, [], SELECTOR, "http://p")
    with pytest.raises(TargetError, match="could not scrape a:1 at its last try"):
        promql.instant_text(_up("0", **one), [], SELECTOR, "http://p")
    with pytest.raises(TargetError, match="holds no vllm: series"):
        promql.instant_text(_up(**one), [], SELECTOR, "http://p")
    with pytest.raises(TargetError, match=r"Prometheus refused the query .*parse error"):
        promql.result('{"status":"error","error":"parse error"}', "http://p/api/v1/query")
    with pytest.raises(TargetError, match="did not answer with Prometheus' JSON"):
        promql.result("<html>", "http://p/api/v1/query")
    assert parse_selector(' job="vllm" , instance=~"10\\\\..*" ') == (
        '{job="vllm" , instance=~"10\\\\..*"}'
    )
    with pytest.raises(InvalidInput, match="give PromQL label matchers"):
        parse_selector("{job=vllm}")
    with pytest.raises(InvalidInput, match="selector is for a target read from Prometheus"):
        q.parse_target({"name": "t", "base_url": "http://h", "selector": '{job="x"}'})


def test_a_target_read_from_prometheus_shows_what_the_scraped_one_shows(
    settings: Settings,
) -> None:
    fake = FakeVllm(kv_usage=0.375, running=3, waiting=2)
    stop = threading.Event()

    def traffic() -> None:  # the engine keeps serving: every answer's TTFT is 150 ms
        while not stop.wait(0.2):
            fake.ttft.observe(0.15, 5)
            fake.generation_tokens += 50

    feeder = threading.Thread(target=traffic, daemon=True)
    with serve(fake) as url, prometheus({"vllm": url.split("//", 1)[1]}) as prom:
        feeder.start()
        worker = Worker(settings)
        store = worker.store
        q.add_target(store, q.parse_target({"name": "direct", "base_url": url}))
        worker.start()
        try:
            wait_scraped(prom, "vllm")
            time.sleep(4)  # Prometheus scrapes the engine a few times first
            added_at = time.time()
            spec = {"name": "viaprom", "base_url": prom, "source": "prometheus",
                    "selector": '{job="vllm"}'}  # fmt: skip
            q.add_target(store, q.parse_target(spec))

            def both() -> bool:
                worker.tick()  # the main loop's pass: picks up the new target
                views = [series_view(store, n, 120, ["kv_usage", "ttft_p99"]) for n in
                         ("direct", "viaprom")]  # fmt: skip
                return all(v.series["ttft_p99"][-1][1] is not None for v in views)

            wait_until(both, 30, "TTFT p99 on both targets")
            assert q.get_target(store, "viaprom").health == "up"
            direct, viaprom = (
                series_view(store, n, 120, ["kv_usage", "ttft_p99"]) for n in ("direct", "viaprom")
            )
            assert direct.series["kv_usage"][-1][1] == viaprom.series["kv_usage"][-1][1] == 0.375
            scraped, read = (v.series["ttft_p99"][-1][1] for v in (direct, viaprom))
            assert scraped is not None and read is not None
            assert read == pytest.approx(scraped, rel=0.02) and 0.1 < scraped <= 0.25
            # Its recent past came from a range query: points from before it was added.
            tid = q.get_target(store, "viaprom").id
            points = q.series_points(store, tid, ["kv_usage"], 0, time.time())
            assert float(points["ts"].min()) < added_at - 2
        finally:
            stop.set()
            worker.stop()


def test_a_probe_of_a_target_read_from_prometheus_is_refused_with_the_way_out(
    settings: Settings,
) -> None:
    worker = Worker(settings)
    spec = {"name": "viaprom", "base_url": "http://127.0.0.1:9", "source": "prometheus",
            "selector": '{job="vllm"}'}  # fmt: skip
    tid = q.add_target(worker.store, q.parse_target(spec)).id
    run = q.request_run(worker.store, "latency", {"rate": 1, "duration_s": 2}, target_id=tid)
    worker.start()

    def failed() -> bool:
        worker.tick()
        return q.get_run(worker.store, run.id).status == "failed"

    try:
        wait_until(failed, 20)
    finally:
        worker.stop()
    error = q.get_run(worker.store, run.id).error or ""
    assert "is read from Prometheus" in error and "add the engine by its URL" in error
