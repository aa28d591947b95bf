"""What a step with a token count the CPU engine has not run lately costs, by whether it
ever ran that count (docs/simulator.md, step 10 of the calibration).

vLLM's CPU backend runs each linear layer through a oneDNN matmul planned for one number
of rows (the step's tokens) and keeps the plans of the last 32 numbers; oneDNN keeps the
primitives it built behind that (its own cache, 1,024 by default). So a count can be
new to the engine, or evicted from the 32 but built before, or kept. Lone prompts, one
prefill step each, sent in order six a second by a latency run (the calibration's path, step
10) with a 300-token prompt between every two (the baseline, always kept), in one repeat:

1. 40 counts never run (one every two tokens);
2. 40 other counts never run, so that the first 40 leave the 32 plans;
3. the first 40 again (evicted, built before) alternated with 40 counts of the same range
   never run, so that both kinds meet the same host.

Each kind's median TTFT over the 300-token prompts' median of the same phase.

    .venv/bin/python -m benchmarks.matmul_plans [--repeats 2]   # ~1 min a repeat
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.simulator import ENGINE, probe_runner
from probes.kinds import calibration
from tests.support import injection

BASELINE = 300  # tokens: run every other prompt, so always among the 32 kept
# Each repeat's range of counts (40 even and 40 odd in the first 80 tokens, the 40 that
# evict them past it), under the engine's 512-token budget: one prefill step a prompt.
RANGES = ((301, 381), (131, 211), (31, 111))
RATE = 6.0  # prompts a second, in order (a latency run of an in-order trace): each alone


def between(*kinds: list[int]) -> list[int]:
    """The kinds' lengths in turn, the baseline before each."""
    return [n for group in zip(*kinds, strict=True) for m in group for n in (BASELINE, m)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, choices=range(1, len(RANGES) + 1))
    args = parser.parse_args()
    started = time.time()
    with injection.diag_worker(Path(".engine-venv").resolve(), ENGINE) as (worker, request):
        run = probe_runner(request)
        kinds = ("never run", "never run, beside the evicted", "evicted, built before")
        print(f"| repeat | counts | {' | '.join(kinds)} |")
        print("|---|---|---|---|---|")
        for repeat, (low, high) in enumerate(RANGES[: args.repeats]):
            first, second = list(range(low, high, 2)), list(range(low + 1, high, 2))
            flush = list(range(high, high + 80, 2))  # (the first 40 leave the 32 plans)
            phases = [[BASELINE] * 10, between(first), between(flush), between(first, second)]
            trace = [n for phase in phases for n in phase]
            run_id, _ = run(
                "latency",
                {
                    "rate": RATE,
                    "arrival": "constant",
                    "duration_s": len(trace) / RATE + 1.0,
                    "max_requests": len(trace),
                    "profile": {
                        "kind": "empirical",
                        "pairs": [[n, 2] for n in trace],
                        "in_order": True,
                    },
                    "seed": 300 + repeat,  # (prompts of their own)
                },
            )
            ttft = [t * 1000 for _, _, t, _ in calibration.lone_records(worker.store, run_id)]
            if len(ttft) != len(trace):
                raise SystemExit(f"{len(trace) - len(ttft)} prompts of {len(trace)} not answered")
            at = np.cumsum([0, *(len(p) for p in phases)])
            new = ttft[at[1] : at[2]]
            last = ttft[at[3] : at[4]]  # (baseline, evicted, baseline, never run) in turn
            base = float(np.median(last[0::2]))
            print(
                f"| {repeat + 1} | {low}-{high - 1} | "
                f"{np.median(new[1::2]) - np.median(new[0::2]):+.2f} ms | "
                f"{np.median(last[3::4]) - base:+.2f} ms | "
                f"{np.median(last[1::4]) - base:+.2f} ms |",
                flush=True,
            )
    print(f"({time.time() - started:.0f} s, medians over a {BASELINE}-token prompt's)")


if __name__ == "__main__":
    main()
