"""The capacity search on the real CPU engine: the simulator, calibrated on the engine,
predicts the highest rate meeting an SLO in windows of the probe's length; the capacity
probe (guided) searches around that prediction, re-aimed by re-simulating with the step
cost that gives the TPOT it measures first, the break that closes its bracket measured
twice (at most six measured rates); an exhaustive grid of measured rates says where the
answer is. Prints the prediction, the search's points, the grid, and how far apart.

    .venv/bin/python -m benchmarks.capacity_search                   # ~8 min
    .venv/bin/python -m benchmarks.capacity_search --rounds 2        # ~13 min
    .venv/bin/python -m benchmarks.capacity_search --order sequential
    .venv/bin/python -m benchmarks.capacity_search --duration 30     # ~15 min
    .venv/bin/python -m benchmarks.capacity_search --duration 60 --rounds 2   # ~50 min

The grid is a 4 % ladder from 0.8 to 1.25 times the search's re-aim (the prediction when
there is none), extended at its ends until it brackets. Interleaved (the default), the
search's rates and the grid's (shuffled) are measured in one sequence, so that the
engine's drift on a shared machine falls on both alike; sequential, the capacity probe
searches in one run and the grid follows it. The engine is the diagnosis scenarios' (4
slots, whole prefills); the load and the SLO are those of tests/support/capacity.py;
tests/fixtures/capacity/ keeps a run's grid, which tests/planner/test_search.py searches.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from planner.simulate.search import Bracket, resimulated
from tests.support import capacity, injection
from tests.support.capacity import Point


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=12.0, help="seconds of arrivals a rate")
    ap.add_argument("--rounds", type=int, default=1, help="searches and grids, one after another")
    ap.add_argument("--low", type=float, default=0.8, help="the grid's lowest rate, x its centre")
    ap.add_argument("--high", type=float, default=1.25, help="the grid's highest, x its centre")
    ap.add_argument("--order", choices=("interleaved", "sequential"), default="interleaved")
    args = ap.parse_args()
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    started = time.time()
    with injection.diag_worker(venv) as (worker, request):
        data = worker.settings.data_dir
        capacity.calibrate(data, injection.NAME)
        predicted = capacity.predicted(worker.store, injection.NAME, args.duration)
        print(f"SLO {capacity.SLO}, load {capacity.LOAD}, {args.duration:g} s a rate, {args.order}")
        print(
            f"predicted highest rate meeting the SLO: {predicted.rps:.2f} req/s, TPOT p50 "
            f"there {_ms(predicted.tpot_s)}",
            flush=True,
        )
        span = (args.low, args.high)
        rows = []
        for r in range(args.rounds):
            if args.order == "interleaved":
                steps, points = capacity.interleaved(
                    request, injection.NAME, predicted, span, args.duration, seed=r
                )
            else:
                found = capacity.guided(request, injection.NAME, args.duration)
                steps = [Point.of(s) for s in found.steps]
                centre = capacity.centre(predicted, steps[0].verdict(True, predicted))
                rates = capacity.ladder(centre * args.low, centre * args.high)
                points = capacity.grid(request, injection.NAME, rates, args.duration)
            tried = ", ".join(
                f"{p.rate:g} {'held' if p.held else 'broke'} (TPOT {_ms(p.tpot_s)}, the "
                f"engine's {_ms(p.engine_tpot_s)})"
                for p in steps
            )
            got = max((p.rate for p in steps if p.held), default=None)
            aim = steps[0].verdict(True, predicted).aim
            print(f"round {r + 1}: search {tried} -> {_rate(got)}", flush=True)
            if aim is not None:
                print(f"  its first TPOT re-aimed it at {aim:.2f} req/s (the grid's centre)")
            first = steps[0]
            if predicted.scenario is not None:
                tpot = first.tpot
                scaled = resimulated(predicted.scenario, first.rate, tpot)
                if scaled is not None and tpot is not None:
                    print(
                        f"  the engine's steps {scaled.scale:.2f} times as long as calibrated "
                        f"(its TPOT: {tpot.label}, {_ms(tpot.seconds)})"
                    )
            print(capacity.table(points), flush=True)
            best = capacity.grid_answer(points)
            strict = capacity.below_first_break(points)
            try:
                on_grid: Bracket | None = capacity.replayed(predicted, points)
            except AssertionError as why:  # the grid cannot answer (it held nowhere)
                print(f"  no replay on the grid's verdicts: {why}", flush=True)
                on_grid = None
            rows.append((r + 1, len(steps), got, on_grid, best, strict))
    print()
    print(
        "| round | search: points | found | on the grid's verdicts: points | found | grid "
        "found | below its first break | search / grid | on the grid / grid | "
        "predicted / grid |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r, n, got, on_grid, best, strict in rows:
        print(
            f"| {r} | {n} | {_rate(got)} | {on_grid.points if on_grid else '-'} | "
            f"{_rate(on_grid.held if on_grid else None)} | {_rate(best)} | {_rate(strict)} | "
            f"{_off(got, best)} | {_off(on_grid.held if on_grid else None, best)} | "
            f"{_off(predicted.rps, best)} |"
        )
    print(f"{time.time() - started:.0f} s in all")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _off(x: float | None, truth: float | None) -> str:
    return "-" if x is None or truth is None else f"{x / truth - 1:+.1%}"


if __name__ == "__main__":
    main()
