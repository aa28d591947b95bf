"""A/B experiment: one workload against two settings of the managed engine (chunked prefill on
and off, two `max_num_batched_tokens`, two KV dtypes), to measure what a setting does to
head-of-line blocking rather than guess.

The engine is restarted with each arm's settings before that arm runs; rounds alternate the
order (A B, B A, A B, ...) so drift on a shared machine falls on both arms alike. Each arm
reports short requests' TTFT p99 (the lowest prompt band of the mix: what long prefills
hold up), everyone's ITL p99 and the worst ITL (the longest stall of a running request),
each as the median over its rounds with the spread (lowest and highest round). At the end
the engine is restarted as it was.
"""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from planner.errors import InvalidInput
from planner.workload import PROMPT_BANDS
from probes.engine.spec import EngineSpec, parse_spec
from probes.kinds import latency
from probes.kinds.chart import Axis, Chart, Color, Trace
from probes.kinds.context import PlannedLoad, ProbeContext, ProbeProgress, ProbeResult
from probes.kinds.contract import CliOption, FormField, ProbeKind, Row

# The settings an arm may change: those that shape scheduling and the cache.
ARM_FIELDS = frozenset(
    {
        "enable_chunked_prefill",
        "max_num_batched_tokens",
        "max_num_seqs",
        "kv_cache_dtype",
        "block_size",
        "enable_prefix_caching",
        "kv_cache_memory_bytes",
        "gpu_memory_utilization",
    }
)
RESTART_S = 300.0  # a restart's share of the deadline: a CPU engine takes 30-60 s


class Params(latency.Params):
    """A latency workload, and the two arms' engine settings."""

    a: dict[str, Any] = Field(description="arm A's engine settings, e.g. enable_chunked_prefill")
    b: dict[str, Any] = Field(description="arm B's engine settings")
    rounds: int = Field(2, ge=1, le=10, description="rounds; each runs both arms")
    confirm: bool = Field(False, description="required: the probe restarts the engine")

    @model_validator(mode="after")
    def _confirmed(self) -> Params:
        if not self.confirm:
            raise ValueError(
                "the A/B probe restarts the engine before each arm (requests it serves "
                "meanwhile fail): confirm to run it (--confirm from a shell)"
            )
        return self

    @field_validator("a", "b")
    @classmethod
    def _known(cls, arm: dict[str, Any]) -> dict[str, Any]:
        if not arm:
            raise ValueError("an arm needs at least one setting")
        unknown = sorted(set(arm) - ARM_FIELDS)
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)}: an arm may set only {', '.join(sorted(ARM_FIELDS))}"
            )
        return arm

    def load(self) -> PlannedLoad:
        one = super().load()
        runs = 2 * self.rounds
        return PlannedLoad(
            requests=one.requests * runs,
            run_s=(one.run_s + RESTART_S) * runs + RESTART_S,
            rate=self.rate,
            step_s=self.duration_s,
        )


class ArmRun(BaseModel):
    """One arm in one round."""

    arm: str
    round: int
    requests: int
    errors: int
    short_class: str
    short_ttft_p99_s: float | None
    ttft_p99_s: float | None
    itl_p99_s: float | None
    itl_max_s: float | None = None  # the worst stall of any running request
    trustworthy: bool


class Arm(BaseModel):
    """One arm over its rounds: medians and the spread (lowest, highest round)."""

    arm: str
    settings: dict[str, Any]
    short_ttft_p99_s: float | None
    short_ttft_p99_range: tuple[float, float] | None
    itl_p99_s: float | None
    itl_p99_range: tuple[float, float] | None
    itl_max_s: float | None = None
    itl_max_range: tuple[float, float] | None = None


class Result(ProbeResult):
    """Both arms side by side, and every round."""

    arms: list[Arm]
    runs: list[ArmRun]


def _short(m: latency.Measurement) -> tuple[str, float | None]:
    """The lowest prompt band in the run and its TTFT p99 (everyone, with one class)."""
    if not m.by_class:
        return "all requests", m.ttft_s.p99
    order = [name for _, name in PROMPT_BANDS]
    pick = min(m.by_class, key=lambda c: order.index(c.name) if c.name in order else len(order))
    return pick.name, pick.ttft_s.p99


def _spread(values: list[float | None]) -> tuple[float | None, tuple[float, float] | None]:
    got = [v for v in values if v is not None]
    if not got:
        return None, None
    return statistics.median(got), (min(got), max(got))


def _arm_spec(base: EngineSpec, settings: dict[str, Any]) -> EngineSpec:
    return parse_spec(base.model_dump() | settings)


async def run(ctx: ProbeContext, params: Params) -> Result:
    """Run the experiment, and put the engine back as it was."""
    if ctx.restart is None or ctx.spec is None:
        raise InvalidInput(
            "the A/B probe restarts the engine between arms: it runs on an engine kvscope manages"
        )
    original = ctx.spec
    specs = {"A": _arm_spec(original, params.a), "B": _arm_spec(original, params.b)}
    runs: list[ArmRun] = []
    total = 2 * params.rounds
    try:
        for r in range(params.rounds):
            for arm in ("A", "B") if r % 2 == 0 else ("B", "A"):
                done = len(runs) / total
                ctx.report(done, ProbeProgress(phase=f"round {r + 1}: restarting for arm {arm}"))
                await ctx.restart(specs[arm])
                ctx.check_cancel()
                share = (done, (len(runs) + 1) / total)
                m = await latency.measure(ctx, params, params.rate, f"r{r + 1}-{arm}", share)
                name, short = _short(m)
                runs.append(
                    ArmRun(
                        arm=arm, round=r + 1, requests=m.requests, errors=m.errors,
                        short_class=name, short_ttft_p99_s=short, ttft_p99_s=m.ttft_s.p99,
                        itl_p99_s=m.itl_s.p99, itl_max_s=m.itl_s.max,
                        trustworthy=m.trustworthy,
                    )
                )  # fmt: skip
    finally:
        ctx.report(len(runs) / total, ProbeProgress(phase="restarting the engine as it was"))
        await ctx.restart(original)
    arms = []
    for arm, settings in (("A", params.a), ("B", params.b)):
        mine = [x for x in runs if x.arm == arm]
        short, short_range = _spread([x.short_ttft_p99_s for x in mine])
        itl, itl_range = _spread([x.itl_p99_s for x in mine])
        stall, stall_range = _spread([x.itl_max_s for x in mine])
        arms.append(
            Arm(
                arm=arm, settings=settings, short_ttft_p99_s=short,
                short_ttft_p99_range=short_range, itl_p99_s=itl, itl_p99_range=itl_range,
                itl_max_s=stall, itl_max_range=stall_range,
            )
        )  # fmt: skip
    ctx.report(1.0, ProbeProgress(phase="done"))
    return Result(arms=arms, runs=runs)


def _label(arm: Arm) -> str:
    return f"{arm.arm}: " + ", ".join(f"{k}={v}" for k, v in arm.settings.items())


def chart(r: Result) -> Chart:
    """Each round's short-request TTFT p99 and ITL p99 per arm; the spread is the scatter."""
    traces = []
    for i, arm in enumerate(r.arms):
        mine = [x for x in r.runs if x.arm == arm.arm]
        color: Color = "c0" if i == 0 else "c1"
        traces.append(
            Trace(f"{_label(arm)} · short TTFT p99", ["short TTFT p99"] * len(mine),
                  [x.short_ttft_p99_s for x in mine], mode="markers", color=color, size=11)
        )  # fmt: skip
        traces.append(
            Trace(f"{_label(arm)} · ITL p99", ["ITL p99"] * len(mine),
                  [x.itl_p99_s for x in mine], mode="markers", color=color, symbol="x", size=11)
        )  # fmt: skip
        traces.append(
            Trace(f"{_label(arm)} · ITL max", ["ITL max"] * len(mine),
                  [x.itl_max_s for x in mine], mode="markers", color=color, symbol="x", size=11)
        )  # fmt: skip
    return Chart(
        title="A/B: each round's tail, per arm", x=Axis(""), y=Axis("seconds", log=True),
        traces=traces,
    )  # fmt: skip


def table(r: Result) -> list[Row]:
    """Each arm's medians and spread over rounds."""
    rows: list[Row] = []
    for arm in r.arms:
        lo, hi = arm.short_ttft_p99_range or (None, None)
        ilo, ihi = arm.itl_p99_range or (None, None)
        mlo, mhi = arm.itl_max_range or (None, None)
        rows.append(
            {"arm": _label(arm), "short TTFT p99 (median)": arm.short_ttft_p99_s,
             "lowest": lo, "highest": hi, "ITL p99 (median)": arm.itl_p99_s,
             "ITL lowest": ilo, "ITL highest": ihi, "worst ITL (median)": arm.itl_max_s,
             "worst lowest": mlo, "worst highest": mhi}
        )  # fmt: skip
    return rows


def headline(r: Result) -> str:
    """The two arms' short-request TTFT p99 and worst ITL, in one line."""
    rounds = max((x.round for x in r.runs), default=0)
    ttft = " vs ".join(f"{a.arm} {_ms(a.short_ttft_p99_s)}" for a in r.arms)
    stall = " vs ".join(f"{a.arm} {_ms(a.itl_max_s)}" for a in r.arms)
    return f"median of {rounds} rounds: short requests' TTFT p99 {ttft}; worst ITL {stall}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def notes(r: Result) -> list[str]:
    """How to read it."""
    out = [
        "Short requests: the lowest prompt band of the mix (what long prefills hold up). "
        "Arms alternate by round (A B, B A, ...); the engine restarts before each arm and "
        "once more at the end, as it was."
    ]
    untrusted = [f"round {x.round} arm {x.arm}" for x in r.runs if not x.trustworthy]
    if untrusted:
        out.append("The sender was late in " + ", ".join(untrusted) + ": those tails are high.")
    return out


KIND: ProbeKind[Params, Result, ProbeProgress] = ProbeKind(
    name="ab",
    title="A/B engine settings",
    command="ab",
    summary="One workload against two engine settings, restarting between arms; "
    "short requests' TTFT p99 and ITL p99 side by side.",
    params=Params,
    result=Result,
    progress=ProbeProgress,
    run=run,
    form=(
        FormField("rate", "requests per second"),
        FormField("duration_s", "seconds per arm"),
        FormField("rounds", "rounds"),
    ),
    cli=(
        CliOption("rate"),
        CliOption("duration_s", flag="duration"),
        CliOption("profile"),
        CliOption("prompt_tokens"),
        CliOption("output_tokens"),
        CliOption("rounds"),
        CliOption("confirm"),
    ),
    chart=chart,
    headline=headline,
    table=table,
    notes=notes,
    destructive=True,
    danger="restarts the engine with each arm's settings, and once more at the end",
)
