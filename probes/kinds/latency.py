"""Latency probe: a request rate for a duration; TTFT, ITL, TPOT, E2E and queue time tails.

Open loop, so a slow engine cannot slow the sender (no coordinated omission). The client's
TTFT is reported beside the engine's own `vllm:time_to_first_token_seconds` over the same
requests: the gap is HTTP, streaming and client time, and it should be small.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any, Literal

from pydantic import Field, model_validator

from planner.errors import KvscopeError
from probes.loadgen import Arrival, RunResult, percentiles
from probes.probe import (
    ProbeContext,
    ProbeParams,
    Sampler,
    counter_delta,
    histogram_delta,
    rounded,
)
from probes.workloads import FixedProfile, Profile, parse_profile

KIND = "latency"


class Params(ProbeParams):
    """A rate for a duration, with a workload: a profile, or fixed prompt/output lengths."""

    rate: float = Field(1.0, gt=0, le=10_000, description="requests per second")
    duration_s: float = Field(30.0, gt=0, le=24 * 3600)
    arrival: Literal["poisson", "constant", "gamma"] = "poisson"
    cv: float = Field(1.0, gt=0, description="gamma arrivals: coefficient of variation")
    profile: str | dict[str, Any] | None = None
    prompt_tokens: int | None = Field(None, ge=1)
    output_tokens: int | None = Field(None, ge=1)
    max_requests: int | None = Field(None, ge=1)
    ttft_slo_s: float | None = Field(None, gt=0)
    tpot_slo_s: float | None = Field(None, gt=0)
    lateness_limit_s: float = Field(0.010, gt=0)

    @model_validator(mode="after")
    def _workload(self) -> Params:
        if self.profile is not None and (self.prompt_tokens or self.output_tokens):
            raise ValueError("give a profile or prompt/output token counts, not both")
        return self

    def workload(self) -> Profile:
        """The profile to draw requests from (fixed 256/64 tokens when nothing is given)."""
        if self.profile is not None:
            return parse_profile(self.profile)
        return FixedProfile(
            prompt_tokens=self.prompt_tokens or 256, output_tokens=self.output_tokens or 64
        )


async def measure(
    ctx: ProbeContext,
    params: Params,
    rate: float,
    step: str,
    share: tuple[float, float] = (0.0, 1.0),
    attempt: int = 0,
) -> dict[str, Any]:
    """One open-loop run at `rate`: the summary, the engine's own view and KV/queue peaks.

    Used by this probe and by the capacity search; `share` is the slice of the progress bar
    this run fills. Each `attempt` of a search gets prompts of its own (seed + attempt): the
    same prompts again would meet vLLM's prefix cache and make later rates look faster.
    """
    lo, hi = share
    schedule = Arrival(kind=params.arrival, rate=rate, cv=params.cv).within(
        params.duration_s, params.seed
    )
    if params.max_requests:
        schedule = schedule[: params.max_requests]
    if not schedule:
        raise KvscopeError(f"no request falls within {params.duration_s} s at {rate} req/s")
    ctx.report(lo, {"phase": f"{step}: building {len(schedule)} prompts"})
    specs = await ctx.profile_prompts(
        params.workload(), len(schedule), params.seed + attempt, params.api
    )
    ctx.check_cancel()
    before = await _scrape_or_none(ctx)

    def progress(done: int, total: int) -> None:
        ctx.report(
            lo + (hi - lo) * done / max(total, 1), {"phase": f"{step}: {done}/{total} requests"}
        )

    async with Sampler(ctx) as sampler:
        result = await ctx.open_loop(
            params,
            specs,
            schedule,
            max_duration_s=params.duration_s,
            progress=progress,
            lateness_limit_s=params.lateness_limit_s,
        )
    await asyncio.sleep(0.5)  # the engine records its histograms as it finishes requests
    after = await _scrape_or_none(ctx)
    ctx.sink(result.records, step)
    return summarize_run(result, params, rate, before, after, sampler)


def summarize_run(
    result: RunResult, params: Params, rate: float, before: Any, after: Any, sampler: Sampler
) -> dict[str, Any]:
    """The figures of one run, the client's and the engine's side by side."""
    summary = result.summary(params.ttft_slo_s, params.tpot_slo_s).as_dict()
    sent = [
        r.first_token_ts - r.sent_ts
        for r in result.records
        if r.status == "ok" and r.first_token_ts is not None and r.sent_ts is not None
    ]
    out: dict[str, Any] = {
        "rate": rate,
        **summary,
        "planned": result.planned,
        "stopped": result.stopped,
        "ttft_from_send_s": asdict(percentiles(sent)),
        "kv_usage_peak": sampler.peak("kv_usage"),
        "running_peak": sampler.peak("running"),
        "waiting_peak": sampler.peak("waiting"),
        "preemptions": sampler.increase("preemptions_total"),
    }
    if before is not None and after is not None:
        engine = {
            h: histogram_delta(before, after, h)
            for h in ("ttft", "itl", "tpot", "e2e", "queue_time")
        }
        engine["preemptions"] = {"count": counter_delta(before, after, "preemptions_total")}
        out["engine"] = engine
        client_p50, engine_p50 = summary["ttft_s"]["p50"], engine["ttft"]["p50"]
        if client_p50 is not None and engine_p50 is not None:
            # Both from the engine's histogram resolution: a gap, not a precise figure.
            out["ttft_gap_p50_s"] = client_p50 - engine_p50
        out["queue_time_s"] = engine["queue_time"]
    return rounded(out)


async def _scrape_or_none(ctx: ProbeContext) -> Any:
    try:
        return await ctx.scrape()
    except KvscopeError:
        return None  # an OpenAI-compatible server without vLLM's metrics: client view only


async def run(ctx: ProbeContext, params: Params) -> dict[str, Any]:
    """Run the probe."""
    out = await measure(ctx, params, params.rate, "latency")
    ctx.report(1.0, {"phase": "done"})
    return out
