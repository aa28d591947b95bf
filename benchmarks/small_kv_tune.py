"""The small KV's workload of `benchmarks/simulator.py` tuned on its own run three ways,
each replayed without the host's noise against what was measured: on the engine the
calibration was fitted on (511 blocks, where nothing waits for blocks), on the run's own
(95 blocks), and on its own at the host's speed the run had, window by window. Tuned
elsewhere, a run's waits for blocks read as a slower step and a longer API time, which the
prediction on its own engine then counts again; on its own, what is left in the tail is
mostly the host's drift within the run (docs/simulator-log.md, "The small KV tuned on its own
engine"). Last, request by request, the requests that waited (a measured TTFT of 100 ms
or more) against the same requests in the replay at the run's host speed: whether the
tail is the same requests' waits, or only the same quantile.

    .venv/bin/python -m benchmarks.small_kv_tune             # ~7 min
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
    speed_as_run,
    started_config,
    tune_figures,
)
from planner.simulate import EngineConfig, EngineStats, SimRequest, simulate
from planner.simulate.calibrate import Calibration, LoadRun, tune
from planner.simulate.steps import ObservedStep
from planner.simulate.whatif import replay
from probes.kinds import calibration
from storage import queries as q
from tests.support import injection

QUANTILES = (50, 90, 99)
WAITED_S = 0.1  # a TTFT this long waited for blocks or behind a recompute, not for a step


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
        waits: list[str] = []
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
            waits.append(f"seed {seed}: {_waited(measured[:, 0], read[2].ttfts)}")
        print("\nThe requests that waited, measured -> replayed at the run's host speed:")
        print("\n".join(waits), flush=True)


class _Replay(NamedTuple):
    preemptions: int
    ttfts: np.ndarray  # each request's, in the order of the requests replayed (nan: refused)
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
    speed = None if measured is None else speed_as_run(requests, runs_on, own.cost(), measured)
    stats = EngineStats()
    results = [
        r for r in simulate(requests, runs_on, own.cost(), stats, speed=speed) if not r.refused
    ]
    e2e = np.array([r.e2e_s for r in results], dtype=float) + own.request_s
    by_request = {id(r.request): r.ttft_s for r in results}
    ttfts = np.array([by_request.get(id(r)) for r in requests], dtype=float) + own.request_s
    return _Replay(
        stats.preemptions,
        ttfts,
        [float(np.nanpercentile(ttfts, p)) for p in QUANTILES],
        float(np.percentile(e2e, 99)),
        own.load_scale,
        own.request_s,
    )


def _waited(measured: np.ndarray, replayed: np.ndarray) -> str:
    """The requests whose measured TTFT was at least WAITED_S, against the same requests
    replayed: how many, the median ratio, how many within 25 %, and the three slowest."""
    waited = np.flatnonzero(measured >= WAITED_S)
    if not len(waited):
        return "none waited"
    ratio = replayed[waited] / measured[waited]
    slowest = waited[np.argsort(-measured[waited])[:3]]
    pairs = ", ".join(f"{measured[i] * 1000:,.0f} -> {replayed[i] * 1000:,.0f}" for i in slowest)
    return (
        f"{len(waited)} of {len(measured)} waited {WAITED_S * 1000:.0f} ms or more; replayed "
        f"x{np.nanmedian(ratio):.2f} (median), {int(np.sum(np.abs(ratio - 1) <= 0.25))} within "
        f"25 %, {int(np.sum(replayed[waited] >= WAITED_S))} waited there too; the slowest "
        f"{pairs} ms"
    )


def _cell(measured: float, predicted: list[float]) -> str:
    return f"{measured * 1000:,.0f} -> " + " / ".join(f"{x * 1000:,.0f}" for x in predicted)


if __name__ == "__main__":
    main()
