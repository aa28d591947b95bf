"""Worker figures under hostile targets, and a probe's memory over a long run.

1. A real `kvscope worker` scrapes 20 loopback targets for a minute at the default interval
   (2 s; `--interval` to change it): 10 serve a
   captured vLLM 0.32 metrics page with moving values, 10 are frozen (accept, never answer).
   Prints the worker's peak RSS and CPU share of one core beside the targets (< 300 MB,
   < 10% of a core), and the healthy targets' scrape interval drift.
2. `kvscope probe latency` at 400 req/s against the loopback OpenAI stand-in, for 20 s and
   for 80 s: peak RSS of the probe's process for each, so memory is seen to follow what is
   in flight, not what is planned (8,000 against 32,000 requests).

Medians of several runs; the load it ran under is printed with it.

    .venv/bin/python -m benchmarks.worker [--runs 3] [--measure-s 60]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.engine import cpu_seconds, rss_mb
from storage import queries as q
from storage.db import open_store
from tests.support.cli import spawn
from tests.support.fake_openai import FakeConfig
from tests.support.fake_openai import serve as serve_openai
from tests.support.fake_vllm import FakeVllm, serve
from tests.support.hostile import hostile

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "tests" / "fixtures" / "metrics" / "vllm_cpu_0.32.0_loaded.txt"


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _moving(capture: str, rate: float) -> Callable[[], str]:
    """The capture with its counters grown by `rate` per second since the first call, as a
    busy engine's move (its histogram buckets move less: they stay as captured)."""
    start = time.monotonic()
    counter = re.compile(r"^(vllm:\w+_total\{[^}]*\}) ([0-9.e+-]+)$", re.M)

    def text() -> str:
        grown = rate * (time.monotonic() - start)
        return counter.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + grown}", capture)

    return text


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def worker_run(measure_s: float, interval_s: float) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="kvscope-bench-worker-"))
    store = open_store(f"sqlite:///{data / 'kvscope.db'}")
    text = CAPTURE.read_text()
    with ExitStack() as stack:
        bad = stack.enter_context(hostile())
        for i in range(10):
            fake = FakeVllm()
            fake.text = _moving(text, rate=100.0 + i)  # type: ignore[method-assign]
            url = stack.enter_context(serve(fake))
            q.add_target(store, q.parse_target({"name": f"ok{i}", "base_url": url}))
            frozen = {"name": f"frozen{i}", "base_url": f"{bad}/silent"}
            q.add_target(store, q.parse_target(frozen))
        worker = spawn(
            "worker", env_dir=data, environ={"KVSCOPE_SCRAPE__INTERVAL_S": str(interval_s)}
        )
        try:
            time.sleep(10)  # start, first scrapes (which create every series), settle
            c0, t0 = cpu_seconds(worker.pid), time.time()
            time.sleep(measure_s)
            cpu = (cpu_seconds(worker.pid) - c0) / (time.time() - t0) * 100
            peak = _peak_rss_mb(worker.pid)
            load = _load()
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
    drifts: list[float] = []
    for i in range(10):
        tid = q.get_target(store, f"ok{i}").id
        pts = q.series_points(store, tid, ["scrape_duration_s"], t0, t0 + measure_s)
        drifts += list(np.abs(np.diff(np.sort(pts["ts"].to_numpy(float))) - interval_s))
    return {
        "cpu_pct": cpu,
        "peak_rss_mb": peak,
        "drift_p99_ms": float(np.quantile(drifts, 0.99)) * 1000 if drifts else float("nan"),
        "load": load,
    }


def probe_run(duration_s: float) -> float:
    data = Path(tempfile.mkdtemp(prefix="kvscope-bench-probe-"))
    with serve_openai(FakeConfig()) as fake:
        probe = spawn(
            *("probe", "latency", "--target", fake.url),
            *("--rate", "400", "--duration", str(duration_s), "--prompt-tokens", "16"),
            *("--output-tokens", "8", "--arrival", "constant"),
            *("--set", "lateness_limit_s=1"),
            env_dir=data,
        )
        peak = 0.0
        while probe.poll() is None:
            try:
                peak = max(peak, _peak_rss_mb(probe.pid), rss_mb(probe.pid))
            except OSError:
                break
            time.sleep(0.5)
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--measure-s", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=2.0, help="scrape interval, seconds")
    args = ap.parse_args()
    runs = [worker_run(args.measure_s, args.interval) for _ in range(args.runs)]

    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    print(
        f"worker, 20 targets (10 frozen) scraped every {args.interval:g} s for "
        f"{args.measure_s:.0f} s: "
        f"median {med('cpu_pct'):.1f}% of one core (target < 10%), peak RSS "
        f"{med('peak_rss_mb'):.0f} MB (target < 300 MB), healthy scrape drift p99 "
        f"{med('drift_p99_ms'):.0f} ms (runs under: {'; '.join(r['load'] for r in runs)})"
    )
    short = statistics.median(probe_run(20) for _ in range(args.runs))
    long = statistics.median(probe_run(80) for _ in range(args.runs))
    print(
        f"latency probe at 400 req/s: peak RSS {short:.0f} MB for 20 s (8,000 requests), "
        f"{long:.0f} MB for 80 s (32,000 requests)"
    )


if __name__ == "__main__":
    main()
