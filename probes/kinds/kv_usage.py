"""KV usage probe: a steady rate with a growing number of unique prefixes; does KV creep?

Baseline (no load), load (a constant request rate, each request with a shared prefix, new
prefixes arriving as it goes), cool-down. It samples KV usage, free blocks and preemptions
throughout and reports the slope of KV usage while the request rate is stable (a creep is a
slope, not a level) and whether usage returns to its baseline once the load stops.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import Field

from planner.stats import linear_trend
from planner.workload import Arrival, RequestShape
from probes.kinds.chart import Axis, Band, Chart, Trace
from probes.kinds.context import (
    PROMPT_BUILD_S,
    Figures,
    PlannedLoad,
    ProbeContext,
    ProbeParams,
    ProbeProgress,
    ProbeResult,
    SamplePoint,
    Sampler,
)
from probes.kinds.contract import CliOption, FormField, ProbeKind

RETURN_TOLERANCE = 0.02  # of the cache


class Params(ProbeParams):
    """Rate and duration of the load, the prefixes, and the quiet windows around it."""

    rate: float = Field(2.0, gt=0, le=1000, description="requests per second")
    duration_s: float = Field(60.0, gt=0, le=24 * 3600, description="seconds of load")
    prompt_tokens: int = Field(256, ge=2, description="including the prefix")
    prefix_tokens: int = Field(128, ge=1, description="shared prefix length")
    output_tokens: int = Field(128, ge=1)
    requests_per_prefix: int = Field(4, ge=1, description="a new prefix every n requests")
    baseline_s: float = Field(5.0, ge=0)
    cooldown_s: float = Field(15.0, ge=0)
    sample_every_s: float = Field(1.0, gt=0)

    def load(self) -> PlannedLoad:
        return PlannedLoad(
            requests=max(1, round(self.rate * self.duration_s)),
            run_s=self.baseline_s
            + self.duration_s
            + self.cooldown_s
            + self.request_timeout_s
            + PROMPT_BUILD_S,
            rate=self.rate,
            step_s=self.duration_s,
        )


class Trend(Figures):
    """Least-squares slope of KV usage over a window, per minute, with its standard error."""

    slope_per_min: float | None = None
    slope_stderr_per_min: float | None = None
    significant: bool = False
    samples: int = 0
    mean: float | None = None


class Progress(ProbeProgress):
    """The timeline sampled so far."""

    timeline: list[SamplePoint] = Field(default_factory=list)


class Result(ProbeResult):
    """KV usage over the run, its slope under load, and whether it came back."""

    timeline: list[SamplePoint]
    load_window: tuple[float, float]
    total_s: float
    requests: int
    errors: int
    unique_prefixes: int
    slope_per_min: float | None
    slope_stderr_per_min: float | None
    mean_under_load: float | None
    kv_usage_peak: float | None
    baseline: float | None
    after: float | None
    returned_to_baseline: bool | None
    preemptions: float | None
    message: str


def trend(points: Sequence[SamplePoint], start: float, end: float) -> Trend:
    """Least-squares slope of KV usage (share of the cache per minute) within [start, end],
    its standard error, and whether it stands out of the noise (beyond two errors)."""
    inside = [(p.t, p.kv_usage) for p in points if start <= p.t <= end and p.kv_usage is not None]
    line = linear_trend([t for t, _ in inside], [kv for _, kv in inside])
    if line is None:
        return Trend()
    return Trend(
        slope_per_min=line.slope * 60,
        slope_stderr_per_min=line.stderr * 60,
        significant=line.significant,
        samples=line.n,
        mean=float(np.mean([kv for _, kv in inside])),
    )


def _mean(points: Sequence[SamplePoint], start: float, end: float) -> float | None:
    vals = [p.kv_usage for p in points if start <= p.t <= end and p.kv_usage is not None]
    return float(np.mean(vals)) if vals else None


async def run(ctx: ProbeContext, params: Params) -> Result:
    """Run the probe."""
    schedule = Arrival(kind="constant", rate=params.rate).within(params.duration_s)
    shapes = [
        RequestShape(
            params.prompt_tokens,
            params.output_tokens,
            prefix=(
                f"prefix-{i // params.requests_per_prefix}",
                min(params.prefix_tokens, params.prompt_tokens - 1),
            ),
        )
        for i in range(len(schedule))
    ]
    ctx.report(0.0, Progress(phase=f"building {len(shapes)} prompts"))
    specs = await ctx.prompts(shapes, params.seed, params.api)
    total = params.baseline_s + params.duration_s + params.cooldown_s
    async with Sampler(ctx, every_s=params.sample_every_s) as sampler:
        ctx.report(0.02, Progress(phase="baseline"))
        await ctx.sleep(params.baseline_s)
        load_start = sampler.points[-1].t if sampler.points else 0.0

        def progress(done: int, planned: int) -> None:
            ctx.report(
                0.02 + 0.8 * done / max(planned, 1),
                Progress(phase=f"load: {done}/{planned}", timeline=sampler.points[-300:]),
            )

        result = await ctx.open_loop(
            params, "kv_usage", specs, schedule, max_duration_s=params.duration_s,
            progress=progress,
        )  # fmt: skip
        load_end = sampler.points[-1].t if sampler.points else load_start
        if not ctx.cancelled():
            ctx.report(0.85, Progress(phase="cool-down", timeline=sampler.points[-300:]))
            await ctx.sleep(params.cooldown_s)
    points = sampler.points
    # The first fifth of the load fills the cache from empty: the creep is judged after it.
    steady = trend(points, load_start + 0.2 * (load_end - load_start), load_end)
    baseline = _mean(points, 0.0, load_start)
    tail_start = load_end + params.cooldown_s * 2 / 3
    after = _mean(points, tail_start, load_end + params.cooldown_s + 60)
    returned = None if baseline is None or after is None else after <= baseline + RETURN_TOLERANCE
    summary = result.summary()
    ctx.report(1.0, Progress(phase="done", timeline=points[-300:]))
    return Result(
        timeline=points,
        load_window=(load_start, load_end),
        total_s=total,
        requests=summary.requests,
        errors=summary.errors,
        unique_prefixes=-(-len(specs) // params.requests_per_prefix),
        slope_per_min=steady.slope_per_min,
        slope_stderr_per_min=steady.slope_stderr_per_min,
        mean_under_load=steady.mean,
        kv_usage_peak=sampler.peak("kv_usage"),
        baseline=baseline,
        after=after,
        returned_to_baseline=returned,
        preemptions=sampler.increase("preemptions_total"),
        message=message(steady, baseline, after, returned),
    )


def message(
    steady: Trend, baseline: float | None, after: float | None, returned: bool | None
) -> str:
    """The verdict in words: creep or noise, and whether usage came back."""
    slope = steady.slope_per_min
    if slope is None or steady.slope_stderr_per_min is None:
        return "too few KV samples to judge a trend (does the target expose vLLM's metrics?)"
    spread = f"{slope:+.1%} ± {2 * steady.slope_stderr_per_min:.1%} of the cache per minute"
    if steady.significant:
        creep = f"KV usage {'rose' if slope > 0 else 'fell'} at a stable request rate: {spread}"
    else:
        creep = (
            f"no clear KV trend at a stable request rate: {spread} is within the noise of "
            f"{steady.samples} samples (a longer run narrows it)"
        )
    if returned is None or after is None or baseline is None:
        return creep
    back = (
        "returned to its baseline"
        if returned
        else f"stayed at {after:.1%} (baseline {baseline:.1%})"
    )
    return f"{creep}; after the load it {back}"


def timeline_chart(
    timeline: Sequence[SamplePoint], load_window: tuple[float, float] | None
) -> Chart:
    """KV usage (free blocks on hover) with cumulative preemptions; the load window shaded."""
    t = [p.t for p in timeline]
    pre = [p.preemptions_total for p in timeline]
    first = next((p for p in pre if p is not None), 0.0)
    kv = [p.kv_usage for p in timeline]
    hover = [
        "-" if k is None else f"{k:.1%} used, {p.free_blocks} blocks free"
        for k, p in zip(kv, timeline, strict=True)
    ]
    traces = [
        Trace("KV usage", t, kv, steps=True, hover=hover),
        Trace(
            "preemptions",
            t,
            [None if p is None else p - first for p in pre],
            axis="y2",
            color="c2",
            dash="dot",
            steps=True,
        ),
    ]
    bands = [Band(load_window[0], load_window[1], "load")] if load_window else []
    return Chart(
        title="KV usage during the probe",
        x=Axis("seconds"),
        y=Axis("KV usage", share=True),
        y2=Axis("preemptions"),
        traces=traces,
        bands=bands,
    )


KIND: ProbeKind[Params, Result, Progress] = ProbeKind(
    name="kv_usage",
    title="KV usage",
    command="kv-usage",
    summary="KV usage under a steady load with growing prefixes: its slope, and whether it "
    "returns.",
    params=Params,
    result=Result,
    progress=Progress,
    run=run,
    form=(
        FormField("rate", "requests per second"),
        FormField("duration_s", "seconds of load"),
        FormField("prefix_tokens", "shared prefix tokens"),
        FormField("output_tokens", "output tokens"),
    ),
    cli=(
        CliOption("rate"),
        CliOption("duration_s", flag="duration"),
        CliOption("prompt_tokens"),
        CliOption("prefix_tokens"),
        CliOption("output_tokens"),
    ),
    chart=lambda r: timeline_chart(r.timeline, r.load_window),
    partial_chart=lambda p: timeline_chart(p.timeline, None) if p.timeline else None,
    headline=lambda r: r.message,
)
