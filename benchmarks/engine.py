"""Engine figures: time to healthy, RSS of the engine's processes, the worker's own overhead.

Starts a real `kvscope worker` (scraping every second) that runs the embedded CPU engine,
then samples /proc. Target (issue 4): the worker under 5% of one core and under 200 MB RSS
while it scrapes the engine every second. Prints medians of several runs.

    .venv/bin/python -m benchmarks.engine [--runs 3] [--measure-s 60]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from probes.engine import group_pids
from probes.engine.spec import build_tiny_model, embedded_spec
from storage import queries as q
from storage.db import open_store
from storage.settings import Settings
from tests.support.cli import spawn

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    """Resident set size of one process, MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def proc_label(pid: int) -> str:
    """A short name for one engine process: vLLM renames its own, the rest by command line."""
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    if not comm.startswith("python"):
        return comm
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return (
        "API server"
        if " serve " in cmd
        else "resource tracker"
        if "resource_tracker" in cmd
        else comm
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(measure_s: float) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="kvscope-bench-engine-"))
    settings = Settings(data_dir=data, embedded_port=free_port())
    build_tiny_model(settings)
    store = open_store(settings.db_url)
    spec = embedded_spec(settings)
    q.save_engine_spec(store, spec.name, spec.model_dump())
    q.mark_started(store, spec.name, spec.model_dump())  # wanted running, as `kvscope up` does
    env = {
        "KVSCOPE_SCRAPE_INTERVAL_S": "1",
        "KVSCOPE_EMBEDDED_PORT": str(settings.embedded_port),
        "KVSCOPE_DEMO_LOAD": "0",
    }
    worker = spawn("worker", env_dir=data, environ=env)
    t0 = time.time()
    try:
        state: dict[str, object] = {}
        while time.time() - t0 < 600:
            got = q.get_state(store, "engine:embedded")
            state = got[0] if got else {}
            if state.get("status") == "running":
                break
            time.sleep(0.5)
        else:
            raise SystemExit("the engine did not become healthy in 600 s")
        healthy = float(state["facts"]["time_to_healthy_s"])  # type: ignore[index]
        time.sleep(5)  # let the first scrapes and rollups settle
        engine_pids = group_pids(int(state["pid"]))  # type: ignore[call-overload]
        engine_rss = sum(rss_mb(p) for p in engine_pids)
        labels = sorted(proc_label(p) for p in engine_pids)
        c0, w0 = cpu_seconds(worker.pid), time.time()
        rss = []
        while time.time() - w0 < measure_s:
            rss.append(rss_mb(worker.pid))
            time.sleep(1)
        cpu = (cpu_seconds(worker.pid) - c0) / (time.time() - w0) * 100
        samples = q.count_samples(store)
    finally:
        worker.send_signal(signal.SIGTERM)  # the worker stops its engine on the way out
        worker.wait(120)
        store.dispose()
    return {
        "healthy_s": healthy,
        "engine_rss_mb": engine_rss,
        "engine_procs": len(engine_pids),
        "engine_labels": ", ".join(labels),
        "worker_cpu_pct": cpu,
        "worker_rss_mb": max(rss),
        "samples": samples,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--measure-s", type=float, default=60.0)
    args = ap.parse_args()
    runs = [one_run(args.measure_s) for _ in range(args.runs)]

    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    print(
        f"time to healthy: median {med('healthy_s'):.1f} s "
        f"(runs: {', '.join(format(r['healthy_s'], '.1f') for r in runs)})"
    )
    print(
        f"engine RSS: median {med('engine_rss_mb'):,.0f} MB over "
        f"{med('engine_procs'):.0f} processes ({runs[0]['engine_labels']})"
    )
    print(
        f"worker while scraping every second for {args.measure_s:.0f} s: median "
        f"{med('worker_cpu_pct'):.2f}% of one core, peak RSS {med('worker_rss_mb'):.0f} MB "
        f"(targets: under 5% and 200 MB)"
    )


if __name__ == "__main__":
    main()
