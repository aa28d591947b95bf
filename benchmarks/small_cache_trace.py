"""The small-cache workload of `benchmarks/simulator.py`, request by request: each request's
measured TTFT and E2E beside the simulator's replay of the same requests at the run's own
step speed (`tune` on the run), and the worker's scrapes of the engine through the run.
Tells the scheduler's error from the host's: a request that waited while the engine had
room, or had nothing running, waited on the API server, not on the scheduler.

    .venv/bin/python -m benchmarks.small_cache_trace             # ~4 min
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.simulator import (
    ENGINE,
    SMALL_KV,
    WORKLOADS,
    probe_runner,
    started_config,
    tune_figures,
)
from planner.simulate import simulate
from planner.simulate.calibrate import LoadRun, tune
from planner.simulate.whatif import replay
from probes.kinds import calibration
from storage import queries as q
from tests.support import injection

SCRAPED = ("running", "waiting", "kv_usage", "preemptions_total", "scrape_duration_s", "up")
# A request is said to have waited when its measured TTFT exceeds the replay's by this.
WAITED_S = 0.25


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=0.92, help="requests a second (run D's)")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    args = ap.parse_args()
    name, profile, _, arrival, cv, _ = next(w for w in WORKLOADS if w[5])
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    with injection.diag_worker(venv, ENGINE | SMALL_KV) as (worker, request):
        run = probe_runner(request)
        config = started_config(worker)
        fitted, _ = calibration.quiet(worker.store, run, config)
        run_id, s = run(
            "latency",
            dict(rate=args.rate, duration_s=args.duration, arrival=arrival, cv=cv,
                 profile=profile, request_timeout_s=300, seed=7),
        )  # fmt: skip
        rows = q.replayable(worker.store, run_id)
        measured = q.replayed_latencies(worker.store, run_id)
        t0 = rows[0][0]
        requests = replay(rows)
        own = tune(fitted, requests, args.rate, *tune_figures(LoadRun.model_validate(s), args.rate))
        results = {id(r.request): r for r in simulate(requests, config, own.cost())}
        target = q.get_target(worker.store, injection.NAME).id
        end = t0 + max(r.arrival_s + e2e for r, (_, e2e) in zip(requests, measured, strict=True))
        scrapes = q.series_points(worker.store, target, SCRAPED, t0 - 1, end + 2)
    print(f"{name}, {args.rate:g} req/s: step scale x{own.load_scale:.2f}, "
          f"API {own.request_s * 1000:.0f} ms (tuned on the run)")  # fmt: skip
    print("| sent s | TTFT ms measured | replayed | E2E ms measured | replayed | "
          "preempted (replay) |\n|---|---|---|---|---|---|")  # fmt: skip
    waited, replayed_preemptions = 0, 0
    for r, (ttft, e2e) in zip(requests, measured, strict=True):
        x = results[id(r)]
        assert x.ttft_s is not None and x.e2e_s is not None  # (replayed, so answered)
        waited += ttft > x.ttft_s + own.request_s + WAITED_S
        replayed_preemptions += x.preemptions
        print(f"| {r.arrival_s:.2f} | {ttft * 1000:,.0f} | {(x.ttft_s + own.request_s) * 1000:,.0f}"
              f" | {e2e * 1000:,.0f} | {(x.e2e_s + own.request_s) * 1000:,.0f} "
              f"| {x.preemptions} |")  # fmt: skip
    # The store keeps a sample only when it changed: carried forward for the table.
    table = scrapes.pivot_table(index="ts", columns="metric", values="value").ffill()
    print("\n| scraped at s | running | waiting | KV usage | preemptions | scrape s | up |\n"
          "|---|---|---|---|---|---|---|")  # fmt: skip
    for ts, row in table.iterrows():
        cells = " | ".join(f"{row.get(m, float('nan')):g}" for m in SCRAPED)
        print(f"| {float(ts) - t0:.1f} | {cells} |")  # type: ignore[arg-type]
    gaps = table.index.to_series().diff().max()
    slowest = table["scrape_duration_s"].max() if "scrape_duration_s" in table else float("nan")
    print(f"\npreemptions: {s.get('preemptions')} measured, {replayed_preemptions} replayed; "
          f"{waited} of {len(requests)} requests waited over {WAITED_S * 1000:.0f} ms longer "
          f"than the replay for a first token; longest time between stored scrapes "
          f"{gaps:.1f} s (the worker scrapes every second), slowest scrape "
          f"{slowest:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
