"""The diagnosis' confusion table on the real CPU engine: every cause of
tests/support/injection.py injected `--rounds` times (in the order none, queueing,
kv_pressure, prefill_interference, down; round r draws its prompts with seed r), each
window judged on its own. Prints the table and the share right; the bar is 90% of
injected windows right and no quiet window named a cause.

    .venv/bin/python -m benchmarks.diagnosis --rounds 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.support import injection


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--duration", type=float, default=injection.DURATION_S, help="seconds of load a scenario"
    )
    ap.add_argument("--causes", nargs="*", default=list(injection.CAUSES), help="inject only these")
    args = ap.parse_args()
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    pairs = []
    with injection.diag_worker(venv) as (worker, request):
        for r in range(args.rounds):
            for cause in args.causes:
                window = injection.inject(request, worker, cause, args.duration, seed=r)
                v, found = injection.judge(worker, window)
                pairs.append((cause, v.cause.value))
                print(
                    f"round {r + 1} {cause:>21} -> {v.cause.value:<21} score {v.score:.2f} "
                    f"runner-up {v.runner_up.value} ({v.runner_up_score:.2f}) "
                    f"window {window[1] - window[0]:.0f} s",
                    flush=True,
                )
                if v.cause.value != cause:
                    print("   ", injection.describe(v, found), flush=True)
    right = sum(i == n for i, n in pairs)
    quiet_wrong = sum(i == "none" and n != "none" for i, n in pairs)
    print()
    print(injection.confusion(pairs))
    print(f"\n{right}/{len(pairs)} injected windows named right ({right / len(pairs):.0%}); "
          f"quiet windows named a cause: {quiet_wrong}")  # fmt: skip


if __name__ == "__main__":
    main()
