"""How the CPU engine's decode step grows with its context (a cached token's cost), read
three ways on one engine, each within one run (docs/simulator-log.md, "How a decode step grows
with its context"):

- the calibration's lone requests (PREFILL_PARAMS: prompts of 64, 1,024 and 4,096 tokens,
  one every 4 s) and the slope its quiet fit reads from them;
- a closed loop at concurrency 1 over the same prompts with 128-token answers: one
  sequence's slope, the engine never idle and the host's drift on every context alike;
- an open-loop run of the fidelity benchmark's length mix, its decode steps read back and
  grouped by how many sequences they decoded (`steps.context_slopes`).

    .venv/bin/python -m benchmarks.context_slope [--repeats 2] [--rate 8]   # ~2 min a repeat
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from benchmarks.simulator import ENGINE, MIXED, probe_runner, started_config
from planner.simulate.calibrate import (
    PREFILL_PARAMS,
    SWEEP_PARAMS,
    Sweep,
    lone_decodes,
    quiet_fit,
)
from planner.simulate.steps import context_slopes
from probes.kinds import calibration
from tests.support import injection

PROMPTS = (64, 1024, 4096)
ANSWER = 128  # tokens: enough steps that a few slow ones after a prefill do not count


def lone_slope(
    records: Iterable[tuple[int | None, int | None, float | None, float | None]],
) -> tuple[dict[int, float], float | None]:
    """The median TPOT at each context (prompt and half the answer) from (prompt, output,
    TTFT, E2E) records, read as the calibration reads them (`lone_decodes`), and the slope
    of the line through them."""
    tpots: dict[float, list[float]] = {}
    for sample in lone_decodes(records):
        tpots.setdefault(sample.context, []).append(sample.itl_s)
    medians = {round(c): float(np.median(v)) for c, v in sorted(tpots.items())}
    if len(medians) < 2:
        return medians, None
    return medians, float(np.polyfit(list(medians), list(medians.values()), 1)[0])


def _ms(medians: dict[int, float]) -> str:
    return ", ".join(f"{c:,}: {s * 1000:.2f}" for c, s in medians.items())


def _ns(slope: float | None) -> str:
    return "-" if slope is None else f"{slope * 1e9:.0f} ns"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rate", type=float, default=8.0, help="the length mix's req/s")
    args = parser.parse_args()
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    started = time.time()
    pairs = [[p, ANSWER] for p in PROMPTS]
    with injection.diag_worker(venv, ENGINE) as (worker, request):
        run = probe_runner(request)
        config = started_config(worker)
        _, summary = run("batch_sweep", dict(SWEEP_PARAMS))
        sweep = Sweep.model_validate(summary)
        for i in range(args.repeats):
            lone_id, _ = run("latency", dict(PREFILL_PARAMS, seed=100 + i))
            lone = calibration.lone_records(worker.store, lone_id)
            medians, slope = lone_slope(lone)
            fitted = quiet_fit(sweep, lone, config)
            print(f"repeat {i + 1}: lone requests, TPOT ms by context ({_ms(medians)}): "
                  f"line {_ns(slope)}, quiet fit {_ns(fitted.pair_s + fitted.kv_s)}",
                  flush=True)  # fmt: skip
            loop_id, _ = run(
                "batch_sweep",
                {"concurrencies": [1], "requests_per_step": 24, "seed": 300 + i,
                 "profile": {"kind": "empirical", "pairs": pairs}},
            )  # fmt: skip
            medians, slope = lone_slope(calibration.lone_records(worker.store, loop_id))
            print(f"  closed loop at 1, TPOT ms by context ({_ms(medians)}): {_ns(slope)}",
                  flush=True)  # fmt: skip
            mix_id, _ = run(
                "latency",
                {"rate": args.rate, "duration_s": 40.0, "profile": MIXED, "seed": 500 + i,
                 "request_timeout_s": 300},
            )  # fmt: skip
            slopes = context_slopes(calibration.steps_of(worker.store, mix_id).steps)
            print("  length mix, by sequences decoding: "
                  + ", ".join(f"{k}: {_ns(s)}" for k, s in slopes.items()), flush=True)  # fmt: skip
    print(f"{time.time() - started:.0f} s in all")


if __name__ == "__main__":
    main()
