"""Queueing approximations against closed forms, hand values and a simulated queue."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.errors import InvalidInput
from planner.queueing import (
    LIMITS,
    allen_cunneen_wait,
    arrival_cv,
    arrival_rate,
    coefficient_of_variation,
    erlang_c,
    interarrival_gaps,
    kingman_wait,
    measure_variability,
    mmc_wait,
    queue_estimate,
    service_cv,
    share_waiting_longer,
    utilisation,
    waiting_probability,
)


def test_kingman_by_hand() -> None:
    # rho/(1-rho) = 4, (1.5² + 0.5²)/2 = 1.25, tau = 2 s
    assert kingman_wait(0.8, 1.5, 0.5, 2.0) == pytest.approx(10.0)


@pytest.mark.parametrize("rho", [0.0, 0.1, 0.5, 0.9, 0.99])
def test_kingman_is_mm1_with_poisson_in_and_out(rho: float) -> None:
    tau = 0.25
    assert kingman_wait(rho, 1.0, 1.0, tau) == pytest.approx(rho / (1 - rho) * tau)


def test_kingman_is_pollaczek_khinchine_for_mg1() -> None:
    # M/D/1: Wq = rho tau / (2 (1 - rho))
    assert kingman_wait(0.6, 1.0, 0.0, 1.0) == pytest.approx(0.6 / (2 * 0.4))


@pytest.mark.parametrize("rho", [1.0, 1.2])
def test_saturation_refused(rho: float) -> None:
    with pytest.raises(InvalidInput, match="grows without bound"):
        kingman_wait(rho, 1.0, 1.0, 1.0)
    with pytest.raises(InvalidInput, match="grows without bound"):
        mmc_wait(4, rho, 1.0)
    with pytest.raises(InvalidInput, match="grows without bound"):
        queue_estimate(rho * 2, 1.0, servers=2)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-0.1, 1.0, 1.0, 1.0), "utilisation"),
        ((0.5, -1.0, 1.0, 1.0), "arrival cv"),
        ((0.5, 1.0, math.nan, 1.0), "service cv"),
        ((0.5, 1.0, 1.0, 0.0), "service time"),
    ],
)
def test_kingman_refuses_bad_input(args: tuple[float, float, float, float], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        kingman_wait(*args)


def _erlang_c_direct(c: int, a: float) -> float:
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


@pytest.mark.parametrize(("c", "a"), [(1, 0.5), (2, 1.0), (3, 2.4), (8, 6.0), (20, 19.0)])
def test_erlang_c_matches_the_textbook_sum(c: int, a: float) -> None:
    assert erlang_c(c, a) == pytest.approx(_erlang_c_direct(c, a))


def test_erlang_c_known_values() -> None:
    assert erlang_c(1, 0.7) == pytest.approx(0.7)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(5, 0.0) == 0.0
    # Stable where factorials overflow a float.
    assert 0 < erlang_c(2000, 1950.0) < 1


def test_mmc_reduces_to_mm1_and_allen_cunneen_to_both() -> None:
    assert mmc_wait(1, 0.6, 2.0) == pytest.approx(kingman_wait(0.6, 1, 1, 2.0))
    assert allen_cunneen_wait(1, 0.6, 1.7, 0.4, 2.0) == pytest.approx(
        kingman_wait(0.6, 1.7, 0.4, 2.0)
    )
    assert allen_cunneen_wait(4, 0.8, 1.0, 1.0, 2.0) == pytest.approx(mmc_wait(4, 0.8, 2.0))
    # M/M/2 at a = 1.5: C = 9/14, Wq = C / (2 mu - lambda) = (9/14) / 0.5
    assert mmc_wait(2, 0.75, 1.0) == pytest.approx(9 / 7)


def test_pooling_beats_separate_queues() -> None:
    # Same utilisation, four servers behind one queue wait far less than one server.
    assert mmc_wait(4, 0.8, 1.0) < kingman_wait(0.8, 1, 1, 1.0) / 2


def test_exponential_tail_is_exact_for_mm1() -> None:
    lam, mu, t = 0.8, 1.0, 3.0
    est = queue_estimate(lam, 1 / mu)
    assert est.model == "M/M/1" and est.p_wait == pytest.approx(0.8)
    assert est.share_waiting_longer(t) == pytest.approx(0.8 * math.exp(-(mu - lam) * t))
    assert est.share_waiting_longer(0.0) == pytest.approx(est.p_wait)


def test_exponential_tail_is_exact_for_mmc() -> None:
    c, lam, tau, t = 3, 2.4, 1.0, 1.5
    est = queue_estimate(lam, tau, servers=c)
    expected = erlang_c(c, lam * tau) * math.exp(-(c / tau - lam) * t)
    assert est.model == "M/M/c Erlang C"
    assert est.share_waiting_longer(t) == pytest.approx(expected)


def test_share_waiting_longer_edges() -> None:
    assert share_waiting_longer(1.0, 0.0, 0.5) == 0.0
    assert share_waiting_longer(1.0, 2.0, 0.0) == 0.0
    with pytest.raises(InvalidInput, match="probability"):
        share_waiting_longer(1.0, 2.0, 1.5)
    with pytest.raises(InvalidInput, match="bound"):
        share_waiting_longer(-1.0, 2.0, 0.5)


def _simulate_wait(gaps: np.ndarray, services: np.ndarray) -> tuple[float, np.ndarray]:
    # Lindley's recursion for a FIFO single-server queue.
    waits = np.zeros(len(services))
    for i in range(1, len(services)):
        waits[i] = max(0.0, waits[i - 1] + services[i - 1] - gaps[i])
    return float(waits[len(waits) // 10 :].mean()), waits[len(waits) // 10 :]


def test_kingman_against_a_simulated_mm1() -> None:
    rng = np.random.default_rng(7)
    n, lam, tau = 200_000, 0.7, 1.0
    gaps, services = rng.exponential(1 / lam, n), rng.exponential(tau, n)
    mean, waits = _simulate_wait(gaps, services)
    est = queue_estimate(lam, tau)
    assert mean == pytest.approx(est.mean_wait_s, rel=0.08)
    assert float((waits > 3.0).mean()) == pytest.approx(est.share_waiting_longer(3.0), rel=0.1)


def test_kingman_against_a_simulated_gg1_in_heavy_traffic() -> None:
    rng = np.random.default_rng(11)
    n, lam, tau = 300_000, 0.9, 1.0
    # Gamma gaps with cv 0.5 and gamma services with cv 1.5
    ca, cs = 0.5, 1.5
    gaps = rng.gamma(1 / ca**2, ca**2 / lam, n)
    services = rng.gamma(1 / cs**2, cs**2 * tau, n)
    mean, _ = _simulate_wait(gaps, services)
    assert mean == pytest.approx(kingman_wait(lam * tau, ca, cs, tau), rel=0.15)


def test_cv_helpers() -> None:
    assert coefficient_of_variation([1.0, 2.0, 3.0]) == pytest.approx(0.5)
    assert service_cv([2.0, 2.0, 2.0]) == 0.0
    assert interarrival_gaps([3.0, 0.0, 1.0]) == [1.0, 2.0]
    assert arrival_cv([0.0, 1.0, 2.0, 3.0]) == 0.0
    assert arrival_rate([0.0, 1.0, 3.0]) == pytest.approx(2 / 3)
    rng = np.random.default_rng(3)
    poisson = np.cumsum(rng.exponential(0.5, 50_000))
    assert arrival_cv(list(poisson)) == pytest.approx(1.0, abs=0.02)
    assert arrival_rate(list(poisson)) == pytest.approx(2.0, rel=0.02)


@pytest.mark.parametrize(
    ("values", "match"),
    [([1.0], "at least 2"), ([0.0, 0.0], "mean of 0"), ([1.0, -1.0], ">= 0")],
)
def test_cv_refuses_what_it_cannot_measure(values: list[float], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        coefficient_of_variation(values)


def test_arrival_rate_needs_a_span() -> None:
    with pytest.raises(InvalidInput, match="at least 2 arrivals"):
        arrival_rate([5.0, 5.0])


def test_measure_variability() -> None:
    v = measure_variability([0.0, 1.0, 2.0, 4.0], [1.0, 3.0])
    assert v.arrival_rate == pytest.approx(0.75)
    assert v.ca == pytest.approx(coefficient_of_variation([1.0, 1.0, 2.0]))
    assert (v.service_s, v.arrivals, v.services) == (2.0, 4, 2)
    assert v.cs == pytest.approx(math.sqrt(2) / 2)
    with pytest.raises(InvalidInput, match="3 arrivals"):
        measure_variability([0.0, 1.0], [1.0, 2.0])


def test_queue_estimate_names_its_model_and_limits() -> None:
    est = queue_estimate(0.5, 1.0, ca=2.0)
    assert est.model == "G/G/1 Kingman" and est.rho == 0.5
    assert est.mean_wait_s == pytest.approx(kingman_wait(0.5, 2.0, 1.0, 1.0))
    assert est.mean_response_s == pytest.approx(est.mean_wait_s + 1.0)
    assert est.limits == LIMITS and "not for SLAs" in est.limits
    multi = queue_estimate(3.0, 1.0, servers=4, cs=0.5)
    assert multi.model == "G/G/c Allen-Cunneen"
    assert multi.p_wait == pytest.approx(waiting_probability(4, 0.75))


def test_utilisation() -> None:
    assert utilisation(6.0, 0.5, servers=4) == 0.75
    assert utilisation(6.0, 0.5) == 3.0  # overloaded is reported, not refused
    with pytest.raises(InvalidInput, match="servers"):
        utilisation(1.0, 1.0, servers=0)
