"""A slow drain, made on purpose: the calibration's run past the knee with the host slowed
from its last send to its end (spinning processes, two a core, as another tenant's burst on
a shared host), so that its drain runs slower than its arrivals. Three calibrations of
one engine, each on it restarted (an empty prefix cache, no matmul plan kept):

- slowed, with the retry turned off: the full batch's cost as the slow drain leaves it;
- slowed, as kvscope calibrates (`UNSTEADY_DRAIN`: a drain more than 10 % slower than its
  arrivals is made again with prompts of its own, the faster kept);
- not slowed, the control.

Each is followed by one workload past the knee (1.25 times its capacity), measured on the
engine with nothing slowed and predicted by that calibration, as a user's next run: how
far a slow drain moves the prediction, and whether the retry takes it back. (Each is
scored against a run of its own: this host's speed moves by half between calibrations
minutes apart, so one run replayed through all three measured that, not the drain.)
Prints each calibration's reading of its drain, its full batch's cost a sequence and its
capacity, then the figures.

    .venv/bin/python -m benchmarks.slow_drain            # ~25 min
    .venv/bin/python -m benchmarks.slow_drain --hogs 8   # slower still
    .venv/bin/python -m benchmarks.slow_drain --keep F   # and keep the store in F
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks.simulator import (
    ENGINE,
    WORKLOADS,
    calibrated_workload,
    drawn,
    probe_runner,
    run_workload,
    score,
    started_config,
)
from planner.simulate.calibrate import SATURATED_PARAMS, Calibration
from planner.simulate.whatif import capacity_rps, replay
from probes.kinds import calibration
from probes.worker import Worker
from storage import queries as q
from tests.support import injection
from tests.support.hog import spinning
from tests.support.waiting import ended, wait_ended, wait_until

# The hogs start this long after the run's last send is due (its first stored answer plus
# its arrivals' duration): the drain alone is slowed. The progress is stored at most once a
# second, so they may start a second later still, and a drain lasts a few seconds (at 1.0
# s, sd4's missed its own: x1.015).
AFTER_LAST_SEND_S = 0.3
ABOVE_THE_KNEE = WORKLOADS[1]


def drain_slowed(worker: Worker, request: injection.Request, hogs: int) -> calibration.RunProbe:
    """Runs one probe of a calibration on the benchmark's engine and waits for it, the run
    past the knee (its seed; not the retry's, which has prompts of its own) with `hogs`
    spinning from its last send to its end."""
    plain = probe_runner(request, "the calibration's")
    target = q.get_target(worker.store, injection.NAME).id

    def run(kind: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if not (hogs and kind == "latency" and params.get("seed") == SATURATED_PARAMS["seed"]):
            return plain(kind, params)
        run_id = q.request_run(worker.store, kind, dict(params), target_id=target).id

        def answered() -> bool:
            row = q.get_run(worker.store, run_id)
            return row.progress > 0 or ended(row)

        # Its prompts are built first (seconds); the first answer stored (its progress above
        # 0) comes a request's time after its first send.
        wait_until(answered, timeout=900, what="the run past the knee's first answer")
        time.sleep(float(params["duration_s"]) + AFTER_LAST_SEND_S)
        with spinning(hogs):
            row = wait_ended(worker.store, run_id, timeout=900)
        if row.status != "done":
            raise SystemExit(f"the calibration's {kind} ended {row.status}: {row.error}")
        return row.id, row.summary

    return run


def calibrated(
    worker: Worker, request: injection.Request, name: str, hogs: int, restart: bool = True
) -> Calibration:
    """A calibration of the engine (restarted first unless just started: each calibration
    meets neither a prefix nor a matmul plan of the one before), its drain slowed by `hogs`
    (none: not)."""
    if restart:
        restarted = request("engine_restart", name=injection.NAME)
        if restarted.status != "done":
            raise SystemExit(f"the engine did not restart: {restarted.error}")
        injection.wait_serving(worker)
    print(f"\n## {name}", flush=True)
    config = started_config(worker)
    cal = calibration.calibrate(
        worker.store,
        drain_slowed(worker, request, hogs),
        config,
        say=lambda line: print(f"- {line}", flush=True),
    )
    scenario, _ = calibrated_workload(config, cal, ABOVE_THE_KNEE)
    print(
        f"- a full batch's cost a sequence {cal.load_seq_s * 1e6:+.0f} us a step; each arrival "
        f"{cal.arrival_s * 1000:.2f} ms; capacity {capacity_rps(scenario):.2f} req/s",
        flush=True,
    )
    return cal


def predicted_next(
    worker: Worker, request: injection.Request, name: str, cal: Calibration, seed: int
) -> tuple[int, int]:
    """The workload past the knee (1.25 times `cal`'s capacity, its traffic drawn with
    `seed`) measured on the engine with nothing slowed and predicted by `cal`, the figures
    printed; (met, scored)."""
    config = started_config(worker)
    scenario, rate = calibrated_workload(config, cal, ABOVE_THE_KNEE)
    run = run_workload(request, ABOVE_THE_KNEE, rate, seed)
    traffic = replay(q.replayable(worker.store, run.id))
    tally = [0, 0]
    score(name, f"{rate:g}", run.summary, drawn(scenario, rate, traffic), tally)
    return tally[0], tally[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    hogs = "spinning processes in the slowed drain (default: two a core)"
    parser.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 2), help=hogs)
    seed = "the measured workloads' traffic (default: from the clock)"
    parser.add_argument("--seed", type=int, default=time.time_ns() % 2**31, help=seed)
    parser.add_argument("--keep", type=Path, help="copy the store to this file afterwards")
    args = parser.parse_args()
    if args.hogs < 1:
        parser.error(
            f"--hogs must be at least 1 (a drain slowed by nothing is the control), not {args.hogs}"
        )
    print(f"{args.hogs} spinning processes in a slowed drain; traffic seed {args.seed} (i-th: +i)")
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    keep = args.keep.resolve() if args.keep else None
    trials = [
        ("slowed, the retry turned off", args.hogs, 1.0),  # (a drain never made again)
        ("slowed, as kvscope calibrates", args.hogs, calibration.UNSTEADY_DRAIN),
        ("not slowed", 0, calibration.UNSTEADY_DRAIN),
    ]
    met: dict[str, tuple[int, int]] = {}
    engine = injection.diag_worker(venv, dict(ENGINE), keep=keep)
    with engine as (worker, request):
        for i, (name, hogs, unsteady) in enumerate(trials):
            with mock.patch.object(calibration, "UNSTEADY_DRAIN", unsteady):
                cal = calibrated(worker, request, name, hogs, restart=i > 0)
            print("\n| calibration | rate/s | figure | measured | predicted | error | target "
                  "| met |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
            met[name] = predicted_next(worker, request, name, cal, args.seed + i)
    print("\nfigures met: " + ", ".join(f"{name} {m}/{n}" for name, (m, n) in met.items()))


if __name__ == "__main__":
    main()
