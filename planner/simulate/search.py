"""Where to measure: the highest rate meeting an SLO, searched around the simulator's
prediction instead of from scratch.

Start at the predicted rate; step up (or down) by `step` until the SLO's verdict changes,
which brackets the answer in one step's width; then halve the bracket while points remain.
A prediction within a step of the truth lands within `tolerance` in four measurements (a
fifth measures the closing break again, below); one three steps off still brackets by the
fifth and narrows by the sixth.

A calibration goes stale: on a shared machine the engine's speed moves by half within an
hour, and a prediction twice too high cannot be bracketed in six 10 % steps. So the first
measurement also re-aims the search (`reaim`): the engine's TPOT there against the TPOT the
simulator predicted there says how much slower or faster it runs than calibrated, and the
rate scales by the same ratio. The search jumps to that aim when it lies beyond the next
step on the side the verdict points to; otherwise it steps as before.

With the calibrated scenario at hand (the capacity probe's `guided`), the re-aim is
re-simulated instead (`resimulated`): the step cost is scaled until the simulator gives the
TPOT measured at the first rate, and the aim is that scenario's highest rate meeting the SLO.
The plain ratio misses by what the batch adds: a slower engine also holds more requests in
flight at the same rate, so its TPOT overstates its slowness (7-15 % low for an engine
1.3-2 times as costly, as much high for one 0.5-0.7 times; `tests/planner/test_search.py`).
The TPOT read (`Tpot.of`) is the client's p50 when its sender kept time and the answers
streamed; otherwise the engine's own mean over the run, which a starved client does not
touch (on the CPU engine the first, predicted rate broke with its sender late in three of
four live searches, and the client's timings there said nothing).

One window can break a rate the engine holds: on a shared host a window whose steps run a
fifth slower now and then queues most requests past the TTFT bound at a rate its
neighbours hold. So the break that closes the bracket is measured once more while points
remain (`confirm`), and counts only if it breaks again; held there, the search goes on
above it. On a simulated engine with such windows this lands within 5 % of an exhaustive
grid about 4 times in 100 more often, and more than 5 % below it about 9 times fewer
(`benchmarks/search_noise.py`; `benchmarks/capacity_search.py` runs it live).

The search is a generator: it yields the next rate to measure and is sent the verdict there
(whether the SLO held, or a `Verdict` with an aim), so a probe can drive it from async code
and a test from a plain function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Literal

from planner.errors import InvalidInput
from planner.simulate.calibrate import BURST_SHARE
from planner.simulate.whatif import Figures, Scenario, capacity_rps, highest, predict

STEP = 1.1
TpotSource = Literal["client p50", "engine mean"]
MAX_POINTS = 6
# A measured TPOT further than this factor from the predicted one is not a speed ratio to
# scale by (answers that arrived whole read as a TPOT near 0).
REAIM_LIMIT = 4.0


@dataclass(frozen=True)
class Bracket:
    """The highest rate measured to hold and the lowest measured to break (None: none)."""

    held: float | None
    broke: float | None
    points: int


@dataclass(frozen=True)
class Verdict:
    """A measured rate: whether the SLO held, and the rate the measurement points to (None:
    no opinion)."""

    held: bool
    aim: float | None = None


def reaim(
    predicted: float, predicted_tpot_s: float | None, measured_tpot_s: float | None
) -> float | None:
    """The rate `predicted` scaled by how much faster the engine ran than the simulator said,
    measured at the predicted rate: the predicted TPOT over the measured. None when either
    TPOT is missing or the ratio is past `REAIM_LIMIT` either way (whether a TPOT is the
    engine's to read is `Tpot.of`'s call)."""
    if not predicted_tpot_s or not measured_tpot_s:
        return None
    if predicted_tpot_s <= 0 or measured_tpot_s <= 0:
        return None
    ratio = predicted_tpot_s / measured_tpot_s
    if not 1 / REAIM_LIMIT <= ratio <= REAIM_LIMIT:
        return None
    return predicted * ratio


@dataclass(frozen=True)
class Tpot:
    """A TPOT measured at a rate, for a re-aim: the client's p50 over the run's requests, or
    the engine's own mean over them (`engine`: vLLM's per-request histogram, its sum over its
    count)."""

    seconds: float
    engine: bool = False

    @classmethod
    def of(
        cls, client_p50_s: float | None, on_time: bool, engine_mean_s: float | None = None
    ) -> Tpot | None:
        """The client's p50 when its sender kept time and the answers streamed (its p50 at
        least `BURST_SHARE` of the engine's mean); else the engine's mean; None without
        either. A late sender's timings are the client's own delays, and answers that came
        whole read near 0."""
        engine = engine_mean_s if engine_mean_s and engine_mean_s > 0 else None
        streamed = engine is None or (client_p50_s or 0) >= BURST_SHARE * engine
        if on_time and client_p50_s and client_p50_s > 0 and streamed:
            return cls(client_p50_s)
        return None if engine is None else cls(engine, engine=True)

    def simulated(self, figures: Figures) -> float | None:
        """The same statistic of a prediction's TPOT."""
        return figures.mean if self.engine else figures.p50

    @property
    def label(self) -> TpotSource:
        return "engine mean" if self.engine else "client p50"


@dataclass(frozen=True)
class Aim:
    """Where a measured TPOT points: the highest rate meeting the SLO on the scenario whose
    step cost is `scale` times the calibrated one (None: the plain ratio's aim)."""

    rate: float
    scale: float | None = None


# Bisection steps on the step cost's scale (log, over REAIM_LIMIT either way): 0.3 % wide.
_SCALE_STEPS = 10


def resimulated(scenario: Scenario, rate: float, measured: Tpot | None) -> Aim | None:
    """The re-aim from the scenario itself: the step-cost scale at which its TPOT at `rate`
    (the measured statistic) is the one measured there, and the highest rate meeting its
    SLO at that scale. None when nothing was measured, no scale within `REAIM_LIMIT` either
    way gives it, or no rate meets the SLO at that scale."""
    if measured is None:
        return None
    measured_tpot_s = measured.seconds
    base = capacity_rps(scenario)  # every step k times as long: capacity / k

    def at(k: float) -> Scenario:
        return replace(scenario, cost=scenario.cost.scaled(k))

    def tpot(k: float) -> float | None:
        return measured.simulated(predict(at(k), rate, 0, base / k).tpot_s)

    low, high = 1 / REAIM_LIMIT, REAIM_LIMIT
    slowest, fastest = tpot(high), tpot(low)
    if slowest is None or fastest is None or not fastest <= measured_tpot_s <= slowest:
        return None
    for _ in range(_SCALE_STEPS):
        mid = math.sqrt(low * high)
        got = tpot(mid)
        if got is None:
            return None
        if got < measured_tpot_s:
            low = mid
        else:
            high = mid
    scale = math.sqrt(low * high)
    found = highest(at(scale))
    if found is None:
        return None
    return Aim(found[0], scale)


def first_aim(
    rate: float,
    measured: Tpot | None,
    scenario: Scenario | None = None,
    predicted_tpot_s: float | None = None,
) -> Aim | None:
    """The first measurement's aim: re-simulated with the calibrated `scenario`, else the
    plain ratio of the client's TPOT p50 against `predicted_tpot_s` (a p50 made elsewhere:
    the engine's mean is not scaled against it)."""
    if scenario is not None:
        return resimulated(scenario, rate, measured)
    if measured is None or measured.engine:
        return None
    plain = reaim(rate, predicted_tpot_s, measured.seconds)
    return None if plain is None else Aim(plain)


def guided(
    predicted: float,
    step: float = STEP,
    max_points: int = MAX_POINTS,
    tolerance: float = 0.05,
    confirm: bool = True,
) -> Generator[float, bool | Verdict, Bracket]:
    """Rates to measure, from the simulator's `predicted` highest rate; send True (or a
    `Verdict`) where the SLO held. Stops when the bracket is within `tolerance` (relative)
    or the points run out. With `confirm`, the break that closes the bracket is measured
    once more while points remain, and counts as broken only if it breaks again."""
    if not predicted > 0 or not math.isfinite(predicted):
        raise InvalidInput(f"the predicted rate must be above 0 requests/s, got {predicted}")
    if step <= 1 or max_points < 2:
        raise InvalidInput("the step must exceed 1 and at least two points are needed")
    held: float | None = None
    broke: float | None = None  # the lowest break above `held`: the bracket's top
    breaks: list[float] = []
    confirmed: set[float] = set()
    points = 0
    rate = predicted
    while points < max_points:
        seen = yield rate
        verdict = seen if isinstance(seen, Verdict) else Verdict(bool(seen))
        ok = verdict.held
        points += 1
        if ok:
            held = rate if held is None else max(held, rate)
            if rate in breaks:
                breaks.remove(rate)  # broke in one window, held in the next: it holds
        elif rate not in breaks:
            breaks.append(rate)
        broke = min((b for b in breaks if held is None or b > held), default=None)
        if held is not None and broke is not None:
            if broke / held - 1 <= tolerance:
                if confirm and broke not in confirmed and points < max_points:
                    confirmed.add(broke)
                    rate = broke
                    continue
                break
            rate = math.sqrt(held * broke)
        else:
            rate = rate * step if ok else rate / step
            aim = verdict.aim
            if aim is not None and (aim > rate if ok else aim < rate):
                rate = aim
    return Bracket(held, broke, points)


def run(
    predicted: float,
    holds: Callable[[float], bool | Verdict],
    step: float = STEP,
    confirm: bool = True,
) -> Bracket:
    """Drive `guided` with a plain `holds(rate) -> bool | Verdict` (tests, benchmarks)."""
    search = guided(predicted, step, confirm=confirm)
    try:
        rate = next(search)
        while True:
            rate = search.send(holds(rate))
    except StopIteration as done:
        result: Bracket = done.value
        return result
