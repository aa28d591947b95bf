"""The capacity search against an exhaustive grid on a simulated engine whose capacity moves
between windows: how often six points land within 5 % of the grid's answer, with and
without measuring the closing break again, and how often two grids measured alike agree
(the criterion's own noise floor). Seconds; no engine.

    .venv/bin/python -m benchmarks.search_noise
    .venv/bin/python -m benchmarks.search_noise --trials 20000 --sigma 0.03 --slow 0.15

The engine's capacity in a 30-s spell is its median times a draw: lognormal with `sigma`,
and in a `slow` share of spells 0.70-0.88 times (steps 15-40 % longer; the CPU engine's
live grids, rounds 11-14 of docs/simulator-log.md, read an engine TPOT 1.15-1.5 times the
round's median in about one window in six). A window of n spells holds a rate up to the
mean of its spells' capacities (the queue builds on the average). The prediction is 5 %
low to 40 % high (the calibrated simulator's spread on that engine), and the first window
re-aims the search at its own capacity within 3 % (the re-simulated re-aim). The grid is
the live benchmark's (tests/support/capacity.py): a 4 % ladder from 0.8 to 1.25 times the
re-aim, extended at its ends, its answer the highest rate held.
"""

from __future__ import annotations

import argparse
import random
import statistics

from tests.support.capacity import TOLERANCE, noisy_grid, noisy_search, noisy_windows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--sigma", type=float, default=0.04, help="a steady spell's spread (log)")
    ap.add_argument("--slow", type=float, default=0.15, help="share of slow spells")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(
        f"{args.trials} trials; spells: lognormal sigma {args.sigma:g}, {args.slow:.0%} slow "
        "(0.70-0.88 times the capacity)"
    )
    print(
        "| window | search: within 5 % of the grid | below | above | points (mean) | "
        "unconfirmed: within 5 % | below | above | two grids within 5 % of each other |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for spells in (1, 2, 4):
        row = [f"{30 * spells} s"]
        for confirm in (True, False):
            rng = random.Random(args.seed)
            window = noisy_windows(rng, args.sigma, args.slow, spells)
            off, points = [], []
            for _ in range(args.trials):
                held, centre, n = noisy_search(rng, window, confirm)
                truth = noisy_grid(window, centre)
                if held is not None and truth is not None:
                    off.append(held / truth - 1)
                    points.append(n)
            row += [
                f"{sum(abs(e) <= TOLERANCE for e in off) / len(off):.0%}",
                f"{sum(e < -TOLERANCE for e in off) / len(off):.0%}",
                f"{sum(e > TOLERANCE for e in off) / len(off):.0%}",
            ]
            if confirm:
                row.append(f"{statistics.fmean(points):.1f}")
        rng = random.Random(args.seed)
        window = noisy_windows(rng, args.sigma, args.slow, spells)
        pairs = [(noisy_grid(window, 1.0), noisy_grid(window, 1.0)) for _ in range(args.trials)]
        agree = [abs(a / b - 1) <= TOLERANCE for a, b in pairs if a and b]
        row.append(f"{sum(agree) / len(agree):.0%}")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
