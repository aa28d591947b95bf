"""Storage figures: ingest rate into SQLite and window reads at the Live page's resolution.

Targets (issue 2): ingest above 20,000 samples/s; reading a 24-hour and a 30-day window for
one target under 200 ms with 30 days of data for 4 targets. Prints medians of several runs.

    .venv/bin/python -m benchmarks.storage [--series 40] [--runs 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine, insert

from storage import dashboards
from storage import queries as q
from storage.db import open_store, transaction
from storage.ingest import Point, SampleWriter
from storage.tables import Rollup, Sample, Series

DAY = 86400
LIVE_SERIES = (
    "kv_usage",
    "running",
    "waiting",
    "preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_hits_total",
    "prefix_cache_queries_total",
    "requests_finished_total",
)


def bench_ingest(store: Engine, scrapes: int, points: int, runs: int) -> list[float]:
    """Samples/s through SampleWriter, every value changing (no suppression): worst case."""
    rates = []
    for r in range(runs):
        tid = q.add_target(store, q.parse_target({"name": f"ingest{r}", "base_url": "http://h"})).id
        writer = SampleWriter(store)
        names = [Point(f"m{i}", {"le": str(i)}, 0.0) for i in range(points)]
        writer.write(tid, names, 0.0)  # series creation is a one-off, not ingest
        t0 = time.perf_counter()
        for s in range(1, scrapes + 1):
            writer.write(tid, [Point(p.series, p.labels, float(s)) for p in names], float(s))
        rates.append(scrapes * points / (time.perf_counter() - t0))
    return rates


def _series_for(store: Engine, tid: int, extra: int) -> list[int]:
    names = [(m, "{}") for m in LIVE_SERIES]
    names += [("ttft_bucket", f'{{"le":"{i}"}}') for i in range(extra)]
    ids = []
    with transaction(store) as s:
        for metric, lk in names:
            row = Series(
                target_id=tid,
                metric=metric,
                labels_key=lk,
                labels={},
                raw_name=metric,
                kind="counter" if metric.endswith(("_total", "_bucket")) else "gauge",
            )
            s.add(row)
            s.flush()
            ids.append(row.id)
    return ids


def fill_history(
    store: Engine, now: float, targets: int, series: int, raw_hours: float = 48
) -> None:
    """30 days of rollups and `raw_hours` of raw samples (2 s apart) per target,
    bulk-inserted."""
    rng = random.Random(0)
    raw_start = now - raw_hours * 3600
    for t in range(targets):
        tid = q.add_target(store, q.parse_target({"name": f"t{t}", "base_url": "http://h"})).id
        ids = _series_for(store, tid, max(0, series - len(LIVE_SERIES)))
        for res, start in ((3600, now - 30 * DAY), (60, now - 30 * DAY)):
            rows = []
            for sid in ids:
                for k in range(int((now - start) // res)):
                    v = 0.5 + 0.4 * math.sin(k / 50) + rng.random() * 0.01
                    rows.append(
                        {
                            "series_id": sid,
                            "resolution": res,
                            "ts": start + k * res,
                            "min": v,
                            "max": v,
                            "avg": v,
                            "last": v * k,
                            "count": 30,
                        }
                    )
            for i in range(0, len(rows), 200_000):
                with transaction(store) as s:
                    s.execute(insert(Rollup), rows[i : i + 200_000])
        rows = []
        for sid in ids:
            for k in range(int(raw_hours * 3600 // 2)):
                rows.append({"series_id": sid, "ts": raw_start + 2 * k, "value": float(k)})
                if len(rows) >= 200_000:
                    with transaction(store) as s:
                        s.execute(insert(Sample), rows)
                    rows = []
        if rows:
            with transaction(store) as s:
                s.execute(insert(Sample), rows)


def timed(fn: object, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--series", type=int, default=40, help="stored series per target")
    ap.add_argument("--targets", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", type=Path, help="build the store in this folder and keep it")
    args = ap.parse_args()

    folder = args.keep or Path(tempfile.mkdtemp(prefix="kvscope-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    store = open_store(f"sqlite:///{folder / 'bench.db'}")

    rates = bench_ingest(store, scrapes=200, points=250, runs=args.runs)
    print(
        f"ingest: median {statistics.median(rates):,.0f} samples/s "
        f"(min {min(rates):,.0f}, max {max(rates):,.0f}; {args.runs} runs of 200 scrapes "
        "x 250 changing samples, one transaction per scrape)"
    )

    now = float(int(time.time() // 3600 * 3600))
    t0 = time.perf_counter()
    fill_history(store, now, args.targets, args.series)
    size_mb = (folder / "bench.db").stat().st_size / 1e6
    print(
        f"history: {args.targets} targets x {args.series} series, 48 h raw at 2 s + 30 days "
        f"of 1-minute and 1-hour rollups: {q.count_samples(store):,} raw samples, "
        f"{size_mb:,.0f} MB, built in {time.perf_counter() - t0:.0f} s"
    )

    tid = q.get_target(store, "t1").id
    for label, window in (("24-hour", DAY), ("30-day", 30 * DAY)):
        read = timed(
            lambda w=window: q.series_points(
                store, tid, LIVE_SERIES, now - w, now, 60 if w == DAY else 3600
            ),
            args.runs,
        )
        page = timed(lambda w=window: dashboards.live(store, tid, now - w, now), args.runs)
        print(
            f"{label} window: read {statistics.median(read):.1f} ms, Live page frame "
            f"(reads + rates + gauges) {statistics.median(page):.1f} ms (median of "
            f"{args.runs})"
        )
    store.dispose()
    if not args.keep:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()


if __name__ == "__main__":
    main()
