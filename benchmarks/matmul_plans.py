"""What a step with a token count the CPU engine has not run lately costs, by whether it
ever ran that count (docs/simulator.md, step 10 of the calibration).

vLLM's CPU backend runs each linear layer through a oneDNN matmul planned for one number
of rows (the step's tokens) and keeps the plans of the last 32 numbers; oneDNN keeps the
primitives it built behind that (its own cache, 1,024 by default). So a count can be
new to the engine, or evicted from the 32 but built before, or kept. Lone prompts, one
prefill step each, sent back to back straight to the engine with a 300-token prompt between
every two (the baseline, always kept), in one repeat:

1. 40 counts never run (one every two tokens);
2. 40 other counts never run, so that the first 40 leave the 32 plans;
3. the first 40 again (evicted, built before) alternated with 40 counts of the same range
   never run, so that both kinds meet the same host.

Each kind's median TTFT over the 300-token prompts' median of the same phase.

    .venv/bin/python -m benchmarks.matmul_plans [--repeats 2]   # ~1 min and the engine's start
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.simulator import ENGINE
from tests.support import injection

BASELINE = 300  # tokens: run every other prompt, so always among the 32 kept
# Each repeat's range of counts (40 even and 40 odd in the first 80 tokens, the 40 that
# evict them past it), under the engine's 512-token budget: one prefill step a prompt.
RANGES = ((301, 381), (131, 211), (31, 111))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, choices=range(1, len(RANGES) + 1))
    args = parser.parse_args()
    rng = random.Random(7)
    started = time.time()
    with injection.diag_worker(Path(".engine-venv").resolve(), ENGINE) as (worker, _):
        (manager,) = worker.engines.values()
        with httpx.Client(base_url=manager.spec.base_url, timeout=60) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]

            def lone(tokens: int) -> float:
                """Milliseconds to the answer of one prompt of `tokens` random tokens."""
                prompt = [rng.randrange(10, 4000) for _ in range(tokens)]
                t = time.perf_counter()
                body = {"model": model, "prompt": prompt, "max_tokens": 1}
                client.post("/v1/completions", json=body).raise_for_status()
                return (time.perf_counter() - t) * 1000

            def over(lengths: list[int]) -> float:
                """Each length once, the baseline between: their median over its median."""
                base, kind = [], []
                for n in lengths:
                    base.append(lone(BASELINE))
                    kind.append(lone(n))
                return float(np.median(kind) - np.median(base))

            for _ in range(10):
                lone(BASELINE)
            kinds = ("never run", "never run, beside the evicted", "evicted, built before")
            print(f"| repeat | counts | {' | '.join(kinds)} |")
            print("|---|---|---|---|---|")
            for repeat, (low, high) in enumerate(RANGES[: args.repeats]):
                first, second = list(range(low, high, 2)), list(range(low + 1, high, 2))
                flush = list(range(high, high + 80, 2))
                new = over(first)
                over(flush)  # (the first 40 leave the 32 plans)
                base, evicted, fresh = [], [], []
                for old, n in zip(first, second, strict=True):
                    base.append(lone(BASELINE))
                    evicted.append(lone(old))
                    base.append(lone(BASELINE))
                    fresh.append(lone(n))
                mid = float(np.median(base))
                print(
                    f"| {repeat + 1} | {low}-{high - 1} | {new:+.2f} ms | "
                    f"{np.median(fresh) - mid:+.2f} ms | {np.median(evicted) - mid:+.2f} ms |",
                    flush=True,
                )
    print(f"({time.time() - started:.0f} s, medians over a {BASELINE}-token prompt's)")


if __name__ == "__main__":
    main()
