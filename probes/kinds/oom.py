"""OOM probe: grow the context of a batch of concurrent sequences until the engine gives out.

Each step sends `batch` requests of `context` tokens at once. vLLM's paged cache does not
crash when it runs out of blocks: it queues and preempts. So the first limit met is usually
`kv_exhausted` (not every sequence could hold its KV at once); beyond it come requests
`rejected_too_long` (over max_model_len), `engine_oom`, `engine_crashed` or `timeout`.
Destructive by nature: it needs `confirm`, and a managed engine unless `allow_external`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from planner.errors import InvalidInput, KvscopeError
from planner.kv import vllm_kv_cache
from planner.models import from_config_file
from probes.loadgen import RequestResult, percentiles
from probes.probe import ProbeContext, ProbeParams, Sampler, counter_delta, rounded
from probes.workloads import FixedProfile

KIND = "oom"
TOO_LONG = re.compile(
    r"maximum context length is (\d+)|maximum model length of (\d+)|"
    r"context length is only (\d+)",
    re.IGNORECASE,
)
OOM = re.compile(r"out of memory|OutOfMemory|No available memory", re.IGNORECASE)
Outcome = Literal[
    "ok", "kv_exhausted", "rejected_too_long", "engine_oom", "engine_crashed", "timeout", "errors"
]


class Params(ProbeParams):
    """The batch, where the context starts and how it grows, and the safety catches."""

    batch: int = Field(4, ge=1, le=1024, description="concurrent sequences per step")
    start_context: int = Field(1024, ge=16)
    step: int = Field(1024, ge=1)
    max_context: int | None = Field(None, ge=16, description="stop here if nothing failed")
    search: Literal["step", "bisect"] = "step"
    bisect_granularity: int = Field(32, ge=1, description="tokens; one KV block is typical")
    output_tokens: int = Field(64, ge=1, description="long enough that sequences overlap")
    stop_on: Literal["kv_exhausted", "error"] = "kv_exhausted"
    max_steps: int = Field(32, ge=1, le=200)
    request_timeout_s: float = Field(180.0, gt=0)
    confirm: bool = False
    allow_external: bool = False

    @model_validator(mode="after")
    def _confirmed(self) -> Params:
        if not self.confirm:
            raise ValueError(
                "the OOM probe pushes the engine until it fails (it may crash it "
                "and interrupt other traffic): confirm to run it (--confirm from a shell)"
            )
        if self.output_tokens >= self.start_context:
            raise ValueError("output_tokens must be smaller than start_context")
        return self


def classify(
    records: Sequence[RequestResult],
    batch: int,
    peaks: dict[str, float | None],
    preemptions: float | None,
) -> tuple[Outcome, str]:
    """What one step showed, and a line saying why."""
    errors = [r for r in records if r.status == "error"]
    if errors:
        texts = [r.error or "" for r in errors]
        if any(r.http_status == 400 and TOO_LONG.search(r.error or "") for r in errors):
            return "rejected_too_long", next(t for t in texts if TOO_LONG.search(t))[:300]
        if any(OOM.search(t) for t in texts):
            return "engine_oom", next(t for t in texts if OOM.search(t))[:300]
        if any("timed out" in t or "Timeout" in t or "stalled" in t for t in texts):
            return "timeout", texts[0][:300]
        return "errors", f"{len(errors)} of {len(records)} requests failed: {texts[0][:200]}"
    if preemptions:
        return "kv_exhausted", f"{preemptions:.0f} preemption(s): the batch's KV did not fit"
    waiting = peaks.get("waiting") or 0
    if waiting:
        # Not a limit by itself: a prompt can wait for the prefill token budget, or for KV
        # space to be admitted. Only a preemption proves the cache ran out mid-flight.
        return "ok", (
            f"no preemption; up to {waiting:.0f} sequence(s) waited to be admitted "
            "(prefill budget or KV space)"
        )
    return "ok", f"all {batch} sequences fit (no preemption)"


def predicted_frontier(facts: dict[str, Any], batch: int) -> dict[str, Any] | None:
    """The planner's longest context at which `batch` sequences fit, for a managed engine
    whose spec fixes the KV bytes; None otherwise."""
    spec = facts.get("spec") or {}
    config = Path(str(spec.get("model", ""))) / "config.json"
    if not spec.get("kv_cache_memory_bytes") or not config.is_file():
        return None
    layout = vllm_kv_cache(
        from_config_file(config),
        int(spec["kv_cache_memory_bytes"]),
        spec.get("block_size"),
        kv_dtype=spec.get("kv_cache_dtype", "auto"),
        model_dtype=spec.get("dtype", "auto"),
        max_model_len=spec.get("max_model_len"),
    )
    blocks = spec.get("num_gpu_blocks_override") or layout.num_blocks
    # One block is vLLM's null block; a sequence needs whole blocks.
    per_seq = (blocks - 1) // batch * layout.block_size
    return {
        "context": min(per_seq, layout.max_model_len),
        "max_model_len": layout.max_model_len,
        "num_blocks": blocks,
        "block_size": layout.block_size,
        "why": f"({blocks} blocks - 1) // {batch} sequences x {layout.block_size} tokens, "
        f"at most max_model_len {layout.max_model_len}",
    }


async def _step(ctx: ProbeContext, params: Params, context: int, index: int) -> dict[str, Any]:
    prompt = context - params.output_tokens
    profile = FixedProfile(prompt_tokens=prompt, output_tokens=params.output_tokens)
    specs = await ctx.profile_prompts(profile, params.batch, params.seed + index, params.api)
    try:
        before = await ctx.scrape()
    except KvscopeError:
        before = None  # no vLLM metrics: the sampler's view (or none) has to do
    async with Sampler(ctx, every_s=0.25) as sampler:
        result = await ctx.closed_loop(params, specs, params.batch)
    ctx.sink(result.records, f"context={context}")
    preemptions = sampler.increase("preemptions_total")
    if before is not None:
        with contextlib.suppress(KvscopeError):
            preemptions = counter_delta(before, await ctx.scrape(), "preemptions_total")
    peaks = {k: sampler.peak(k) for k in ("kv_usage", "running", "waiting")}
    outcome, why = classify(result.records, params.batch, peaks, preemptions)
    if outcome == "errors" and not await ctx.healthy():
        outcome, why = "engine_crashed", f"the engine stopped answering /health: {why}"
    ok = [r for r in result.records if r.status == "ok"]
    return rounded(
        {
            "context": context,
            "prompt_tokens": prompt,
            "ok": len(ok),
            "errors": len(result.records) - len(ok),
            "kv_usage_peak": peaks["kv_usage"],
            "running_peak": peaks["running"],
            "waiting_peak": peaks["waiting"],
            "preemptions": preemptions,
            "ttft_p50_s": percentiles([x for r in ok if (x := r.ttft_s) is not None]).p50,
            "e2e_p50_s": percentiles([x for r in ok if (x := r.e2e_s) is not None]).p50,
            "outcome": outcome,
            "why": why,
        }
    )


def _failed(step: dict[str, Any], stop_on: str) -> bool:
    if step["outcome"] == "ok":
        return False
    return not (step["outcome"] == "kv_exhausted" and stop_on == "error")


async def run(ctx: ProbeContext, params: Params) -> dict[str, Any]:
    """Run the probe."""
    if not ctx.managed and not params.allow_external:
        raise InvalidInput(
            "the OOM probe runs on an engine kvscope manages; to push an "
            "external engine until it fails, set allow_external"
        )
    if not await ctx.healthy():
        raise KvscopeError(f"{ctx.base_url} is not healthy before the probe; nothing was sent")
    steps: list[dict[str, Any]] = []
    failure: dict[str, Any] | None = None
    last_good: int | None = None
    context = params.start_context
    for i in range(params.max_steps):
        ctx.check_cancel()
        if params.max_context is not None and context > params.max_context:
            break
        ctx.report(
            min(0.95, i / params.max_steps * 2),
            {"phase": f"context {context} x {params.batch}", "steps": steps},
        )
        step = await _step(ctx, params, context, i)
        steps.append(step)
        if _failed(step, params.stop_on):
            failure = step
            break
        last_good = context
        context += params.step
    if failure is not None and params.search == "bisect" and last_good is not None:
        lo, hi = last_good, failure["context"]
        while hi - lo > params.bisect_granularity:
            ctx.check_cancel()
            mid = (lo + hi) // 2
            step = await _step(ctx, params, mid, len(steps))
            step["bisect"] = True
            steps.append(step)
            if _failed(step, params.stop_on):
                hi, failure = mid, step
            else:
                lo = mid
        last_good = lo
    health = await _health_after(ctx)
    prediction = predicted_frontier(ctx.facts, params.batch)
    ctx.report(1.0, {"phase": "done", "steps": steps})
    return {
        "batch": params.batch,
        "steps": steps,
        "last_good_context": last_good,
        "failure": None
        if failure is None
        else {"kind": failure["outcome"], "context": failure["context"], "message": failure["why"]},
        "health_after": health,
        "predicted": prediction,
        "message": _message(params.batch, last_good, failure, prediction),
    }


async def _health_after(ctx: ProbeContext, wait_s: float = 300.0) -> str:
    if await ctx.healthy():
        return "healthy"
    if not ctx.managed:
        return "unhealthy"
    # kvscope's supervisor restarts a crashed managed engine; wait for it.
    for _ in range(int(wait_s / 5)):
        await asyncio.sleep(5)
        if await ctx.healthy():
            return "restarted"
    return "unhealthy"


def _message(
    batch: int,
    last_good: int | None,
    failure: dict[str, Any] | None,
    prediction: dict[str, Any] | None,
) -> str:
    if failure is None:
        head = f"no failure with {batch} sequences up to {last_good} tokens each"
    else:
        good = f"{last_good} tokens" if last_good is not None else "the first step"
        head = (
            f"{batch} sequences: fine at {good}, {failure['outcome']} at "
            f"{failure['context']} tokens"
        )
    if prediction:
        head += f"; the planner predicts {prediction['context']} tokens"
    return head
