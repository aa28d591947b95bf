"""What-if runs: traffic drawn from a workload profile, run through the modelled engine, and
the figures a person reads (the latency probe's shape), the highest rate meeting an SLO and
how far a prediction can be trusted.

Memory does not grow with the number of requests: latencies go into fixed-size log-bucket
sketches as requests finish, and the KV/queue timeline is sampled at most `TIMELINE_POINTS`
times a run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from planner.errors import InvalidInput
from planner.simulate.engine import (
    SPEED_WINDOW_S,
    EngineConfig,
    EngineStats,
    HostSpeed,
    RequestResult,
    SimRequest,
    StepCost,
    simulate,
)
from planner.workload import Arrival, Profile, RequestShape, shape_class

# Past this utilisation (the rate over the most the engine completes with every slot full),
# queueing dominates and small errors in the step cost move the tail a lot: the prediction
# is flagged as an extrapolation.
UTILISATION_FLAG = 0.85
MAX_REQUESTS = 1_000_000  # a run's; memory stays flat, but time grows with the count
TIMELINE_POINTS = 400
# Bucket edges grow by 1 %: a quantile read from the sketch is within 0.5 % of the value.
_RATIO = 1.01
_LO, _HI = 1e-6, 1e5
_EDGES = _LO * _RATIO ** np.arange(math.ceil(math.log(_HI / _LO) / math.log(_RATIO)) + 1)
_FLUSH = 4096


class Sketch:
    """Quantiles of any number of values (seconds) in fixed memory: counts in log-spaced
    buckets; values are buffered and binned a few thousand at a time."""

    def __init__(self) -> None:
        self.counts = np.zeros(len(_EDGES) + 1)
        self.n = 0.0
        self.total = 0.0
        self.max = -math.inf
        self._values: list[float] = []
        # Arrays handed to add_many, binned together (the simulator's engine hands a few
        # gaps per step, and binning costs the same for a few values as for thousands).
        self._arrays: list[np.ndarray] = []
        self._weights: list[float] = []
        self._lengths: list[int] = []
        self._buffered = 0

    def add(self, value: float) -> None:
        self._values.append(value)
        if len(self._values) >= _FLUSH:
            self.flush()

    def add_many(self, values: np.ndarray, weight: float = 1.0) -> None:
        """Values each seen `weight` times; the array is kept until binned, unchanged."""
        if not len(values):
            return
        self._arrays.append(values)
        self._weights.append(weight)
        self._lengths.append(len(values))
        self._buffered += len(values)
        if self._buffered >= _FLUSH:
            self.flush()

    def flush(self) -> None:
        if self._values:
            self._arrays.append(np.asarray(self._values, dtype=float))
            self._weights.append(1.0)
            self._lengths.append(len(self._values))
            self._values = []
        if not self._arrays:
            return
        values = np.concatenate(self._arrays)
        w = np.repeat(np.asarray(self._weights), self._lengths)
        self._arrays, self._weights, self._lengths, self._buffered = [], [], [], 0
        self.counts += np.bincount(
            np.searchsorted(_EDGES, values), weights=w, minlength=len(self.counts)
        )
        self.n += float(w.sum())
        self.total += float((values * w).sum())
        self.max = max(self.max, float(values.max()))

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0-1) as the probes read theirs (`planner.stats.percentile`):
        linear between the two values around rank (n - 1) q, each the geometric middle of
        its bucket (0 under a microsecond). The rank of the value itself (before 2026-12-07)
        read a p99 of 100 requests as their slowest, where a probe reads nearer the second."""
        self.flush()
        if not self.n:
            return None
        cumulative = np.cumsum(self.counts)
        rank = max(self.n - 1.0, 0.0) * q
        below = math.floor(rank)
        low, high = np.searchsorted(cumulative, [below, below + 1], side="right")
        last = int(np.flatnonzero(self.counts)[-1])
        a, b = self._middle(int(low)), self._middle(min(int(high), last))
        return min(a + (b - a) * (rank - below), self.max)

    @staticmethod
    def _middle(i: int) -> float:
        """The value bucket `i` stands for."""
        return 0.0 if i == 0 else float(math.sqrt(_EDGES[i - 1] * _EDGES[min(i, len(_EDGES) - 1)]))

    def figures(self) -> Figures:
        self.flush()
        if not self.n:
            return Figures()
        return Figures(
            p50=self.quantile(0.5),
            p95=self.quantile(0.95),
            p99=self.quantile(0.99),
            mean=self.total / self.n,
            max=self.max,
        )


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Figures(_Out):
    """p50/p95/p99/mean/max of one latency in seconds (the latency probe's shape)."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    max: float | None = None


class SloBounds(_Out):
    """The bounds a request must meet (MLPerf-style: TTFT and TPOT) and the share required."""

    ttft_s: float
    tpot_s: float
    share: float = 0.99


class ClassPrediction(_Out):
    """One request class (a mixed profile's component, else a prompt band)."""

    name: str
    requests: int
    ttft_s: Figures
    tpot_s: Figures
    e2e_s: Figures
    queue_s: Figures
    slo_share: float | None = None


class Prediction(_Out):
    """One simulated run at one rate: the latency probe's figures and the engine's."""

    rate: float
    requests: int
    refused: int
    duration_s: float
    ttft_s: Figures
    tpot_s: Figures
    itl_s: Figures
    e2e_s: Figures
    queue_s: Figures
    preemptions: int
    # Share of prompt tokens found in the prefix cache (None: prefix caching off).
    prefix_hit_rate: float | None = None
    capacity_rps: float  # requests/s the engine completes with every request at once
    utilisation: float  # rate / capacity_rps
    output_tokens_per_s: float
    slo_share: float | None = None  # share of requests inside both SLO bounds
    goodput_rps: float | None = None  # requests per second inside both bounds
    by_class: list[ClassPrediction] = []
    # (seconds, KV blocks in use as a share, requests waiting)
    timeline: list[tuple[float, float, int]] = []
    extrapolation: list[str] = []  # why the figure is outside what the source was checked on
    source: str


@dataclass(frozen=True)
class Scenario:
    """Everything but the rate: the engine, its step cost, the traffic and the SLO."""

    config: EngineConfig
    cost: StepCost
    profile: Profile
    requests: int = 2000
    arrival: str = "poisson"
    cv: float = 1.0
    slo: SloBounds | None = None
    source: str = "roofline"
    # The API's own time (HTTP, tokenising), added once to TTFT and E2E (a calibrated fit).
    api_s: float = 0.0
    # A calibration's relative fit error (10th, 90th percentile): each seed of an interval
    # draws its step cost's drift from it (`drift`).
    residuals: tuple[float, float] | None = None
    # Flag predictions past the longest prompt and the largest batch a calibrated cost was
    # fitted on; None for a roofline, which has no range.
    calibrated_prompt: int | None = None
    calibrated_batch: int | None = None
    # A calibration's host noise: (TTFT, E2E) residuals in seconds, one drawn and added to
    # each request (seeded, as the traffic is).
    noise: tuple[tuple[float, float], ...] = ()
    # A calibration's TPOT spread where the queue stood (`Calibration.queued_tpot`): a
    # request that waited QUEUED_STEPS of its own steps or more decodes that many times as
    # long as simulated, one drawn for each (seeded).
    queued_tpot: tuple[float, ...] = ()
    # A calibration's host speed, one factor per window of SPEED_WINDOW_S it measured: a
    # prediction draws each window's from these (seeded).
    speed: tuple[float, ...] = ()
    # Later runs' drifts against the calibration (`Calibration.checks`): from MIN_CHECKS on,
    # each seed of an interval draws its step cost's drift from them (`drift`).
    drifts: tuple[float, ...] = ()
    # Later runs' host noise (`Check.noise`, the runs that did not queue): from MIN_CHECKS
    # drifts on, each seed of an interval draws its pool of noise from these and `noise`.
    noise_pools: tuple[tuple[tuple[float, float], ...], ...] = ()
    # Seconds of arrivals instead of a count: a run at rate r then has r x duration_s
    # requests, as a latency probe's window has (a short window that starts empty holds a
    # rate that a long one queues at).
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise InvalidInput(f"requests must be at least 1, got {self.requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise InvalidInput(f"duration_s must be above 0 seconds, got {self.duration_s}")

    def count(self, rate: float) -> int:
        """Requests in a run at `rate`: `requests`, or `duration_s` of arrivals."""
        if self.duration_s is None:
            return self.requests
        n = max(1, round(rate * self.duration_s))
        if n > MAX_REQUESTS:
            raise InvalidInput(
                f"{self.duration_s:g} s at {rate:g} requests/s is {n:,} requests; at most "
                f"{MAX_REQUESTS:,} a run"
            )
        return n

    def arrivals(self, rate: float) -> Arrival:
        if rate <= 0:
            raise InvalidInput(f"the rate must be above 0 requests/s, got {rate}")
        return Arrival(kind=self.arrival, rate=rate, cv=self.cv)


def traffic(
    profile: Profile, arrival: Arrival, requests: int, seed: int = 0
) -> Iterator[SimRequest]:
    """`requests` requests: send times from `arrival`, lengths from `profile` (independent
    streams of the same seed), each tagged with its class as the probes tag theirs. A
    session's turn is sent once its previous turn has ended, as the probes send it."""
    if arrival.kind == "ramp":
        times: Iterator[float] = iter(arrival.offsets(requests, seed))
    else:
        times = itertools.islice(arrival.iter_offsets(seed), requests)
    shapes = profile.iter_shapes(np.random.default_rng([seed, 1]))
    for t, shape in zip(times, shapes, strict=False):
        yield as_request(t, shape)


def as_request(t: float, shape: RequestShape) -> SimRequest:
    """The request a probe sends for `shape` at `t`, classed as the probes class theirs."""
    component = shape.tags.get("component")
    cls = shape_class(str(component) if component else None, shape.prompt_tokens)
    return SimRequest(
        t, shape.prompt_tokens, shape.output_tokens, cls, *_shared(shape), shape.session
    )


def _shared(shape: RequestShape) -> tuple[str | None, int, int]:
    """What a request shares through the prefix cache: its key, the tokens it may find
    there, the tokens it leaves there for later ones."""
    if shape.prefix is not None:
        key, tokens = shape.prefix
        return key, tokens, tokens
    if shape.session is not None:
        # The next turn begins with this turn's prompt verbatim (its answer's part is text
        # standing in for it, which the cache cannot hold), as the probes send turns.
        return shape.session, shape.repeated_tokens, shape.prompt_tokens
    return None, 0, 0


def replay(rows: Iterable[tuple[float, int, int, str | None]]) -> list[SimRequest]:
    """Stored requests (send time, prompt tokens, output tokens, mixed-profile component or
    None) as traffic: in order, the first at 0, classed as the probes class theirs."""
    ordered = sorted(rows, key=lambda row: row[0])
    if not ordered:
        raise InvalidInput("there are no requests to replay")
    start = ordered[0][0]
    return [SimRequest(t - start, p, o, shape_class(c, p)) for t, p, o, c in ordered]


@dataclass
class _Class:
    ttft: Sketch = field(default_factory=Sketch)
    tpot: Sketch = field(default_factory=Sketch)
    e2e: Sketch = field(default_factory=Sketch)
    queue: Sketch = field(default_factory=Sketch)
    requests: int = 0
    met: int = 0

    def add(self, ttft: np.ndarray, e2e: np.ndarray, queue: np.ndarray, tpot: np.ndarray,
            met: int) -> None:  # fmt: skip
        self.ttft.add_many(ttft)
        self.e2e.add_many(e2e)
        self.queue.add_many(queue)
        self.tpot.add_many(tpot[~np.isnan(tpot)])
        self.requests += len(ttft)
        self.met += met


# A request that waited this many of its own steps in the queue decodes where the queue
# stands (`Scenario.queued_tpot`).
QUEUED_STEPS = 10


class _Tally:
    """The answered requests' figures, per class and in all, taken in blocks: a request
    costs one row, and the host noise, the SLO and the sketches work on a block at once."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.api_s, self.slo = scenario.api_s, scenario.slo
        self.noise = np.asarray(scenario.noise, dtype=float).reshape(-1, 2)
        self.spread = np.asarray(scenario.queued_tpot, dtype=float)
        self.rng = np.random.default_rng([seed, 3])
        self.classes: dict[str, _Class] = {}
        self.every = _Class()
        self.names: list[str] = []
        # (TTFT, E2E, queue, TPOT or NaN, arrival) of each request not yet binned
        self.rows: list[tuple[float, float, float, float, float]] = []
        self.end = 0.0  # the last answer, from the start

    def add(self, r: RequestResult) -> None:
        assert r.ttft_s is not None and r.e2e_s is not None and r.queue_s is not None
        tpot = math.nan if r.tpot_s is None else r.tpot_s
        self.rows.append((r.ttft_s, r.e2e_s, r.queue_s, tpot, r.request.arrival_s))
        self.names.append(r.request.cls)
        if len(self.rows) >= _FLUSH:
            self.flush()

    def refused(self, cls: str) -> None:
        self.classes.setdefault(cls, _Class()).requests += 1
        self.every.requests += 1

    def flush(self) -> None:
        if not self.rows:
            return
        ttft, e2e, queue, tpot, arrival = np.asarray(self.rows).T
        if len(self.spread):
            # Where the queue stands a request's TPOT, the mean step over its own stretch of
            # decoding, strays from the simulated as the calibration's run past the knee
            # showed (the host moves the steps from one stretch to the next).
            queued = np.flatnonzero(queue >= QUEUED_STEPS * tpot)  # (NaN: no TPOT, never)
            k = self.spread[self.rng.integers(len(self.spread), size=len(queued))]
            tpot[queued] *= k
            e2e[queued] = ttft[queued] + (e2e[queued] - ttft[queued]) * k
        ttft = ttft + self.api_s
        e2e = e2e + self.api_s
        if len(self.noise):
            # A residual drawn with replacement for each request (a bootstrap of what the
            # calibration's run showed and the scheduler did not): never below 0, nor E2E
            # below TTFT.
            dt, de = self.noise[self.rng.integers(len(self.noise), size=len(ttft))].T
            ttft = np.maximum(ttft + dt, 0.0)
            e2e = np.maximum(e2e + de, ttft)
        self.end = max(self.end, float((arrival + e2e).max()))
        met = np.zeros(len(ttft), dtype=bool)
        if self.slo is not None:
            met = (ttft <= self.slo.ttft_s) & ~(tpot > self.slo.tpot_s)  # (NaN: no TPOT)
        names = np.asarray(self.names)
        for name in dict.fromkeys(self.names):
            rows = names == name
            c = self.classes.setdefault(name, _Class())
            c.add(ttft[rows], e2e[rows], queue[rows], tpot[rows], int(met[rows].sum()))
        self.every.add(ttft, e2e, queue, tpot, int(met.sum()))
        self.rows, self.names = [], []


# Windows of host speed a prediction draws; past them the draws start over (4,096 windows
# of 5 s: more than five hours of simulated time).
SPEED_DRAWS = 4096


def _host_speed(factors: Sequence[float], seed: int) -> HostSpeed | None:
    """Each window's speed drawn with replacement from a calibration's (a bootstrap of the
    host's speed, as the noise is of its stalls); None without a calibration's."""
    if not factors:
        return None
    rng = np.random.default_rng([seed, 4])
    drawn = np.asarray(factors, dtype=float)[rng.integers(len(factors), size=SPEED_DRAWS)]
    return HostSpeed(SPEED_WINDOW_S, tuple(drawn.tolist()))


# The fit error's quantile function (`drift`): through its 10th and 90th percentiles and
# the fit itself at the median, on to 1.25 times those errors at the ends.
_FIT_QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)
# Later runs' drifts a prediction needs before it draws from them instead (`drift`).
MIN_CHECKS = 3


def drift(scenario: Scenario, seed: int) -> float:
    """A whole run's step-cost factor against the calibration's, drawn with its seed; 1
    without a calibration.

    From MIN_CHECKS later runs' drifts on (`Scenario.drifts`), a draw from what they
    predict of the next: their log-normal, its centre and spread estimated from them (a
    Student t with n - 1 degrees of freedom on their log mean and standard deviation times
    sqrt(1 + 1/n), as a prediction interval of a sample of n is). Before that, the
    calibration's fit error (10th and 90th percentiles of measured / fitted - 1: the fit
    itself half the time, off by at least the 10th or the 90th percentile's error one time
    in ten each, the quantiles linear between and to 1.25 times those errors at the ends)
    times one window of its host speed.

    Why: the calibration and the run are minutes apart on a host whose speed moves, and a
    run's windows drawn one by one average that out. On the CPU engine the calibrated TPOT
    p50 of eighteen benchmark runs (90 workloads) read -12 % to +13 % (10th-90th
    percentile), where a calibration's fit error spanned as little as -2 % to +4 % and its
    windows x0.97 to x1.04: its own measurements do not say how far the host will move,
    later runs do. Drawn through the steps, not laid on the p99: past the knee each per
    cent of the cost moves the queue, and the p99, by several."""
    rng = np.random.default_rng([seed, 5])
    if len(scenario.drifts) >= MIN_CHECKS:
        logs = np.log(scenario.drifts)
        n = len(logs)
        spread = float(np.std(logs, ddof=1)) * math.sqrt(1 + 1 / n)
        return max(math.exp(float(logs.mean()) + spread * float(rng.standard_t(n - 1))), 0.05)
    factor = 1.0
    if scenario.residuals is not None:
        low, high = min(scenario.residuals[0], 0.0), max(scenario.residuals[1], 0.0)
        errors = (1.25 * low, low, 0.0, high, 1.25 * high)
        factor += float(np.interp(rng.random(), _FIT_QUANTILES, errors))
    if scenario.speed:
        factor *= float(scenario.speed[int(rng.integers(len(scenario.speed)))])
    return max(factor, 0.05)


_T = TypeVar("_T")


def _resample(pool: Sequence[_T], rng: np.random.Generator) -> tuple[_T, ...]:
    """As many of `pool`'s items, drawn with replacement."""
    return tuple(pool[i] for i in rng.integers(len(pool), size=len(pool))) if pool else ()


def _noise_pool(scenario: Scenario, seed: int) -> Sequence[tuple[float, float]]:
    """The pool of host noise one seed of an interval draws from (`redrawn`)."""
    if len(scenario.drifts) < MIN_CHECKS or not scenario.noise_pools:
        return scenario.noise
    pools = [p for p in (scenario.noise, *scenario.noise_pools) if p]
    return pools[int(np.random.default_rng([seed, 7]).integers(len(pools)))]


def redrawn(scenario: Scenario, seed: int) -> Scenario:
    """`scenario` as another calibration of the same engine might have measured it, for
    one seed of an interval: its step cost times the seed's `drift`, and its pools of host
    noise, TPOT spread where the queue stood and speed windows each drawn again with
    replacement (itself without a calibration).

    Why the pools: they are one tuning run's sample, and a p99 is the few worst of its
    requests. Drawing each run's requests from the same pool reads the pool's tail as the
    host's, and the seeds' p99s agree more than runs do: for a tail of a few stalls in a
    few hundred requests, the runs' p99 fell inside the seeds' 80 % interval 56 % of the
    time, and 70 % with each seed's pool drawn again first (docs/simulator.md).

    From MIN_CHECKS later runs on, the pool of host noise drawn again is first one run's,
    the tuning run's or one of those the checks kept (`Scenario.noise_pools`): a tuning run
    in a quiet spell has few stalls, and drawing its pool again cannot add any (below the
    knee the CPU engine's TTFT p99 read 39 and 51 ms where two such calibrations' intervals
    read 23-28 and 25-27)."""
    factor = drift(scenario, seed)
    if factor == 1.0 and not (scenario.noise or scenario.queued_tpot or scenario.speed):
        return scenario
    rng = np.random.default_rng([seed, 6])
    return replace(
        scenario,
        cost=scenario.cost.scaled(factor),
        noise=_resample(_noise_pool(scenario, seed), rng),
        queued_tpot=_resample(scenario.queued_tpot, rng),
        speed=_resample(scenario.speed, rng),
    )


def capacity_rps(scenario: Scenario) -> float:
    """Requests per second the engine completes when all of the scenario's requests come at
    once (every slot full, the queue never empty), its steps also paying the arrivals'
    engine time (`StepCost.arrival_s`: at that rate one request arrives for each
    answered): the rate the utilisation is measured against."""
    burst = (
        replace(r, arrival_s=0.0)
        for r in traffic(scenario.profile, Arrival(rate=1.0), scenario.requests)
    )
    end, done = 0.0, 0
    for r in simulate(burst, scenario.config, scenario.cost):
        if not r.refused:
            assert r.e2e_s is not None
            end, done = max(end, r.e2e_s), done + 1
    if not done:
        raise InvalidInput("every request is longer than max_model_len: nothing to simulate")
    return done / (end + done * scenario.cost.arrival_s)


def predict(
    scenario: Scenario,
    rate: float,
    seed: int = 0,
    capacity: float | None = None,
    requests: Sequence[SimRequest] | None = None,
    speed: HostSpeed | None = None,
) -> Prediction:
    """One simulated run of `scenario.count(rate)` requests at `rate` requests/s, or of the
    given `requests` (a replay; `rate` then only labels it). `capacity` (requests/s, from
    `capacity_rps`) can be passed in when several rates share it. `speed`: the host's speed
    window by window as a replayed run had it (`calibrate.host_speed`), instead of windows
    drawn from the scenario's."""
    arrival = scenario.arrivals(rate)
    capacity = capacity if capacity is not None else capacity_rps(scenario)
    n = scenario.count(rate)
    expected_s = (requests[-1].arrival_s if requests else n / rate) or 1.0
    stats = EngineStats()
    itl = Sketch()
    tally = _Tally(scenario, seed)
    refused = tokens = 0
    longest_prompt = 0
    slo = scenario.slo
    results = simulate(
        requests if requests is not None else traffic(scenario.profile, arrival, n, seed),
        scenario.config,
        scenario.cost,
        stats,
        sample_every_s=expected_s / TIMELINE_POINTS,
        itl=itl.add_many,
        speed=speed or _host_speed(scenario.speed, seed),
    )
    for r in results:
        longest_prompt = max(longest_prompt, r.request.prompt_tokens)
        if r.refused:
            refused += 1
            tally.refused(r.request.cls)
            continue
        tokens += r.request.output_tokens
        tally.add(r)
    tally.flush()
    classes, every, end = tally.classes, tally.every, tally.end
    duration = max(end, 1e-9)
    flags = _extrapolation(scenario, rate / capacity, longest_prompt, stats)
    blocks = scenario.config.num_blocks
    return Prediction(
        rate=rate,
        requests=every.requests,
        refused=refused,
        duration_s=duration,
        ttft_s=every.ttft.figures(),
        tpot_s=every.tpot.figures(),
        itl_s=itl.figures(),
        e2e_s=every.e2e.figures(),
        queue_s=every.queue.figures(),
        preemptions=stats.preemptions,
        prefix_hit_rate=(
            stats.prefix_hits / stats.prefix_queries if stats.prefix_queries else None
        ),
        capacity_rps=capacity,
        utilisation=rate / capacity,
        output_tokens_per_s=tokens / duration,
        slo_share=every.met / every.requests if slo is not None and every.requests else None,
        goodput_rps=every.met / duration if slo is not None else None,
        by_class=[
            ClassPrediction(
                name=name,
                requests=c.requests,
                ttft_s=c.ttft.figures(),
                tpot_s=c.tpot.figures(),
                e2e_s=c.e2e.figures(),
                queue_s=c.queue.figures(),
                slo_share=c.met / c.requests if slo is not None and c.requests else None,
            )
            for name, c in sorted(classes.items())
        ]
        if len(classes) > 1
        else [],
        timeline=[(t, used / blocks, waiting) for t, used, waiting in stats.timeline],
        extrapolation=flags,
        source=scenario.source,
    )


def _extrapolation(
    scenario: Scenario, utilisation: float, longest_prompt: int, stats: EngineStats
) -> list[str]:
    flags = []
    if utilisation > UTILISATION_FLAG:
        flags.append(
            f"utilisation {utilisation:.0%} (over {UTILISATION_FLAG:.0%}): queueing dominates "
            "and small step-cost errors move the tail a lot"
        )
    top = scenario.calibrated_prompt
    if top is not None and longest_prompt > top:
        flags.append(f"prompts up to {longest_prompt:,} tokens; calibrated up to {top:,}")
    if scenario.calibrated_batch is not None and stats.max_batch > scenario.calibrated_batch:
        flags.append(
            f"batches of up to {stats.max_batch} requests; calibrated up to "
            f"{scenario.calibrated_batch}"
        )
    return flags


class Interval(_Out):
    """An 80 % interval on a p99, from runs with different seeds."""

    low: float
    high: float
    seeds: int


class RatePoint(_Out):
    """One rate of a sweep: the first seed's prediction and the seeds' interval on p99s."""

    prediction: Prediction
    ttft_p99: Interval | None = None
    e2e_p99: Interval | None = None


# The interval is for the p99 of a run yet to come. Of n seeds' p99s, the j-th lowest to the
# j-th highest holds another seed's with probability (n + 1 - 2j) / (n + 1), whatever their
# distribution, so 80 % takes at least nine (lowest to highest). The 10th-90th percentiles
# of five, the interval before, held another seed's 56 % of the time.
MIN_SEEDS = 9


def _interval(values: list[float | None]) -> Interval | None:
    """The seeds' order statistics that hold another seed's value at least 80 % of the time."""
    xs = sorted(v for v in values if v is not None)
    n = len(xs)
    if n < MIN_SEEDS:
        return None
    j = max(1, math.floor(0.1 * (n + 1)))
    return Interval(low=float(xs[j - 1]), high=float(xs[n - j]), seeds=len(xs))


def sweep(scenario: Scenario, rates: list[float], seeds: int = 1) -> list[RatePoint]:
    """Predictions at each rate (seed 0, at the scenario's cost: a calibration's at its
    checks' scale); with several seeds, an 80 % interval on p99 TTFT and E2E from runs that
    each also draw the calibration again (`redrawn`: its step cost's drift and its pools of
    the host's noise and speed)."""
    points = []
    capacity = capacity_rps(scenario)
    # (The same draws at every rate; seed 0 of a roofline, drawn as it is, is the prediction.)
    drawn = [redrawn(scenario, seed) for seed in range(seeds)] if seeds >= MIN_SEEDS else []
    for rate in rates:
        first = predict(scenario, rate, 0, capacity)
        runs = [
            first if seed == 0 and what is scenario else predict(what, rate, seed, capacity)
            for seed, what in enumerate(drawn)
        ] or [first]
        points.append(
            RatePoint(
                prediction=first,
                ttft_p99=_interval([p.ttft_s.p99 for p in runs]),
                e2e_p99=_interval([p.e2e_s.p99 for p in runs]),
            )
        )
    return points


def meets(prediction: Prediction, slo: SloBounds) -> bool:
    """Whether the SLO's share of requests was inside both bounds."""
    return prediction.slo_share is not None and prediction.slo_share >= slo.share


# How far past the capacity `highest` looks before it calls the SLO met at any rate.
_HIGHEST_TOP = 100.0


def highest(scenario: Scenario, tolerance: float = 0.02) -> tuple[float, Prediction] | None:
    """The highest rate (requests/s) whose prediction meets the scenario's SLO, to within
    `tolerance` (relative), and that prediction; None when even 1 % of the engine's capacity
    misses it. The same seed at every rate, so that the rates are compared on the same
    traffic. The search starts between 1 % and 110 % of the capacity; a finite run can
    hold past that (its queue has no time to grow), so the top is raised until it breaks."""
    slo = scenario.slo
    if slo is None:
        raise InvalidInput("the highest rate needs an SLO (ttft_s, tpot_s and a share)")
    capacity = capacity_rps(scenario)

    def at(rate: float) -> Prediction:
        return predict(scenario, rate, 0, capacity)

    good, bad = capacity * 0.01, capacity * 1.1
    if not meets(found := at(good), slo):
        return None
    limit = capacity * _HIGHEST_TOP
    if scenario.duration_s is not None:  # (runs of duration_s: at most MAX_REQUESTS each)
        limit = min(limit, MAX_REQUESTS / scenario.duration_s)
    while meets(top := at(bad), slo):
        if bad * 2 > limit:
            return bad, top
        good, found, bad = bad, top, bad * 2
    while bad / good > 1 + tolerance:
        mid = math.sqrt(good * bad)
        if meets(p := at(mid), slo):
            good, found = mid, p
        else:
            bad = mid
    return good, found


def max_rate(scenario: Scenario, tolerance: float = 0.02) -> float | None:
    """`highest`'s rate alone."""
    found = highest(scenario, tolerance)
    return None if found is None else found[0]
