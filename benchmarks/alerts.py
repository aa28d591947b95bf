"""Alert evaluation time: one pass of every default rule over 4 targets holding 30 days of data.

Target (issue 6): under 1 s. The store is built as benchmarks/storage.py builds it (30 days
of rollups, 48 h of raw samples every 2 s), plus the last two hours of real histograms
(TTFT, ITL, TPOT, output length) and request counters the rules read. Prints the median
of several passes.

    .venv/bin/python -m benchmarks.alerts [--runs 5] [--targets 4]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine

from benchmarks.storage import fill_history
from probes.alerting.evaluate import AlertEvaluator
from probes.alerting.rules import DEFAULT_RULES
from storage import queries as q
from storage.db import open_store
from storage.ingest import Point, SampleWriter

BUCKETS = {
    "ttft": (0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, math.inf),
    "itl": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, math.inf),
    "tpot": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, math.inf),
    "output_len": (64, 128, 256, 512, 1024, 2048, math.inf),
}


def recent_histograms(store: Engine, now: float, hours: float = 2.0) -> None:
    """Real histograms and counters for the window the rules read."""
    rng = random.Random(1)
    for t in q.list_targets(store):
        w = SampleWriter(store, heartbeat_s=0)
        counts = {h: [0.0] * len(b) for h, b in BUCKETS.items()}
        finished = 0.0
        ts = now - hours * 3600
        while ts <= now:
            for h, bounds in BUCKETS.items():
                for _ in range(4):
                    v = rng.lognormvariate(math.log(bounds[2]), 0.6)
                    for i, le in enumerate(bounds):
                        counts[h][i] += v <= le
            finished += 4
            pts = [
                Point(
                    f"{h}_bucket", {"le": "+Inf" if math.isinf(le) else str(le)}, c, kind="bucket"
                )
                for h, bounds in BUCKETS.items()
                for le, c in zip(bounds, counts[h], strict=True)
            ]
            pts.append(Point("requests_finished_total", {}, finished, kind="counter"))
            w.write(t.id, pts, ts)
            ts += 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--targets", type=int, default=4)
    ap.add_argument("--series", type=int, default=40)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kvscope-bench-alerts-"))
    store = open_store(f"sqlite:///{folder / 'bench.db'}")
    now = float(int(time.time() // 3600 * 3600))
    t0 = time.perf_counter()
    fill_history(store, now, args.targets, args.series)
    recent_histograms(store, now)
    q.ensure_rules(store, [r.model_dump() for r in DEFAULT_RULES])
    print(
        f"store: {args.targets} targets, 30 days of history, "
        f"{q.count_samples(store):,} raw samples, built in {time.perf_counter() - t0:.0f} s"
    )
    evaluator = AlertEvaluator(store)
    times = []
    for _ in range(args.runs):
        s = time.perf_counter()
        evaluator.run(now)
        times.append(time.perf_counter() - s)
    print(
        f"one evaluation pass ({len(DEFAULT_RULES)} rules x {args.targets} targets): median "
        f"{statistics.median(times) * 1000:.0f} ms (min {min(times) * 1000:.0f}, max "
        f"{max(times) * 1000:.0f}; target under 1000 ms)"
    )
    store.dispose()
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()


if __name__ == "__main__":
    main()
