"""Where to measure: the highest rate meeting an SLO, searched around the simulator's
prediction instead of from scratch.

Start at the predicted rate; step up (or down) by `step` until the SLO's verdict changes,
which brackets the answer in one step's width; then halve the bracket while points remain.
A prediction within a step of the truth lands within `tolerance` in four measurements; one
three steps off still brackets by the fifth and narrows by the sixth. The search is a
generator: it yields the next rate to measure and is sent whether the SLO held there, so a
probe can drive it from async code and a test from a plain function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass

from planner.errors import InvalidInput

STEP = 1.1
MAX_POINTS = 6


@dataclass(frozen=True)
class Bracket:
    """The highest rate measured to hold and the lowest measured to break (None: none)."""

    held: float | None
    broke: float | None
    points: int


def guided(
    predicted: float, step: float = STEP, max_points: int = MAX_POINTS, tolerance: float = 0.05
) -> Generator[float, bool, Bracket]:
    """Rates to measure, from the simulator's `predicted` highest rate; send True where the
    SLO held. Stops when the bracket is within `tolerance` (relative) or the points run out."""
    if not predicted > 0 or not math.isfinite(predicted):
        raise InvalidInput(f"the predicted rate must be above 0 requests/s, got {predicted}")
    if step <= 1 or max_points < 2:
        raise InvalidInput("the step must exceed 1 and at least two points are needed")
    held: float | None = None
    broke: float | None = None
    points = 0
    rate = predicted
    while points < max_points:
        ok = yield rate
        points += 1
        if ok:
            held = rate
        else:
            broke = rate
        if held is not None and broke is not None:
            if broke / held - 1 <= tolerance:
                break
            rate = math.sqrt(held * broke)
        else:
            rate = rate * step if ok else rate / step
    return Bracket(held, broke, points)


def run(predicted: float, holds: Callable[[float], bool], step: float = STEP) -> Bracket:
    """Drive `guided` with a plain `holds(rate) -> bool` (tests, benchmarks)."""
    search = guided(predicted, step)
    try:
        rate = next(search)
        while True:
            rate = search.send(bool(holds(rate)))
    except StopIteration as done:
        result: Bracket = done.value
        return result
