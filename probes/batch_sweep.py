"""Batch sweep: fixed concurrency 1, 2, 4 ... N; throughput against latency, and the knee.

Closed loop per step (a fixed number of requests in flight), so each step measures what
that batch size gives. The knee is where adding concurrency stops adding throughput but
keeps adding latency: past it, the engine only queues.
"""

from __future__ import annotations

import itertools
from typing import Any

from pydantic import Field, model_validator

from probes.loadgen import Bounds, run_closed_loop
from probes.probe import ProbeContext, ProbeParams, Sampler, rounded
from probes.workloads import FixedProfile, Profile, parse_profile

KIND = "batch_sweep"


class Params(ProbeParams):
    """The concurrencies to try (a list, or powers of two up to a maximum) and the requests."""

    concurrencies: list[int] | None = None
    max_concurrency: int = Field(16, ge=1, le=4096)
    requests_per_step: int | None = Field(None, ge=1, description="default: 4 x concurrency")
    prompt_tokens: int = Field(256, ge=1)
    output_tokens: int = Field(128, ge=1)
    profile: str | dict[str, Any] | None = None
    min_gain: float = Field(
        0.10,
        gt=0,
        lt=1,
        description="a step adding less throughput than this share is past the knee",
    )

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

    def workload(self) -> Profile:
        """Fixed lengths unless a profile is given."""
        if self.profile is not None:
            return parse_profile(self.profile)
        return FixedProfile(prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens)


def find_knee(steps: list[dict[str, Any]], min_gain: float) -> dict[str, Any]:
    """The last concurrency whose next step still added at least `min_gain` of throughput.

    Each step needs `concurrency`, `output_tokens_per_s` and `e2e_s.p50`. Returns the knee's
    concurrency (None when throughput rose to the end) and a sentence saying where it is.
    """
    usable = [s for s in steps if s.get("output_tokens_per_s")]
    for prev, cur in itertools.pairwise(usable):
        gain = cur["output_tokens_per_s"] / prev["output_tokens_per_s"] - 1
        if gain < min_gain:
            lat_prev, lat_cur = prev["e2e_s"]["p50"], cur["e2e_s"]["p50"]
            growth = lat_cur / lat_prev - 1 if lat_prev and lat_cur else None
            latency = f" but {growth:+.0%} E2E p50 latency" if growth is not None else ""
            return {
                "concurrency": prev["concurrency"],
                "gain": gain,
                "latency_growth": growth,
                "message": (
                    f"knee at concurrency {prev['concurrency']}: going to "
                    f"{cur['concurrency']} adds {gain:+.0%} throughput{latency}"
                ),
            }
    last = usable[-1]["concurrency"] if usable else None
    return {
        "concurrency": None,
        "gain": None,
        "latency_growth": None,
        "message": (
            f"no knee up to concurrency {last}: throughput still rose by at least "
            f"{min_gain:.0%} a step; sweep further to find it"
        ),
    }


async def run(ctx: ProbeContext, params: Params) -> dict[str, Any]:
    """Run the probe."""
    concurrencies = params.steps()
    steps: list[dict[str, Any]] = []
    for i, c in enumerate(concurrencies):
        ctx.check_cancel()
        n = params.requests_per_step or max(8, 4 * c)
        ctx.report(
            i / len(concurrencies), {"phase": f"concurrency {c}: {n} requests", "steps": steps}
        )
        specs = await ctx.profile_prompts(params.workload(), n, params.seed + i, params.api)
        async with Sampler(ctx) as sampler:
            result = await run_closed_loop(
                ctx.client,
                ctx.endpoint(params.api),
                specs,
                c,
                cancel=ctx.cancelled,
                bounds=Bounds(request_timeout_s=params.request_timeout_s),
            )
        ctx.sink(result.records, f"concurrency={c}")
        s = result.summary().as_dict()
        steps.append(
            rounded(
                {
                    "concurrency": c,
                    "requests": s["requests"],
                    "ok": s["ok"],
                    "errors": s["errors"],
                    "requests_per_s": s["requests_per_s"],
                    "output_tokens_per_s": s["output_tokens_per_s"],
                    "ttft_s": s["ttft_s"],
                    "itl_s": s["itl_s"],
                    "e2e_s": s["e2e_s"],
                    "kv_usage_peak": sampler.peak("kv_usage"),
                    "preemptions": sampler.increase("preemptions_total"),
                }
            )
        )
        if result.stopped == "cancelled":
            break
    knee = find_knee(steps, params.min_gain)
    ctx.report(1.0, {"phase": "done", "steps": steps})
    return {"steps": steps, "knee": rounded(knee)}
