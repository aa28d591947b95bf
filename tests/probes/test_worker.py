"""The worker against loopback servers: scraping, health, backoff, events and work rows."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from planner.errors import InvalidInput, KvscopeError
from planner.simulate import SimRequest, simulate
from planner.simulate.calibrate import LoadRun, fit
from probes.kinds import calibration
from probes.worker import Worker, scraping
from storage import derived as d
from storage import queries as q
from storage.schemas import ScrapeLimits
from storage.settings import Settings
from tests.planner.test_calibrate import CONFIG, samples
from tests.support.fake_openai import FakeConfig
from tests.support.fake_openai import serve as serve_openai
from tests.support.fake_vllm import FakeVllm, serve
from tests.support.waiting import wait_until


@pytest.fixture
def worker(settings: Settings) -> Iterator[Worker]:
    w = Worker(settings)
    yield w
    if w.scheduler.running:
        w.stop()


def _add(w: Worker, name: str, url: str) -> int:
    return q.add_target(w.store, q.parse_target({"name": name, "base_url": url})).id


def test_scraped_series_and_derived_rates(worker: Worker) -> None:
    fake = FakeVllm(kv_usage=0.5, running=3, rates={"preemptions": 4.0, "generation_tokens": 250.0})
    with serve(fake) as url:
        tid = _add(worker, "fake", url)
        worker.start()
        t0 = time.time()
        time.sleep(6.0)
        worker.stop()
    target = q.get_target(worker.store, "fake")
    assert target.health == "up" and target.num_gpu_blocks == 1000 and target.block_size == 32
    assert target.model_name == "tiny-llama"
    grid = d.Grid(t0 + 5.0, t0 + 5.5, 0.5, 0)
    assert d.gauge(worker.store, tid, "kv_usage", grid).iloc[-1] == 0.5
    pre = d.rate(worker.store, tid, "preemptions_total", grid, window_s=4.0).to_numpy()
    gen = d.rate(worker.store, tid, "generation_tokens_total", grid, window_s=4.0).to_numpy()
    # The fake's counters grow with wall time as it answers, while a sample is stamped when
    # its scrape starts: on a busy machine the two drift up to ~0.3 s apart (16 % of 4.0 was
    # seen over a 2 s window), so the window is 4 s and the tolerance 20 %; a wrong unit or
    # counter is off by far more.
    assert np.allclose(pre, 4.0, rtol=0.2)
    assert np.allclose(gen, 250.0, rtol=0.2)


def test_a_down_target_is_recorded_backs_off_and_does_not_stop_the_others(worker: Worker) -> None:
    fake = FakeVllm()
    with serve(fake) as url:
        good = _add(worker, "good", url)
        _add(worker, "dead", "http://127.0.0.1:9")
        worker.start()
        time.sleep(5.0)
        worker.stop()
    dead = q.get_target(worker.store, "dead")
    assert dead.health == "down" and "connection refused" in (dead.health_message or "")
    # Backoff at 0.5 s doubling: attempts at ~0, 0.5, 1.5, 3.5 s, not ten of them.
    assert 2 <= dead.consecutive_failures <= 5
    downs = q.events(worker.store, 0, time.time() + 1, kinds=["target_down"])
    assert len(downs) == 1 and downs[0].severity == "warning"
    assert q.get_target(worker.store, "good").health == "up"
    assert q.count_samples(worker.store, good) > 0


def test_recovery_counter_reset_and_scrape_warnings_are_events(worker: Worker) -> None:
    fake = FakeVllm(generation_tokens=1000)
    with serve(fake) as url:
        _add(worker, "fake", url)
        worker.start()
        wait_until(lambda: q.get_target(worker.store, "fake").health == "up")
        fake.status = 503
        wait_until(lambda: q.get_target(worker.store, "fake").health == "down")
        fake.status = 200
        fake.restart()
        wait_until(lambda: q.get_target(worker.store, "fake").health == "up")
        fake.body_override = fake.text().replace(
            "vllm:num_requests_waiting{", "vllm:num_requests_waiting{broken "
        )
        wait_until(lambda: q.get_target(worker.store, "fake").health == "degraded")
        worker.stop()
    kinds = [e.kind for e in q.events(worker.store, 0, time.time() + 1)]
    assert kinds.count("target_down") == 1 and kinds.count("target_up") == 1
    assert "counter_reset" in kinds and "scrape_warning" in kinds
    assert "HTTP 503" in (
        q.events(worker.store, 0, time.time() + 1, kinds=["target_down"])[0].message
    )


def test_a_healthy_targets_row_stays_fresh_and_a_health_written_elsewhere_is_corrected(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scraping, "HEALTH_REFRESH_S", 0.6)
    with serve(FakeVllm()) as url:
        tid = _add(worker, "fake", url)
        worker.start()
        wait_until(lambda: q.get_target(worker.store, "fake").health == "up")
        first = q.get_target(worker.store, "fake").last_scrape_at or 0.0
        # Only the times move while nothing new is said (the cheap refresh)...
        wait_until(lambda: (q.get_target(worker.store, "fake").last_scrape_at or 0.0) > first + 1)
        # ...and a health another writer left (a check that failed) is put right, with its
        # event, instead of being refreshed over.
        marked = time.time()
        q.set_target_health(worker.store, tid, ok=False, message="checked: refused", ts=marked)
        wait_until(lambda: q.get_target(worker.store, "fake").health == "up")
        worker.stop()
    # (A scrape that timed out on a busy machine adds an event of its own before.)
    ups = q.events(worker.store, marked, time.time() + 1, kinds=["target_up"])
    assert len(ups) == 1 and ups[0].target_id == tid


def test_the_last_scrape_is_read_from_its_samples_not_the_rows_refresh(
    settings: Settings,
) -> None:
    """A worker taking a target over keeps its cadence from the last scrape: the row's time
    is refreshed only every HEALTH_REFRESH_S, the scrape's own sample every time."""
    w = Worker(settings)
    fake = FakeVllm(delay_s=0.05)
    with serve(fake) as url:
        tid = _add(w, "fake", url)
        w.scrape_target(tid)
        row = q.get_target(w.store, tid).last_scrape_at
        assert row is not None and w.scraper.last_scrape_at(tid) == row
        w.scrape_target(tid)  # within HEALTH_REFRESH_S: the row keeps the first time
        assert q.get_target(w.store, tid).last_scrape_at == row
        newest = q.latest_ts(w.store, tid, scraping.SCRAPE_DURATION)
        assert newest is not None and newest > row
        # Each duration covers its answer: it once read the few microseconds before the
        # request, two scrapes often the same value, and the second sample went unstored.
        frame = q.series_points(w.store, tid, [scraping.SCRAPE_DURATION], row - 1, newest + 1)
        assert len(frame) == 2 and (frame["value"] >= fake.delay_s).all()
        assert w.scraper.last_scrape_at(tid) == newest
    assert q.latest_ts(w.store, tid, "no_such_series") is None
    w.stop()


def test_slow_endpoint_times_out_with_a_clear_message(settings: Settings) -> None:
    w = Worker(settings.model_copy(update={"scrape": ScrapeLimits(timeout_s=0.3)}))
    fake = FakeVllm(delay_s=1.0)
    with serve(fake) as url:
        tid = _add(w, "slow", url)
        w.scrape_target(tid)
    assert "did not answer in full within 0.3 s" in (
        q.get_target(w.store, "slow").health_message or ""
    )


def test_work_rows_are_carried_out_and_failures_are_data(worker: Worker) -> None:
    fake = FakeVllm(kv_usage=0.125)
    with serve(fake) as url:
        tid = _add(worker, "fake", url)
        dead = _add(worker, "dead", "http://127.0.0.1:9")
        ok = q.request_run(worker.store, "check_target", target_id=tid)
        bad = q.request_run(worker.store, "check_target", target_id=dead)
        odd = q.request_run(worker.store, "no-such-probe")
        worker.start()
        for _ in range(30):
            worker.tick()
            if all(
                q.get_run(worker.store, r.id).status not in ("queued", "running")
                for r in (ok, bad, odd)
            ):
                break
            time.sleep(0.1)
        worker.stop()
    done = q.get_run(worker.store, ok.id)
    assert done.status == "done" and done.summary["kv_usage"] == 0.125
    failed = q.get_run(worker.store, bad.id)
    assert failed.status == "failed" and "connection refused" in (failed.error or "")
    assert q.get_run(worker.store, odd.id).status == "failed"


def test_a_restarted_worker_marks_left_over_runs_interrupted(settings: Settings) -> None:
    first = Worker(settings)
    run = q.request_run(first.store, "check_target")
    q.claim_next_run(first.store, ["check_target"])  # then the process "dies"
    second = Worker(settings)
    second.start()
    second.stop()
    after = q.get_run(second.store, run.id)
    assert after.status == "interrupted" and "worker stopped" in (after.error or "")


def test_the_worker_runs_a_wanted_engine_and_stops_it_on_shutdown(
    settings: Settings, tmp_path: Path
) -> None:
    from probes.engine import group_pids, parse_spec

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    fake = Path(__file__).resolve().parents[1] / "support" / "fake_engine.py"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = parse_spec(
        {
            "name": "fake",
            "model": str(model),
            "vllm": str(fake),
            "port": port,
            "kv_cache_memory_bytes": 16 << 20,
        }
    )
    w = Worker(settings)
    q.save_engine_spec(w.store, "fake", spec.model_dump())
    q.mark_started(w.store, "fake", spec.model_dump())  # as `kvscope up` leaves it
    w.start()
    wait_until(lambda: "fake" in w.engines and w.engines["fake"].state.status == "running", 30)
    pid = w.engines["fake"].state.pid
    assert pid is not None and group_pids(pid)

    def scraped() -> bool:
        w.tick()  # the main loop adds the scrape job once the engine is healthy
        return q.get_target(w.store, "fake").health == "up"

    wait_until(scraped, 15)
    w.stop()
    assert group_pids(pid) == []
    assert [e.kind for e in q.events(w.store, 0, time.time() + 1, kinds=["engine_stopped"])]


def test_a_new_worker_replaces_the_stored_jobs_of_a_dead_one(settings: Settings) -> None:
    first = Worker(settings)
    q.add_target(first.store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:9"}))
    first.start()
    _die(first)  # the process died: its jobs stay in the job store
    _expire_lease(first)  # ... and its lease ran out, as a dead worker's does
    second = Worker(settings)
    second.start()
    try:
        jobs = second.scheduler.get_jobs()
        assert {j.id for j in jobs} == {
            "rollup",
            "retention",
            "gpu",
            "heartbeat",
            "engines",
            "alerts",
        }
        assert all(j.args[0] == second.key for j in jobs)
        # Two workers in one process (tests do this) never run each other's jobs.
        assert second.key != first.key
    finally:
        second.stop()


def test_probe_schedules_become_jobs_that_queue_one_run_at_a_time(settings: Settings) -> None:
    w = Worker(settings)
    tid = q.add_target(w.store, q.parse_target({"name": "t", "base_url": "http://h:1"})).id
    sched = q.add_schedule(w.store, tid, "latency", {"rate": 1, "duration_s": 5}, every_s=600)
    with pytest.raises(InvalidInput, match="at most every 10 s"):
        q.add_schedule(w.store, tid, "latency", {}, every_s=1)
    w.start()
    try:
        w.sync_schedules()
        job = w.scheduler.get_job(f"schedule:{sched.id}")
        assert job is not None and job.trigger.interval.total_seconds() == 600
        w.queue_scheduled(sched.id)
        w.queue_scheduled(sched.id)  # the first is still queued: no pile-up
        runs = q.list_runs(w.store, kind="latency")
        assert len(runs) == 1 and runs[0].params["schedule_id"] == sched.id
        assert runs[0].target_id == tid
        q.remove_schedule(w.store, sched.id)
        w.sync_schedules()
        assert w.scheduler.get_job(f"schedule:{sched.id}") is None
    finally:
        w.stop()


def _die(w: Worker) -> None:
    """Stop a worker's threads as a killed process would: nothing released, nothing marked."""
    w.scheduler.shutdown(wait=False)
    w._stop.set()
    if w._fleet_thread is not None:
        w._fleet_thread.join(10)
    w.scrapes.stop()


def _expire_lease(w: Worker) -> None:
    from sqlalchemy import update

    from storage.db import transaction
    from storage.tables import WorkerLease

    with transaction(w.store) as s:
        s.execute(update(WorkerLease).values(expires_at=time.time() - 1))


@pytest.mark.sqlite_only  # on PostgreSQL several share a store (tests/probes/test_fleet.py)
def test_one_worker_per_store_and_the_next_takes_over_when_the_lease_ends(
    settings: Settings,
) -> None:
    first = Worker(settings)
    first.start()
    try:
        second = Worker(settings)
        with pytest.raises(KvscopeError, match=f"worker lease held by pid {os.getpid()} on "):
            second.start()
        assert not second.scheduler.running  # refused before it did anything
    finally:
        first.stop()  # a clean stop gives the lease back
    third = Worker(settings)
    third.start()
    third.stop()
    # A holder on another host is waited for until its lease expires.
    q.acquire_lease(third.store, "worker", "elsewhere", 4242, "other-host", ttl_s=1.5)
    fourth = Worker(settings)
    with pytest.raises(KvscopeError, match="held by pid 4242 on other-host"):
        fourth.start()
    time.sleep(1.6)
    fourth.start()
    assert q.get_lease(fourth.store, "worker").holder == fourth.key  # type: ignore[union-attr]
    fourth.stop()


@pytest.mark.sqlite_only  # the disk under a SQLite file
def test_a_nearly_full_disk_pauses_ingest_and_says_so(settings: Settings) -> None:
    from storage.dashboards import worker_status
    from storage.settings import Retention

    full = settings.model_copy(update={"retention": Retention(min_free_disk_mb=1e12)})
    w = Worker(full)
    fake = FakeVllm(kv_usage=0.5)
    with serve(fake) as url:
        tid = _add(w, "fake", url)
        w.check_disk()
        w.scrape_target(tid)
        assert q.count_samples(w.store, tid) == 0  # nothing written while paused
        status = worker_status(w.store)
        assert status.disk_warning is not None and "ingest paused" in status.disk_warning
        w.settings = settings  # room again
        w.check_disk()
        w.scrape_target(tid)
        assert q.count_samples(w.store, tid) > 0
    kinds = [e.kind for e in q.events(w.store, 0, time.time() + 1)]
    assert kinds.count("disk_low") == 1 and kinds.count("disk_ok") == 1
    assert worker_status(w.store).disk_warning is None


def test_a_latency_run_on_a_calibrated_target_is_checked_against_its_calibration(
    worker: Worker,
) -> None:
    """The worker keeps each finished latency run on a calibrated target as a check: how
    many times as long as the calibration says the run's steps took."""
    cal = fit(*samples(), CONFIG).model_copy(
        update={"target": "cal", "fitted_at": time.time() - 60, "tuned_at": time.time() - 60}
    )
    params = {"rate": 5, "duration_s": 2, "prompt_tokens": 32, "output_tokens": 8,
              "arrival": "constant"}  # fmt: skip
    with serve_openai(FakeConfig(ttft_s=0.005, itl_s=0.004)) as fake:
        tid = _add(worker, "cal", fake.url)
        plain = _add(worker, "plain", fake.url)
        calibration.save(worker.store, "cal", cal)
        runs = [q.request_run(worker.store, "latency", params, target_id=t) for t in (tid, plain)]
        worker.start()

        def done() -> bool:
            worker.tick()
            return all(q.get_run(worker.store, r.id).status == "done" for r in runs)

        wait_until(done, timeout=60, what="the latency runs")
        worker.stop()
    found = calibration.stored(worker.store, "cal")
    assert found is not None and [c.run for c in found.checks] == [f"latency run {runs[0].id}"]
    # The stand-in answers a token every 4 ms or so (more on a busy machine), one request
    # at a time; the calibration says a lone decode step of its length takes this long.
    (alone,) = simulate([SimRequest(0.0, 32, 8)], CONFIG, cal.cost())
    figures = LoadRun.model_validate(q.get_run(worker.store, runs[0].id).summary).tune_figures
    assert alone.tpot_s is not None and figures is not None
    assert found.checks[0].drift == pytest.approx(figures[0] / alone.tpot_s, rel=0.1)
    assert calibration.stored(worker.store, "plain") is None
