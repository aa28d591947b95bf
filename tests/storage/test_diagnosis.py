"""Diagnosis over stored data: a minute of scrapes of an engine in each state, written through
the real parse and write path, gets the cause that state is; a calm minute gets none.
(The same causes injected into the real CPU engine: tests/e2e/test_diagnosis_engine.py.)"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from sqlalchemy import Engine

from probes.vllm.metrics import parse_metrics
from storage import queries as q
from storage.dashboards.diagnosis import diagnose, signals
from storage.ingest import Point, SampleWriter
from tests.support.fake_vllm import FakeVllm

NOW = 2_000_000.0
STEP = 2.0

Step = Callable[[FakeVllm, random.Random], bool]  # fills one scrape; False: the scrape failed


def _requests(
    fake: FakeVllm, n: int, ttft: float, queue: float, prompt: int, itl: float = 0.005
) -> None:
    for _ in range(n):
        fake.ttft.observe(ttft)
        fake.queue_time.observe(queue)
        fake.prompt_len.observe(prompt)
        fake.e2e.observe(ttft + 30 * itl)
        fake.tpot.observe(itl)
        fake.itl.observe(itl, times=30)
        fake.finished["stop"] = fake.finished.get("stop", 0) + 1


def quiet(f: FakeVllm, rng: random.Random) -> bool:
    f.running, f.waiting, f.kv_usage = 1, 0, 0.05
    _requests(f, 1, rng.uniform(0.015, 0.03), 0.0001, rng.randint(50, 90))
    return True


def queueing(f: FakeVllm, rng: random.Random) -> bool:
    f.running, f.waiting, f.kv_usage = 4, rng.randint(15, 25), 0.04
    _requests(f, 4, rng.uniform(2.5, 3.5), 2.6, 64)
    return True


def kv_pressure(f: FakeVllm, rng: random.Random) -> bool:
    f.running, f.waiting, f.kv_usage = 3, rng.randint(3, 6), rng.uniform(0.93, 0.99)
    f.preemptions += 1
    _requests(f, 1, rng.uniform(3.0, 5.0), 3.0, 5000)
    return True


def prefill(f: FakeVllm, rng: random.Random) -> bool:
    f.running, f.waiting, f.kv_usage = 2, 0, rng.uniform(0.05, 0.45)
    _requests(f, 10, 0.02, 0.0001, 64)
    _requests(f, 1, 1.5, 0.0001, 7000)  # a long prefill, and a short one stuck behind it
    _requests(f, 1, 1.2, 0.0001, 64)
    return True


def errors(f: FakeVllm, rng: random.Random) -> bool:
    quiet(f, rng)
    _requests(f, 2, 0.02, 0.0001, 64)
    f.finished["abort"] = f.finished.get("abort", 0) + 1
    return True


def down(f: FakeVllm, rng: random.Random) -> bool:
    return rng.random() < 0.4


def _write(store: Engine, tid: int, step: Step, start: float, end: float, seed: int = 0) -> None:
    fake, writer, rng = FakeVllm(), SampleWriter(store, heartbeat_s=0), random.Random(seed)
    t = start
    while t <= end:
        ok = step(fake, rng)
        points: list[Point] = [Point("up", {}, 1.0 if ok else 0.0, kind="gauge")]
        if ok:
            parsed = parse_metrics(fake.text())
            writer.write(tid, parsed.samples, t)
            q.set_target_health(
                store, tid, ok=True, message=None, ts=t, cache_info=parsed.cache_info
            )
        writer.write(tid, points, t)
        t += STEP


def _target(store: Engine) -> int:
    return q.add_target(store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:1"})).id


@pytest.mark.parametrize(
    ("step", "cause"),
    [
        (quiet, "none"),
        (queueing, "queueing"),
        (kv_pressure, "kv_pressure"),
        (prefill, "prefill_interference"),
        (errors, "errors"),
        (down, "down"),
    ],
)
def test_a_minute_in_each_state_gets_its_cause(store: Engine, step: Step, cause: str) -> None:
    tid = _target(store)
    _write(store, tid, step, NOW - 62, NOW)
    found = diagnose(store, tid, since_s=60, window_s=60, now=NOW)
    assert (found.cause, len(found.windows)) == (cause, 1)
    if cause != "none":
        assert found.evidence and found.worst is not None and found.worst.score >= 0.5
        assert found.runner_up != cause


def test_kv_pressure_outranks_the_queue_it_causes(store: Engine) -> None:
    tid = _target(store)
    _write(store, tid, kv_pressure, NOW - 62, NOW)
    found = diagnose(store, tid, since_s=60, window_s=60, now=NOW)
    assert (found.cause, found.runner_up) == ("kv_pressure", "queueing")
    shown = {e.series for e in found.evidence}
    assert {"preemptions", "kv_usage max", "waiting mean"} <= shown


def test_a_crash_in_the_window_is_down_even_when_scrapes_answered(store: Engine) -> None:
    tid = _target(store)
    _write(store, tid, quiet, NOW - 62, NOW)
    q.record_event(store, "engine_crashed", "engine t exited", target_id=tid, ts=NOW - 30)
    assert diagnose(store, tid, since_s=60, window_s=60, now=NOW).cause == "down"


def test_windows_are_judged_each_on_its_own(store: Engine) -> None:
    """Five calm minutes, one queueing, two calm: the period's verdict is the queue's, and
    only its window names it."""
    tid = _target(store)
    start = NOW - 8 * 60
    _write(store, tid, quiet, start - 2, start + 5 * 60, seed=1)
    _write(store, tid, queueing, start + 5 * 60 + STEP, start + 6 * 60, seed=2)
    _write(store, tid, quiet, start + 6 * 60 + STEP, NOW, seed=3)
    found = diagnose(store, tid, since_s=8 * 60, window_s=60, now=NOW)
    assert [w.cause for w in found.windows] == ["none"] * 5 + ["queueing"] + ["none"] * 2
    assert found.cause == "queueing" and found.worst is not None
    assert found.worst.end == pytest.approx(start + 6 * 60)


def test_decode_slowdown_needs_and_uses_the_targets_own_baseline(store: Engine) -> None:
    def usual(f: FakeVllm, rng: random.Random) -> bool:
        f.running, f.waiting, f.kv_usage = 4, 0, 0.2
        _requests(f, 2, 0.05, 0.0001, 64, itl=0.01)
        return True

    def crowded(f: FakeVllm, rng: random.Random) -> bool:
        f.running, f.waiting, f.kv_usage = 16, 0, 0.6
        _requests(f, 2, 0.12, 0.0001, 64, itl=0.03)
        return True

    tid = _target(store)
    _write(store, tid, usual, NOW - 600, NOW - 120)
    _write(store, tid, crowded, NOW - 120 + STEP, NOW)
    found = diagnose(store, tid, since_s=60, window_s=60, now=NOW)
    assert found.cause == "decode_slowdown"
    assert diagnose(store, tid, since_s=60, window_s=60, now=NOW, use_baseline=False).cause == (
        "none"
    )


def test_the_signals_are_those_of_the_window(store: Engine) -> None:
    tid = _target(store)
    _write(store, tid, queueing, NOW - 62, NOW)
    (s,) = signals(store, tid, NOW - 60, NOW, 60)
    assert s.window_s == 60 and s.up_share == 1.0
    assert s.finished == pytest.approx(4 * 30)  # 30 scrapes after the first, 4 each
    assert s.queue_mean_s == pytest.approx(2.6) and 15 <= (s.waiting_mean or 0) <= 25
    assert s.kv_capacity_tokens == 1000 * 32 and s.prompt_p50 is not None
