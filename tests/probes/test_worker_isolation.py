"""Isolation in the worker: ten frozen targets cannot slow ten healthy ones, stop the
heartbeat, or keep an engine stop waiting behind slow checks and a long probe."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine

from probes.engine.spec import parse_spec
from probes.worker import Worker
from storage import queries as q
from storage.schemas import ScrapeLimits
from storage.settings import Settings
from tests.support.fake_openai import FakeConfig
from tests.support.fake_openai import serve as serve_openai
from tests.support.fake_vllm import FakeVllm, serve
from tests.support.hostile import hostile
from tests.support.waiting import free_port, wait_until

FAKE_ENGINE = Path(__file__).resolve().parents[1] / "support" / "fake_engine.py"
INTERVAL_S = 1.0


def _finished(w: Worker, run_id: int) -> bool:
    return q.get_run(w.store, run_id).status not in ("queued", "running")


def test_frozen_targets_slow_nobody(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, scrape=ScrapeLimits(interval_s=INTERVAL_S, timeout_s=INTERVAL_S)
    )
    w = Worker(settings)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = parse_spec(
        {"name": "fake", "model": str(model), "vllm": str(FAKE_ENGINE), "port": free_port()}
        | {"kv_cache_memory_bytes": 16 << 20}
    )
    q.save_engine_spec(w.store, "fake", spec.model_dump())
    fakes = [FakeVllm(kv_usage=0.1 * i) for i in range(10)]
    servers = [serve(f) for f in fakes]
    urls = [s.__enter__() for s in servers]
    heartbeat_ages: list[float] = []
    stop_watch = threading.Event()
    try:
        with hostile() as bad, serve_openai(FakeConfig(itl_s=0.01)) as openai:
            for i, url in enumerate(urls):
                q.add_target(w.store, q.parse_target({"name": f"ok{i}", "base_url": url}))
            for i in range(10):
                data = {"name": f"frozen{i}", "base_url": f"{bad}/silent"}
                q.add_target(w.store, q.parse_target(data))
            slow = q.add_target(w.store, q.parse_target({"name": "llm", "base_url": openai.url}))
            w.start()

            def tick() -> None:
                while not stop_watch.is_set():
                    w.tick()
                    state = q.get_state(w.store, "worker")
                    if state is not None:
                        heartbeat_ages.append(time.time() - state[1])
                    stop_watch.wait(0.5)

            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
            start = q.request_run(w.store, "engine_start", {"name": "fake"})
            wait_until(lambda: _finished(w, start.id), 60)
            assert q.get_run(w.store, start.id).status == "done"
            # Warm-up over: every target's first scrapes (which create its series, CPU the
            # scrape loop shares in this one test process) are behind us.
            time.sleep(2.0)
            steady_from = time.time()
            # A long probe and two checks of frozen targets, then the stop.
            probe = q.request_run(
                w.store,
                "latency",
                {"rate": 5, "duration_s": 60, "prompt_tokens": 16, "output_tokens": 8},
                slow.id,
            )
            frozen = [q.get_target(w.store, f"frozen{i}").id for i in range(2)]
            for tid in frozen:
                q.request_run(w.store, "check_target", target_id=tid)
            wait_until(lambda: q.get_run(w.store, probe.id).status == "running", 30)
            t0 = time.monotonic()
            stop = q.request_run(w.store, "engine_stop", {"name": "fake"})
            wait_until(lambda: _finished(w, stop.id), 30)
            stop_took = time.monotonic() - t0
            time.sleep(8.0)  # scrapes go on beside everything else
            q.cancel_run(w.store, probe.id)
            wait_until(lambda: _finished(w, probe.id), 10)
            stop_watch.set()
            ticker.join(10)
            steady_to = time.time()
    finally:
        stop_watch.set()
        w.stop()
        for s in servers:
            s.__exit__(None, None, None)
    assert q.get_run(w.store, stop.id).status == "done"
    assert stop_took < 10.0, stop_took
    assert q.get_run(w.store, probe.id).status == "cancelled"
    assert heartbeat_ages and max(heartbeat_ages) < 10.0, max(heartbeat_ages)
    # Each healthy target's scrapes (their stored start times) kept to the interval.
    drifts: list[float] = []
    for i in range(10):
        tid = q.get_target(w.store, f"ok{i}").id
        points = q.series_points(w.store, tid, ["scrape_duration_s"], 0, time.time() + 1)
        starts = np.sort(points["ts"].to_numpy(float))
        starts = starts[starts >= steady_from]
        # Scraped through the whole steady period: from its first interval to its last (a
        # slot missed between shows in the worst gap, below), not a count with a fixed slack
        # (a clean-clone run beside a hog read 7 scrapes in 9.9 s against a bound of 7.9).
        assert len(starts) >= 2, (i, starts)
        ends = (starts[0] - steady_from, steady_to - starts[-1])
        assert max(ends) < 2 * INTERVAL_S, (i, ends, np.diff(starts))
        drifts += list(np.abs(np.diff(starts) - INTERVAL_S))
    median, p99, worst = np.quantile(drifts, [0.5, 0.99, 1.0])
    ms = {
        name: f"{v * 1000:.0f} ms" for name, v in (("median", median), ("p99", p99), ("max", worst))
    }
    print(f"healthy scrape interval drift: {ms}; engine stop {stop_took:.1f} s")
    # Frozen neighbours sharing the healthy targets' threads would hold their scrapes back
    # in most intervals (the median) or by whole deadlines one after another (the max).
    # Alone with two cores spinning the median is 0-1 ms and the max 10 ms; late in the
    # suite with one core spinning the p99 once read 0.7 s (median 1 ms): a stall of the
    # whole test process delays every target at once, so the tail is not judged alone.
    assert median < 0.05, median
    assert worst < 2 * INTERVAL_S, worst
    for i in range(10):
        frozen_target = q.get_target(w.store, f"frozen{i}")
        assert frozen_target.health == "down"
        assert "did not answer in full" in (frozen_target.health_message or "")


@pytest.mark.sqlite_only  # PostgreSQL's sequences never hand an id out twice
def test_a_new_target_under_a_removed_ones_id_is_scraped_cleanly(
    store: Engine, settings: Settings
) -> None:
    from probes.worker.scraping import TargetScraper

    # A generous deadline: this test is about ids, not speed (the default here is 0.5 s).
    roomy = settings.model_copy(update={"scrape": ScrapeLimits(interval_s=10, timeout_s=10)})
    scraper = TargetScraper(store, roomy)
    with serve(FakeVllm(kv_usage=0.5)) as url:
        old = q.add_target(store, q.parse_target({"name": "old", "base_url": url}))
        scraper.scrape(old.id)
        assert q.get_target(store, "old").health == "up"
        q.remove_target(store, "old")
        new = q.add_target(store, q.parse_target({"name": "new", "base_url": url}))
        assert new.id == old.id  # SQLite reuses the highest id: the case under test
        scraper.scrape(new.id)
    assert q.get_target(store, "new").health == "up"
    assert not [e for e in q.events(store, 0, 2e9) if e.kind == "storage_error"]
    assert q.count_samples(store, new.id) > 0
