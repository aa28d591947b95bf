"""A burst's arrivals: what the requests arriving just after one cost its first token, on
the CPU engine against the calibrated simulator.

One calibration as `kvscope simulate calibrate` makes it, then the fidelity benchmark's
bursty workload (256/64 tokens, gamma arrivals of CV 3 at half the calibrated capacity,
40 s) with several seeds, and one run below the knee as a control. Each run is replayed
through the simulator on its own requests (without the host's noise), and two tables are
printed:

- the requests that met no queue in the replay (under 6 ms), by how many others arrived
  within 20 ms after them: their measured and simulated TTFT medians. A burst's first
  request waits for what its followers take from the host, which the simulator charges
  to the steps after them (`StepCost.arrival_s`, one per request arriving while a batch
  runs);
- the TTFT quantiles p10-p90 of each run, simulated against measured: a burst's TTFT p50
  lies between the quick first requests and those that queue, where a few per cent of
  rank move it by a third, so the whole distribution says more than that one figure.

    .venv/bin/python -m benchmarks.burst_arrivals            # ~8 min
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.simulator import (
    ENGINE,
    WORKLOADS,
    Workload,
    calibrate,
    calibrated_workload,
    run_workload,
    started_config,
)
from planner.simulate import SimRequest, simulate
from planner.simulate.whatif import replay
from probes.worker import Worker
from storage import queries as q
from tests.support import injection

QUANTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)
FOLLOW_S = 0.020  # arrivals this soon after a request are its followers
QUIET_S = 0.006  # a replayed queue under this is none
# Followers: the rows' lower bounds (each row up to the next).
FOLLOWERS = (0, 1, 2, 3, 4, 6, 9)
# The fidelity benchmark's workloads, as it runs them.
BELOW, BURSTY = WORKLOADS[0], WORKLOADS[3]


def _run(worker: Worker, request: injection.Request, workload: Workload, rate: float,
         seed: int) -> tuple[list[SimRequest], np.ndarray]:  # fmt: skip
    """One latency run: its answered requests as traffic to replay, by send time, and
    their measured TTFTs in the same order."""
    run = run_workload(request, workload, rate, seed)
    traffic = replay(q.replayable(worker.store, run.id))
    ttft = np.array([t for t, _ in q.replayed_latencies(worker.store, run.id)])
    return traffic, ttft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[7, 11, 13])
    args = ap.parse_args()
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    with injection.diag_worker(venv, ENGINE) as (worker, request):
        cal = calibrate(worker, request)
        print(cal.describe(), flush=True)
        config = started_config(worker)
        runs = [(f"bursty, seed {s}", BURSTY, s) for s in args.seeds]
        runs.append(("below the knee, seed 7", BELOW, 7))
        measured = {}
        for name, workload, seed in runs:
            _, rate = calibrated_workload(config, cal, workload)
            measured[name] = (rate, *_run(worker, request, workload, rate, seed))
    print()
    print("| run | rate/s | followers within 20 ms | requests | TTFT median: measured | "
          "simulated | difference (ms) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    spreads = []
    for name, (rate, traffic, ttft) in measured.items():
        sent = np.array([t.arrival_s for t in traffic])
        results = {id(r.request): r for r in simulate(traffic, config, cal.cost())}
        sim = [results[id(t)] for t in traffic]
        simulated = np.array([r.ttft_s or 0.0 for r in sim]) + cal.request_s
        queued = np.array([r.queue_s or 0.0 for r in sim])
        followers = np.searchsorted(sent, sent + FOLLOW_S) - np.arange(len(sent)) - 1
        for lo, hi in zip(FOLLOWERS, (*FOLLOWERS[1:], 10**9), strict=True):
            picked = (queued < QUIET_S) & (followers >= lo) & (followers < hi)
            if picked.sum() < 5:
                continue
            m, s = np.median(ttft[picked]) * 1000, np.median(simulated[picked]) * 1000
            span = f"{lo}" if hi == lo + 1 else (f"{lo}+" if hi > 99 else f"{lo}-{hi - 1}")
            print(f"| {name} | {rate:g} | {span} | {picked.sum()} | {m:.1f} | {s:.1f} | "
                  f"{m - s:+.1f} |")  # fmt: skip
        spreads.append(
            (name, [np.percentile(simulated, q) / np.percentile(ttft, q) - 1 for q in QUANTILES])
        )
    print()
    print("| run | " + " | ".join(f"TTFT p{q}" for q in QUANTILES) + " |")
    print("|---|" + "---|" * len(QUANTILES))
    for name, errors in spreads:
        print(f"| {name} | " + " | ".join(f"{e:+.0%}" for e in errors) + " |")
    bursty = [e for name, e in spreads if name.startswith("bursty")]
    mean = np.mean(np.abs(bursty), axis=0)
    print("| bursty, mean of the errors' size | " + " | ".join(f"{e:.0%}" for e in mean) + " |")


if __name__ == "__main__":
    main()
