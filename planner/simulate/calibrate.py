"""Step costs fitted to a real engine's measurements, and how well they fit.

Two kinds of measurement pin a step cost down. Decode steps: in a closed-loop batch sweep
at concurrency c, the typical inter-token gap is one step with c sequences decoding, each
attending over its prompt and about half its answer; a lone request's TPOT is one sequence
decoding over its prompt. Prefill steps: a lone request's TTFT is the API's own time plus
the steps of its prompt's chunks (the engine's token budget each). The fit is the additive
model

    step = overhead + tokens x token_s + sequences x seq_s + attention pairs x pair_s
           + cached tokens x kv_s

(a sequence costs sampling and streaming its token; a pair is a query token against a
cached one, the quadratic part of a long prefill; a cached token is one the step's
sequences hold, read once a step: a decode's attention over a long context), with the
API's time (HTTP, tokenising)
added once to TTFT and E2E, solved by least squares on relative errors over the median of
each measurement, every coefficient kept non-negative. The residuals say how far a
calibrated prediction can be trusted, and the longest prompt and largest batch measured
bound where it is an interpolation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.errors import InvalidInput
from planner.simulate.engine import (
    KEPT,
    NEW,
    REPLANNED,
    SHAPE_PLANS,
    SPEED_WINDOW_S,
    EngineConfig,
    HostSpeed,
    MatmulPlans,
    RequestResult,
    SimRequest,
    StepCost,
    pairs_of,
    simulate,
)
from planner.simulate.steps import ObservedStep
from planner.simulate.whatif import MIN_CHECKS

_T = TypeVar("_T")

# Where a target's calibration is kept (the store's published facts), by target name.
CALIBRATION_KEY = "calibration:{}"
# The measurements a calibration takes (at most a few minutes on the CPU engine): a
# closed-loop batch sweep for decode steps, and lone requests of three prompt lengths, one
# every 4 s, for prefill steps, the API's time and how a decode step grows with its context
# (their answers long enough to time a few steps each).
SWEEP_CONTEXT = (256, 64)  # prompt and output tokens of the sweep's requests
SWEEP_PARAMS: dict[str, Any] = {
    "concurrencies": [1, 2, 4, 8],
    "prompt_tokens": SWEEP_CONTEXT[0],
    "output_tokens": SWEEP_CONTEXT[1],
    "requests_per_step": 12,
}
PREFILL_PARAMS: dict[str, Any] = {
    "rate": 0.25,
    "arrival": "constant",
    "duration_s": 48.0,
    "profile": {"kind": "empirical", "pairs": [[64, 16], [1024, 16], [4096, 16]]},
}
# What a step takes to plan its matmuls for a token count never run and for one evicted
# from the 32 kept (`shape_cost`): lone prompts in order, six a second (each TTFT a few
# tens of ms: alone in the engine), one prefill step each under the CPU engine's 512-token
# budget. 24 lengths never run, the same again (kept), 24 others never run, then the first
# 24 once more (evicted by the 24 others, the answers' decodes and themselves): each kind
# of the same lengths.
SHAPE_LENGTHS = (list(range(330, 378, 2)), list(range(331, 379, 2)))
SHAPE_PARAMS: dict[str, Any] = {
    "rate": 6.0,
    "arrival": "constant",
    "duration_s": 16.0,
    "profile": {
        "kind": "empirical",
        "pairs": [[p, 2] for part in (0, 0, 1, 0) for p in SHAPE_LENGTHS[part]],
        "in_order": True,
    },
    "seed": 5,  # (prompts of their own: another run's of the same seed would be cached)
}


@dataclass(frozen=True)
class DecodeSample:
    """A measured inter-token gap (seconds) with `batch` sequences decoding, each attending
    over `context` tokens on average."""

    batch: int
    context: float
    itl_s: float
    alone: bool = False  # a lone request's (no prompts join its steps), not a closed loop's


@dataclass(frozen=True)
class PrefillSample:
    """A measured TTFT (seconds) of a lone request with `prompt_tokens` tokens."""

    prompt_tokens: int
    ttft_s: float


class _Read(BaseModel):
    """What a calibration reads of a probe's result (the rest is ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Tail(_Read):
    """A latency's figures as the probes report them; a calibration reads the median (and
    the engine's mean queue time)."""

    p50: float | None = None
    mean: float | None = None


class SweepStep(_Read):
    """One concurrency of a closed-loop batch sweep's result."""

    concurrency: int = Field(ge=1)
    requests_per_s: float | None = None
    ttft_s: Tail = Tail()
    tpot_s: Tail = Tail()
    itl_s: Tail = Tail()
    e2e_s: Tail = Tail()


class Sweep(_Read):
    """A batch sweep's result: its steps."""

    steps: list[SweepStep] = Field(default_factory=list)


class _EngineQueue(_Read):
    queue_time: Tail | None = None


class LoadRun(_Read):
    """An open-loop run's result (a latency probe's), as a tune reads it: the client's TTFT
    and TPOT and the engine's own queue time."""

    ttft_s: Tail = Tail()
    tpot_s: Tail = Tail()
    engine: _EngineQueue | None = None

    @property
    def tune_figures(self) -> tuple[float, float] | None:
        """(TPOT mean, TTFT p50), what a tune fits to; None when no request had two tokens.
        The mean, not the median: the engine's throughput, and so its queue past the knee,
        follows its mean step, and a shared host's stalls lengthen the mean where the median
        does not see them (the TPOT p50 of older summaries where the mean is missing)."""
        tpot, ttft = self.tpot_s.mean or self.tpot_s.p50, self.ttft_s.p50
        return None if tpot is None or ttft is None else (tpot, ttft)

    @property
    def queue_mean_s(self) -> float | None:
        queue = self.engine.queue_time if self.engine is not None else None
        return queue.mean if queue is not None else None


def decode_samples(sweep: Sweep) -> list[DecodeSample]:
    """Decode samples from a batch sweep's result: each step's median TPOT (its median
    inter-token gap where the run kept no TPOT; at high concurrency tokens reach the client
    in bursts and the median gap reads 0), its sequences attending over the prompt and half
    the answer on average."""
    prompt, output = SWEEP_CONTEXT
    out = []
    for step in sweep.steps:
        if gap := step.tpot_s.p50 or step.itl_s.p50:
            out.append(DecodeSample(step.concurrency, prompt + output / 2, gap))
    return out


# A sweep step whose TPOT p50 is under this share of its (E2E - TTFT) p50 spread over the
# answer's tokens saw its tokens arrive together: the client's clock says nothing of steps.
BURST_SHARE = 0.25


def bursts(sweep: Sweep) -> str | None:
    """Why a batch sweep cannot be fitted on (its answers reached the client in bursts), or
    None. Beside a CPU hog the CPU engine's API server, with the engine core in its own
    process, streamed whole answers at once: TPOT p50 0.06 ms at concurrency 1 where the
    answers took 1 ms a token, and a fit with error up to +17,000 %."""
    tokens = SWEEP_CONTEXT[1] - 1
    for step in sweep.steps:
        tpot, ttft, e2e = step.tpot_s.p50, step.ttft_s.p50, step.e2e_s.p50
        if tpot is None or ttft is None or e2e is None or e2e <= ttft:
            continue
        spread = (e2e - ttft) / tokens
        if tpot < BURST_SHARE * spread:
            return (
                f"at concurrency {step.concurrency} the answers reached the client in "
                f"bursts (TPOT p50 {tpot * 1000:.2f} ms against {spread * 1000:.2f} ms a token "
                "from first to last): the API server was starved of CPU"
            )
    return None


def lone_decodes(
    records: Iterable[tuple[int | None, int | None, float | None, float | None]],
) -> list[DecodeSample]:
    """Decode samples from lone requests' (prompt tokens, output tokens, TTFT, E2E)
    records: each answer's TPOT, one sequence attending over its prompt and half its
    answer. The sweep decodes at one context only; these tell a long context's cost."""
    out = []
    for prompt, output, ttft, e2e in records:
        if prompt and output and output > 1 and ttft is not None and e2e is not None:
            tpot = (e2e - ttft) / (output - 1)
            if tpot > 0:
                out.append(DecodeSample(1, prompt + output / 2, tpot, alone=True))
    return out


def sweep_prefills(sweep: Sweep) -> list[PrefillSample]:
    """The sweep's one-at-a-time step: each request alone, its median TTFT a prefill."""
    for step in sweep.steps:
        if step.concurrency == 1 and step.ttft_s.p50:
            return [PrefillSample(SWEEP_CONTEXT[0], step.ttft_s.p50)]
    return []


def prefill_samples(records: Iterable[tuple[int | None, float | None]]) -> list[PrefillSample]:
    """Prefill samples from lone requests' (prompt tokens, TTFT) records."""
    return [
        PrefillSample(int(tokens), float(ttft))
        for tokens, ttft in records
        if tokens and ttft is not None and ttft > 0
    ]


class Check(BaseModel):
    """A later open-loop run of the calibrated engine replayed at the calibration's step
    cost: how many times as long its steps ran (`drift_of`; 1: the calibration held)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    at: float  # when it was checked (Unix seconds)
    drift: float = Field(gt=0)
    run: str  # what ran: "retune", "latency run 12"
    # The host's noise in that run, as `Calibration.noise` is in the tuning run's, at this
    # drift (`noise_of`): empty for a run that queued (its residuals would be the queue's
    # too), for a check stored before, and past the newest NOISE_CHECKS that have it.
    noise: list[tuple[float, float]] = Field(default_factory=list)
    # Whether the run queued (`tuning_refused`): past the knee its batches ran full, so its
    # drift reads the full batch's cost, which a retune keeps (`retune_hint`). None for a
    # check stored before this was kept.
    queued: bool | None = None

    @property
    def ttft_noise_p99_s(self) -> float | None:
        """The 99th percentile of its TTFT noise: the stalls the run met (None unkept)."""
        return float(np.quantile([t for t, _ in self.noise], 0.99)) if self.noise else None


# The newest checks a calibration keeps, the newest of them that keep their host noise, and
# how much of it each keeps (a calibration is read on every prediction).
MAX_CHECKS = 32
NOISE_CHECKS = 8
CHECK_NOISE_SAMPLES = 128


class Calibration(BaseModel):
    """Fitted coefficients (seconds), their residuals and the range they were fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    overhead_s: float = Field(ge=0)
    token_s: float = Field(ge=0)
    seq_s: float = Field(ge=0)
    pair_s: float = Field(ge=0)
    api_s: float = Field(ge=0)
    kv_s: float = Field(0.0, ge=0)  # (0 in a calibration stored before it was fitted)
    # The 10th and 90th percentiles of measured / fitted - 1 over every sample.
    residual_low: float
    residual_high: float
    samples: int
    max_prompt: int
    max_batch: int
    engine: dict[str, int | bool] = Field(default_factory=dict)  # the EngineConfig fitted on
    fitted_at: float | None = None  # the quiet fit's time (Unix seconds)
    tuned_at: float | None = None  # the tune's: `kvscope simulate calibrate --retune` moves it
    target: str | None = None
    # Under open-loop load, steps ran `load_scale` times as long as the quiet measurements
    # say and the API took `load_api_s` more (one workload's run, `tune`); 1 and 0 untuned.
    load_scale: float = Field(1.0, gt=0)
    load_api_s: float = 0.0
    tuned_rate: float | None = None
    # The host's noise: each request of that run as (TTFT, E2E) measured minus simulated by
    # the tuned cost, in seconds (at most NOISE_SAMPLES, evenly taken). A scheduler with a
    # deterministic step cost has no stalls; a shared machine has them, and a prediction
    # adds one of these to each request.
    noise: list[tuple[float, float]] = Field(default_factory=list)
    # The host's speed in that run, window by window (SPEED_WINDOW_S each): the measured
    # TPOT median of the requests decoding in it over the tuned replay's, over their mean.
    # A prediction draws its windows from these.
    speed: list[float] = Field(default_factory=list)
    # The quiet fit's rows (steps, tokens, sequences, pairs, cached tokens, API; stored
    # before the cached tokens, without them) and medians, to fit again
    # with a tuning run's steps (`on_steps`), and how many kinds of those steps it was.
    quiet_rows: list[list[float]] = Field(default_factory=list)
    quiet_s: list[float] = Field(default_factory=list)
    step_kinds: int = 0
    # The engine time each request arriving while a batch runs takes from the steps
    # (StepCost.arrival_s), measured on an open-loop run past the knee at `saturated_rate`
    # (`arrival_cost`); 0 and None unmeasured. (Stored from 2026-12-05's evening to
    # 12-06's, it was read per intake, the requests arriving in one step: read per request
    # it is about a tenth high. Until 12-06's night the drain was taken as it ran, whatever
    # the host's speed; a new calibration takes it at the arrivals' (`host_drift`).)
    arrival_s: float = Field(0.0, ge=0)
    saturated_rate: float | None = None
    # A request's TPOT where the queue stood, over the simulated one, its mean 1 (the same
    # run's requests that decoded while requests arrived; `queued_spread`); empty
    # unmeasured. With the client, the API server and the engine core all busy, a
    # request's mean step strays from the next one's (the CPU engine past the knee: p90 /
    # p50 1.39, the simulator's 1.07), which host noise from the tuning run, at 40 % of
    # capacity, does not show.
    queued_tpot: list[float] = Field(default_factory=list)
    # What the same run's drain says a sequence costs a step under load beyond `seq_s`
    # (`full_batch`; 0 unmeasured); with `load_scale` on both.
    load_seq_s: float = 0.0
    # What a step takes to plan its matmuls for a token count never run and for one run
    # before but not among the last 32 (StepCost.shape_s and replan_s; `shape_cost`); 0
    # unmeasured.
    shape_s: float = Field(0.0, ge=0)
    replan_s: float = Field(0.0, ge=0)
    # Later runs of the engine replayed at this cost (`Check`), oldest first: from
    # MIN_CHECKS since the tune on, what a prediction takes its step cost at
    # (`checked_scale`) and its interval draws its drift from (`planner.simulate.whatif.drift`).
    checks: list[Check] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _stored_before_arrivals(cls, data: Any) -> Any:
        """A calibration stored with `queued_scale` (a factor on steps taken while
        requests waited, which the arrival cost replaced) reads as unmeasured past the
        knee: the factor does not convert."""
        if isinstance(data, dict) and "queued_scale" in data:
            data = {k: v for k, v in data.items() if k not in ("queued_scale", "saturated_rate")}
        return data

    def cost(self) -> StepCost:
        k = self.load_scale
        return StepCost(
            overhead_s=self.overhead_s * k,
            weights_read_s=0.0,
            kv_token_read_s=self.kv_s * k,
            token_compute_s=self.token_s * k,
            additive=True,
            seq_s=max(self.seq_s + self.load_seq_s, 0.0) * k,
            pair_s=self.pair_s * k,
            arrival_s=self.arrival_s,
            shape_s=self.shape_s * k,
            replan_s=self.replan_s * k,
        )

    @property
    def request_s(self) -> float:
        """The API's time per request under load."""
        return max(self.api_s + self.load_api_s, 0.0)

    @property
    def last_tuned(self) -> float | None:
        """When its step cost was last tuned (a calibration without a tune: when fitted)."""
        return self.tuned_at or self.fitted_at

    def checks_since_tune(self) -> list[Check]:
        """Its checks of runs made since that tune, oldest first."""
        tuned = self.last_tuned
        return [c for c in self.checks if tuned is None or c.at > tuned]

    def checked_scale(self) -> float:
        """The scale a prediction takes its step cost at: from MIN_CHECKS checks since the
        tune on, the geometric mean of their drifts (the centre its interval's drift is drawn
        around); 1 before, as fitted.

        Why: a calibration is one moment of a shared host, and the runs after it ran their
        steps at a level of its own: over the benchmark runs BQ-BZ the median of each one's
        seven checked runs read x0.46 to x1.48. The geometric mean of the runs checked
        before predicted the next one's drift within 10 % 18 times in 40, where 1 (the cost
        as fitted) did 11 times, and came nearer in 33 (docs/simulator-log.md, "A
        prediction at its checks' scale")."""
        drifts = [c.drift for c in self.checks_since_tune()]
        if len(drifts) < MIN_CHECKS:
            return 1.0
        return math.exp(float(np.mean(np.log(drifts))))

    def config(self) -> EngineConfig:
        """The engine settings it was fitted on."""
        return EngineConfig(**self.engine)  # type: ignore[arg-type]

    def quiet_step(self) -> str:
        """The quiet fit's step cost and API time, as a formula to read."""
        return (
            f"quiet step = {self.overhead_s * 1000:.2f} ms + {self.token_s * 1e6:.2f} us a "
            f"token + {self.seq_s * 1e6:.0f} us a sequence + {self.pair_s * 1e9:.1f} ns an "
            f"attention pair + {self.kv_s * 1e9:.1f} ns a cached token; API "
            f"{self.api_s * 1000:.2f} ms a request"
        )

    def fit_error(self) -> str:
        """How far its fit missed the measurements it was fitted on."""
        return (
            f"fit error {self.residual_low:+.0%} to {self.residual_high:+.0%} (10th-90th "
            "percentile)"
        )

    def checks_said(self) -> str | None:
        """What later runs replayed at this cost said of it (`checks`), or None."""
        if not self.checks:
            return None
        drifts = [c.drift for c in self.checks]
        many = "s" * (len(drifts) > 1)
        noisy = [c for c in self.checks if c.noise]
        noise = f", the host's noise from {len(noisy)} that did not queue" if noisy else ""
        median = f" (median x{float(np.median(drifts)):.2f})" if many else ""
        return (
            f"{len(drifts)} later run{many} replayed at this cost ran {'their' if many else 'its'} "
            f"steps {factor_span(drifts)} as long{median}{noise}"
        )

    def measured_error(self) -> str:
        """Its fit error and, where later runs were checked, how far they drifted."""
        said = self.checks_said()
        return self.fit_error() if said is None else f"{self.fit_error()}; {said}"

    def describe(self, now: float | None = None) -> str:
        """What it was fitted on and how well; with `now`, how long ago it was measured (the
        machine's speed moves with time, docs/simulator.md)."""
        tuned = (
            f"; under load (an open-loop run at {self.tuned_rate:g} req/s) steps x"
            f"{self.load_scale:.2f} and the API {self.load_api_s * 1000:+.0f} ms"
            if self.tuned_rate is not None
            else ""
        )
        if self.step_kinds:
            tuned += f", fitted again with {self.step_kinds} kinds of its steps"
        if self.shape_s or self.replan_s:
            tuned += (
                f"; a step with a token count never run takes {self.shape_s * 1000:.2f} ms "
                f"more, one run before but not among the last {SHAPE_PLANS} "
                f"{self.replan_s * 1000:.2f} ms"
            )
        if self.saturated_rate is not None:
            tuned += (
                f"; each request arriving while a batch runs takes "
                f"{self.arrival_s * 1000:.2f} ms of the engine's steps "
                f"(an open-loop run past the knee at {self.saturated_rate:g} req/s)"
            )
            if self.load_seq_s:
                tuned += f", a sequence {self.load_seq_s * 1e6:+.0f} us a step in a full batch"
            if self.queued_tpot:
                low, high = np.quantile(self.queued_tpot, [0.1, 0.9])
                tuned += (
                    f", a TPOT where the queue stood x{low:.2f} to x{high:.2f} the simulated "
                    f"(10th-90th percentile of {len(self.queued_tpot)} requests)"
                )
        if self.noise:
            ttft = np.quantile([t for t, _ in self.noise], [0.5, 0.99]) * 1000
            tuned += (
                f", host noise from its {len(self.noise)} requests (TTFT residual p50 "
                f"{ttft[0]:+.0f} ms, p99 {ttft[1]:+.0f} ms)"
            )
        if self.speed:
            tuned += (
                f", host speed {factor_span(self.speed)} over {len(self.speed)} windows of "
                f"{SPEED_WINDOW_S:g} s"
            )
        if self.checks:
            tuned += f"; {self.checks_said()}"
        if (scale := self.checked_scale()) != 1.0:
            tuned += (
                f"; predicted at x{scale:.2f} of this cost, as the {len(self.checks_since_tune())} "
                "runs checked since the tune ran their steps (geometric mean)"
            )
        if now is not None and self.fitted_at is not None:
            tuned += f"; fitted {_ago(now - self.fitted_at)}"
            if self.tuned_at is not None and abs(self.tuned_at - self.fitted_at) > 60:
                tuned += f", tuned {_ago(now - self.tuned_at)}"
        return (
            f"calibrated on {self.target or 'an engine'} from {self.samples} measurements: "
            f"{self.fit_error()}; prompts up to {self.max_prompt:,} tokens, batches up to "
            f"{self.max_batch}{tuned}"
        )


STALE_AFTER_S = 3600.0


def drift_of(
    calibration: Calibration,
    requests: Sequence[SimRequest],
    tpot_mean_s: float,
    config: EngineConfig | None = None,
) -> float:
    """How many times as long the steps of an open-loop run of `requests` ran as
    `calibration` says: the scale of its step cost at which a replay of the run on `config`
    (the engine it ran on; by default the one fitted) gives the run's measured TPOT mean."""
    config = config or calibration.config()
    cost = calibration.cost()

    def tpot_mean(k: float) -> float:
        tpots = [r.tpot_s for r in simulate(requests, config, cost.scaled(k)) if r.tpot_s]
        if not tpots:
            raise InvalidInput("the run has no request with two tokens to check it on")
        return float(np.mean(tpots))

    return _bisect(tpot_mean, tpot_mean_s, 0.125, 8.0, 24, log=True)  # (to 1e-6 of it)


def noise_of(
    calibration: Calibration,
    requests: Sequence[SimRequest],
    measured: Sequence[tuple[float, float]],
    drift: float,
    config: EngineConfig | None = None,
) -> list[tuple[float, float]]:
    """The host's noise in a later open-loop run of `requests` (each one's measured (TTFT,
    E2E), in the same order): what a replay at the calibration's step cost times the run's
    `drift` (`drift_of`), at the host's speed the run had window by window, and with the
    calibration's API time, leaves of each, at most CHECK_NOISE_SAMPLES evenly taken. The
    run's own measure of the stalls that a p99 below the knee is made of, where the tuning
    run's is one sample of a few minutes (`planner.simulate.whatif.redrawn`)."""
    config = config or calibration.config()
    cost = calibration.cost().scaled(drift)

    def replayed(speed: HostSpeed | None) -> dict[int, RequestResult]:
        results = simulate(requests, config, cost, speed=speed)
        return {id(r.request): r for r in results if not r.refused}

    noise, _ = _residuals(requests, measured, replayed, calibration.request_s)
    return _evenly(noise, CHECK_NOISE_SAMPLES)


def _residuals(
    requests: Sequence[SimRequest],
    measured: Sequence[tuple[float, float]],
    replayed: Callable[[HostSpeed | None], dict[int, RequestResult]],
    api_s: float,
) -> tuple[list[tuple[float, float]], list[float]]:
    """Each request's measured (TTFT, E2E) less its replay's and `api_s`, the replay made
    at the host's speed the run had window by window; and those windows (`host_speed`)."""
    if len(measured) != len(requests):
        raise InvalidInput(
            f"{len(measured)} measured latencies for {len(requests)} replayed requests"
        )
    results = replayed(None)
    speed, in_order = host_speed(requests, results, measured)
    if in_order is not None:
        results = replayed(in_order)
    noise = []
    for req, (ttft_s, e2e_s) in zip(requests, measured, strict=True):
        r = results.get(id(req))
        if r is not None and r.ttft_s is not None and r.e2e_s is not None:
            noise.append((ttft_s - r.ttft_s - api_s, e2e_s - r.e2e_s - api_s))
    return noise, speed


def _evenly(items: list[_T], most: int) -> list[_T]:
    """At most `most` of `items`, evenly taken."""
    return items[:: max(1, math.ceil(len(items) / most))]


def checked(calibration: Calibration, check: Check) -> Calibration:
    """`calibration` with `check` kept (the newest MAX_CHECKS; the host noise of the newest
    NOISE_CHECKS that have it)."""
    kept, noisy = [], 0
    for c in reversed([*calibration.checks, check][-MAX_CHECKS:]):
        noisy += bool(c.noise)
        kept.append(c if noisy <= NOISE_CHECKS else c.model_copy(update={"noise": []}))
    return calibration.model_copy(update={"checks": kept[::-1]})


# Checks since the tune that, all off the same way by more than DRIFTED, call for a
# retune however young the tune; and the fewest checks on each side, queued and not, whose
# medians set more than DRIFTED apart call for a new calibration (`retune_hint`).
DRIFTED_RUNS = 3
DRIFTED = 0.10
SPLIT_RUNS = 2


def retune_hint(calibration: Calibration, now: float) -> str | None:
    """What to run when the checks since the tune say the full batch's cost is off (the
    runs that queued drifted apart from those that did not: a retune keeps that cost, a
    calibration measures it again), when the tune was made on an unsteady host (its
    windows' speeds more than UNSTEADY_SPAN apart), when the last DRIFTED_RUNS checks all
    ran their steps more than DRIFTED longer, or all shorter, or when the tune is over
    STALE_AFTER_S old (on a shared machine the step scale moved from about x1.2 to x2.0
    between sessions); None otherwise."""
    tuned = calibration.last_tuned
    target = calibration.target or "NAME"
    since = calibration.checks_since_tune()
    anew = f"kvscope simulate calibrate --target {target} (up to 10 minutes) measures it again"
    if split := _full_batch_split(since):
        return f"{split}: the cost of a full batch is off, which a retune keeps; {anew}"
    if unsteady := unsteady_tune(calibration):
        return (
            f"{unsteady}: a calibration made while the machine is steadier predicts better; {anew}"
        )
    retune = (
        f"kvscope simulate calibrate --target {target} --retune (a minute or two) measures it again"
    )
    last = [c.drift for c in since[-DRIFTED_RUNS:]]
    if len(last) == DRIFTED_RUNS and (min(last) > 1 + DRIFTED or max(last) < 1 - DRIFTED):
        return (
            f"the last {DRIFTED_RUNS} runs checked since the tune ran the steps "
            f"{factor_span(last)} as long as calibrated: {retune}"
        )
    if tuned is None or now - tuned <= STALE_AFTER_S:
        return None
    return (
        f"the step cost was tuned {_ago(now - tuned)}, and a machine's speed under load moves "
        f"with time: {retune}"
    )


# A tuning run whose host ran its slowest window more than UNSTEADY_SPAN times as long as
# its fastest was made on an unsteady host: the calibration makes it once more and keeps
# the steadier (`probes.kinds.calibration`), and a kept one still past it calls for a new
# calibration (`retune_hint`). On the CPU engine, since BA,
# the runs tuned within 1.15 met 7-20 of 21 figures (BM's 7: its slow drain); BE at 1.21
# met 6; BD and BQ-BT at 1.37-2.21 met 0-6.
UNSTEADY_SPAN = 1.25


def speed_span(calibration: Calibration) -> float:
    """How far apart the tuning run's host speed windows ran: the fastest over the slowest
    (1 where none was measured)."""
    return max(calibration.speed) / min(calibration.speed) if calibration.speed else 1.0


def unsteady_tune(calibration: Calibration) -> str | None:
    """What the tuning run's host speed says where its windows spread past UNSTEADY_SPAN."""
    span = speed_span(calibration)
    if span <= UNSTEADY_SPAN:
        return None
    return (
        f"the tuning run's host ran {factor_span(calibration.speed)} window to window, x"
        f"{span:.2f} apart (a steady host's within x{UNSTEADY_SPAN:.2f})"
    )


# A new calibration whose engine completes more than MOVED times as many, or as few,
# requests a second as the previous one of the same engine did as its latest checks ran
# (`moved_since`) was measured on a host that moved: BW's whole calibration ran in a slow
# spell (its quiet step's overhead 4.94 ms where BU's and BV's read 2.07 and 1.30), and
# the runs after ran their steps at a median x0.46 of it.
MOVED = 1.5


def moved_since(previous: Calibration, new: Calibration, now: float) -> str | None:
    """What a new calibration of the same engine says of its host against the previous
    one, taken at the speed its last DRIFTED_RUNS checks since its tune ran (as calibrated
    where none): None within MOVED, or for another engine (not comparable)."""
    if previous.engine != new.engine:
        return None
    last = [c.drift for c in previous.checks_since_tune()[-DRIFTED_RUNS:]]
    drift = float(np.median(last)) if last else 1.0
    said = capacity_estimate(previous)
    before, now_rps = said / drift, capacity_estimate(new)
    if 1 / MOVED <= before / now_rps <= MOVED:
        return None
    when = f" (fitted {_ago(now - previous.fitted_at)})" if previous.fitted_at else ""
    as_run = f", {before:.3g} at the speed its last {len(last)} runs checked ran" if last else ""
    return (
        f"this calibration says the engine completes {now_rps:.3g} req/s with every slot "
        f"full; the previous one{when} said {said:.3g}{as_run}: the host ran "
        f"{'slower' if before > now_rps else 'faster'} while this one measured, and if that "
        "was a passing spell, the runs checked next call for a retune"
    )


def _full_batch_split(checks: Sequence[Check]) -> str | None:
    """What the checks say where the runs that queued (full batches) and those that did
    not drifted more than DRIFTED apart (medians, SPLIT_RUNS on each side at least)."""
    full = [c.drift for c in checks if c.queued]
    other = [c.drift for c in checks if c.queued is False]
    if min(len(full), len(other)) < SPLIT_RUNS:
        return None
    if abs(float(np.median(full)) / float(np.median(other)) - 1) <= DRIFTED:
        return None
    return (
        f"since the tune, the runs that queued (their batches full) ran the steps "
        f"{factor_span(full)} as long as calibrated, those that did not {factor_span(other)}"
    )


def factor_span(drifts: Sequence[float]) -> str:
    """Factors as a person reads them: "x0.88 to x1.04", or "x1.04" where they agree."""
    low, high = f"x{min(drifts):.2f}", f"x{max(drifts):.2f}"
    return low if low == high else f"{low} to {high}"


def _ago(seconds: float) -> str:
    minutes = max(seconds, 0.0) / 60
    if minutes < 1:
        return "under a minute ago"
    if minutes < 120:
        return f"{minutes:.0f} min ago"
    if minutes < 48 * 60:
        return f"{minutes / 60:.0f} h ago"
    return f"{minutes / 1440:.0f} days ago"


def _lone_chunks(prompt: int, config: EngineConfig) -> list[int]:
    """The chunks a lone prompt's prefill takes, one step each: the token budget's."""
    cap = min(config.max_num_batched_tokens, config.prefill_cap)
    return [min(cap, prompt - done) for done in range(0, prompt, cap)]


def _prefill_row(prompt: int, config: EngineConfig) -> list[float]:
    """Features of a lone prompt's prefill: one step per chunk of the token budget."""
    row = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    done = 0
    for chunk in _lone_chunks(prompt, config):
        row[0] += 1
        row[1] += chunk
        row[2] += 1
        row[3] += pairs_of(chunk, done)
        row[4] += done + chunk
        done += chunk
    return row


def fit(
    decodes: Sequence[DecodeSample],
    prefills: Sequence[PrefillSample],
    config: EngineConfig,
) -> Calibration:
    """The step cost that best explains the samples (relative least squares over the median
    of each batch size and each prompt length, coefficients non-negative). Needs decode
    samples at two batch sizes or more and prefill samples at two prompt lengths or more,
    or the coefficients cannot be told apart."""
    if len({d.batch for d in decodes}) < 2:
        raise InvalidInput("calibration needs decode gaps measured at two batch sizes or more")
    if len({p.prompt_tokens for p in prefills}) < 2:
        raise InvalidInput("calibration needs TTFTs of lone requests at two prompt lengths or more")
    if any(d.itl_s <= 0 for d in decodes) or any(p.ttft_s <= 0 for p in prefills):
        raise InvalidInput("measured latencies must be above 0")
    # Columns: steps (overhead), tokens, sequences, attention pairs, cached tokens, the
    # API's time, and a lone decode's step (an engine woken from idle for a few steps runs
    # them slower than a busy one: its own term, fitted and left out of the step cost, so
    # that the lone decodes say how a step grows with the context, not how fast it is).
    rows, y = [], []
    # In a closed loop each request's prompt joins the decodes of the others once in its
    # life of `output` steps: on average a step also carries batch / output prompts.
    prompt, output = SWEEP_CONTEXT
    mixed = pairs_of(min(prompt, config.max_num_batched_tokens), 0) / output
    for batch, alone, context in sorted({(d.batch, d.alone, d.context) for d in decodes}):
        same = [d for d in decodes if (d.batch, d.alone, d.context) == (batch, alone, context)]
        held = batch * (context + 1)
        if alone:
            rows.append([1.0, batch, batch, held, held, 0.0, 1.0])
        else:
            tokens = batch * (1 + prompt / output)
            joined = batch * prompt / output
            rows.append([1.0, tokens, batch, held + batch * mixed, held + joined, 0.0, 0.0])
        y.append(float(np.median([d.itl_s for d in same])))
    for prompt in sorted({p.prompt_tokens for p in prefills}):
        rows.append(_prefill_row(prompt, config))
        y.append(float(np.median([p.ttft_s for p in prefills if p.prompt_tokens == prompt])))
    beta, low, high = _solved(rows, y)
    return Calibration(
        **_coefficients(beta),
        residual_low=low,
        residual_high=high,
        quiet_rows=rows,
        quiet_s=y,
        samples=len(decodes) + len(prefills),
        max_prompt=max(p.prompt_tokens for p in prefills),
        max_batch=max(d.batch for d in decodes),
        engine={
            "num_blocks": config.num_blocks,
            "block_size": config.block_size,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "chunked_prefill": config.chunked_prefill,
            "max_model_len": config.max_model_len,
            "long_prefill_token_threshold": config.long_prefill_token_threshold,
        },
    )


# The fitted coefficients, in the order of the fit's columns; the last column, a lone
# decode's step, is fitted and left out (`fit`).
_COEFFICIENTS = ("overhead_s", "token_s", "seq_s", "pair_s", "kv_s", "api_s")


def _coefficients(beta: np.ndarray) -> dict[str, float]:
    """A fit's solution as the calibration's coefficients."""
    return {name: float(b) for name, b in zip(_COEFFICIENTS, beta, strict=False)}


def quiet_fit(
    sweep: Sweep,
    lone: Iterable[tuple[int | None, int | None, float | None, float | None]],
    config: EngineConfig,
) -> Calibration:
    """The fit of a calibration's first two measurements: a batch sweep's result and lone
    requests' (prompt tokens, output tokens, TTFT, E2E) records."""
    lone = list(lone)
    return fit(
        decode_samples(sweep) + lone_decodes(lone),
        sweep_prefills(sweep) + prefill_samples((p, ttft) for p, _, ttft, _ in lone),
        config,
    )


def _solved(rows: Sequence[Sequence[float]], y: Sequence[float]) -> tuple[np.ndarray, float, float]:
    """The coefficients that best explain `y` from `rows` (relative least squares, each
    non-negative), and the 10th and 90th percentiles of measured / fitted - 1."""
    x, ys = np.asarray(rows, dtype=float), np.asarray(y, dtype=float)
    beta = _nonnegative_fit(x / ys[:, None], np.ones_like(ys))
    low, high = np.quantile(ys / (x @ beta) - 1.0, [0.1, 0.9])
    return beta, float(low), float(high)


# Steps of one kind (requests decoding, prefills finished) a refit needs to read that kind.
STEP_KIND_MIN = 20


def step_rows(
    steps: Iterable[ObservedStep], config: EngineConfig
) -> list[tuple[list[float], float, bool]]:
    """The fit's rows from steps read back from a run's token times: one per kind of step
    (requests decoding, prompts whose prefill it finished) seen STEP_KIND_MIN times, its
    features' mean and its median length, and whether it finished a prefill."""
    kinds: dict[tuple[int, tuple[int, ...]], list[ObservedStep]] = {}
    for step in steps:
        if step.seconds is not None and step.seconds > 0:
            kinds.setdefault((step.decodes, tuple(sorted(step.prefills))), []).append(step)
    out = []
    for (_, prefills), same in sorted(kinds.items()):
        if len(same) >= STEP_KIND_MIN:
            features = np.mean([s.features(config) for s in same], axis=0)
            seconds = float(np.median([s.seconds for s in same if s.seconds is not None]))
            out.append(([1.0, *features.tolist(), 0.0, 0.0], seconds, bool(prefills)))
    return out


def on_steps(calibration: Calibration, steps: Iterable[ObservedStep]) -> Calibration:
    """The quiet fit made again with the steps of a run under load beside its own rows.
    A lone prompt's TTFT is the API's time plus its prefill, and the quiet fit cannot tell
    the two apart well; a step that finishes a prefill among decodes measures the
    prefill's cost alone (on the CPU engine the quiet fit had a 256-token prefill at about
    half what such steps took). The steps ran under load: they are first brought to the
    quiet fit's speed (the median ratio of their decode-only kinds to it), and the tune's
    scale puts the load back. Unchanged without the quiet rows (a calibration stored
    before they were kept) or without two decode-only kinds and one that finished a
    prefill."""
    config = calibration.config()
    rows = step_rows(steps, config)
    plain = [(row, y) for row, y, prefill in rows if not prefill]
    if not calibration.quiet_rows or len(plain) < 2 or len(plain) == len(rows):
        return calibration
    quiet = np.array([*(getattr(calibration, name) for name in _COEFFICIENTS), 0.0])
    load = float(np.median([y / float(np.dot(row, quiet)) for row, y in plain]))
    # (Rows stored before the cached tokens were fitted: none counted, no lone decodes.)
    stored = [
        r if len(r) == len(quiet) else [*r[:4], 0.0, r[4], 0.0] for r in calibration.quiet_rows
    ]
    beta, low, high = _solved(
        [*stored, *(row for row, _, _ in rows)],
        [*calibration.quiet_s, *(y / load for _, y, _ in rows)],
    )
    return calibration.model_copy(
        update={
            **_coefficients(beta),
            "residual_low": low,
            "residual_high": high,
            "step_kinds": len(rows),
        }
    )


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: drop the most negative and refit."""
    active = list(range(x.shape[1]))
    while True:
        beta = np.zeros(x.shape[1])
        solved, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        beta[active] = solved
        if (beta >= 0).all():
            return beta
        active.remove(int(np.argmin(beta)))
        if not active:
            raise InvalidInput("the measurements fit no positive step cost")


# The open-loop run a calibration is tuned on: this share of the quiet fit's capacity.
LOAD_SHARE = 0.4
LOAD_PARAMS: dict[str, Any] = {
    "duration_s": 30.0,
    "arrival": "poisson",
    "profile": {
        "kind": "fixed",
        "prompt_tokens": SWEEP_CONTEXT[0],
        "output_tokens": SWEEP_CONTEXT[1],
    },
    "seed": 11,
}


# A tuning run must not queue: its TTFT would be the queue's, and the tune would put the
# queue into the API's time and the step scale (a host-bound engine, whose API server and
# client cannot keep up with what the quiet fit says its steps can, queued at 40 %). Such a
# run is refused and made again at half the rate, at most LOAD_TRIES runs in all. (A late
# sender is no reason: the tune replays the times the requests were sent.)
QUEUED_SHARE = 0.5  # mean queue time over TTFT p50 that says the run queued
LOAD_TRIES = 3


def tuning_refused(run: LoadRun) -> str | None:
    """Why an open-loop run cannot be tuned on, or None."""
    if run.tune_figures is None:
        return "had no request answered with two tokens or more"
    queue, ttft = run.queue_mean_s, run.tune_figures[1]
    if queue is not None and ttft and queue >= QUEUED_SHARE * ttft:
        return (
            f"queued: {queue * 1000:,.0f} ms in the engine's queue on average against a TTFT "
            f"p50 of {ttft * 1000:,.0f} ms"
        )
    return None


# Most host-noise residuals a calibration keeps (the tuning run has about 200 requests).
NOISE_SAMPLES = 256
# The host's speed is measured over windows of SPEED_WINDOW_S (the tuning run has six),
# each with at least this many requests beginning to decode in it.
SPEED_MIN_REQUESTS = 5


def tune(
    calibration: Calibration,
    requests: Sequence[SimRequest],
    rate: float,
    tpot_mean_s: float,
    ttft_p50_s: float,
    measured: Sequence[tuple[float, float]] | None = None,
    steps: Iterable[ObservedStep] | None = None,
    config: EngineConfig | None = None,
) -> Calibration:
    """The calibration under load: with the run's `steps` (read back from its token
    times), the quiet fit made again beside them (`on_steps`); then the one step-cost scale
    at which a replay of an open-loop run's own requests gives its measured TPOT mean
    (`LoadRun.tune_figures`), then the API time that gives its TTFT p50. A quiet closed
    loop and lone requests miss what load adds on a shared machine (the API server and the
    client taking CPU from the engine's steps). With each request's measured (TTFT, E2E),
    in the order of `requests`, the host's speed window by window (`host_speed`), and what
    the tuned replay at that speed does not explain is kept as the host's noise. The replay
    runs on `config`, the engine the run was made on (by default the one fitted on): on
    another, the waits and recomputes for its blocks would be put into the scale and the
    API time."""
    if steps is not None:
        calibration = on_steps(calibration, steps)
    config = config or calibration.config()

    def replayed(scale: float, speed: HostSpeed | None = None) -> dict[int, RequestResult]:
        cost = calibration.model_copy(update={"load_scale": scale}).cost()
        results = simulate(requests, config, cost, speed=speed)
        return {id(r.request): r for r in results if not r.refused}

    def figures(results: dict[int, RequestResult]) -> tuple[float, float]:
        """The replay's (TPOT mean, TTFT p50)."""
        tpots, ttfts = [], []
        for r in results.values():
            if r.tpot_s is not None:
                tpots.append(r.tpot_s)
            if r.ttft_s is not None:
                ttfts.append(r.ttft_s)
        if not tpots or not ttfts:
            raise InvalidInput("the open-loop run has no request with two tokens to tune on")
        return float(np.mean(tpots)), float(np.median(ttfts))

    # TPOT grows with the step cost.
    scale = _bisect(lambda k: figures(replayed(k))[0], tpot_mean_s, 0.25, 8.0, 40, log=True)
    results = replayed(scale)
    api_s = ttft_p50_s - figures(results)[1]  # the API's time under load: request_s
    noise: list[tuple[float, float]] = []
    speed: list[float] = []
    if measured is not None:
        noise, speed = _residuals(
            requests, measured, lambda at: results if at is None else replayed(scale, at), api_s
        )
        noise = _evenly(noise, NOISE_SAMPLES)
    return calibration.model_copy(
        update={
            "load_scale": scale,
            "load_api_s": api_s - calibration.api_s,
            "tuned_rate": rate,
            "noise": noise,
            "speed": speed,
        }
    )


# The open-loop run past the knee a calibration measures what arrivals cost on
# (`arrival_cost`): twice the capacity, so that the queue forms within a second (at 1.5
# times the CPU engine once kept up, its queue time a mean of 0.3 s), for 20 s; the queue
# it leaves drains for about as long.
SATURATED_SHARE = 2.0
SATURATED_PARAMS: dict[str, Any] = dict(LOAD_PARAMS, duration_s=20.0, seed=23)
# Its requests that began decoding in the first ARRIVAL_SETTLE_S are left out (at two
# rates the CPU engine's first 10 s ran a tenth slower than the rest, overload 11), and so
# are the last `max_num_seqs` to begin (the batch empties under them); each side needs
# ARRIVAL_MIN_REQUESTS.
ARRIVAL_SETTLE_S = 5.0
ARRIVAL_MIN_REQUESTS = 30


@dataclass(frozen=True, slots=True)
class _Sides:
    """An open-loop run past the knee, its requests by when they decoded: the TPOTs of
    those that decoded while requests arrived (from ARRIVAL_SETTLE_S in to the last send)
    and of those that began in the queue's drain after it, and the rate they arrived at."""

    arriving: list[float]
    drain: list[float]
    rate: float
    arriving_at: list[int]  # the arriving side's places in the run's requests


def _sides(
    requests: Sequence[SimRequest], measured: Sequence[tuple[float, float]], max_num_seqs: int
) -> _Sides:
    if len(measured) != len(requests):
        raise InvalidInput(f"{len(measured)} measured latencies for {len(requests)} requests")
    sends = [r.arrival_s for r in requests]
    first, last = min(sends, default=0.0), max(sends, default=0.0)
    rate = (len(sends) - 1) / (last - first) if last > first else 0.0
    decoded = sorted(
        (req.arrival_s + ttft, req.arrival_s + e2e, (e2e - ttft) / (req.output_tokens - 1), i)
        for i, (req, (ttft, e2e)) in enumerate(zip(requests, measured, strict=True))
        if req.output_tokens > 1
    )[: -max_num_seqs or None]  # (the batch empties under the last to begin)
    arriving = [(tpot, i) for began, end, tpot, i in decoded
                if began >= first + ARRIVAL_SETTLE_S and end <= last]  # fmt: skip
    drain = [tpot for began, _, tpot, _ in decoded if began >= last]
    return _Sides([t for t, _ in arriving], drain, rate, [i for _, i in arriving])


def queued_spread(
    calibration: Calibration,
    requests: Sequence[SimRequest],
    measured: Sequence[tuple[float, float]],
) -> list[float]:
    """How a TPOT where the queue stood strays from the simulated one (`queued_tpot`): for
    each request of the run past the knee that decoded while requests arrived, its measured
    TPOT over the replay's with the calibrated cost, over their mean (the level is the
    cost's: this is the spread); at most NOISE_SAMPLES, evenly taken, and none when fewer
    than ARRIVAL_MIN_REQUESTS."""
    config = calibration.config()
    sides = _sides(requests, measured, config.max_num_seqs)
    replayed = {id(r.request): r for r in simulate(requests, config, calibration.cost())}
    ratios = []
    for tpot, i in zip(sides.arriving, sides.arriving_at, strict=True):
        sim = replayed.get(id(requests[i]))
        if sim is not None and sim.tpot_s:
            ratios.append(tpot / sim.tpot_s)
    if len(ratios) < ARRIVAL_MIN_REQUESTS:
        return []
    mean = float(np.mean(ratios))
    return [r / mean for r in _evenly(ratios, NOISE_SAMPLES)]


# The host's speed while requests arrived, against the drain's (`host_drift`): from a full
# batch's decode-only steps that began with no request sent from QUIET_BEFORE_S before to
# QUIET_AFTER_STEPS typical steps after (on the CPU engine an arrival lengthened, as the
# client saw it, the step it fell in by 0.7-2.2 ms and the step after by 0.1-0.4 ms), each
# side at least ARRIVAL_MIN_STEPS.
QUIET_BEFORE_S = 0.010
QUIET_AFTER_STEPS = 1.5
ARRIVAL_MIN_STEPS = 100


@dataclass(frozen=True, slots=True)
class QuietSteps:
    """A run past the knee's full-batch decode-only steps, their lengths in seconds: those
    that began from ARRIVAL_SETTLE_S in to the last send, the quiet ones among them (nothing
    sent from QUIET_BEFORE_S before their start to `after_s` after), and those that began
    after the last send (the drain)."""

    arriving: np.ndarray
    quiet: np.ndarray
    drain: np.ndarray
    after_s: float


def quiet_steps(
    steps: Sequence[ObservedStep], sends: Sequence[float], max_num_seqs: int
) -> QuietSteps | None:
    """The run's steps (as the client saw them, `observed_steps`) by when they began against
    its send times (on the same clock); None with no send or no step of a full batch."""
    sent = np.sort(np.asarray(sends, dtype=float))
    full = np.array(
        [(s.at_s - s.seconds, s.seconds) for s in steps
         if s.seconds and not s.prefills and s.decodes >= max_num_seqs],
        dtype=float,
    ).reshape(-1, 2)  # fmt: skip
    if len(sent) < 2 or not len(full):
        return None
    after = QUIET_AFTER_STEPS * float(np.median(full[:, 1]))
    began, took = full[:, 0], full[:, 1]
    near = np.searchsorted(sent, began + after) - np.searchsorted(sent, began - QUIET_BEFORE_S)
    arriving = (began >= sent[0] + ARRIVAL_SETTLE_S) & (began + after <= sent[-1])
    return QuietSteps(took[arriving], took[arriving & (near == 0)], took[began > sent[-1]], after)


def host_drift(
    steps: Sequence[ObservedStep], sends: Sequence[float], max_num_seqs: int
) -> tuple[float | None, str]:
    """How fast the host ran the steps while requests arrived, against the drain after
    the last send, from an open-loop run past the knee (`quiet_steps`): the quiet steps'
    mean over the drain's. Steps are chosen by when they began (a longer step holds more
    sends), and neither side has arrivals near, so the ratio is the host's. (ratio, how it
    was read), or (None, why not)."""
    read = quiet_steps(steps, sends, max_num_seqs)
    if read is None:
        return None, "its answers show no step of a full batch"
    if min(len(read.quiet), len(read.drain)) < ARRIVAL_MIN_STEPS:
        return None, (
            f"{len(read.quiet)} steps of a full batch began while requests arrived with "
            f"nothing sent from {QUIET_BEFORE_S * 1000:.0f} ms before to "
            f"{read.after_s * 1000:.1f} ms after, {len(read.drain)} in the drain; each needs "
            f"{ARRIVAL_MIN_STEPS}"
        )
    calm, drained = float(np.mean(read.quiet)), float(np.mean(read.drain))
    return calm / drained, (
        f"a full batch's steps with nothing sent near them took {calm * 1000:.2f} ms while "
        f"requests arrived, {drained * 1000:.2f} ms in the drain ({len(read.quiet)} and "
        f"{len(read.drain)} steps)"
    )


def arrival_cost(
    requests: Sequence[SimRequest],
    measured: Sequence[tuple[float, float]],
    max_num_seqs: int,
    drift: float | None = None,
) -> tuple[float | None, str]:
    """The engine time each arrival takes (`StepCost.arrival_s`), from an open-loop run past
    the knee (its requests as sent and their measured (TTFT, E2E)): the TPOT mean of the
    requests that decoded while requests still arrived against that of those that began
    decoding in the queue's drain after the last send. Both decode in a full batch with a
    queue behind it, the same steps but for the arrivals: at rate r and steps of s (the
    arriving mean), r s requests arrive a step, so each costs c = (arriving - drain) / (r
    s). The two sides are a minute apart, and a shared host's drift between them is as
    large as the effect, so the drain is taken at the arriving side's host speed where
    `host_drift` read it (`drift`): on the CPU engine five runs of one engine read
    0.47-1.23 ms so, 0.00-2.52 ms without. (cost, how it was read), or (None, why not)
    when the run has too few of either side (an engine that kept up leaves no queue to
    drain). A drain slower than the arrivals reads 0."""
    sides = _sides(requests, measured, max_num_seqs)
    arriving, drain = sides.arriving, sides.drain
    if not sides.rate:
        return None, "it sent too few requests to read a rate from"
    if min(len(arriving), len(drain)) < ARRIVAL_MIN_REQUESTS:
        return None, (
            f"{len(arriving)} requests decoded while requests arrived and {len(drain)} in "
            f"the queue's drain; each needs {ARRIVAL_MIN_REQUESTS}"
            + (" (the engine kept up: no queue to drain)" if len(drain) < len(arriving) else "")
        )
    during, after = float(np.mean(arriving)), float(np.mean(drain))
    cost = max(0.0, during - after * (drift or 1.0)) / (sides.rate * during)
    how = (
        f"TPOT mean {during * 1000:.2f} ms while {sides.rate:.1f} req/s arrived, "
        f"{after * 1000:.2f} ms in the drain ({len(arriving)} and {len(drain)} requests)"
    )
    return cost, how + (f", the drain's taken x{drift:.3f} for the host" if drift else "")


# Lone requests of each kind (a token count never run, one kept, one evicted) that
# `shape_cost` needs to read a difference from the kept.
SHAPE_MIN_REQUESTS = 8


def shape_cost(
    calibration: Calibration, lone: Sequence[tuple[int, int, float]]
) -> tuple[tuple[float, float] | None, str]:
    """What a step takes to plan its matmuls for a token count the engine never ran
    (`StepCost.shape_s`) and for one it ran before but not among its last
    `StepCost.shape_plans` (`replan_s`), from lone requests in the order sent, as (prompt
    tokens, output tokens, TTFT): their steps' counts run through the engine's plans tell
    which kind each prompt met; each kind's median TTFT over the quiet fit's lone TTFT,
    less that of the prompts whose counts were kept, is its cost (at least 0). ((new,
    again), how it was read), or (None, why not) with too few new or kept; too few
    planned again read 0."""
    config = calibration.config()
    plans = MatmulPlans(SHAPE_PLANS)
    over: tuple[list[float], list[float], list[float]] = ([], [], [])  # (by KEPT, ...)
    coefficients = np.array([getattr(calibration, name) for name in _COEFFICIENTS])
    for prompt, output, ttft in lone:
        met = max(plans.use(c) for c in _lone_chunks(prompt, config))  # (each, in order)
        if output > 1:
            plans.use(1)  # (its decodes)
        alone = float(np.dot(_prefill_row(prompt, config)[: len(coefficients)], coefficients))
        over[met].append(ttft - alone)
    kept, again, new = (len(o) for o in over)
    if min(kept, new) < SHAPE_MIN_REQUESTS:
        return None, (
            f"{new} lone prompts needed plans never built and {kept} found theirs kept; each "
            f"kind needs {SHAPE_MIN_REQUESTS}"
        )
    base = float(np.median(over[KEPT]))
    costs = [
        max(0.0, float(np.median(o)) - base) if len(o) >= SHAPE_MIN_REQUESTS else 0.0
        for o in (over[NEW], over[REPLANNED])
    ]
    how = (
        f"the TTFT of {new} lone prompts whose token count was never run ran "
        f"{(base + costs[0]) * 1000:+.2f} ms over the quiet fit, of {kept} whose count was kept "
        f"{base * 1000:+.2f} ms, "
    )
    how += (
        f"of {again} run before but not kept {(base + costs[1]) * 1000:+.2f} ms"
        if again >= SHAPE_MIN_REQUESTS
        else f"{again} run before but not kept (too few to read: 0)"
    )
    return (costs[0], costs[1]), how


# The full batch's fit and the tune made again after it alternate (`full_batch`) until a
# sequence's cost moves by less than FULL_BATCH_SETTLED_S, at most FULL_BATCH_ROUNDS times.
FULL_BATCH_ROUNDS = 8
FULL_BATCH_SETTLED_S = 2e-6


def full_batch(
    calibration: Calibration,
    requests: Sequence[SimRequest],
    measured: Sequence[tuple[float, float]],
    tune_again: Callable[[Calibration], Calibration],
) -> Calibration:
    """The tuned calibration with a full batch's steps as the run past the knee measured
    them: the cost a sequence adds to a step under load (`load_seq_s`) at which the
    replay's drain (`_sides`: a full batch, a queue, nothing arriving) gives the drain's
    measured TPOT mean, then the tune made again (`tune_again`, on its own run) so that
    small batches keep theirs; in turn until that cost settles. The tuning run at 40 % of
    capacity seldom fills the batch, and one scale on every step put the CPU engine's
    full-batch drain 12-13 % faster than measured (about 2.4 ms against 2.69-2.71), so the
    simulator served 18 % more than the engine at 5 % over its capacity (44.8 req/s
    against 38). Unchanged when the run has too few requests in its drain, or when no
    cost a sequence within reach gives it."""
    config = calibration.config()
    seqs = config.max_num_seqs
    target = _sides(requests, measured, seqs).drain
    if len(target) < ARRIVAL_MIN_REQUESTS:
        return calibration
    want = float(np.mean(target))

    def drain_mean(cal: Calibration) -> float:
        results = {id(r.request): r for r in simulate(requests, config, cal.cost())}
        replayed = [(r.ttft_s or 0.0, r.e2e_s or 0.0) for r in (results[id(q)] for q in requests)]
        drain = _sides(requests, replayed, seqs).drain
        return float(np.mean(drain)) if drain else math.nan

    cal = calibration
    for _ in range(FULL_BATCH_ROUNDS):

        def with_extra(extra: float, base: Calibration = cal) -> float:
            return drain_mean(base.model_copy(update={"load_seq_s": extra}))

        low, high = -cal.seq_s, cal.overhead_s  # (a sequence costs at most a step's overhead more)
        if not with_extra(low) <= want <= with_extra(high):
            break  # (nothing within reach: the tune stands)
        before, extra = cal.load_seq_s, _bisect(with_extra, want, low, high, 20, log=False)
        cal = tune_again(cal.model_copy(update={"load_seq_s": extra}))
        if abs(extra - before) < FULL_BATCH_SETTLED_S:
            break
    return cal


def _bisect(
    grows: Callable[[float], float],
    target: float,
    low: float,
    high: float,
    steps: int,
    *,
    log: bool,
) -> float:
    """The x in [low, high] where `grows` (increasing in x) reaches `target`, by `steps`
    halvings; on a log scale with `log` (a scale is as likely to be half as twice; a
    range from below 0 cannot be)."""

    def middle(a: float, b: float) -> float:
        return math.sqrt(a * b) if log else (a + b) / 2

    for _ in range(steps):
        mid = middle(low, high)
        if grows(mid) < target:
            low = mid
        else:
            high = mid
    return middle(low, high)


def host_speed(
    requests: Sequence[SimRequest],
    replayed: Mapping[int, RequestResult],
    measured: Sequence[tuple[float, float]],
) -> tuple[list[float], HostSpeed | None]:
    """The host's speed in an open-loop run, window by window: for the requests that began
    decoding in each SPEED_WINDOW_S window (SPEED_MIN_REQUESTS at least), their measured
    TPOT median over the replay's, scaled so that the windows' mean is 1 (the tuning
    already matched the run's TPOT mean: drawn windows spread the steps around it, they do
    not slow them again). Also the run's own speed in order, to replay it with (None when
    no window had enough requests)."""
    windows: dict[int, tuple[list[float], list[float]]] = {}
    for req, (ttft_s, e2e_s) in zip(requests, measured, strict=True):
        r = replayed.get(id(req))
        if r is None or r.tpot_s is None or req.output_tokens < 2:
            continue
        i = int((req.arrival_s + ttft_s) // SPEED_WINDOW_S)
        got, simulated = windows.setdefault(i, ([], []))
        got.append((e2e_s - ttft_s) / (req.output_tokens - 1))
        simulated.append(r.tpot_s)
    ratios = {
        i: float(np.median(got) / np.median(simulated))
        for i, (got, simulated) in windows.items()
        if len(got) >= SPEED_MIN_REQUESTS and np.median(got) > 0
    }
    if not ratios:
        return [], None
    middle = float(np.mean(list(ratios.values())))
    factors = {i: ratio / middle for i, ratio in ratios.items()}
    # In order, a window without enough requests at the mean speed, and so past the
    # run for as long again as it lasted (the queue's drain).
    windows_run = 2 * max(max(factors), int(requests[-1].arrival_s // SPEED_WINDOW_S)) + 2
    in_order = tuple(factors.get(i, 1.0) for i in range(windows_run))
    return [factors[i] for i in sorted(factors)], HostSpeed(SPEED_WINDOW_S, in_order)


def load_rate(calibration: Calibration, sweep: Sweep | None = None) -> float:
    """The rate of the open-loop run to tune on: LOAD_SHARE of `capacity_estimate`, rounded
    to what a person would type."""
    return round(LOAD_SHARE * capacity_estimate(calibration, sweep), 2)


def saturated_rate(calibration: Calibration, sweep: Sweep | None = None) -> float:
    """The rate of the open-loop run past the knee: SATURATED_SHARE of `capacity_estimate`."""
    return round(SATURATED_SHARE * capacity_estimate(calibration, sweep), 2)


def capacity_estimate(calibration: Calibration, sweep: Sweep | None = None) -> float:
    """Requests a second the engine completes with every slot full, as the fit says. With
    the batch sweep's summary, no more than the most it completed (its requests are the
    open-loop runs' shape): the fit counts the engine's steps only, and on a shared machine
    the API server and the client may not keep up with them (a quiet fit of the 4-slot CPU
    engine once said 352 req/s where the sweep completed 30)."""
    from planner.simulate.whatif import Scenario, capacity_rps
    from planner.workload import parse_profile

    quiet = Scenario(
        calibration.config(), calibration.cost(), parse_profile(LOAD_PARAMS["profile"]), 200
    )
    capacity = capacity_rps(quiet)
    measured = [x.requests_per_s or 0.0 for x in sweep.steps] if sweep is not None else []
    if max(measured, default=0.0) > 0:
        capacity = min(capacity, max(measured))
    return capacity
