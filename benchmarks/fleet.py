"""Fleet figures: 50 loopback targets scraped every second by one worker on SQLite and by
one and three workers on PostgreSQL; then ingest and 30-day reads on both stores.

1. Scraping (issue 16): 50 loopback metric servers, each a captured vLLM 0.32 `/metrics`
   page whose counters move, scraped at a 1 s interval by real `kvscope worker` processes
   for `--measure-s`. Per setup: scrape start jitter (|interval between two scrape starts
   of a target - 1 s|, p50 and p99; target < 100 ms at p99), targets scraped twice within
   one interval (target 0), gaps over two intervals, and the workers' CPU per target (ms of
   CPU per target per second, all workers together).
2. Storage: the same 50 targets' 30 days of 1-hour and 1-minute rollups and the last hour
   of raw samples (the Live page's series), built on SQLite and on PostgreSQL; ingest
   through the real writer; the Live page's frame for one target over 24 hours and 30 days,
   and the Overview's rows for all 50 (target: the Live page under 200 ms).

PostgreSQL is a throwaway cluster from Debian's server binaries (as the tests start one).
Medians of several runs where it says so; the machine's load is printed with them.

    .venv/bin/python -m benchmarks.fleet [--measure-s 60] [--targets 50] [--skip-storage]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from benchmarks.engine import cpu_seconds
from benchmarks.storage import DAY, bench_ingest, fill_history, timed
from benchmarks.worker import CAPTURE, _moving
from storage import dashboards
from storage import queries as q
from storage.db import open_store
from tests.support.cli import spawn
from tests.support.fake_vllm import FakeVllm, serve
from tests.support.postgres import Cluster, start_cluster

INTERVAL_S = 1.0


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def scrape_run(url: str, workers: int, targets: int, measure_s: float) -> dict[str, float]:
    """`workers` worker processes on the store at `url` scraping `targets` servers."""
    data = Path(tempfile.mkdtemp(prefix="kvscope-bench-fleet-"))
    store = open_store(url)
    text = CAPTURE.read_text()
    with ExitStack() as stack:
        for i in range(targets):
            fake = FakeVllm()
            fake.text = _moving(text, rate=100.0 + i)  # type: ignore[method-assign]
            base = stack.enter_context(serve(fake))
            q.add_target(store, q.parse_target({"name": f"r{i}", "base_url": base}))
        env = {"KVSCOPE_DATABASE_URL": url, "KVSCOPE_SCRAPE__INTERVAL_S": str(INTERVAL_S)}
        procs = [spawn("worker", env_dir=data, environ=env) for _ in range(workers)]
        try:
            time.sleep(12)  # start, join, first scrapes (which create every series), settle
            c0, t0 = sum(cpu_seconds(p.pid) for p in procs), time.time()
            time.sleep(measure_s)
            t1 = time.time()
            cpu = sum(cpu_seconds(p.pid) for p in procs) - c0
            load = _load()
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(60)
    jitter: list[float] = []
    twice = gaps = 0
    for i in range(targets):
        tid = q.get_target(store, f"r{i}").id
        pts = q.series_points(store, tid, ["scrape_duration_s"], t0, t1)
        steps = np.diff(np.sort(pts["ts"].to_numpy(float)))
        jitter += list(np.abs(steps - INTERVAL_S))
        twice += int((steps < 0.5 * INTERVAL_S).sum())
        gaps += int((steps > 2 * INTERVAL_S).sum())
    store.dispose()
    print(f"    ({load})", flush=True)
    return {
        "jitter_p50_ms": float(np.quantile(jitter, 0.5)) * 1000,
        "jitter_p99_ms": float(np.quantile(jitter, 0.99)) * 1000,
        "twice": twice,
        "gaps": gaps,
        "cpu_ms_per_target_s": cpu / targets / (t1 - t0) * 1000,
        "scrapes": len(jitter) + targets,
    }


def storage_run(url: str, targets: int, runs: int) -> dict[str, float]:
    store = open_store(url)
    rates = bench_ingest(store, scrapes=100, points=250, runs=runs)
    now = float(int(time.time() // 3600 * 3600))
    t0 = time.perf_counter()
    fill_history(store, now, targets, series=9, raw_hours=1)
    built = time.perf_counter() - t0
    tid = q.get_target(store, "t1").id
    day = timed(lambda: dashboards.live(store, tid, now - DAY, now), runs)
    month = timed(lambda: dashboards.live(store, tid, now - 30 * DAY, now), runs)
    overview = timed(lambda: dashboards.overview(store, now), runs)
    store.dispose()
    return {
        "ingest": statistics.median(rates),
        "built_s": built,
        "live_24h_ms": statistics.median(day),
        "live_30d_ms": statistics.median(month),
        "overview_ms": statistics.median(overview),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--measure-s", type=float, default=60.0)
    ap.add_argument("--targets", type=int, default=50)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--skip-storage", action="store_true")
    args = ap.parse_args()
    cluster: Cluster = start_cluster()
    try:
        print(f"## Scraping {args.targets} targets every {INTERVAL_S:g} s for {args.measure_s:g} s")
        print("| store | workers | jitter p50 ms | jitter p99 ms | scraped twice in an "
              "interval | gaps > 2 intervals | CPU ms per target-second |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        folder = Path(tempfile.mkdtemp(prefix="kvscope-bench-fleet-db-"))
        setups = [
            ("SQLite", 1, f"sqlite:///{folder / 'one.db'}"),
            ("PostgreSQL", 1, cluster.database()),
            ("PostgreSQL", 3, cluster.database()),
        ]
        for name, workers, url in setups:
            r = scrape_run(url, workers, args.targets, args.measure_s)
            print(f"| {name} | {workers} | {r['jitter_p50_ms']:.0f} | {r['jitter_p99_ms']:.0f} | "
                  f"{r['twice']} of {r['scrapes']:,} | {r['gaps']} | "
                  f"{r['cpu_ms_per_target_s']:.1f} |", flush=True)  # fmt: skip
        if args.skip_storage:
            return
        print(f"\n## Storage: {args.targets} targets x 9 series, 30 days of rollups, 1 h raw")
        print("| store | ingest samples/s | built in s | Live 24 h ms | Live 30 d ms | "
              f"Overview of {args.targets} ms |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for name, url in (
            ("SQLite", f"sqlite:///{folder / 'history.db'}"),
            ("PostgreSQL", cluster.database(migrated=False)),
        ):
            r = storage_run(url, args.targets, args.runs)
            print(f"| {name} | {r['ingest']:,.0f} | {r['built_s']:.0f} | {r['live_24h_ms']:.0f} | "
                  f"{r['live_30d_ms']:.0f} | {r['overview_ms']:.0f} |", flush=True)  # fmt: skip
        print(f"({_load()})")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
