"""Capacity probe: the highest request rate at which an SLO holds, MLPerf-style.

An SLO is a TTFT bound, a TPOT bound and the share of requests that must be inside both.
The search brackets (doubling the rate until the SLO breaks), then bisects between the last
rate that held and the first that did not. A run whose sender was late is not trusted to
pass: the rate it reports may not be the rate the engine saw.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from probes import latency
from probes.probe import ProbeContext, rounded

KIND = "capacity"


class Params(latency.Params):
    """A latency run per rate, plus the promise and the search bounds."""

    ttft_slo_s: float = Field(gt=0)  # required here
    tpot_slo_s: float = Field(gt=0)
    share: float = Field(0.9, gt=0, le=1, description="share of requests inside both bounds")
    start_rate: float = Field(1.0, gt=0)
    max_rate: float = Field(64.0, gt=0)
    iterations: int = Field(3, ge=0, le=10, description="bisection steps after bracketing")
    duration_s: float = Field(20.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _bounds(self) -> Params:
        if self.max_rate < self.start_rate:
            raise ValueError("max_rate must not be below start_rate")
        return self


async def run(ctx: ProbeContext, params: Params) -> dict[str, Any]:
    """Run the probe."""
    steps: list[dict[str, Any]] = []
    expected = 2 + params.iterations + max(0, int(params.max_rate / params.start_rate).bit_length())

    async def attempt(rate: float) -> bool:
        ctx.check_cancel()
        i = len(steps)
        share = (i / expected, min(1.0, (i + 1) / expected))
        m = await latency.measure(ctx, params, rate, f"rate={rate:g}", share, attempt=i)
        if not m["trustworthy"]:
            # The sender fell behind its schedule: the rate the engine saw is not `rate`.
            untrusted.append(f"{rate:g} req/s ({m['reason']})")
        passed = bool(
            m["slo_share"] is not None and m["slo_share"] >= params.share and m["trustworthy"]
        )
        steps.append(
            rounded(
                {
                    "rate": rate,
                    "slo_share": m["slo_share"],
                    "passed": passed,
                    "trustworthy": m["trustworthy"],
                    "requests": m["requests"],
                    "errors": m["errors"],
                    "ttft_s": m["ttft_s"],
                    "tpot_s": m["tpot_s"],
                    "requests_per_s": m["requests_per_s"],
                }
            )
        )
        ctx.report(
            share[1], {"phase": f"rate {rate:g}: {'held' if passed else 'broke'}", "steps": steps}
        )
        return passed

    untrusted: list[str] = []
    good: float | None = None
    bad: float | None = None
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
    ctx.report(1.0, {"phase": "done", "steps": steps})
    slo = (
        f"TTFT <= {params.ttft_slo_s:g} s and TPOT <= {params.tpot_slo_s:g} s for "
        f"{params.share:.0%} of requests"
    )
    if good is None:
        message = f"the SLO ({slo}) already breaks at {params.start_rate:g} req/s"
    elif bad is None:
        message = f"the SLO ({slo}) held up to the highest rate tried, {good:g} req/s"
    else:
        message = f"capacity {good:g} req/s: {slo} holds there and breaks at {bad:g} req/s"
    if untrusted:
        message += (
            "; not trusted, the load generator was late at "
            + ", ".join(untrusted)
            + " (a busy client machine: raise lateness_limit_s or run it elsewhere)"
        )
    return {
        "capacity_rps": good,
        "first_failing_rps": bad,
        "slo": {"ttft_s": params.ttft_slo_s, "tpot_s": params.tpot_slo_s, "share": params.share},
        "steps": steps,
        "message": message,
    }
