"""The capacity search on a real engine against an exhaustive grid of measured rates
(benchmarks/capacity_search.py; tests/planner/test_search.py replays a grid it measured).

The user's path throughout: `kvscope simulate calibrate --target NAME` fits the simulator to
the engine, and the capacity probe, `guided`, predicts the highest rate meeting the SLO
from that calibration, measures there and re-aims by re-simulating with the step cost that
gives the TPOT it measured. The grid measures every rate of a geometric ladder with the
same probe pinned to one rate (the same verdict: the SLO's share held, the sender on time).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from planner.simulate import search, whatif
from planner.simulate.search import Bracket, Verdict
from planner.simulate.whatif import Scenario
from probes.kinds import calibration
from probes.kinds.capacity import Params, Result, Step
from tests.support.cli import kvscope

# Whole 256-token prompts and 128-token answers, evenly spaced: the diag engine's four slots
# are the limit, and past them the queue (TTFT) grows while TPOT stays put. Poisson arrivals
# at 90 % of the slots' capacity make 12 s windows that queue for seconds or not at all
# (queueing at that load, not the host), so the grid's verdicts would be coin tosses.
LOAD: dict[str, Any] = {"prompt_tokens": 256, "output_tokens": 128, "arrival": "constant"}
SLO: dict[str, Any] = {"ttft_slo_s": 1.0, "tpot_slo_s": 0.25, "share": 0.9}
TOLERANCE = 0.05  # the search must land within this of the grid's answer

Request = Callable[..., Any]


def calibrate(data_dir: Path, target: str, timeout: float = 900) -> None:
    """`kvscope simulate calibrate --target` against the store in `data_dir`."""
    done = kvscope("simulate", "calibrate", "--target", target, env_dir=data_dir, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"calibration failed: {done.stderr.strip()[-2000:]}")


@dataclass(frozen=True)
class Prediction:
    """The calibrated simulator's highest rate meeting SLO for LOAD and its TPOT p50 there;
    with the `scenario` it came from, a first measurement re-aims by re-simulating it (as
    the guided probe does), else by the plain TPOT ratio."""

    rps: float
    tpot_s: float | None = None  # None: no re-aim
    scenario: Scenario | None = None


def predicted(store: Engine, target: str, duration_s: float) -> Prediction:
    """What the guided capacity probe predicts for LOAD and SLO in windows of `duration_s`,
    from the calibration stored for `target`."""
    params = Params.model_validate({**LOAD, **SLO, "duration_s": duration_s, "guided": True})
    scenario = params.scenario(calibration.stored(store, target))
    found = whatif.highest(scenario)
    if found is None:
        raise AssertionError(f"the simulator says the SLO breaks at any rate ({scenario.source})")
    return Prediction(round(found[0], 3), found[1].tpot_s.p50, scenario)


def _capacity(request: Request, target: str, duration_s: float, **params: Any) -> Result:
    run = request(
        "capacity", target=target, timeout=1800, duration_s=duration_s, request_timeout_s=60,
        lateness_limit_s=0.5, **LOAD, **SLO, **params,
    )  # fmt: skip
    if run.status != "done":
        raise AssertionError(f"the capacity probe ended {run.status}: {run.error}")
    return Result.model_validate(run.summary)


def guided(request: Request, target: str, duration_s: float) -> Result:
    """The capacity probe searching around the calibrated simulator's prediction."""
    return _capacity(request, target, duration_s, guided=True)


@dataclass(frozen=True)
class Point:
    """One rate of the grid: whether the SLO held there (the share inside it, from a sender
    on time), the share, and whether the sender kept its schedule."""

    rate: float
    held: bool
    share: float | None
    on_time: bool = True
    tpot_s: float | None = None  # the client's p50
    engine_tpot_s: float | None = None  # the engine's own mean

    @classmethod
    def of(cls, step: Step) -> Point:
        """A capacity probe's step as a grid point."""
        return cls(
            step.rate, step.passed, step.slo_share, step.trustworthy, step.tpot_s.p50,
            step.engine_tpot_s,
        )  # fmt: skip

    @property
    def tpot(self) -> search.Tpot | None:
        """The TPOT a re-aim reads here, as the capacity probe picks it."""
        return search.Tpot.of(self.tpot_s, self.on_time, self.engine_tpot_s)

    def verdict(self, first: bool, predicted: Prediction) -> Verdict:
        """As the capacity probe reads it: the first point, measured at the predicted rate,
        re-aims the search by its TPOT."""
        got = (
            search.first_aim(self.rate, self.tpot, predicted.scenario, predicted.tpot_s)
            if first
            else None
        )
        return Verdict(self.held, None if got is None else round(got.rate, 3))


def pinned(request: Request, target: str, rate: float, duration_s: float) -> Point:
    """One rate measured by the capacity probe pinned to it (no search): the verdict each
    step of its search gets."""
    s = _capacity(request, target, duration_s, start_rate=rate, max_rate=rate, iterations=0)
    (step,) = s.steps
    return Point.of(step)


def grid(
    request: Request, target: str, rates: list[float], duration_s: float, extend: int = 4
) -> list[Point]:
    """Each rate measured pinned, lowest first, then extended at its ends (`extended`)."""
    measure = _pinned_to(request, target, duration_s)
    return extended(measure, [measure(rate) for rate in rates], extend)


def _pinned_to(request: Request, target: str, duration_s: float) -> Callable[[float], Point]:
    return lambda rate: pinned(request, target, rate, duration_s)


def extended(
    measure: Callable[[float], Point], points: list[Point], extend: int = 4
) -> list[Point]:
    """A grid, lowest rate first, with up to `extend` rates more at each end, the ladder's
    step apart and each measured by `measure`, until the lowest rate held and the two
    highest broke (the grid then holds every verdict a search could meet)."""
    points = list(points)
    step = points[1].rate / points[0].rate if len(points) > 1 else 1.05
    for _ in range(extend):
        if any(p.held for p in points[-2:]):
            points.append(measure(round(points[-1].rate * step, 3)))
    for _ in range(extend):
        if not points[0].held:
            points.insert(0, measure(round(points[0].rate / step, 3)))
    return points


def interleaved(
    request: Request,
    target: str,
    predicted: Prediction,
    span: tuple[float, float],
    duration_s: float,
    between: int = 3,
    seed: int = 0,
) -> tuple[list[Point], list[Point]]:
    """The capacity probe's search from `predicted` and a grid, measured in one sequence:
    after each rate the search measures, `between` of the grid's in a shuffled order. Minutes
    apart the engine's capacity on a shared machine moves by more than the tolerance;
    interleaved, a drift of the host falls on both alike. The grid is a ladder over `span`
    times where the search's first measurement aims (`centre`): the prediction, or its
    re-aim when the engine ran slower or faster than calibrated. Returns the search's
    points in the order measured and the grid, lowest rate first."""
    order: list[float] = []
    measured: dict[float, Point] = {}

    def more_grid(n: int) -> None:
        for rate in order[len(measured) : len(measured) + n]:
            measured[rate] = pinned(request, target, rate, duration_s)

    steps: list[Point] = []

    def holds(rate: float) -> Verdict:
        steps.append(pinned(request, target, round(rate, 3), duration_s))
        verdict = steps[-1].verdict(len(steps) == 1, predicted)
        if not order:
            order.extend(ladder(*(centre(predicted, verdict) * x for x in span)))
            random.Random(seed).shuffle(order)
        more_grid(between)
        return verdict

    search.run(predicted.rps, holds)
    more_grid(len(order))
    points = [measured[rate] for rate in sorted(measured)]
    return steps, extended(_pinned_to(request, target, duration_s), points)


def centre(predicted: Prediction, first: Verdict) -> float:
    """Where a grid is laid: around the search's re-aim, else the prediction."""
    return first.aim or predicted.rps


GRID_STEP = 1.04


def ladder(low: float, high: float, step: float = GRID_STEP) -> list[float]:
    """Rates from `low` to at least `high`, each `step` times the last (rounded to ms)."""
    n = math.ceil(math.log(high / low) / math.log(step))
    return [round(low * step**i, 3) for i in range(n + 1)]


def grid_answer(points: list[Point]) -> float | None:
    """What the exhaustive grid finds: the highest rate at which the SLO held."""
    held = [p.rate for p in points if p.held]
    return max(held) if held else None


def below_first_break(points: list[Point]) -> float | None:
    """A stricter reading of the grid: the highest rate that held below the lowest that
    broke (a verdict that flips back above a break is the window's noise, not capacity)."""
    broke = [p.rate for p in points if not p.held]
    held = [p.rate for p in points if p.held and (not broke or p.rate < min(broke))]
    return max(held) if held else None


def replayed(predicted: Prediction, points: list[Point]) -> Bracket:
    """The capacity probe's search from `predicted`, run on the grid's verdicts: each rate
    it asks for is answered by the grid's nearest rate (the two searches judged on the same
    measurements, not on two runs minutes apart), its first re-aimed by that rate's TPOT
    when both the prediction and the grid have one (a re-aim may jump past the grid: above
    a top that broke, or below a bottom that held, the grid's end answers). Refused when
    the grid's end cannot answer."""
    rates = [p.rate for p in points]
    half_step = math.sqrt(rates[1] / rates[0]) if len(rates) > 1 else 1.0

    def nearest(rate: float) -> Point:
        above = rate > rates[-1] * half_step and not points[-1].held
        below = rate < rates[0] / half_step and points[0].held
        inside = rates[0] / half_step <= rate <= rates[-1] * half_step
        if not (inside or above or below):
            raise AssertionError(f"the search asked for {rate:g}/s, beyond the grid {rates}")
        return min(points, key=lambda p: abs(math.log(p.rate / rate)))

    asked: list[float] = []

    def holds(rate: float) -> Verdict:
        asked.append(rate)
        return nearest(rate).verdict(len(asked) == 1, predicted)

    found = search.run(predicted.rps, holds)
    # Where it landed, as the grid rates that answered.
    return Bracket(
        held=None if found.held is None else nearest(found.held).rate,
        broke=None if found.broke is None else nearest(found.broke).rate,
        points=found.points,
    )


def table(points: list[Point]) -> str:
    """The grid as Markdown rows."""
    rows = [
        "| rate/s | inside the SLO | sender on time | held | TPOT ms: client p50, engine mean |",
        "|---|---|---|---|---|",
    ]
    for p in points:
        share = "-" if p.share is None else f"{p.share:.0%}"
        late = "yes" if p.on_time else "no (late)"
        tpot = ", ".join(
            "-" if t is None else f"{t * 1000:.1f}" for t in (p.tpot_s, p.engine_tpot_s)
        )
        rows.append(f"| {p.rate:g} | {share} | {late} | {'yes' if p.held else 'no'} | {tpot} |")
    return "\n".join(rows)


# An engine whose capacity moves between windows, simulated: what a verdict a window costs.
Window = Callable[[], float]


def noisy_windows(rng: random.Random, sigma: float, slow: float, spells: int) -> Window:
    """Draws of one window's capacity, the engine's median 1 (benchmarks/search_noise.py):
    the mean of `spells` 30-s spells, each lognormal with `sigma` or, a `slow` share of
    them, 0.70-0.88 (steps 15-40 % longer)."""

    def spell() -> float:
        if rng.random() < slow:
            return rng.uniform(0.70, 0.88)
        return rng.lognormvariate(0.0, sigma)

    return lambda: statistics.fmean(spell() for _ in range(spells))


def noisy_grid(window: Window, centre: float) -> float | None:
    """The exhaustive grid's answer around `centre`, on windows drawn from `window`."""

    def measure(rate: float) -> Point:
        return Point(rate, rate <= window(), None)

    rates = ladder(0.8 * centre, 1.25 * centre)
    return grid_answer(extended(measure, [measure(r) for r in rates]))


def noisy_search(
    rng: random.Random, window: Window, confirm: bool
) -> tuple[float | None, float, int]:
    """The guided search from a prediction off by up to 40 %: what it found, where its first
    window re-aimed it (the grid's centre), and its points."""
    aims: list[float] = []

    def holds(rate: float) -> Verdict:
        capacity = window()
        if not aims:
            aims.append(capacity * rng.gauss(1.0, 0.03))
            return Verdict(rate <= capacity, aims[0])
        return Verdict(rate <= capacity)

    found = search.run(rng.uniform(0.95, 1.40), holds, confirm=confirm)
    return found.held, aims[0], found.points
