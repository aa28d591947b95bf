"""The small KV's workload of `benchmarks/simulator.py` tuned on its own run three ways,
each replayed without the host's noise against what was measured: on the engine the
calibration was fitted on (511 blocks, where nothing waits for blocks), on the run's own
(95 blocks), and on its own at the host's speed the run had, window by window. Tuned
elsewhere, a run's waits for blocks read as a slower step and a longer API time, which the
prediction on its own engine then counts again; on its own, what is left in the tail is
mostly the host's drift within the run (docs/simulator-log.md, "The small KV tuned on its own
engine").

    .venv/bin/python -m benchmarks.small_kv_tune             # ~6 min
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from benchmarks.simulator import (
    ENGINE,
    SMALL_KV,
    WORKLOADS,
    calibrate,
    calibrated_workload,
    started_config,
    tune_figures,
)
from planner.simulate import EngineConfig, EngineStats, SimRequest, simulate
from planner.simulate.calibrate import Calibration, LoadRun, host_speed, tune
from planner.simulate.steps import ObservedStep
from planner.simulate.whatif import replay
from probes.kinds import calibration
from storage import queries as q
from tests.support import injection

QUANTILES = (50, 90, 99)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[7, 8, 9])
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    args = ap.parse_args()
    workload = next(w for w in WORKLOADS if w[5])
    name, profile, _, arrival, cv, _ = workload
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    with injection.diag_worker(venv, ENGINE) as (worker, request):
        cal = calibrate(worker, request)
        fitted_on = started_config(worker)
    print(cal.describe(), flush=True)
    with injection.diag_worker(venv, ENGINE | SMALL_KV) as (worker, request):
        small = started_config(worker)
        _, rate = calibrated_workload(small, cal, workload)  # (the fidelity benchmark's rate)
        print(f"\n{name}, {rate:g} req/s; measured -> tuned on {fitted_on.num_blocks} blocks "
              f"/ on its own {small.num_blocks} / on its own and replayed at the run's host "
              "speed window by window; without the host's noise\n")  # fmt: skip
        heads = ["seed", "preemptions", *(f"TTFT p{p} ms" for p in QUANTILES), "E2E p99 ms",
                 "step scale, API"]  # fmt: skip
        print("| " + " | ".join(heads) + " |\n" + "|---" * len(heads) + "|", flush=True)
        for seed in args.seeds:
            done = request(
                "latency", target=injection.NAME, timeout=1200, rate=rate,
                duration_s=args.duration, arrival=arrival, cv=cv, profile=profile,
                request_timeout_s=300, seed=seed,
            )  # fmt: skip
            if done.status != "done":
                print(f"| {seed} | the run ended {done.status}: {done.error} |", flush=True)
                continue
            requests = replay(q.replayable(worker.store, done.id))
            latencies = q.replayed_latencies(worker.store, done.id)
            measured = np.array(latencies)
            figures = tune_figures(LoadRun.model_validate(done.summary), rate)
            steps = calibration.steps_of(worker.store, done.id).steps
            ways = ((fitted_on, None), (small, None), (small, latencies))
            read = [_replayed(cal, requests, rate, figures, steps, c, small, at) for c, at in ways]
            cells = [f"{done.summary.get('preemptions') or 0:.0f} -> "
                     + " / ".join(str(r.preemptions) for r in read)]  # fmt: skip
            for i, p in enumerate(QUANTILES):
                cells.append(_cell(np.percentile(measured[:, 0], p), [r.ttft[i] for r in read]))
            cells.append(_cell(np.percentile(measured[:, 1], 99), [r.e2e_p99 for r in read]))
            cells.append(" / ".join(f"x{r.scale:.2f}, {r.api_s * 1000:.0f} ms" for r in read))
            print(f"| {seed} | " + " | ".join(cells) + " |", flush=True)


class _Replay(NamedTuple):
    preemptions: int
    ttft: list[float]  # at QUANTILES
    e2e_p99: float
    scale: float  # the tune's step scale
    api_s: float  # and its API time


def _replayed(
    cal: Calibration,
    requests: Sequence[SimRequest],
    rate: float,
    figures: tuple[float, float],
    steps: Sequence[ObservedStep],
    tuned_on: EngineConfig,
    runs_on: EngineConfig,
    measured: Sequence[tuple[float, float]] | None,
) -> _Replay:
    """The run tuned on `tuned_on` and replayed on `runs_on`, its own engine; with what each
    request `measured` (TTFT, E2E), at the host's speed the run had, window by window
    (`host_speed`: what the calibration draws from, here in the run's own order)."""
    own = tune(cal, requests, rate, *figures, steps=steps, config=tuned_on)
    speed = None
    if measured is not None:
        flat = {id(r.request): r for r in simulate(requests, runs_on, own.cost())}
        speed = host_speed(requests, flat, measured)[1]
    stats = EngineStats()
    results = [
        r for r in simulate(requests, runs_on, own.cost(), stats, speed=speed) if not r.refused
    ]
    ttft = np.array([r.ttft_s for r in results], dtype=float) + own.request_s
    e2e = np.array([r.e2e_s for r in results], dtype=float) + own.request_s
    return _Replay(
        stats.preemptions,
        [float(np.percentile(ttft, p)) for p in QUANTILES],
        float(np.percentile(e2e, 99)),
        own.load_scale,
        own.request_s,
    )


def _cell(measured: float, predicted: list[float]) -> str:
    return f"{measured * 1000:,.0f} -> " + " / ".join(f"{x * 1000:,.0f}" for x in predicted)


if __name__ == "__main__":
    main()
