"""Queueing approximations for mean wait and wait tails: a thinking tool, not a forecast.

Kingman's G/G/1 formula, the exact M/M/c (Erlang C) wait and the Allen–Cunneen G/G/c
approximation, plus an exponential-tail share of requests that wait longer than a bound.
They assume a steady state, independent arrivals and service, and first-come first-served;
vLLM batches continuously and preempts, so read them as direction and size, not truth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from planner.errors import InvalidInput

QueueModel = Literal["M/M/1", "G/G/1 Kingman", "M/M/c Erlang C", "G/G/c Allen-Cunneen"]

LIMITS = (
    "Steady-state approximations: arrivals and service independent, first come first "
    "served, utilisation below 1. Kingman is exact for M/M/1 and good in heavy traffic; "
    "light traffic and very bursty input make it loose. A vLLM replica batches and preempts, "
    "so the 'server' here is an abstraction: use it for direction and size, not for SLAs."
)


def _positive(value: float, what: str) -> float:
    if math.isnan(value) or not value > 0 or math.isinf(value):
        raise InvalidInput(f"{what} must be a positive number, got {value}")
    return value


def _cv_value(value: float, what: str) -> float:
    if math.isnan(value) or value < 0 or math.isinf(value):
        raise InvalidInput(f"{what} must be a number >= 0 (1 for Poisson), got {value}")
    return value


def _check_rho(rho: float) -> float:
    if math.isnan(rho) or rho < 0:
        raise InvalidInput(f"utilisation must be >= 0, got {rho}")
    if rho >= 1:
        raise InvalidInput(
            f"utilisation {rho:.3g} >= 1: requests arrive at least as fast as they are served, "
            "so the queue grows without bound and no mean wait exists; add capacity or shed load"
        )
    return rho


def _check_servers(servers: int) -> int:
    if servers < 1:
        raise InvalidInput(f"number of servers must be at least 1, got {servers}")
    return servers


# ---------------------------------------------------------------------------------------
# Measuring variability
# ---------------------------------------------------------------------------------------


def coefficient_of_variation(samples: Sequence[float], what: str = "samples") -> float:
    """Standard deviation over mean (sample std, n-1). Needs 2+ values with a positive mean.

    1 for exponential (Poisson gaps), 0 for constant; a handful of values gives a noisy cv.
    """
    xs = np.asarray(samples, dtype=float)
    if xs.size < 2:
        raise InvalidInput(f"{what}: a coefficient of variation needs at least 2 values")
    if not np.isfinite(xs).all() or (xs < 0).any():
        raise InvalidInput(f"{what} must be finite numbers >= 0")
    mean = float(xs.mean())
    if mean <= 0:
        raise InvalidInput(f"{what} have a mean of 0: no variability to measure")
    return float(xs.std(ddof=1)) / mean


def interarrival_gaps(timestamps: Sequence[float]) -> list[float]:
    """Gaps between consecutive arrivals (timestamps in seconds, any order)."""
    ts = np.sort(np.asarray(timestamps, dtype=float))
    if not np.isfinite(ts).all():
        raise InvalidInput("arrival timestamps must be finite numbers of seconds")
    return [float(g) for g in np.diff(ts)]


def arrival_rate(timestamps: Sequence[float]) -> float:
    """Arrivals per second between the first and the last timestamp: (n - 1) / span."""
    gaps = interarrival_gaps(timestamps)
    span = sum(gaps)
    if not gaps or span <= 0:
        raise InvalidInput("an arrival rate needs at least 2 arrivals at different times")
    return len(gaps) / span


def arrival_cv(timestamps: Sequence[float]) -> float:
    """cv of the inter-arrival gaps (ca): 1 for Poisson arrivals, above 1 for bursts."""
    return coefficient_of_variation(interarrival_gaps(timestamps), "inter-arrival gaps")


def service_cv(service_times: Sequence[float]) -> float:
    """cv of service times (cs); for an LLM it follows mostly the spread of output lengths."""
    return coefficient_of_variation(service_times, "service times")


@dataclass(frozen=True, slots=True)
class Variability:
    """Arrival rate and mean service time with their coefficients of variation."""

    arrival_rate: float
    ca: float
    service_s: float
    cs: float
    arrivals: int
    services: int


def measure_variability(
    arrival_timestamps: Sequence[float], service_times: Sequence[float]
) -> Variability:
    """Rate, ca, mean service time and cs from request records (needs 3+ arrivals, 2+ times)."""
    if len(arrival_timestamps) < 3:
        raise InvalidInput("measuring arrival variability needs at least 3 arrivals")
    svc = np.asarray(service_times, dtype=float)
    cs = service_cv(service_times)
    return Variability(
        arrival_rate=arrival_rate(arrival_timestamps),
        ca=arrival_cv(arrival_timestamps),
        service_s=float(svc.mean()),
        cs=cs,
        arrivals=len(arrival_timestamps),
        services=int(svc.size),
    )


def utilisation(rate: float, service_s: float, servers: int = 1) -> float:
    """ρ = λ·τ / c: the share of time each server is busy (may be >= 1: overloaded)."""
    _check_servers(servers)
    if math.isnan(rate) or rate < 0:
        raise InvalidInput(f"arrival rate must be >= 0 requests/s, got {rate}")
    return rate * _positive(service_s, "mean service time") / servers


# ---------------------------------------------------------------------------------------
# Mean waits
# ---------------------------------------------------------------------------------------


def kingman_wait(rho: float, ca: float, cs: float, service_s: float) -> float:
    """Kingman's G/G/1 mean queue wait: ρ/(1-ρ) · (ca² + cs²)/2 · τ (seconds).

    Exact for M/M/1 (ca = cs = 1) and M/G/1; an approximation otherwise, best when busy.
    """
    rho = _check_rho(rho)
    ca, cs = _cv_value(ca, "arrival cv"), _cv_value(cs, "service cv")
    tau = _positive(service_s, "mean service time")
    return rho / (1 - rho) * (ca * ca + cs * cs) / 2 * tau


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability an arrival must wait in M/M/c with offered load a = λτ (Erlang C).

    Computed through the Erlang B recursion, which stays stable for thousands of servers.
    """
    c = _check_servers(servers)
    if math.isnan(offered_load) or offered_load < 0:
        raise InvalidInput(f"offered load must be >= 0, got {offered_load}")
    rho = _check_rho(offered_load / c)
    if offered_load == 0:
        return 0.0
    b = 1.0
    for k in range(1, c + 1):
        b = offered_load * b / (k + offered_load * b)
    return b / (1 - rho * (1 - b))


def mmc_wait(servers: int, rho: float, service_s: float) -> float:
    """Exact M/M/c mean queue wait: C(c, cρ) · τ / (c (1 - ρ)); Poisson in, exponential out."""
    c = _check_servers(servers)
    rho = _check_rho(rho)
    tau = _positive(service_s, "mean service time")
    return erlang_c(c, c * rho) * tau / (c * (1 - rho))


def allen_cunneen_wait(servers: int, rho: float, ca: float, cs: float, service_s: float) -> float:
    """Allen–Cunneen G/G/c mean wait: the M/M/c wait scaled by (ca² + cs²)/2.

    Reduces to Kingman at c = 1 and to M/M/c at ca = cs = 1; a heuristic in between.
    """
    ca, cs = _cv_value(ca, "arrival cv"), _cv_value(cs, "service cv")
    return mmc_wait(servers, rho, service_s) * (ca * ca + cs * cs) / 2


def waiting_probability(servers: int, rho: float) -> float:
    """Share of arrivals that wait at all: ρ for one server (exact for Poisson), Erlang C else."""
    c = _check_servers(servers)
    rho = _check_rho(rho)
    return rho if c == 1 else erlang_c(c, c * rho)


def share_waiting_longer(bound_s: float, mean_wait_s: float, p_wait: float) -> float:
    """Rough share of requests waiting longer than bound_s: p · exp(-bound · p / Wq).

    Waits are taken as 0 with probability 1 - p and exponential otherwise (mean Wq / p):
    exact for M/M/c, a rough tail for anything burstier or more regular.
    """
    if math.isnan(bound_s) or bound_s < 0:
        raise InvalidInput(f"wait bound must be >= 0 seconds, got {bound_s}")
    if math.isnan(p_wait) or not 0 <= p_wait <= 1:
        raise InvalidInput(f"probability of waiting must be from 0 to 1, got {p_wait}")
    if math.isnan(mean_wait_s) or mean_wait_s < 0:
        raise InvalidInput(f"mean wait must be >= 0 seconds, got {mean_wait_s}")
    if p_wait == 0 or mean_wait_s == 0:
        return 0.0
    return p_wait * math.exp(-bound_s * p_wait / mean_wait_s)


# ---------------------------------------------------------------------------------------
# One call for a page
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueEstimate:
    """A queue's utilisation, chance of waiting and mean wait under a named model."""

    model: QueueModel
    servers: int
    arrival_rate: float
    service_s: float
    ca: float
    cs: float
    rho: float
    p_wait: float
    mean_wait_s: float
    limits: str = LIMITS

    @property
    def mean_response_s(self) -> float:
        """Mean wait plus mean service time."""
        return self.mean_wait_s + self.service_s

    def share_waiting_longer(self, bound_s: float) -> float:
        """Rough share of requests whose wait exceeds bound_s (exponential tail)."""
        return share_waiting_longer(bound_s, self.mean_wait_s, self.p_wait)


def queue_estimate(
    rate: float, service_s: float, servers: int = 1, ca: float = 1.0, cs: float = 1.0
) -> QueueEstimate:
    """Mean wait for λ = rate (req/s) on `servers` of mean service time τ; refuses ρ >= 1.

    One server: Kingman (M/M/1 when ca = cs = 1). Several: Allen–Cunneen (Erlang C exact
    when ca = cs = 1). The servers share one queue (a perfect router).
    """
    rho = _check_rho(utilisation(rate, service_s, servers))
    ca, cs = _cv_value(ca, "arrival cv"), _cv_value(cs, "service cv")
    poisson = ca == 1 and cs == 1
    model: QueueModel
    if servers == 1:
        model = "M/M/1" if poisson else "G/G/1 Kingman"
        wait = kingman_wait(rho, ca, cs, service_s)
    else:
        model = "M/M/c Erlang C" if poisson else "G/G/c Allen-Cunneen"
        wait = allen_cunneen_wait(servers, rho, ca, cs, service_s)
    return QueueEstimate(
        model=model,
        servers=servers,
        arrival_rate=rate,
        service_s=service_s,
        ca=ca,
        cs=cs,
        rho=rho,
        p_wait=waiting_probability(servers, rho),
        mean_wait_s=wait,
    )
