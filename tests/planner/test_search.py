"""The capacity search around the simulator's prediction: few points, close to a grid."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner.errors import InvalidInput
from planner.simulate import EngineConfig, StepCost
from planner.simulate.search import (
    MAX_POINTS,
    Aim,
    Tpot,
    Verdict,
    first_aim,
    guided,
    reaim,
    resimulated,
    run,
)
from planner.simulate.whatif import (
    Prediction,
    Scenario,
    SloBounds,
    capacity_rps,
    highest,
    max_rate,
    meets,
    predict,
)
from planner.workload import FixedProfile
from tests.support.capacity import (
    TOLERANCE,
    Point,
    below_first_break,
    grid_answer,
    noisy_grid,
    noisy_search,
    noisy_windows,
    replayed,
)
from tests.support.capacity import (
    Prediction as Predicted,
)

COST = StepCost(0.002, 0.010, 2e-7, 2e-5)
CONFIG = EngineConfig(num_blocks=4096, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048)
SLO = SloBounds(ttft_s=0.15, tpot_s=0.05, share=0.95)
PREDICTED = Scenario(CONFIG, COST, FixedProfile(prompt_tokens=512, output_tokens=64), 400, slo=SLO)


def engine_off_by(slower: float) -> tuple[Callable[[float], Prediction], float]:
    """An engine that is the simulator with every step cost times `slower`: its prediction
    at a rate, and a 2 % grid's answer (the highest rate held below the first that broke)."""
    cost = StepCost(0.002 * slower, 0.010 * slower, 2e-7 * slower, 2e-5 * slower)
    truth = replace(PREDICTED, cost=cost)
    capacity = capacity_rps(truth)

    def at(rate: float) -> Prediction:
        return predict(truth, rate, 0, capacity)

    grid = capacity * 0.3 * 1.02 ** np.arange(120)
    return at, next(float(a) for a, b in itertools.pairwise(grid) if not meets(at(b), SLO))


@pytest.mark.parametrize("slower", [0.8, 1.3])
def test_six_points_land_within_five_percent_of_a_grid(slower: float) -> None:
    """The engine is the simulator with a step cost off by `slower`; the prediction is the
    simulator's own. The search must land within 5 % of a 2 % grid's answer."""
    at, grid_best = engine_off_by(slower)
    predicted = max_rate(PREDICTED)
    assert predicted is not None
    found = run(predicted, lambda rate: meets(at(rate), SLO))
    assert found.points <= MAX_POINTS and found.held is not None
    assert abs(found.held / grid_best - 1) <= 0.05 + 0.02  # the grid's own step


@pytest.mark.parametrize("slower", [2.0, 0.5])
def test_a_stale_calibration_is_re_aimed_by_the_first_points_tpot(slower: float) -> None:
    """The engine runs twice as slow (or fast) as calibrated: six 10 % steps from the
    prediction cannot bracket it. The TPOT measured at the first rate against the TPOT
    predicted there re-aims the search, which then lands within 5 % of a grid."""
    at, grid_best = engine_off_by(slower)
    predicted = max_rate(PREDICTED)
    assert predicted is not None
    expected_tpot = predict(PREDICTED, predicted, 0, capacity_rps(PREDICTED)).tpot_s.p50
    assert expected_tpot is not None
    tried: list[float] = []

    def measured(rate: float) -> Verdict:
        tried.append(rate)
        seen = at(rate)
        aim = reaim(rate, expected_tpot, seen.tpot_s.p50) if len(tried) == 1 else None
        return Verdict(meets(seen, SLO), aim)

    blind = run(predicted, lambda rate: meets(at(rate), SLO))
    assert blind.held is None or blind.broke is None  # not even bracketed without the aim
    found = run(predicted, measured)
    assert found.points <= MAX_POINTS and found.held is not None
    assert abs(found.held / grid_best - 1) <= 0.05 + 0.02  # the grid's own step
    assert abs(math.log(tried[1] / predicted)) > math.log(1.5)  # it jumped, not stepped


@pytest.mark.parametrize("slower", [0.5, 0.7, 1.3, 2.0])
def test_the_re_simulated_aim_lands_on_the_grid_where_the_ratio_misses(slower: float) -> None:
    """At the same rate a slower engine also holds more requests in flight (and a faster one
    fewer), so its TPOT overstates how much slower (faster) it is: the plain ratio lands
    7-15 % low for an engine 1.3-2 times as costly and 10-15 % high for one 0.5-0.7 times.
    Re-simulating finds the step cost that gives the measured TPOT, and that scenario's
    highest rate lands within 3 % of a 2 % grid."""
    at, grid_best = engine_off_by(slower)
    found = highest(PREDICTED)
    assert found is not None
    predicted, there = found
    seen = at(predicted)
    assert seen.tpot_s.p50 is not None and seen.tpot_s.mean is not None
    aim = resimulated(PREDICTED, predicted, Tpot(seen.tpot_s.p50))
    assert aim is not None and aim.scale == pytest.approx(slower, rel=0.03)
    assert abs(aim.rate / grid_best - 1) <= 0.01 + 0.02  # the grid's own step
    plain = reaim(predicted, there.tpot_s.p50, seen.tpot_s.p50)
    assert plain is not None and abs(plain / grid_best - 1) > 0.07
    # The engine's own mean, read against the simulated mean, finds the same scale.
    own = resimulated(PREDICTED, predicted, Tpot(seen.tpot_s.mean, engine=True))
    assert own is not None and own.scale == pytest.approx(slower, rel=0.03)
    # No TPOT, or one no scale within the limit gives: no aim.
    assert resimulated(PREDICTED, predicted, None) is None
    assert resimulated(PREDICTED, predicted, Tpot(100.0)) is None


def test_the_tpot_a_re_aim_reads_is_the_clients_only_where_it_shows_the_engine() -> None:
    """The client's p50 from a sender on time whose answers streamed; else the engine's
    own mean (a late sender's timings are its own delays; answers that came whole read
    near 0); nothing without either."""
    assert Tpot.of(0.004, True, 0.0042) == Tpot(0.004)
    assert Tpot.of(0.004, True) == Tpot(0.004)
    assert Tpot.of(0.004, False, 0.0042) == Tpot(0.0042, engine=True)
    assert Tpot.of(0.0001, True, 0.0042) == Tpot(0.0042, engine=True)  # came whole
    assert Tpot.of(None, True, 0.0042) == Tpot(0.0042, engine=True)
    assert Tpot.of(0.004, False) is None and Tpot.of(None, True, 0.0) is None
    # The plain ratio scales a p50 made elsewhere: the engine's mean is not read against it.
    assert first_aim(10.0, Tpot(0.008), None, 0.004) == Aim(5.0)
    assert first_aim(10.0, Tpot(0.008, engine=True), None, 0.004) is None


def test_an_aim_only_jumps_the_way_the_verdict_points_and_beyond_a_step() -> None:
    search = guided(10.0)
    assert next(search) == 10.0
    assert search.send(Verdict(False, 20.0)) == pytest.approx(10 / 1.1)  # broke: not up
    assert search.send(Verdict(False, 8.8)) == pytest.approx(10 / 1.21)  # within a step
    assert search.send(Verdict(False, 5.0)) == 5.0  # beyond it: jumps
    assert reaim(10.0, 0.004, 0.008) == pytest.approx(5.0)
    assert reaim(10.0, 0.004, 0.002) == pytest.approx(20.0)
    # Answers that came whole (TPOT ~0), or none measured: no aim.
    assert reaim(10.0, 0.004, 0.0005) is None and reaim(10.0, 0.004, None) is None
    # No TPOT predicted: nothing to scale by.
    assert reaim(10.0, None, 0.008) is None


def test_the_search_stops_when_the_bracket_is_narrow_and_refuses_nonsense() -> None:
    # Held at 10, broke at 11, then at sqrt(110), which closes the bracket and breaks again.
    found = run(10.0, lambda r: r <= 10.2)
    assert (found.held, found.points) == (10.0, 4) and found.broke == pytest.approx(110**0.5)
    assert run(10.0, lambda r: r <= 10.2, confirm=False).points == 3
    nothing = run(10.0, lambda r: False)
    assert nothing.held is None and nothing.points == MAX_POINTS
    with pytest.raises(InvalidInput, match="above 0"):
        next(guided(0.0))


def test_a_break_in_one_slow_window_is_measured_again_and_the_rate_it_holds_is_found() -> None:
    """The engine holds up to 10.7 req/s, but the window at sqrt(110) ran slow and broke it:
    the break that closes the bracket is measured again, holds, and the search finds it;
    11 then breaks twice and closes the bracket, in five points."""
    windows: dict[float, list[bool]] = {}
    slow = {round(110**0.5, 6)}  # the first window at this rate

    def holds(rate: float) -> bool:
        seen = windows.setdefault(round(rate, 6), [])
        ok = rate <= 10.7 and not (round(rate, 6) in slow and not seen)
        seen.append(ok)
        return ok

    found = run(10.0, holds)
    assert found.held == pytest.approx(110**0.5) and found.broke == 11.0
    assert found.points == 5 and windows[round(110**0.5, 6)] == [False, True]
    assert windows[11.0] == [False, False]


def test_a_break_is_measured_again_only_while_points_remain() -> None:
    """Four breaks stepping down, a hold, and a bisection that breaks and closes the bracket
    at the sixth point: no seventh to confirm it."""
    asked: list[float] = []

    def holds(rate: float) -> bool:
        asked.append(rate)
        return rate <= 7.0

    found = run(10.0, holds)
    assert found.points == MAX_POINTS == len(asked) and len(set(asked)) == len(asked)
    assert found.held is not None and found.broke is not None
    assert found.held == asked[4] <= 7.0 < found.broke == asked[5]
    assert found.broke / found.held - 1 <= TOLERANCE


def _against_grids(sigma: float, slow: float, spells: int, confirm: bool) -> list[float]:
    """The search's answer over the grid's, less 1, on 600 simulated engines."""
    rng = random.Random(7)
    window = noisy_windows(rng, sigma, slow, spells)
    off = []
    for _ in range(600):
        held, centre, points = noisy_search(rng, window, confirm)
        truth = noisy_grid(window, centre)
        assert points <= MAX_POINTS
        if held is not None and truth is not None:
            off.append(held / truth - 1)
    return off


def test_where_windows_vary_a_confirmed_break_keeps_the_search_near_the_grid() -> None:
    """benchmarks/search_noise.py, short. On an engine whose capacity varies 2 % between
    60-s windows, six points land within 5 % of the grid nine times in ten. Where it varies
    4 % and one 30-s window in seven runs slow, measuring the closing break again lands the
    search more than 5 % below the grid markedly less often than trusting one window."""
    steady = _against_grids(0.02, 0.0, 2, confirm=True)
    assert sum(abs(e) <= TOLERANCE for e in steady) / len(steady) >= 0.88

    def below(off: list[float]) -> float:
        return sum(e < -TOLERANCE for e in off) / len(off)

    confirmed, single = (_against_grids(0.04, 0.15, 1, c) for c in (True, False))
    assert below(confirmed) < below(single) - 0.03


GRID = Path(__file__).parents[1] / "fixtures" / "capacity" / "cpu_engine_grid.json"


@pytest.mark.parametrize("off", [1.0, 0.75, 1.3])
def test_on_the_cpu_engines_measured_grid_six_points_land_within_five_percent(off: float) -> None:
    """The verdicts of a 4 % grid measured on the CPU engine (benchmarks/capacity_search.py)
    searched from the calibrated simulator's prediction, and from one 25 % lower and one
    30 % higher: at most six points. The grid is not monotonic (it broke at 5.71 req/s, its
    sender late, held at 5.93 and broke from 6.17): from the prediction the search lands
    within 5 % of its highest rate that held; from the others, within 5 % of the highest
    rate that held below its first break (5.49), where a search met the late 5.71."""
    doc = json.loads(GRID.read_text())
    points = [Point(p["rate"], p["held"], p["slo_share"]) for p in doc["grid"]]
    best = grid_answer(points)
    below = below_first_break(points)
    found = replayed(Predicted(doc["predicted_rps"] * off), points)
    assert (best, below) == (5.933, 5.485)
    assert found.points <= MAX_POINTS and found.held is not None
    truth = 5.933 if off == 1.0 else 5.485
    assert abs(found.held / truth - 1) <= TOLERANCE


def test_a_grid_replay_answers_a_jump_past_its_ends_by_its_end() -> None:
    """A re-aim can jump past a measured grid: above a top that broke the grid still says
    broke, below a bottom that held it says held; past an end that cannot say, it refuses."""
    grid = [Point(4.0, True, 1.0), Point(5.0, True, 1.0), Point(6.0, False, 0.2)]
    fast = [replace(p, tpot_s=0.002) for p in grid]  # half the predicted TPOT: aims at 2x
    found = replayed(Predicted(5.0, 0.004), fast)
    assert found.held == 5.0 and found.broke == 6.0
    slow = [replace(p, tpot_s=0.016) for p in grid[1:]]  # aims at a quarter, below 5 held
    assert replayed(Predicted(6.0, 0.004), slow).held == 5.0
    with pytest.raises(AssertionError, match="beyond the grid"):
        replayed(Predicted(6.0, 0.004), [replace(grid[2], tpot_s=0.016)])
