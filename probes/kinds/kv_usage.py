"""KV usage probe: a steady rate with a growing number of unique prefixes; does KV creep?

Baseline (no load), load (a constant request rate, each request with a shared prefix, new
prefixes arriving as it goes), cool-down. It samples KV usage, free blocks and preemptions
throughout and reports the slope of KV usage while the request rate is stable (a creep is a
slope, not a level) and whether usage returns to its baseline once the load stops.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from pydantic import Field

from planner.stats import linear_trend
from probes.loadgen import Arrival
from probes.probe import ProbeContext, ProbeParams, Sampler, rounded
from probes.workloads import RequestShape

KIND = "kv_usage"
RETURN_TOLERANCE = 0.02  # of the cache


class Params(ProbeParams):
    """Rate and duration of the load, the prefixes, and the quiet windows around it."""

    rate: float = Field(2.0, gt=0, le=1000)
    duration_s: float = Field(60.0, gt=0, le=24 * 3600)
    prompt_tokens: int = Field(256, ge=2, description="including the prefix")
    prefix_tokens: int = Field(128, ge=1)
    output_tokens: int = Field(128, ge=1)
    requests_per_prefix: int = Field(4, ge=1, description="a new prefix every n requests")
    baseline_s: float = Field(5.0, ge=0)
    cooldown_s: float = Field(15.0, ge=0)
    sample_every_s: float = Field(1.0, gt=0)


def trend(points: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """Least-squares slope of KV usage (share of the cache per minute) within [start, end],
    its standard error, and whether it stands out of the noise (beyond two errors)."""
    inside = [p for p in points if start <= p["t"] <= end and p.get("kv_usage") is not None]
    line = linear_trend([p["t"] for p in inside], [p["kv_usage"] for p in inside])
    if line is None:
        return {"slope_per_min": None, "slope_stderr_per_min": None, "mean": None}
    return {
        "slope_per_min": line.slope * 60,
        "slope_stderr_per_min": line.stderr * 60,
        "significant": line.significant,
        "samples": line.n,
        "mean": float(np.mean([p["kv_usage"] for p in inside])),
    }


def _mean(points: list[dict[str, Any]], start: float, end: float) -> float | None:
    vals = [
        p["kv_usage"] for p in points if start <= p["t"] <= end and p.get("kv_usage") is not None
    ]
    return float(np.mean(vals)) if vals else None


async def run(ctx: ProbeContext, params: Params) -> dict[str, Any]:
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
    ctx.report(0.0, {"phase": f"building {len(shapes)} prompts"})
    specs = await ctx.prompts(shapes, params.seed, params.api)
    total = params.baseline_s + params.duration_s + params.cooldown_s
    async with Sampler(ctx, every_s=params.sample_every_s) as sampler:
        ctx.report(0.02, {"phase": "baseline"})
        await asyncio.sleep(params.baseline_s)
        load_start = sampler.points[-1]["t"] if sampler.points else 0.0

        def progress(done: int, planned: int) -> None:
            ctx.report(
                0.02 + 0.8 * done / max(planned, 1),
                {"phase": f"load: {done}/{planned}", "timeline": sampler.points[-300:]},
            )

        result = await ctx.open_loop(
            params, specs, schedule, max_duration_s=params.duration_s, progress=progress
        )
        load_end = sampler.points[-1]["t"] if sampler.points else load_start
        ctx.sink(result.records, "kv_usage")
        if not ctx.cancelled():
            ctx.report(0.85, {"phase": "cool-down", "timeline": sampler.points[-300:]})
            await asyncio.sleep(params.cooldown_s)
    points = sampler.points
    # The first fifth of the load fills the cache from empty: the creep is judged after it.
    steady = trend(points, load_start + 0.2 * (load_end - load_start), load_end)
    baseline = _mean(points, 0.0, load_start)
    tail_start = load_end + params.cooldown_s * 2 / 3
    after = _mean(points, tail_start, load_end + params.cooldown_s + 60)
    returned = None if baseline is None or after is None else after <= baseline + RETURN_TOLERANCE
    summary = result.summary().as_dict()
    ctx.report(1.0, {"phase": "done", "timeline": points[-300:]})
    return rounded(
        {
            "timeline": points,
            "load_window": [load_start, load_end],
            "total_s": total,
            "requests": summary["requests"],
            "errors": summary["errors"],
            "unique_prefixes": -(-len(specs) // params.requests_per_prefix),
            "slope_per_min": steady["slope_per_min"],
            "slope_stderr_per_min": steady["slope_stderr_per_min"],
            "mean_under_load": steady["mean"],
            "kv_usage_peak": sampler.peak("kv_usage"),
            "baseline": baseline,
            "after": after,
            "returned_to_baseline": returned,
            "preemptions": sampler.increase("preemptions_total"),
            "message": _message(steady, baseline, after, returned),
        }
    )


def _message(
    steady: dict[str, Any], baseline: float | None, after: float | None, returned: bool | None
) -> str:
    slope = steady["slope_per_min"]
    if slope is None:
        return "too few KV samples to judge a trend (does the target expose vLLM's metrics?)"
    spread = f"{slope:+.1%} ± {2 * steady['slope_stderr_per_min']:.1%} of the cache per minute"
    if steady["significant"]:
        creep = f"KV usage {'rose' if slope > 0 else 'fell'} at a stable request rate: {spread}"
    else:
        creep = (
            f"no clear KV trend at a stable request rate: {spread} is within the noise of "
            f"{steady['samples']} samples (a longer run narrows it)"
        )
    if returned is None:
        return creep
    back = (
        "returned to its baseline"
        if returned
        else f"stayed at {after:.1%} (baseline {baseline:.1%})"
    )
    return f"{creep}; after the load it {back}"
