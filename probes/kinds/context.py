"""What every probe run may use: its context, the engine's own view around a run, a sampler.

The context hands a probe its vLLM client (injected: tests pass a loopback server), the
model, a cancel check, a progress callback that also carries partial results, and a sink
for the request records it sends. Nothing here knows the store; `runner.py` wires that up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import sys
import time
from abc import abstractmethod
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from planner import slo
from planner.errors import Cancelled, InvalidInput, KvscopeError
from planner.simulate.calibrate import Calibration
from planner.stats import histogram_quantile
from planner.workload import Arrival, Profile, RequestShape
from probes.engine.spec import EngineSpec
from probes.load.generator import (
    Bounds,
    Progress,
    RequestResult,
    RequestSpec,
    RunResult,
    run_closed_loop,
    run_open_loop,
)
from probes.load.workloads import PromptBuilder
from probes.vllm.client import Api, AsyncVllmClient, Endpoint
from probes.vllm.metrics import ParsedScrape
from storage.schemas import ProbeLimits

T = TypeVar("T")
# Prompts are built before a run starts: each is counted with the target's tokenizer, and
# counting during a run is load on the target beside the run's own. A run gets every prompt
# first when they come to at most PROMPT_TOKENS_AHEAD tokens (about 16 MB of text); a longer
# one a window of that many tokens (PROMPTS_AHEAD requests at most, PROMPTS_AHEAD_MIN at
# least) and the rest as it goes.
PROMPT_TOKENS_AHEAD = 4_000_000
PROMPTS_AHEAD = 4096
PROMPTS_AHEAD_MIN = 256
PROMPT_BUILD_S = 120.0  # allowance for building prompts, in a run's deadline
SAMPLE_TIMEOUT_S = 2.0  # a scrape during a run: short, so a cancel is honoured in time
# A scrape between steps, whose counters a step's verdict rests on: the engine is idle, but
# beside a busy host its API server can take longer than a sample's timeout to answer.
SETTLED_TIMEOUT_S = 10.0


class Figures(BaseModel):
    """Base of typed probe figures: stored as JSON, read back typed; unknown keys ignored, so
    runs stored by an older kvscope still load."""

    model_config = ConfigDict(extra="ignore")


@dataclass(frozen=True)
class PlannedLoad:
    """What a probe's parameters ask of an engine, checked against the limits before it runs.

    `rate` and `step_s` are the highest rate and longest stretch of load of any step,
    `requests` all it plans, `in_flight` a closed loop's concurrency, `run_s` how long the
    whole run may take (its deadline is drawn from it).
    """

    requests: int
    run_s: float
    rate: float | None = None
    step_s: float | None = None
    in_flight: int | None = None


class ProbeParams(BaseModel):
    """Common to every probe's parameters: strict, so a typo is an error, not a default."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    api: Literal["completions", "chat"] = "completions"
    request_timeout_s: float = Field(300.0, gt=0)

    @abstractmethod
    def load(self) -> PlannedLoad:
        """What the run asks for; each kind says."""


class ProbeProgress(Figures):
    """What a running probe reports besides its progress fraction; kinds add partial results."""

    phase: str = ""


class ProbeResult(Figures):
    """Base of every probe's result: the model and target it ran against."""

    model: str | None = None
    target: str | None = None


ProbeCancelled = Cancelled  # the name probes know it by
Report = Callable[[float, ProbeProgress], None]
Sink = Callable[[Sequence[RequestResult], str], None]


def prompt_window(profile: Profile, seed: int, most: int = PROMPTS_AHEAD) -> int:
    """How many prompts a run builds before it starts: PROMPT_TOKENS_AHEAD tokens of the
    profile's first draws, `most` at most and PROMPTS_AHEAD_MIN (or `most`) at least."""
    sample = profile.shapes(PROMPTS_AHEAD_MIN, seed)
    mean = max(1.0, sum(s.prompt_tokens for s in sample) / len(sample))
    return max(min(PROMPTS_AHEAD_MIN, most), min(int(PROMPT_TOKENS_AHEAD / mean), most))


@dataclass
class ProbeContext:
    """What a probe may use. `report(fraction, progress)` may be called often; it is cheap.

    `spec` is the managed engine's spec when the target is one (the planner's predictions
    compare against it), else None; `restart` runs it with another spec.
    """

    vllm: AsyncVllmClient
    model: str
    cancelled: Callable[[], bool] = lambda: False
    report: Report = lambda fraction, progress: None
    sink: Sink = lambda records, step: None
    managed: bool = False
    spec: EngineSpec | None = None
    limits: ProbeLimits = field(default_factory=ProbeLimits)
    # Restart the managed engine running `spec` and wait until it serves (the worker's;
    # None where the target is not an engine kvscope manages). The A/B probe uses it.
    restart: Callable[[EngineSpec], Awaitable[None]] | None = None
    # The simulator's calibration stored for this target (`kvscope simulate calibrate`), if
    # any: the capacity probe's guided search predicts and re-aims with it.
    calibration: Calibration | None = None
    prompts_ahead: int = PROMPTS_AHEAD  # (a test streams a short run with fewer)

    @property
    def base_url(self) -> str:
        return self.vllm.base_url

    def endpoint(self, api: Api = "completions") -> Endpoint:
        """Where requests go, with the target's token."""
        return self.vllm.endpoint(self.model, api)

    async def open_loop(
        self,
        params: ProbeParams,
        step: str,
        specs: Sequence[RequestSpec] | AsyncIterator[RequestSpec],
        schedule: Sequence[float] | Iterable[float],
        *,
        planned: int | None = None,
        max_duration_s: float | None = None,
        progress: Progress | None = None,
        lateness_limit_s: float = 0.010,
    ) -> RunResult:
        """The open loop against this target, with the probe's request timeout, in-flight cap
        and cancel; its records go to the sink as it runs, tagged with `step`."""
        return await run_open_loop(
            self.vllm.http,
            self.endpoint(params.api),
            specs,
            schedule,
            bounds=Bounds(
                max_duration_s=max_duration_s,
                request_timeout_s=params.request_timeout_s,
                max_in_flight=self.limits.max_in_flight,
            ),
            cancel=self.cancelled,
            progress=progress,
            lateness_limit_s=lateness_limit_s,
            planned=planned,
            on_records=lambda records: self.sink(records, step),
            keep_records=False,
        )

    async def closed_loop(
        self,
        params: ProbeParams,
        step: str,
        specs: Sequence[RequestSpec],
        concurrency: int,
        keep_records: bool = False,
    ) -> RunResult:
        """The closed loop against this target, with the probe's request timeout and cancel;
        its records go to the sink as it runs (and stay in the result with `keep_records`)."""
        return await run_closed_loop(
            self.vllm.http,
            self.endpoint(params.api),
            specs,
            concurrency,
            bounds=Bounds(request_timeout_s=params.request_timeout_s),
            cancel=self.cancelled,
            on_records=lambda records: self.sink(records, step),
            keep_records=keep_records,
        )

    def check_cancel(self) -> None:
        """Raise ProbeCancelled if the user asked to stop."""
        if self.cancelled():
            raise ProbeCancelled("cancelled on request; the steps measured so far are kept")

    async def prompts(
        self, shapes: Sequence[RequestShape], seed: int, api: Api = "completions"
    ) -> list[RequestSpec]:
        """Prompts of exactly the shapes' token counts, by the target's own tokenizer."""
        builder = PromptBuilder(
            self.vllm, self.model, chat=api == "chat", seed=seed, cancelled=self.cancelled
        )
        return await builder.build(shapes)

    async def profile_prompts(
        self, profile: Profile, n: int, seed: int, api: Api = "completions"
    ) -> list[RequestSpec]:
        """`n` prompts drawn from a workload profile."""
        return await self.prompts(profile.shapes(n, seed), seed, api)

    async def workload(
        self,
        profile: Profile,
        arrivals: Arrival,
        duration_s: float,
        seed: int,
        api: Api = "completions",
        max_requests: int | None = None,
    ) -> tuple[
        Sequence[RequestSpec] | AsyncIterator[RequestSpec], Sequence[float] | Iterator[float]
    ]:
        """Prompts and send times for one open-loop run.

        A run whose prompts fit its window (`prompt_window`) gets its whole schedule and
        every prompt before it starts: no tokenizer calls during the measurement. A longer
        one gets its send times as it goes and its prompts a window ahead, the whole window
        built before it starts, so memory follows the window, not the plan.
        """
        window = prompt_window(profile, seed, self.prompts_ahead)
        if min(arrivals.expected(duration_s), max_requests or sys.maxsize) <= window:
            schedule = arrivals.within(duration_s, seed)[:max_requests]
            return await self.profile_prompts(profile, len(schedule), seed, api), schedule
        times: Iterator[float] = arrivals.stream(duration_s, seed)
        if max_requests:
            times = itertools.islice(times, max_requests)
        builder = PromptBuilder(
            self.vllm, self.model, chat=api == "chat", seed=seed, cancelled=self.cancelled
        )
        shapes = profile.iter_shapes(np.random.default_rng(seed))
        return await builder.ahead(shapes, window), times

    async def sleep(self, seconds: float) -> None:
        """Wait, but no longer than until the user cancels (checked every 0.1 s)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and not self.cancelled():
            await asyncio.sleep(min(left, 0.1))

    async def scrape(self, timeout: float = SAMPLE_TIMEOUT_S) -> ParsedScrape:
        """The target's metrics now (a frozen target costs `timeout`, never a cancel)."""
        return await self.vllm.scrape(timeout)

    async def scrape_or_none(self, timeout: float = SAMPLE_TIMEOUT_S) -> ParsedScrape | None:
        """The target's metrics, or None from a server without vLLM's (or no answer)."""
        try:
            return await self.vllm.scrape(timeout)
        except KvscopeError:
            return None

    async def healthy(self, timeout: float = 5.0) -> bool:
        """Whether the engine says it is healthy."""
        return await self.vllm.healthy(timeout)


# --- the engine's own view ---------------------------------------------------------------


class HistogramDelta(Figures):
    """Observations an engine histogram gained between two scrapes: count and quantiles."""

    count: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None  # the histogram's _sum over its _count: exact, not bucketed


def _sum(scrape: ParsedScrape, series: str) -> float | None:
    vals = [s.value for s in scrape.samples if s.series == series]
    return sum(vals) if vals else None


def _mean(scrape: ParsedScrape, series: str) -> float | None:
    vals = [s.value for s in scrape.samples if s.series == series]
    return sum(vals) / len(vals) if vals else None


def _buckets(scrape: ParsedScrape, histogram: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for s in scrape.samples:
        if s.series == f"{histogram}_bucket":
            le = float(s.labels["le"])
            out[le] = out.get(le, 0.0) + s.value
    return out


def histogram_delta(before: ParsedScrape, after: ParsedScrape, histogram: str) -> HistogramDelta:
    """Count and p50/p95/p99 of the observations an engine histogram gained between two
    scrapes: the engine's own view of the requests sent in between."""
    later, earlier = sorted(_buckets(after, histogram).items()), _buckets(before, histogram)
    try:  # planner's delta: an engine restart in between counts from zero, not negative
        pairs = slo.histogram_delta(later, sorted(earlier.items())) if earlier else later
    except InvalidInput:  # other bucket edges, or none: the engine was not the same one
        pairs = later

    def q(x: float) -> float | None:
        v = histogram_quantile(x, pairs) if pairs else math.nan
        return None if math.isnan(v) else v

    count = pairs[-1][1] if pairs else 0.0
    total = counter_delta(before, after, f"{histogram}_sum")
    mean = total / count if total is not None and count else None
    return HistogramDelta(count=count, p50=q(0.5), p95=q(0.95), p99=q(0.99), mean=mean)


def counter_delta(before: ParsedScrape, after: ParsedScrape, series: str) -> float | None:
    """How much a counter grew between two scrapes (None when the engine lacks it)."""
    a, b = _sum(before, series), _sum(after, series)
    if a is None or b is None:
        return None
    return b - a if b >= a else b  # a restart in between: count from zero


class SamplePoint(Figures):
    """KV usage, queues and preemptions at one moment of a run; `t` counts from its start."""

    t: float
    ts: float
    kv_usage: float | None = None
    free_blocks: float | None = None
    running: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None


SampledKey = Literal["kv_usage", "free_blocks", "running", "waiting", "preemptions_total"]


@dataclass
class Sampler:
    """Samples KV usage, queues and preemptions every `every_s` while a step runs."""

    ctx: ProbeContext
    every_s: float = 1.0
    points: list[SamplePoint] = field(default_factory=list)
    block_size: int | None = None  # the engine's, from its cache_config_info
    _task: asyncio.Task[None] | None = None
    _t0: float = 0.0

    async def __aenter__(self) -> Sampler:
        self._t0 = time.time()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.sample()  # one last point after the step

    async def _loop(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.every_s)

    async def sample(self) -> None:
        """Take one point."""
        try:
            scrape = await self.ctx.scrape()
        except KvscopeError:  # a missed point is a gap in the timeline, not a failed probe
            return
        kv = _mean(scrape, "kv_usage")
        blocks = scrape.cache_info.get("num_gpu_blocks")
        if (size := scrape.cache_info.get("block_size", "")).isdigit():
            self.block_size = int(size)
        free = None
        if kv is not None and blocks and blocks.isdigit():
            # vLLM: usage = 1 - free / (num_blocks - 1); one block is the null block.
            free = round((1.0 - kv) * (int(blocks) - 1))
        now = time.time()
        self.points.append(
            SamplePoint(
                t=round(now - self._t0, 3),
                ts=now,
                kv_usage=kv,
                free_blocks=free,
                running=_sum(scrape, "running"),
                waiting=_sum(scrape, "waiting"),
                preemptions_total=_sum(scrape, "preemptions_total"),
            )
        )

    def values(self, key: SampledKey) -> list[float]:
        """The sampled values of one quantity, gaps left out."""
        return [v for p in self.points if (v := getattr(p, key)) is not None]

    def peak(self, key: SampledKey) -> float | None:
        """The highest value of a sampled quantity."""
        vals = self.values(key)
        return max(vals) if vals else None

    def increase(self, key: SampledKey) -> float | None:
        """How much a sampled counter grew over the step."""
        vals = self.values(key)
        if len(vals) < 2:
            return None
        return max(0.0, float(vals[-1]) - float(vals[0]))


def rounded(value: T, digits: int = 6) -> T:
    """Floats rounded for storage and JSON (NaN becomes None); containers walked."""
    return cast(T, _round(value, digits))


def _round(value: Any, digits: int) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, digits)
    if isinstance(value, Mapping):
        return {k: _round(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_round(v, digits) for v in value]
    return value


def stored(result: BaseModel) -> dict[str, Any]:
    """A result or progress as the JSON the store keeps: floats rounded, NaN as null."""
    return rounded(result.model_dump(mode="python"))
