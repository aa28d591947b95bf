"""Capacity probe: the highest request rate at which an SLO holds, MLPerf-style.

An SLO is a TTFT bound, a TPOT bound and the share of requests that must be inside both.
The search brackets (doubling the rate until the SLO breaks), then bisects between the last
rate that held and the first that did not. Guided by the simulator, it searches around its
prediction instead (`planner.simulate.search`: at most six rates) and re-aims after the
first rate, a calibration gone stale being the usual reason a prediction is far off:
`guided` takes the target's stored calibration, predicts the highest rate for this load
and SLO in windows of this probe's length, and re-aims by re-simulating with the step cost
that gives the TPOT measured at the first rate (the engine's own mean where the client's
timings are not the engine's); `predicted_rps` (with `predicted_tpot_s`) is a prediction
made elsewhere, re-aimed by the plain TPOT ratio. A run whose sender was
late is not trusted to pass: the rate it reports may not be the rate the engine saw.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from pydantic import Field, model_validator

from planner.errors import InvalidInput
from planner.simulate import search, whatif
from planner.simulate.calibrate import Calibration
from planner.simulate.setup import Settings, calibrated_scenario
from probes.kinds import latency
from probes.kinds.chart import Axis, Chart, Color, Mark, TailPoint, Trace, tail_against_rate
from probes.kinds.context import (
    PROMPT_BUILD_S,
    Figures,
    PlannedLoad,
    ProbeContext,
    ProbeProgress,
    ProbeResult,
)
from probes.kinds.contract import CliOption, FormField, ProbeKind, Row, dump_rows
from probes.load.generator import Percentiles


class Params(latency.Params):
    """A latency run per rate, plus the promise and the search bounds."""

    ttft_slo_s: float = Field(gt=0, description="TTFT bound, seconds")  # required here
    tpot_slo_s: float = Field(gt=0, description="TPOT bound, seconds")
    share: float = Field(0.9, gt=0, le=1, description="share of requests inside both bounds")
    start_rate: float = Field(1.0, gt=0, description="first rate tried, requests per second")
    max_rate: float = Field(64.0, gt=0, description="highest rate tried (guided too)")
    iterations: int = Field(3, ge=0, le=10, description="bisection steps after bracketing")
    duration_s: float = Field(20.0, gt=0, le=3600, description="seconds per rate")
    guided: bool = Field(
        False,
        description="search around the simulator calibrated on this target (kvscope simulate "
        "calibrate --target NAME first): at most 6 rates, re-aimed after the first",
    )
    predicted_rps: float | None = Field(
        None,
        gt=0,
        description="the simulator's highest rate meeting the SLO (kvscope simulate "
        "--target ... max_rate): search around it, at most 6 rates, instead of doubling",
    )
    predicted_tpot_s: float | None = Field(
        None,
        gt=0,
        description="the simulator's TPOT p50 at that rate (kvscope simulate ... --json's "
        "tpot_p50_at_max_rate): the engine's TPOT measured there re-aims the search by "
        "their ratio, when the engine runs slower or faster than calibrated",
    )

    def attempts(self) -> int:
        """Rates tried at most: around a prediction, or doubling from start_rate past
        max_rate, then bisecting."""
        if self.guided or self.predicted_rps is not None:
            return search.MAX_POINTS
        return 2 + self.iterations + max(0, int(self.max_rate / self.start_rate).bit_length())

    def load(self) -> PlannedLoad:
        per_rate = self.arrivals(self.max_rate).expected(self.duration_s)
        return PlannedLoad(
            requests=per_rate * self.attempts(),
            run_s=self.attempts() * (self.duration_s + self.request_timeout_s + PROMPT_BUILD_S),
            rate=self.max_rate,
            step_s=self.duration_s,
        )

    @model_validator(mode="after")
    def _bounds(self) -> Params:
        if self.max_rate < self.start_rate:
            raise ValueError("max_rate must not be below start_rate")
        if self.predicted_tpot_s is not None and self.predicted_rps is None:
            raise ValueError("predicted_tpot_s goes with predicted_rps (the rate it is at)")
        if self.guided and self.predicted_rps is not None:
            raise ValueError("give guided (the stored calibration predicts) or predicted_rps")
        return self

    def scenario(self, calibration: Calibration | None) -> whatif.Scenario:
        """The simulator's scenario for this search: the target's calibration, this load in
        windows of `duration_s`, this SLO."""
        if calibration is None:
            raise InvalidInput(
                "guided needs the simulator calibrated on this target: run kvscope simulate "
                "calibrate --target NAME first, or give predicted_rps"
            )
        traffic = Settings(arrival=self.arrival, cv=self.cv, duration_s=self.duration_s)
        slo = whatif.SloBounds(ttft_s=self.ttft_slo_s, tpot_s=self.tpot_slo_s, share=self.share)
        what = calibrated_scenario(calibration, traffic, slo=slo)
        return replace(what, profile=self.workload())


class Step(Figures):
    """One rate tried."""

    rate: float
    slo_share: float | None
    passed: bool
    trustworthy: bool
    requests: int
    errors: int
    ttft_s: Percentiles
    tpot_s: Percentiles
    requests_per_s: float
    # Per request class, when the rate's run had more than one (else empty).
    by_class: list[latency.ClassFigures] = Field(default_factory=list)
    # The engine's own TPOT over the run's requests (vLLM's histogram: its sum over its
    # count), None without a scrape: what a re-aim reads when the client's timings are not
    # the engine's (a late sender, answers that came whole).
    engine_tpot_s: float | None = None
    # Which TPOT re-aimed the search: the client's p50, or the engine's own mean.
    aim_tpot: search.TpotSource | None = None
    # Where this step's TPOT pointed the search (the first step of a guided search; it jumps
    # there when that lies beyond the next step on the side the verdict points to).
    aim_rps: float | None = None
    # The step-cost scale the guided re-aim found: the engine's steps this many times as long
    # as calibrated, at this step's rate.
    aim_scale: float | None = None


class Slo(Figures):
    """The promise searched for."""

    ttft_s: float
    tpot_s: float
    share: float


class Progress(ProbeProgress):
    """The rates tried so far."""

    steps: list[Step] = Field(default_factory=list)
    share: float = 0.9


class Result(ProbeResult):
    """The highest rate that held, the first that broke, and every rate tried."""

    capacity_rps: float | None
    first_failing_rps: float | None
    slo: Slo
    steps: list[Step]
    message: str
    # Where a guided search started: the calibrated simulator's highest rate meeting the SLO.
    predicted_rps: float | None = None


async def run(ctx: ProbeContext, params: Params) -> Result:
    """Run the probe."""
    steps: list[Step] = []
    untrusted: list[str] = []
    expected = params.attempts()
    slo = (
        f"TTFT <= {params.ttft_slo_s:g} s and TPOT <= {params.tpot_slo_s:g} s for "
        f"{params.share:.0%} of requests"
    )
    predicted, predicted_tpot = params.predicted_rps, params.predicted_tpot_s
    scenario = params.scenario(ctx.calibration) if params.guided else None
    if scenario is not None:
        ctx.report(0.0, Progress(phase="the simulator predicts", share=params.share))
        found = await asyncio.to_thread(whatif.highest, scenario)
        if found is None:
            raise InvalidInput(
                f"the simulator calibrated on this target says the SLO ({slo}) breaks at any "
                "rate for this load: loosen it, or search without guided"
            )
        predicted, predicted_tpot = round(found[0], 3), found[1].tpot_s.p50

    async def attempt(rate: float) -> bool:
        ctx.check_cancel()
        i = len(steps)
        share = (i / expected, min(1.0, (i + 1) / expected))
        m = await latency.measure(ctx, params, rate, f"rate={rate:g}", share, attempt=i)
        if not m.trustworthy:
            # The sender fell behind its schedule: the rate the engine saw is not `rate`.
            untrusted.append(f"{rate:g} req/s ({m.reason})")
        passed = bool(m.slo_share is not None and m.slo_share >= params.share and m.trustworthy)
        engine_tpot = None if m.engine is None else m.engine.tpot.mean
        # The first rate is the predicted one: how much faster the engine ran than predicted.
        tpot = search.Tpot.of(m.tpot_s.p50, m.trustworthy, engine_tpot) if i == 0 else None
        got = (
            await asyncio.to_thread(search.first_aim, rate, tpot, scenario, predicted_tpot)
            if tpot is not None
            else None
        )
        aim = None if got is None else got.rate
        scale = None if got is None or got.scale is None else round(got.scale, 3)
        steps.append(
            Step(
                rate=rate,
                slo_share=m.slo_share,
                passed=passed,
                trustworthy=m.trustworthy,
                requests=m.requests,
                errors=m.errors,
                ttft_s=m.ttft_s,
                tpot_s=m.tpot_s,
                requests_per_s=m.requests_per_s,
                by_class=m.by_class,
                engine_tpot_s=engine_tpot,
                aim_tpot=None if aim is None or tpot is None else tpot.label,
                aim_rps=None if aim is None else round(aim, 3),
                aim_scale=scale,
            )
        )
        phase = f"rate {rate:g}: {'held' if passed else 'broke'}"
        if aim is not None:
            phase += f"; its TPOT points at {aim:.3g} req/s"
        ctx.report(share[1], Progress(phase=phase, steps=steps, share=params.share))
        return passed

    good: float | None = None
    bad: float | None = None
    if predicted is not None:
        # Never past max_rate (what the run's limits were checked against): a search that
        # asks for more once it held there has its answer (one that broke there may measure
        # it again).
        guide = search.guided(min(predicted, params.max_rate))
        try:
            rate = next(guide)
            while True:
                rate = min(round(rate, 3), params.max_rate)
                if rate == params.max_rate and any(s.rate == rate and s.passed for s in steps):
                    good = max((s.rate for s in steps if s.passed), default=None)
                    break
                held = await attempt(rate)
                rate = guide.send(search.Verdict(held, steps[-1].aim_rps))
        except StopIteration as done:
            good, bad = done.value.held, done.value.broke
    else:
        rate = params.start_rate
        while rate <= params.max_rate:
            if await attempt(rate):
                good = rate
                rate *= 2
            else:
                bad = rate
                break
        if good is not None and bad is not None:
            for _ in range(params.iterations):
                mid = round((good + bad) / 2, 3)
                if await attempt(mid):
                    good = mid
                else:
                    bad = mid
    ctx.report(1.0, Progress(phase="done", steps=steps, share=params.share))
    lowest = min(s.rate for s in steps)
    if good is None:
        message = f"the SLO ({slo}) already breaks at {lowest:g} req/s"
    elif bad is None:
        message = f"the SLO ({slo}) held up to the highest rate tried, {good:g} req/s"
    else:
        message = f"capacity {good:g} req/s: {slo} holds there and breaks at {bad:g} req/s"
    aimed = next((s for s in steps if s.aim_rps is not None), None)
    if aimed is not None:
        jumped = len(steps) > 1 and steps[1].rate == aimed.aim_rps
        slower = (
            f" said its steps run {aimed.aim_scale:g} times as long as calibrated and"
            if aimed.aim_scale is not None
            else ""
        )
        own = " (its own mean: the client's timings were not the engine's)"
        whose = own if aimed.aim_tpot == "engine mean" else ""
        message += f" (the engine's TPOT at {aimed.rate:g} req/s{whose}{slower} " + (
            f"re-aimed the search at {aimed.aim_rps:g})"
            if jumped
            else f"pointed at {aimed.aim_rps:g}, within a step or against the verdict)"
        )
    again = _measured_again(steps)
    if again:
        message += f"; measured again where a window broke the bracket's edge: {again}"
    if scenario is not None:
        message += f"; the calibrated simulator predicted {predicted:g} req/s"
    if untrusted:
        message += (
            "; not trusted, the load generator was late at "
            + ", ".join(untrusted)
            + " (a busy client machine: raise lateness_limit_s or run it elsewhere)"
        )
    return Result(
        capacity_rps=good,
        first_failing_rps=bad,
        slo=Slo(ttft_s=params.ttft_slo_s, tpot_s=params.tpot_slo_s, share=params.share),
        steps=steps,
        message=message,
        predicted_rps=predicted if scenario is not None else params.predicted_rps,
    )


def _measured_again(steps: list[Step]) -> str:
    """The rates measured more than once and their verdicts in order ("" when none)."""
    verdicts: dict[float, list[str]] = {}
    for s in steps:
        verdicts.setdefault(s.rate, []).append("held" if s.passed else "broke")
    return ", ".join(
        f"{rate:g} req/s ({', then '.join(v)})" for rate, v in verdicts.items() if len(v) > 1
    )


def steps_chart(steps: list[Step], share: float) -> Chart:
    """Share of requests inside the SLO at each rate tried, the required share marked."""
    ordered = sorted(steps, key=lambda s: s.rate)
    trace = Trace(
        "inside the SLO",
        [s.rate for s in ordered],
        [s.slo_share for s in ordered],
        mode="lines+markers",
        point_colors=["good" if s.passed else "bad" for s in ordered],
        size=10,
    )
    return Chart(
        title="SLO compliance against request rate",
        x=Axis("requests/s"),
        y=Axis("share inside SLO", share=True),
        traces=[trace],
        marks=[Mark(share, f"required {share:.0%}", on="y")],
    )


def tail_chart(r: Result) -> Chart:
    """TTFT and TPOT p50/p99 at each rate tried, the capacity and the SLO's bounds marked."""
    points = [
        TailPoint(s.rate, s.ttft_s.p50, s.ttft_s.p99, s.tpot_s.p50, s.tpot_s.p99) for s in r.steps
    ]
    return tail_against_rate(points, "TPOT", r.capacity_rps, "capacity", r.slo.ttft_s, r.slo.tpot_s)


def class_chart(r: Result) -> Chart:
    """TTFT and ITL p99 of each request class against the rate: head-of-line blocking shows
    as the short class's TTFT rising with the rate while long prompts share the batch."""
    names = sorted({c.name for s in r.steps for c in s.by_class})
    colors: tuple[Color, ...] = ("c0", "c1", "c2", "c3")
    traces = []
    steps = sorted(r.steps, key=lambda s: s.rate)
    for i, name in enumerate(names):
        got = [(s.rate, c) for s in steps for c in s.by_class if c.name == name]
        rates = [rate for rate, _ in got]
        color = colors[i % len(colors)]
        traces.append(Trace(f"{name} TTFT p99", rates, [c.ttft_s.p99 for _, c in got],
                            mode="lines+markers", color=color))  # fmt: skip
        traces.append(Trace(f"{name} ITL p99", rates, [c.itl_s.p99 for _, c in got],
                            mode="lines+markers", color=color, dash="dot"))  # fmt: skip
    return Chart(
        title="By request class, against the rate",
        x=Axis("requests per second"),
        y=Axis("seconds", log=True),
        traces=traces,
    )


def table(r: Result) -> list[Row]:
    """The rates tried."""
    keys = ("rate", "slo_share", "passed", "trustworthy", "requests", "errors")
    more = ("ttft_s.p99", "tpot_s.p50", "tpot_s.p99", "engine_tpot_s", "requests_per_s")
    aim = ("aim_tpot", "aim_rps", "aim_scale")
    return dump_rows(r.steps, (*keys, *more, *aim))


KIND: ProbeKind[Params, Result, Progress] = ProbeKind(
    name="capacity",
    title="Capacity (SLO)",
    command="capacity",
    summary="The highest request rate at which the SLO holds (bracketing, then bisection; "
    "around the simulator's prediction when guided or given one).",
    params=Params,
    result=Result,
    progress=Progress,
    run=run,
    form=(
        FormField("ttft_slo_s", "TTFT bound (s)", 2.0),
        FormField("tpot_slo_s", "TPOT bound (s)", 0.1),
        FormField("share", "share inside both"),
        FormField("duration_s", "seconds per rate"),
        FormField("guided", "guided by the simulator"),
    ),
    cli=(
        CliOption("ttft_slo_s", flag="ttft_slo"),
        CliOption("tpot_slo_s", flag="tpot_slo"),
        CliOption("share"),
        CliOption("start_rate"),
        CliOption("max_rate"),
        CliOption("guided", sets=True),
        CliOption("predicted_rps"),
        CliOption("predicted_tpot_s", flag="predicted_tpot"),
        CliOption("duration_s", flag="duration"),
        CliOption("prompt_tokens"),
        CliOption("output_tokens"),
        CliOption("profile"),
    ),
    chart=lambda r: steps_chart(r.steps, r.slo.share),
    partial_chart=lambda p: steps_chart(p.steps, p.share) if p.steps else None,
    more_charts=lambda r: (
        ([tail_chart(r)] if r.steps else [])
        + ([class_chart(r)] if any(s.by_class for s in r.steps) else [])
    ),
    headline=lambda r: r.message,
    table=table,
)
