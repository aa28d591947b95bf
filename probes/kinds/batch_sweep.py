"""Batch sweep: fixed concurrency 1, 2, 4 ... N; throughput against latency, and the knee.

Closed loop per step (a fixed number of requests in flight), so each step measures what
that batch size gives. The knee is where adding concurrency stops adding throughput but
keeps adding latency (the peak of throughput / latency): past it, the engine mostly queues.
"""

from __future__ import annotations

import itertools
from typing import Any

from pydantic import Field, model_validator

from probes.probe import ProbeContext, ProbeParams, Sampler, rounded
from probes.workloads import FixedProfile, Profile, parse_profile

KIND = "batch_sweep"


class Params(ProbeParams):
    """The concurrencies to try (a list, or powers of two up to a maximum) and the requests."""

    concurrencies: list[int] | None = None
    max_concurrency: int = Field(64, ge=1, le=4096)
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

    def workload(self) -> Profile:
        """Fixed lengths unless a profile is given."""
        if self.profile is not None:
            return parse_profile(self.profile)
        return FixedProfile(prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens)


def find_knee(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The concurrency with the most throughput per unit of latency (Kleinrock's power:
    output tokens/s divided by E2E p50). Before it, more requests in flight buy throughput;
    past it, they mostly buy queueing. Each step needs `concurrency`, `output_tokens_per_s`
    and `e2e_s.p50`; the sentence says what the next step would cost.
    """
    usable = [s for s in steps if s.get("output_tokens_per_s") and s["e2e_s"].get("p50")]
    if not usable:
        return {"concurrency": None, "power": None, "message": "no step produced tokens"}
    powers = [s["output_tokens_per_s"] / s["e2e_s"]["p50"] for s in usable]
    i = max(range(len(usable)), key=powers.__getitem__)
    knee = usable[i]
    if i == len(usable) - 1:
        return {
            "concurrency": None,
            "power": powers[i],
            "message": (
                f"no knee up to concurrency {knee['concurrency']}: throughput still grows faster "
                "than latency there; sweep further to find it"
            ),
        }
    nxt = usable[i + 1]
    gain = nxt["output_tokens_per_s"] / knee["output_tokens_per_s"] - 1
    growth = nxt["e2e_s"]["p50"] / knee["e2e_s"]["p50"] - 1
    return {
        "concurrency": knee["concurrency"],
        "power": powers[i],
        "gain": gain,
        "latency_growth": growth,
        "message": (
            f"knee at concurrency {knee['concurrency']}: going to {nxt['concurrency']} "
            f"adds {gain:+.0%} throughput but {growth:+.0%} E2E p50 latency"
        ),
    }


def _past_knee(steps: list[dict[str, Any]], n: int) -> bool:
    """Whether throughput per unit of latency fell in each of the last `n` steps."""
    powers = [
        s["output_tokens_per_s"] / s["e2e_s"]["p50"]
        for s in steps
        if s.get("output_tokens_per_s") and s["e2e_s"].get("p50")
    ]
    return len(powers) > n and all(b < a for a, b in itertools.pairwise(powers[-n - 1 :]))


async def run(ctx: ProbeContext, params: Params) -> dict[str, Any]:
    """Run the probe."""
    concurrencies = params.steps()
    steps: list[dict[str, Any]] = []
    for i, c in enumerate(concurrencies):
        ctx.check_cancel()
        n = params.requests_per_step or max(8, 2 * c)
        ctx.report(
            i / len(concurrencies), {"phase": f"concurrency {c}: {n} requests", "steps": steps}
        )
        specs = await ctx.profile_prompts(params.workload(), n, params.seed + i, params.api)
        async with Sampler(ctx) as sampler:
            result = await ctx.closed_loop(params, specs, c)
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
        if (
            params.concurrencies is None
            and params.stop_past_knee
            and _past_knee(steps, params.stop_past_knee)
        ):
            break  # the knee is behind us: larger batches would only take longer
    knee = find_knee(steps)
    ctx.report(1.0, {"phase": "done", "steps": steps})
    return {"steps": steps, "knee": rounded(knee)}
