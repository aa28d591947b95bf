"""Several workers on one PostgreSQL store: the targets dealt out, one leader, and a dead
worker's targets taken over within two scrape intervals."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from probes.worker import Worker
from storage import queries as q
from storage.dashboards import worker_status
from storage.db import open_store
from storage.queries import fleet
from storage.settings import Settings
from tests.support.cli import stop
from tests.support.fake_vllm import FakeVllm, serve
from tests.support.postgres import Cluster
from tests.support.waiting import wait_until

INTERVAL_S = 0.5


@pytest.fixture
def shared(postgres: Cluster, tmp_path: Path) -> Iterator[Settings]:
    url = postgres.database()
    yield Settings(data_dir=tmp_path, database_url=url, scrape_interval_s=INTERVAL_S)
    postgres.drop(url)


@pytest.fixture
def targets(shared: Settings) -> Iterator[list[int]]:
    store = open_store(shared.db_url)
    with contextlib.ExitStack() as stack:
        ids = [
            q.add_target(
                store,
                q.parse_target(
                    {
                        "name": f"r{i}",
                        "base_url": stack.enter_context(serve(FakeVllm(kv_usage=0.1 * i))),
                    }
                ),
            ).id
            for i in range(9)
        ]
        yield ids
    store.dispose()


def _partition(workers: list[Worker]) -> list[set[int]]:
    return [w.scrapes.target_ids for w in workers]


def _joiner(shared: Settings, members: list[str], targets: list[int]) -> Worker:
    """A new worker that the hashing gives at least one target (a random key gets none of
    nine among three members one time in 38, and its join would then show nothing)."""
    while True:
        w = Worker(shared)
        if any(fleet.owner(t, [*members, w.key]) == w.key for t in targets):
            return w
        w.gpus.close()  # never started: nothing else to stop
        w.store.dispose()


def test_workers_share_the_targets_and_one_leads(shared: Settings, targets: list[int]) -> None:
    workers = [Worker(shared) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        keys = sorted(w.key for w in workers)

        def dealt() -> bool:
            # (The first to start takes every target, and gives the others theirs as
            # they join.)
            parts = _partition(workers)
            return all(
                fleet.owner(t, keys) == w.key for w in workers for t in w.scrapes.target_ids
            ) and set().union(*parts) == set(targets)

        wait_until(dealt, 10, "every target scraped by exactly one worker, its owner")
        store = workers[0].store
        assert fleet.live_members(store) == keys
        held = fleet.claims(store)
        for w in workers:
            assert w.scrapes.target_ids == {t for t, k in held.items() if k == w.key}
        # One leader, and only its jobs run.
        assert [w.leading for w in workers].count(True) == 1
        leader = next(w for w in workers if w.leading)
        assert [w.scheduler.running for w in workers] == [w is leader for w in workers]
        assert q.get_lease(store, "worker").holder == leader.key  # type: ignore[union-attr]
        wait_until(lambda: all(q.get_target(store, f"r{i}").health == "up" for i in range(9)), 10)
        # The Overview's worker line counts them (the leader's heartbeat, every 5 s).
        wait_until(lambda: "3 workers running" in worker_status(store).message, 15)

        # The leader stops: another leads, and its targets go to the two left.
        leader.stop()
        rest = [w for w in workers if w is not leader]
        wait_until(lambda: any(w.leading for w in rest), 10, "a new leader")
        assert [w.leading for w in rest].count(True) == 1
        wait_until(lambda: set().union(*_partition(rest)) == set(targets), 10, "takeover")
        assert not set.intersection(*_partition(rest))
        assert [w.scheduler.running for w in rest].count(True) == 1
        # A worker joins: it takes a share, nobody scrapes a target twice.
        late = _joiner(shared, [w.key for w in rest], targets)
        late.start()
        rest.append(late)
        wait_until(lambda: bool(late.scrapes.target_ids), 10, "the new worker's share")
        wait_until(lambda: sum(map(len, _partition(rest))) == len(targets), 10)
        assert set().union(*_partition(rest)) == set(targets)
    finally:
        for w in workers + [w for w in locals().get("rest", []) if w not in workers]:
            if not w._stop.is_set():
                w.stop()


def _slots(starts: np.ndarray, interval: float) -> list[int]:
    """Each scrape's slot of the target's cadence (kept by whoever takes it over). A scrape
    starts late on a busy machine, never early, so the cadence's phase is the median one; a
    second scrape in one interval shares a slot with another."""
    phase = np.median((starts - starts[0] + interval / 2) % interval - interval / 2)
    return [int(x) for x in np.floor((starts - starts[0] - phase) / interval + 0.25)]


def test_a_killed_worker_s_targets_are_scraped_again_within_two_intervals(
    shared: Settings, targets: list[int], tmp_path: Path
) -> None:
    """Three `kvscope worker` processes; one is killed (SIGKILL: no goodbye). Every target
    keeps being scraped, at most one slot of its cadence missed (a gap of two intervals),
    and never twice in one slot."""
    interval = 1.0
    env = {
        **os.environ,
        "KVSCOPE_DATA_DIR": str(tmp_path),
        "KVSCOPE_DATABASE_URL": shared.db_url,
        "KVSCOPE_SCRAPE__INTERVAL_S": str(interval),
        "KVSCOPE_TEST_CPU_HOG": "0",
    }
    procs = [
        subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(3)
    ]  # fmt: skip
    store = open_store(shared.db_url)
    try:
        wait_until(lambda: len(fleet.live_members(store)) == 3, 60, "three members")
        wait_until(lambda: len(fleet.claims(store)) == len(targets), 20, "every target claimed")
        time.sleep(3 * interval)
        leases = {r.holder: r.pid for r in fleet.member_leases(store)}
        held = fleet.claims(store)
        victim_key = max(set(held.values()), key=lambda k: sum(v == k for v in held.values()))
        moved = [t for t, k in held.items() if k == victim_key]
        killed_at = time.time()
        victim = next(p for p in procs if p.pid == leases[victim_key])
        victim.kill()
        victim.wait(timeout=10)  # reaped, as init reaps a worker that dies
        wait_until(
            lambda: all(fleet.claims(store).get(t) not in (None, victim_key) for t in moved), 10
        )
        time.sleep(4 * interval)
        worst = 0.0
        for tid in targets:
            points = q.series_points(store, tid, ["scrape_duration_s"], killed_at - 5, time.time())
            starts = np.sort(points["ts"].to_numpy(float))
            gaps = np.diff(starts)
            slots = _slots(starts, interval)
            # At most one slot of the cadence missed (a gap of two intervals, read in slots:
            # a scrape a millisecond late in the next-but-one slot is still in it).
            assert max(np.diff(slots)) <= 2, (tid, tid in moved, gaps.max())
            assert len(set(slots)) == len(slots), (tid, tid in moved, starts - starts[0])
            worst = max(worst, float(gaps.max())) if tid in moved else worst
        print(f"{len(moved)} targets moved; longest gap {worst:.2f} s at a {interval:g} s interval")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # all at once, then wait for each
        for p in procs:
            stop(p)
        store.dispose()
