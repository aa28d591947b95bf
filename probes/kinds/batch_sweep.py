"""Batch sweep: fixed concurrency 1, 2, 4 ... N; throughput against latency, and the knee.

Closed loop per step (a fixed number of requests in flight), so each step measures what
that batch size gives. The knee is where adding concurrency stops adding throughput but
keeps adding latency (the peak of throughput / latency): past it, the engine mostly queues.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from pydantic import Field, model_validator

from planner.workload import FixedProfile, Profile, parse_profile
from probes.kinds.chart import Axis, Chart, Color, Mark, TailPoint, Trace, tail_against_rate
from probes.kinds.context import (
    PROMPT_BUILD_S,
    Figures,
    PlannedLoad,
    ProbeContext,
    ProbeParams,
    ProbeProgress,
    ProbeResult,
    Sampler,
)
from probes.kinds.contract import CliOption, FormField, ProbeKind, Row, dump_rows
from probes.load.generator import Percentiles


class Params(ProbeParams):
    """The concurrencies to try (a list, or powers of two up to a maximum) and the requests."""

    concurrencies: list[int] | None = Field(
        None, description="concurrencies to try (default: 1, 2, 4 ... max_concurrency)"
    )
    max_concurrency: int = Field(
        64,
        ge=1,
        le=4096,
        description="largest concurrency (without a list, the sweep stops two steps past the knee)",
    )
    requests_per_step: int | None = Field(None, ge=1, description="default: 2 x concurrency")
    stop_past_knee: int = Field(
        2,
        ge=0,
        description="without a list of concurrencies, stop "
        "once throughput per latency fell this many steps in a row",
    )
    prompt_tokens: int = Field(256, ge=1)
    output_tokens: int = Field(128, ge=1)
    profile: str | dict[str, Any] | None = None

    @model_validator(mode="after")
    def _steps(self) -> Params:
        if self.concurrencies is not None:
            if not self.concurrencies or any(c < 1 for c in self.concurrencies):
                raise ValueError("concurrencies must be a non-empty list of positive numbers")
            self.concurrencies = sorted(set(self.concurrencies))
        return self

    def steps(self) -> list[int]:
        """The concurrencies in order."""
        if self.concurrencies:
            return self.concurrencies
        out, c = [], 1
        while c < self.max_concurrency:
            out.append(c)
            c *= 2
        return [*out, self.max_concurrency]

    def requests(self, concurrency: int) -> int:
        """Requests sent at one concurrency."""
        return self.requests_per_step or max(8, 2 * concurrency)

    def load(self) -> PlannedLoad:
        steps = self.steps()
        return PlannedLoad(
            requests=sum(self.requests(c) for c in steps),
            run_s=len(steps) * (self.request_timeout_s + 60.0) + PROMPT_BUILD_S,
            in_flight=max(steps),
        )

    def workload(self) -> Profile:
        """Fixed lengths unless a profile is given."""
        if self.profile is not None:
            return parse_profile(self.profile)
        return FixedProfile(prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens)


class Step(Figures):
    """One concurrency: what it gave and what it cost."""

    concurrency: int
    requests: int = 0
    ok: int = 0
    errors: int = 0
    requests_per_s: float = 0.0
    output_tokens_per_s: float
    ttft_s: Percentiles = Percentiles()
    itl_s: Percentiles = Percentiles()
    # Per request, the decode time over its tokens after the first: unlike ITL, not fooled
    # by tokens that reach the client together (runs stored before it was kept have none).
    tpot_s: Percentiles = Percentiles()
    e2e_s: Percentiles
    kv_usage_peak: float | None = None
    preemptions: float | None = None

    @property
    def power(self) -> float | None:
        """Output tokens/s per second of E2E p50: Kleinrock's power."""
        if not self.output_tokens_per_s or not self.e2e_s.p50:
            return None
        return self.output_tokens_per_s / self.e2e_s.p50


class Knee(Figures):
    """Where more concurrency stops buying throughput; the sentence says why."""

    concurrency: int | None
    power: float | None
    gain: float | None = None
    latency_growth: float | None = None
    message: str


class Progress(ProbeProgress):
    """The steps measured so far."""

    steps: list[Step] = Field(default_factory=list)


class Result(ProbeResult):
    """Every step and the knee."""

    steps: list[Step]
    knee: Knee


def find_knee(steps: Sequence[Step]) -> Knee:
    """The concurrency with the most throughput per unit of latency (Kleinrock's power:
    output tokens/s divided by E2E p50). Before it, more requests in flight buy throughput;
    past it, they mostly buy queueing. The sentence says what the next step would cost.
    """
    usable = [(s, p) for s in steps if (p := s.power) is not None]
    if not usable:
        return Knee(concurrency=None, power=None, message="no step produced tokens")
    i = max(range(len(usable)), key=lambda j: usable[j][1])
    knee, power = usable[i]
    if i == len(usable) - 1:
        return Knee(
            concurrency=None,
            power=power,
            message=(
                f"no knee up to concurrency {knee.concurrency}: throughput still grows faster "
                "than latency there; sweep further to find it"
            ),
        )
    nxt = usable[i + 1][0]
    assert knee.e2e_s.p50 is not None and nxt.e2e_s.p50 is not None  # both have a power
    gain = nxt.output_tokens_per_s / knee.output_tokens_per_s - 1
    growth = nxt.e2e_s.p50 / knee.e2e_s.p50 - 1
    return Knee(
        concurrency=knee.concurrency,
        power=power,
        gain=gain,
        latency_growth=growth,
        message=(
            f"knee at concurrency {knee.concurrency}: going to {nxt.concurrency} "
            f"adds {gain:+.0%} throughput but {growth:+.0%} E2E p50 latency"
        ),
    )


def past_knee(steps: Sequence[Step], n: int) -> bool:
    """Whether throughput per unit of latency fell in each of the last `n` steps."""
    powers = [p for s in steps if (p := s.power) is not None]
    return len(powers) > n and all(b < a for a, b in itertools.pairwise(powers[-n - 1 :]))


async def run(ctx: ProbeContext, params: Params) -> Result:
    """Run the probe."""
    concurrencies = params.steps()
    steps: list[Step] = []
    for i, c in enumerate(concurrencies):
        ctx.check_cancel()
        n = params.requests(c)
        ctx.report(
            i / len(concurrencies), Progress(phase=f"concurrency {c}: {n} requests", steps=steps)
        )
        specs = await ctx.profile_prompts(params.workload(), n, params.seed + i, params.api)
        async with Sampler(ctx) as sampler:
            result = await ctx.closed_loop(params, f"concurrency={c}", specs, c)
        s = result.summary()
        steps.append(
            Step(
                concurrency=c,
                requests=s.requests,
                ok=s.ok,
                errors=s.errors,
                requests_per_s=s.requests_per_s,
                output_tokens_per_s=s.output_tokens_per_s,
                ttft_s=s.ttft_s,
                itl_s=s.itl_s,
                tpot_s=s.tpot_s,
                e2e_s=s.e2e_s,
                kv_usage_peak=sampler.peak("kv_usage"),
                preemptions=sampler.increase("preemptions_total"),
            )
        )
        if result.stopped == "cancelled":
            break
        if (
            params.concurrencies is None
            and params.stop_past_knee
            and past_knee(steps, params.stop_past_knee)
        ):
            break  # the knee is behind us: larger batches would only take longer
    ctx.report(1.0, Progress(phase="done", steps=steps))
    return Result(steps=steps, knee=find_knee(steps))


def steps_chart(steps: Sequence[Step], knee: int | None) -> Chart:
    """Throughput and latency against concurrency, the knee marked."""
    c = [s.concurrency for s in steps]
    traces = [Trace("output tokens/s", c, [s.output_tokens_per_s for s in steps], "lines+markers")]
    lines: tuple[tuple[str, Color], ...] = (("p50", "c1"), ("p99", "c2"))
    for q, color in lines:
        traces.append(
            Trace(
                f"E2E {q} (s)",
                c,
                [getattr(s.e2e_s, q) for s in steps],
                "lines+markers",
                axis="y2",
                color=color,
                dash="dot",
            )
        )
    marks = [Mark(knee, f"knee: {knee}")] if knee is not None else []
    return Chart(
        title="Throughput against latency",
        x=Axis("concurrency", log=True, ticks=[float(x) for x in c]),
        y=Axis("output tokens/s", from_zero=True),
        y2=Axis("E2E latency (s)"),
        traces=traces,
        marks=marks,
    )


def tail_chart(r: Result) -> Chart:
    """TTFT and ITL p50/p99 against the request rate each concurrency achieved, the knee's
    rate marked: past it the rate stops growing and only the tail does."""
    points = [
        TailPoint(s.requests_per_s, s.ttft_s.p50, s.ttft_s.p99, s.itl_s.p50, s.itl_s.p99)
        for s in r.steps
        if s.requests_per_s
    ]
    knee = next((s for s in r.steps if s.concurrency == r.knee.concurrency), None)
    rate = knee.requests_per_s if knee is not None and knee.requests_per_s else None
    return tail_against_rate(points, "ITL", rate, f"knee (concurrency {r.knee.concurrency})")


def table(r: Result) -> list[Row]:
    """One row per concurrency."""
    return dump_rows(
        r.steps,
        (
            "concurrency",
            "requests_per_s",
            "output_tokens_per_s",
            "ttft_s.p50",
            "itl_s.p50",
            "e2e_s.p50",
            "e2e_s.p99",
            "kv_usage_peak",
            "preemptions",
        ),
    )


KIND: ProbeKind[Params, Result, Progress] = ProbeKind(
    name="batch_sweep",
    title="Batch sweep",
    command="sweep",
    summary="Throughput against latency at growing concurrency, and where the knee is.",
    params=Params,
    result=Result,
    progress=Progress,
    run=run,
    form=(
        FormField("max_concurrency", "largest concurrency"),
        FormField("prompt_tokens", "prompt tokens"),
        FormField("output_tokens", "output tokens"),
    ),
    cli=(
        CliOption("concurrencies", flag="concurrency"),
        CliOption("max_concurrency"),
        CliOption("requests_per_step"),
        CliOption("prompt_tokens"),
        CliOption("output_tokens"),
    ),
    chart=lambda r: steps_chart(r.steps, r.knee.concurrency),
    more_charts=lambda r: [tail_chart(r)] if r.steps else [],
    partial_chart=lambda p: steps_chart(p.steps, None) if p.steps else None,
    headline=lambda r: r.knee.message,
    table=table,
)
