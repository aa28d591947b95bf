"""Latency probe: a request rate for a duration; TTFT, ITL, TPOT, E2E and queue time tails.

Open loop, so a slow engine cannot slow the sender (no coordinated omission). The client's
TTFT is reported beside the engine's own `vllm:time_to_first_token_seconds` over the same
requests: the gap is HTTP, streaming and client time, and it should be small.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from planner.errors import KvscopeError
from planner.simulate.calibrate import BURST_SHARE
from planner.workload import Arrival, FixedProfile, Profile, parse_profile
from probes.kinds.chart import Axis, Chart, Trace
from probes.kinds.context import (
    PROMPT_BUILD_S,
    Figures,
    HistogramDelta,
    PlannedLoad,
    ProbeContext,
    ProbeParams,
    ProbeProgress,
    ProbeResult,
    Sampler,
    counter_delta,
    histogram_delta,
)
from probes.kinds.contract import CliOption, FormField, ProbeKind, Row
from probes.load.generator import Percentiles, RunResult, Summary
from probes.vllm.metrics import ParsedScrape


class Params(ProbeParams):
    """A rate for a duration, with a workload: a profile, or fixed prompt/output lengths."""

    rate: float = Field(1.0, gt=0, le=10_000, description="requests per second")
    duration_s: float = Field(30.0, gt=0, le=24 * 3600, description="seconds of arrivals")
    arrival: Literal["poisson", "constant", "gamma"] = Field(
        "poisson", description="poisson, constant or gamma"
    )
    cv: float = Field(1.0, gt=0, description="gamma arrivals: coefficient of variation")
    profile: str | dict[str, Any] | None = Field(
        None, description="a workload profile instead of fixed lengths"
    )
    prompt_tokens: int | None = Field(None, ge=1, description="fixed prompt length")
    output_tokens: int | None = Field(None, ge=1, description="fixed answer length")
    max_requests: int | None = Field(None, ge=1)
    ttft_slo_s: float | None = Field(None, gt=0, description="TTFT bound, seconds")
    tpot_slo_s: float | None = Field(None, gt=0, description="TPOT bound, seconds")
    lateness_limit_s: float = Field(0.010, gt=0)

    @model_validator(mode="after")
    def _workload(self) -> Params:
        if self.profile is not None and (self.prompt_tokens or self.output_tokens):
            raise ValueError("give a profile or prompt/output token counts, not both")
        return self

    def arrivals(self, rate: float | None = None) -> Arrival:
        """When requests arrive, at this probe's rate or another."""
        return Arrival(kind=self.arrival, rate=rate or self.rate, cv=self.cv)

    def expected(self, rate: float | None = None) -> int:
        """How many requests one run at `rate` sends, on average."""
        n = self.arrivals(rate).expected(self.duration_s)
        return min(n, self.max_requests) if self.max_requests else n

    def load(self) -> PlannedLoad:
        return PlannedLoad(
            requests=self.expected(),
            run_s=self.duration_s + self.request_timeout_s + PROMPT_BUILD_S,
            rate=self.rate,
            step_s=self.duration_s,
        )

    def workload(self) -> Profile:
        """The profile to draw requests from (fixed 256/64 tokens when nothing is given)."""
        if self.profile is not None:
            return parse_profile(self.profile)
        return FixedProfile(
            prompt_tokens=self.prompt_tokens or 256, output_tokens=self.output_tokens or 64
        )


class EngineView(Figures):
    """The engine's own histograms over the run's requests (bucket-interpolated)."""

    ttft: HistogramDelta
    itl: HistogramDelta
    tpot: HistogramDelta
    e2e: HistogramDelta
    queue_time: HistogramDelta
    preemptions: float | None = None
    # Prompt tokens the engine looked up in its prefix cache over the run, and those it
    # found there (None from an engine without the counters, or a run stored before).
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    # Tokens per engine step over the run: its count is the steps the engine took.
    iteration_tokens: HistogramDelta | None = None

    @property
    def prefix_hit_rate(self) -> float | None:
        """Share of the run's prompt tokens served from the prefix cache."""
        if not self.prefix_queries or self.prefix_hits is None:
            return None
        return self.prefix_hits / self.prefix_queries

    @field_validator("preemptions", mode="before")
    @classmethod
    def _count(cls, value: object) -> object:
        # Runs stored before typed results kept {"count": n} here.
        return value.get("count") if isinstance(value, dict) else value


class ClassFigures(Figures):
    """One request class of a run (a mixed profile's component, or a prompt-length band):
    head-of-line blocking shows as short requests' TTFT and everyone's ITL rising when long
    prompts share the batch."""

    name: str
    requests: int
    ok: int
    ttft_s: Percentiles
    itl_s: Percentiles
    slo_share: float | None = None


class Measurement(Summary):
    """One open-loop run at a rate: the client's figures, the engine's, KV and queue peaks."""

    rate: float
    planned: int
    stopped: str
    ttft_from_send_s: Percentiles
    kv_usage_peak: float | None = None
    running_peak: float | None = None
    waiting_peak: float | None = None
    preemptions: float | None = None
    engine: EngineView | None = None
    ttft_gap_p50_s: float | None = None
    # Why the client's TPOT and ITL do not show the engine's steps (its answers came in
    # bursts), or None.
    bursts: str | None = None
    # Per request class, when the run had more than one (else empty).
    by_class: list[ClassFigures] = Field(default_factory=list)


class Result(Measurement, ProbeResult):
    """The latency probe's result: one measurement."""


async def measure(
    ctx: ProbeContext,
    params: Params,
    rate: float,
    step: str,
    share: tuple[float, float] = (0.0, 1.0),
    attempt: int = 0,
) -> Measurement:
    """One open-loop run at `rate`: the summary, the engine's own view and KV/queue peaks.

    Used by this probe and by the capacity search; `share` is the slice of the progress bar
    this run fills. Each `attempt` of a search gets prompts of its own (seed + attempt): the
    same prompts again would meet vLLM's prefix cache and make later rates look faster.
    """
    lo, hi = share
    planned = params.expected(rate)
    ctx.report(lo, ProbeProgress(phase=f"{step}: building prompts for ~{planned} requests"))
    specs, schedule = await ctx.workload(
        params.workload(),
        params.arrivals(rate),
        params.duration_s,
        params.seed + attempt,
        params.api,
        params.max_requests,
    )
    if isinstance(schedule, list) and not schedule:
        raise KvscopeError(f"no request falls within {params.duration_s} s at {rate} req/s")
    ctx.check_cancel()
    before = await ctx.scrape_or_none()

    def progress(done: int, total: int) -> None:
        ctx.report(
            lo + (hi - lo) * done / max(total, 1),
            ProbeProgress(phase=f"{step}: {done}/{total} requests"),
        )

    async with Sampler(ctx) as sampler:
        result = await ctx.open_loop(
            params,
            step,
            specs,
            schedule,
            planned=planned,
            max_duration_s=params.duration_s,
            progress=progress,
            lateness_limit_s=params.lateness_limit_s,
        )
    await asyncio.sleep(0.5)  # the engine records its histograms as it finishes requests
    after = await ctx.scrape_or_none()
    return summarize_run(result, params, rate, before, after, sampler)


def engine_view(before: ParsedScrape, after: ParsedScrape) -> EngineView:
    """The engine's histograms and preemptions between two scrapes."""
    return EngineView(
        ttft=histogram_delta(before, after, "ttft"),
        itl=histogram_delta(before, after, "itl"),
        tpot=histogram_delta(before, after, "tpot"),
        e2e=histogram_delta(before, after, "e2e"),
        queue_time=histogram_delta(before, after, "queue_time"),
        preemptions=counter_delta(before, after, "preemptions_total"),
        prefix_queries=counter_delta(before, after, "prefix_cache_queries_total"),
        prefix_hits=counter_delta(before, after, "prefix_cache_hits_total"),
        iteration_tokens=histogram_delta(before, after, "iteration_tokens"),
    )


def came_in_bursts(client_tpot_s: float | None, engine_tpot_s: float | None) -> str | None:
    """Why the client's TPOT does not show the engine's steps, or None: its median under
    a quarter of the engine's own mean over the same requests. vLLM times each token where
    the engine core makes it; a starved API server streams several at once (above the CPU
    engine's knee, TPOT p50 read 0 ms where the steps took 3-4)."""
    if client_tpot_s is None or not engine_tpot_s or client_tpot_s >= BURST_SHARE * engine_tpot_s:
        return None
    return (
        f"the answers reached the client in bursts (TPOT p50 {client_tpot_s * 1000:.2f} ms "
        f"against the engine's own mean of {engine_tpot_s * 1000:.2f} ms): the API server or "
        "this client was starved of CPU, so the client's TPOT and ITL undercount and its TTFT "
        "includes decode time; read the engine's figures"
    )


def summarize_run(
    result: RunResult,
    params: Params,
    rate: float,
    before: ParsedScrape | None,
    after: ParsedScrape | None,
    sampler: Sampler,
) -> Measurement:
    """The figures of one run, the client's and the engine's side by side."""
    summary = result.summary(params.ttft_slo_s, params.tpot_slo_s)
    engine = engine_view(before, after) if before is not None and after is not None else None
    gap = None
    if engine is not None and summary.ttft_s.p50 is not None and engine.ttft.p50 is not None:
        # Both from the engine's histogram resolution: a gap, not a precise figure.
        gap = summary.ttft_s.p50 - engine.ttft.p50
    bursts = None if engine is None else came_in_bursts(summary.tpot_s.p50, engine.tpot.mean)
    classes = []
    if len(result.by_class) > 1:
        for name, tally in sorted(result.by_class.items()):
            s = tally.summary(params.ttft_slo_s, params.tpot_slo_s, result.lateness_limit_s)
            classes.append(
                ClassFigures(
                    name=name, requests=s.requests, ok=s.ok, ttft_s=s.ttft_s, itl_s=s.itl_s,
                    slo_share=s.slo_share,
                )
            )  # fmt: skip
    return Measurement(
        **dict(summary),
        by_class=classes,
        rate=rate,
        planned=result.planned,
        stopped=result.stopped,
        ttft_from_send_s=result.tally.from_send_p(),
        kv_usage_peak=sampler.peak("kv_usage"),
        running_peak=sampler.peak("running"),
        waiting_peak=sampler.peak("waiting"),
        preemptions=sampler.increase("preemptions_total"),
        engine=engine,
        ttft_gap_p50_s=gap,
        bursts=bursts,
    )


async def run(ctx: ProbeContext, params: Params) -> Result:
    """Run the probe."""
    out = await measure(ctx, params, params.rate, "latency")
    ctx.report(1.0, ProbeProgress(phase="done"))
    return Result(**dict(out))


_LATENCIES: tuple[tuple[str, str, str], ...] = (
    ("ttft_s", "ttft", "TTFT"),
    ("itl_s", "itl", "ITL"),
    ("tpot_s", "tpot", "TPOT"),
    ("e2e_s", "e2e", "E2E"),
)
_QUANTILES = ("p50", "p95", "p99")


def table(r: Result) -> list[Row]:
    """Client and engine percentiles per latency, with p99/p50."""
    rows: list[Row] = []
    for key, engine_key, label in _LATENCIES:
        mine: Percentiles = getattr(r, key)
        rows.append(
            {
                "": label,
                "side": "client",
                **{q: getattr(mine, q) for q in _QUANTILES},
                "p99/p50": getattr(r.p99_over_p50, key),
            }
        )
        theirs: HistogramDelta | None = getattr(r.engine, engine_key) if r.engine else None
        if theirs is not None and theirs.count:
            rows.append(
                {"": label, "side": "engine histogram"}
                | {q: getattr(theirs, q) for q in _QUANTILES}
            )
    if r.engine is not None and r.engine.queue_time.count:
        q_time = r.engine.queue_time
        rows.append(
            {"": "queue time", "side": "engine histogram"}
            | {q: getattr(q_time, q) for q in _QUANTILES}
        )
    for c in r.by_class:
        for label, figures in (("TTFT", c.ttft_s), ("ITL", c.itl_s)):
            rows.append(
                {"": f"{label} · {c.name}", "side": f"client, {c.requests} requests"}
                | {q: getattr(figures, q) for q in _QUANTILES}
            )
    return rows


def class_chart(r: Result) -> Chart:
    """TTFT and ITL p50/p99 per request class: short prompts' TTFT beside long ones'."""
    names = [c.name for c in r.by_class]
    series = (
        ("TTFT p50", [c.ttft_s.p50 for c in r.by_class], "c0", "circle"),
        ("TTFT p99", [c.ttft_s.p99 for c in r.by_class], "c0", "x"),
        ("ITL p50", [c.itl_s.p50 for c in r.by_class], "c1", "circle"),
        ("ITL p99", [c.itl_s.p99 for c in r.by_class], "c1", "x"),
    )
    return Chart(
        title="By request class",
        x=Axis("class"),
        y=Axis("seconds", log=True),
        traces=[
            Trace(n, names, ys, mode="markers", color=col, symbol=sym, size=11)  # type: ignore[arg-type]
            for n, ys, col, sym in series
        ],
    )


def chart(r: Result) -> Chart:
    """p50, p95 and p99 of each latency: the client's beside the engine's own histograms."""
    labels = [f"{label} {q}" for _, _, label in _LATENCIES for q in _QUANTILES]
    client = [getattr(getattr(r, key), q) for key, _, _ in _LATENCIES for q in _QUANTILES]
    traces = [Trace("client", labels, client, mode="markers", color="c0", size=11)]
    if r.engine is not None:
        engine = [getattr(getattr(r.engine, k), q) for _, k, _ in _LATENCIES for q in _QUANTILES]
        traces.append(
            Trace("engine histogram", labels, engine, mode="markers", color="c1", symbol="x")
        )
    return Chart(
        title="Latency percentiles, client and engine",
        x=Axis(""),
        y=Axis("seconds", log=True),
        traces=traces,
    )


def headline(r: Result) -> str:
    """What a latency run found, in one line."""
    return (
        f"{r.requests} requests, TTFT p50 {_ms(r.ttft_s.p50)} p99 {_ms(r.ttft_s.p99)}, "
        f"ITL p50 {_ms(r.itl_s.p50)}" + ("" if r.trustworthy else " (sender was late: not trusted)")
    )


def notes(r: Result) -> list[str]:
    """How to read the figures."""
    out = [
        "Client times count from each request's scheduled send; the engine's come from "
        "vLLM's own histograms over the same requests (bucket-interpolated). "
        f"Send lateness p99 {_ms(r.lateness_s.p99)}."
        + ("" if r.trustworthy else f" Not trusted: {r.reason}")
        + ("" if r.bursts is None else f" TPOT and ITL: {r.bursts}.")
    ]
    rate = r.engine.prefix_hit_rate if r.engine is not None else None
    if rate is not None and r.engine is not None:
        out.append(
            f"The engine's prefix cache served {rate:.0%} of the run's prompt tokens "
            f"({r.engine.prefix_hits:,.0f} of {r.engine.prefix_queries:,.0f})."
        )
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


KIND: ProbeKind[Params, Result, ProbeProgress] = ProbeKind(
    name="latency",
    title="Latency",
    command="latency",
    summary="TTFT, ITL, TPOT, E2E and queue time at p50/p95/p99 for a rate and a duration.",
    params=Params,
    result=Result,
    progress=ProbeProgress,
    run=run,
    form=(
        FormField("rate", "requests per second"),
        FormField("duration_s", "seconds"),
        FormField("prompt_tokens", "prompt tokens", 256),
        FormField("output_tokens", "output tokens", 64),
    ),
    cli=(
        CliOption("rate"),
        CliOption("duration_s", flag="duration"),
        CliOption("prompt_tokens"),
        CliOption("output_tokens"),
        CliOption("profile"),
        CliOption("arrival"),
        CliOption("ttft_slo_s", flag="ttft_slo"),
        CliOption("tpot_slo_s", flag="tpot_slo"),
    ),
    chart=chart,
    more_charts=lambda r: [class_chart(r)] if r.by_class else [],
    headline=headline,
    table=table,
    notes=notes,
    records_cdf=True,
)
