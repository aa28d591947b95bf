"""How much an open-loop load slows the CPU engine's steps beyond what the quiet fit says:
the step scale and API time `tune` finds, at several shares of the engine's capacity, each
rate run twice (interleaved). Tells whether one scale measured at one load carries to
others (the calibration tunes on one run at LOAD_SHARE).

    .venv/bin/python -m benchmarks.load_scale       # ~8 min; docs/simulator-log.md has a run
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from benchmarks.simulator import ENGINE, probe_runner, started_config, tune_figures
from planner.simulate.calibrate import (
    LOAD_PARAMS,
    LOAD_SHARE,
    SWEEP_CONTEXT,
    LoadRun,
    load_rate,
    tune,
)
from planner.simulate.whatif import replay
from probes.kinds import calibration
from storage import queries as q
from tests.support import injection

SHARES = (0.1, 0.4, 0.8, 0.2, 0.6)


def main() -> None:
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    started = time.time()
    with injection.diag_worker(venv, ENGINE) as (worker, request):
        run = probe_runner(request)
        fitted, sweep = calibration.quiet(worker.store, run, started_config(worker))
        capacity = load_rate(fitted, sweep) / LOAD_SHARE
        print(fitted.describe(), f"; capacity basis {capacity:.2f} req/s", flush=True)
        print("| share | rate/s | out tokens/s | TTFT p50 ms | TPOT p50 ms | queue mean ms "
              "| step scale | API ms |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        found: dict[float, list[float]] = {}
        for share in SHARES * 2:
            rate = round(share * capacity, 2)
            run_id, s = run("latency", dict(LOAD_PARAMS, rate=rate))
            requests = replay(q.replayable(worker.store, run_id))
            loaded = LoadRun.model_validate(s)
            tpot, ttft = tune_figures(loaded, rate)
            tuned = tune(fitted, requests, rate, tpot, ttft)
            found.setdefault(share, []).append(tuned.load_scale)
            queue = loaded.queue_mean_s
            print(f"| {share:g} | {rate:g} | {rate * SWEEP_CONTEXT[1]:,.0f} | "
                  f"{ttft * 1000:,.0f} | {tpot * 1000:.2f} | "
                  f"{'-' if queue is None else f'{queue * 1000:,.0f}'} | "
                  f"x{tuned.load_scale:.2f} | {tuned.request_s * 1000:+.0f} |",
                  flush=True)  # fmt: skip
    print()
    for share in sorted(found):
        print(f"share {share:g}: scale median x{statistics.median(found[share]):.2f} "
              f"({', '.join(f'x{k:.2f}' for k in found[share])})")  # fmt: skip
    print(f"{time.time() - started:.0f} s in all")


if __name__ == "__main__":
    main()
