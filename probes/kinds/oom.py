"""OOM probe: grow the context of a batch of concurrent sequences until the engine gives out.

Each step sends `batch` requests of `context` tokens at once. vLLM's paged cache does not
crash when it runs out of blocks: it queues and preempts. So the first limit met is usually
`kv_exhausted` (not every sequence could hold its KV at once: one was preempted, or waited
while fewer blocks were free than it needs); beyond it come requests `rejected_too_long`
(over max_model_len), `engine_oom`, `engine_crashed` or `timeout`.
Destructive by nature: it needs `confirm`, and a managed engine unless `allow_external`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from planner.errors import KvscopeError
from planner.kv import vllm_kv_cache
from planner.models import from_config_file
from planner.workload import FixedProfile
from probes.engine.spec import EngineSpec
from probes.kinds.chart import Axis, Chart, Mark, Trace
from probes.kinds.context import (
    PROMPT_BUILD_S,
    SETTLED_TIMEOUT_S,
    Figures,
    PlannedLoad,
    ProbeContext,
    ProbeParams,
    ProbeProgress,
    ProbeResult,
    SamplePoint,
    Sampler,
    counter_delta,
)
from probes.kinds.contract import CliOption, FormField, ProbeKind, Row, dump_rows
from probes.load.generator import RequestResult, percentiles

TOO_LONG = re.compile(
    r"maximum context length is (\d+)|maximum model length of (\d+)|"
    r"context length is only (\d+)",
    re.IGNORECASE,
)
HEALTH_WAIT_S = 300.0  # how long a crashed managed engine gets to come back
TOGETHER_TRIES = 3  # a step whose batch never ran all at once is sent again, this often
OOM = re.compile(r"out of memory|OutOfMemory|No available memory", re.IGNORECASE)
Outcome = Literal[
    "ok", "kv_exhausted", "rejected_too_long", "engine_oom", "engine_crashed", "timeout", "errors"
]
# Where a step's preemption count came from: the counter read before and after it, or the
# samples taken during it (a lower bound when the last ones went unanswered).
Counted = Literal["between steps", "sampled"] | None


class Params(ProbeParams):
    """The batch, where the context starts and how it grows, and the safety catches."""

    batch: int = Field(4, ge=1, le=1024, description="concurrent sequences per step")
    start_context: int = Field(1024, ge=16, description="tokens per sequence at the first step")
    step: int = Field(1024, ge=1, description="tokens added per step")
    max_context: int | None = Field(None, ge=16, description="stop here if nothing failed")
    search: Literal["step", "bisect"] = "step"
    bisect_granularity: int = Field(32, ge=1, description="tokens; one KV block is typical")
    output_tokens: int = Field(64, ge=1, description="long enough that sequences overlap")
    stop_on: Literal["kv_exhausted", "error"] = "kv_exhausted"
    max_steps: int = Field(32, ge=1, le=200)
    request_timeout_s: float = Field(180.0, gt=0)
    confirm: bool = Field(False, description="required: the probe pushes the engine until it fails")
    allow_external: bool = Field(False, description="allow an engine kvscope does not manage")

    def load(self) -> PlannedLoad:
        # The steps and a bisection down to one token, each sent up to TOGETHER_TRIES times.
        steps = (self.max_steps + 12) * TOGETHER_TRIES
        return PlannedLoad(
            requests=self.batch * steps,
            run_s=steps * (self.request_timeout_s + 30.0) + HEALTH_WAIT_S + PROMPT_BUILD_S,
            in_flight=self.batch,
        )

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


class Step(Figures):
    """One context tried: what ran, the peaks, and the outcome with its reason."""

    context: int
    prompt_tokens: int
    ok: int
    errors: int
    kv_usage_peak: float | None = None
    running_peak: float | None = None
    waiting_peak: float | None = None
    preemptions: float | None = None
    preemptions_counted: Counted = None
    # The tightest moment a sequence waited for KV space: free blocks then, and what one
    # sequence of this step needs (None: no sample saw one wait with too few free).
    kv_wait_free_blocks: float | None = None
    blocks_needed: int | None = None
    ttft_p50_s: float | None = None
    e2e_p50_s: float | None = None
    outcome: Outcome
    why: str
    # Every answer began before any ended (the client's clock): the batch ran all at once.
    together: bool | None = None
    tries: int = 1
    bisect: bool = False


class Failure(Figures):
    """The first limit met."""

    kind: Outcome
    context: int
    message: str


class Frontier(Figures):
    """The planner's longest context at which the batch fits, and how it got there."""

    context: int
    max_model_len: int
    num_blocks: int
    block_size: int
    why: str


class Progress(ProbeProgress):
    """The steps measured so far."""

    steps: list[Step] = Field(default_factory=list)


class Result(ProbeResult):
    """The frontier found, the planner's beside it, and every step."""

    batch: int
    steps: list[Step]
    last_good_context: int | None
    failure: Failure | None
    health_after: str
    predicted: Frontier | None
    message: str


def kv_bound_wait(points: Sequence[SamplePoint], needed: int) -> float | None:
    """The fewest free blocks among the samples where a sequence waited while fewer blocks
    were free than one sequence of the step needs (None if none did).

    Where the batch fits, a waiting sequence always finds its blocks free (the others hold
    at most theirs), so such a sample proves it does not: vLLM queued instead of preempting,
    as it does when the batch's requests reach the scheduler spread out (a busy host).
    """
    short = [
        p.free_blocks
        for p in points
        if (p.waiting or 0) >= 1 and p.free_blocks is not None and p.free_blocks < needed
    ]
    return min(short) if short else None


def classify(
    records: Sequence[RequestResult],
    batch: int,
    peaks: Mapping[str, float | None],
    preemptions: float | None,
    short_of_blocks: float | None = None,
    needed: int | None = None,
) -> tuple[Outcome, str]:
    """What one step showed, and a line saying why. `short_of_blocks` is `kv_bound_wait`'s
    free blocks, `needed` the blocks one sequence needs."""
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
    if short_of_blocks is not None:
        return "kv_exhausted", (
            f"no preemption, but a sequence waited while {short_of_blocks:.0f} blocks were "
            f"free of the {needed} it needs: vLLM queued it, the batch's KV did not fit at once"
        )
    waiting = peaks.get("waiting") or 0
    if waiting:
        # Not a limit by itself: a prompt waits for the prefill token budget too, and no
        # sample showed it short of blocks.
        return "ok", (
            f"no preemption; up to {waiting:.0f} sequence(s) waited to be admitted, and no "
            "sample saw one short of KV blocks (the prefill token budget)"
        )
    return "ok", f"all {batch} sequences fit (no preemption)"


def predicted_frontier(spec: EngineSpec | None, batch: int) -> Frontier | None:
    """The planner's longest context at which `batch` sequences fit, for a managed engine
    whose spec fixes the KV bytes; None otherwise."""
    if spec is None or not spec.kv_cache_memory_bytes:
        return None
    config = Path(spec.model) / "config.json"
    if not config.is_file():
        return None
    layout = vllm_kv_cache(
        from_config_file(config),
        spec.kv_cache_memory_bytes,
        spec.block_size,
        kv_dtype=spec.kv_cache_dtype,
        model_dtype=spec.dtype,
        max_model_len=spec.max_model_len,
    )
    blocks = spec.num_gpu_blocks_override or layout.num_blocks
    # One block is vLLM's null block; a sequence needs whole blocks.
    per_seq = (blocks - 1) // batch * layout.block_size
    return Frontier(
        context=min(per_seq, layout.max_model_len),
        max_model_len=layout.max_model_len,
        num_blocks=blocks,
        block_size=layout.block_size,
        why=f"({blocks} blocks - 1) // {batch} sequences x {layout.block_size} tokens, "
        f"at most max_model_len {layout.max_model_len}",
    )


def ran_together(records: Sequence[RequestResult]) -> bool | None:
    """Whether every answer began before any ended: each prompt was in the cache while every
    other sequence still held its blocks (None: fewer than two answers to compare)."""
    done = [r for r in records if r.first_token_ts is not None and r.end_ts is not None]
    if len(done) < 2:
        return None
    return max(r.first_token_ts or 0.0 for r in done) < min(r.end_ts or 0.0 for r in done)


async def _step(ctx: ProbeContext, params: Params, context: int, index: int) -> Step:
    """One context measured; sent again (new prompts) while it passes without the batch
    having run all at once, which proves nothing: a busy API server can hand the requests
    to the scheduler so far apart that the first is done before the last begins."""
    for attempt in range(TOGETHER_TRIES):
        step = await _measure(ctx, params, context, params.seed + index + 1000 * attempt)
        step.tries = attempt + 1
        if step.outcome != "ok" or step.together is not False:
            return step
    step.why += (
        f"; but in {TOGETHER_TRIES} tries the batch never ran all at once (an answer ended "
        "before another began), so the fit is not proven"
    )
    return step


async def _measure(ctx: ProbeContext, params: Params, context: int, seed: int) -> Step:
    prompt = context - params.output_tokens
    profile = FixedProfile(prompt_tokens=prompt, output_tokens=params.output_tokens)
    specs = await ctx.profile_prompts(profile, params.batch, seed, params.api)
    # The verdict rests on the preemption counter: read between steps with a patient
    # timeout (a saturated engine's samples time out beside a busy host, and a sampled
    # increase that misses the step's end misses its preemptions). No vLLM metrics, or no
    # answer: the sampler's view has to do.
    before = await ctx.scrape_or_none(SETTLED_TIMEOUT_S)
    async with Sampler(ctx, every_s=0.25) as sampler:
        result = await ctx.closed_loop(
            params, f"context={context}", specs, params.batch, keep_records=True
        )
    preemptions = sampler.increase("preemptions_total")
    counted: Counted = "sampled" if preemptions is not None else None
    if before is not None and (after := await ctx.scrape_or_none(SETTLED_TIMEOUT_S)):
        preemptions, counted = counter_delta(before, after, "preemptions_total"), "between steps"
    peaks = {
        "kv_usage": sampler.peak("kv_usage"),
        "running": sampler.peak("running"),
        "waiting": sampler.peak("waiting"),
    }
    needed = -(-context // sampler.block_size) if sampler.block_size else None
    short = kv_bound_wait(sampler.points, needed) if needed else None
    outcome, why = classify(result.records, params.batch, peaks, preemptions, short, needed)
    if outcome == "errors" and not await ctx.healthy():
        outcome, why = "engine_crashed", f"the engine stopped answering its health check: {why}"
    ok = [r for r in result.records if r.status == "ok"]
    return Step(
        context=context,
        prompt_tokens=prompt,
        ok=len(ok),
        errors=len(result.records) - len(ok),
        kv_usage_peak=peaks["kv_usage"],
        running_peak=peaks["running"],
        waiting_peak=peaks["waiting"],
        preemptions=preemptions,
        preemptions_counted=counted,
        kv_wait_free_blocks=short,
        blocks_needed=needed,
        ttft_p50_s=percentiles([x for r in ok if (x := r.ttft_s) is not None]).p50,
        e2e_p50_s=percentiles([x for r in ok if (x := r.e2e_s) is not None]).p50,
        outcome=outcome,
        why=why,
        together=ran_together(result.records),
    )


def _failed(step: Step, stop_on: str) -> bool:
    if step.outcome == "ok":
        return False
    return not (step.outcome == "kv_exhausted" and stop_on == "error")


async def run(ctx: ProbeContext, params: Params) -> Result:
    """Run the probe (`runner.execute` has refused an engine it may not push)."""
    if not await ctx.healthy():
        raise KvscopeError(f"{ctx.base_url} is not healthy before the probe; nothing was sent")
    steps: list[Step] = []
    failure: Step | None = None
    last_good: int | None = None
    context = params.start_context
    for i in range(params.max_steps):
        ctx.check_cancel()
        if params.max_context is not None and context > params.max_context:
            break
        ctx.report(
            min(0.95, i / params.max_steps * 2),
            Progress(phase=f"context {context} x {params.batch}", steps=steps),
        )
        step = await _step(ctx, params, context, i)
        steps.append(step)
        if _failed(step, params.stop_on):
            failure = step
            break
        last_good = context
        context += params.step
    came_back = True
    if failure is not None and params.search == "bisect" and last_good is not None:
        lo, hi = last_good, failure.context
        while hi - lo > params.bisect_granularity:
            ctx.check_cancel()
            # A step that crashed the engine is measured again only once it is back.
            if not (came_back := await _wait_healthy(ctx)):
                break
            mid = (lo + hi) // 2
            step = await _step(ctx, params, mid, len(steps))
            step.bisect = True
            steps.append(step)
            if _failed(step, params.stop_on):
                hi, failure = mid, step
            else:
                lo = mid
        last_good = lo
    health = await _health_after(ctx) if came_back else "unhealthy"
    prediction = predicted_frontier(ctx.spec, params.batch)
    ctx.report(1.0, Progress(phase="done", steps=steps))
    return Result(
        batch=params.batch,
        steps=steps,
        last_good_context=last_good,
        failure=None
        if failure is None
        else Failure(kind=failure.outcome, context=failure.context, message=failure.why),
        health_after=health,
        predicted=prediction,
        message=_message(params.batch, last_good, failure, prediction)
        + (
            ""
            if came_back
            else f"; the engine did not come back within {HEALTH_WAIT_S:.0f} s after the "
            "crash, so the search stopped there"
        ),
    )


async def _wait_healthy(ctx: ProbeContext, wait_s: float = HEALTH_WAIT_S) -> bool:
    """Whether the engine answers, waiting (cancel aside) for a managed one to restart."""
    if await ctx.healthy():
        return True
    if not ctx.managed:
        return False
    # kvscope's supervisor restarts a crashed managed engine; wait for it, but no longer
    # than the user does.
    end = asyncio.get_running_loop().time() + wait_s
    while asyncio.get_running_loop().time() < end:
        ctx.check_cancel()
        await ctx.sleep(2.0)
        if await ctx.healthy(timeout=2.0):
            return True
    return False


async def _health_after(ctx: ProbeContext) -> str:
    if await ctx.healthy():
        return "healthy"
    return "restarted" if await _wait_healthy(ctx) else "unhealthy"


def _message(
    batch: int, last_good: int | None, failure: Step | None, prediction: Frontier | None
) -> str:
    if failure is None:
        head = f"no failure with {batch} sequences up to {last_good} tokens each"
    else:
        good = f"{last_good} tokens" if last_good is not None else "the first step"
        head = f"{batch} sequences: fine at {good}, {failure.outcome} at {failure.context} tokens"
    if prediction:
        head += f"; the planner predicts {prediction.context} tokens"
    return head


def steps_chart(
    steps: Sequence[Step], failure: Failure | None, predicted: Frontier | None
) -> Chart:
    """Peak KV usage and E2E per context step; the failure and the planner's frontier."""
    ok = [s for s in steps if s.outcome == "ok"]
    bad = [s for s in steps if s.outcome != "ok"]
    traces = [
        Trace("peak KV usage", [s.context for s in steps], [s.kv_usage_peak for s in steps]),
        Trace(
            "all sequences ran",
            [s.context for s in ok],
            [s.kv_usage_peak for s in ok],
            mode="markers",
            color="good",
            size=9,
        ),
        Trace(
            "limit: " + ", ".join(sorted({s.outcome for s in bad})),
            [s.context for s in bad],
            [s.kv_usage_peak or 0.0 for s in bad],
            mode="markers",
            color="bad",
            symbol="x",
            size=13,
            hover=[s.why for s in bad],
        ),
        Trace(
            "E2E p50 (s)",
            [s.context for s in steps],
            [s.e2e_p50_s for s in steps],
            axis="y2",
            color="c1",
            dash="dot",
        ),
    ]
    marks = []
    if failure is not None:
        marks.append(Mark(failure.context, f"measured: {failure.kind}", color="bad"))
    if predicted is not None:
        marks.append(Mark(predicted.context, "planner", color="reference", dash="dot"))
    return Chart(
        title="Context steps and the OOM frontier",
        x=Axis("tokens per sequence"),
        y=Axis("peak KV usage", share=True),
        y2=Axis("E2E p50 (s)"),
        traces=traces,
        marks=marks,
    )


def notes(r: Result) -> list[str]:
    """The planner's reasoning and the engine's health afterwards."""
    out = [f"Planner: {r.predicted.why}."] if r.predicted else []
    return [*out, f"Engine health afterwards: {r.health_after}."]


def table(r: Result) -> list[Row]:
    """One row per context tried."""
    return dump_rows(
        r.steps,
        (
            "context",
            "outcome",
            "ok",
            "errors",
            "kv_usage_peak",
            "running_peak",
            "waiting_peak",
            "preemptions",
            "kv_wait_free_blocks",
            "blocks_needed",
            "ttft_p50_s",
            "e2e_p50_s",
            "together",
            "tries",
            "bisect",
            "why",
        ),
    )


KIND: ProbeKind[Params, Result, Progress] = ProbeKind(
    name="oom",
    title="OOM (context frontier)",
    command="oom",
    summary="Grow the context of a batch until the engine queues, preempts, rejects or fails.",
    params=Params,
    result=Result,
    progress=Progress,
    run=run,
    form=(
        FormField("batch", "concurrent sequences"),
        FormField("start_context", "first context"),
        FormField("step", "tokens added per step"),
        FormField("output_tokens", "output tokens"),
    ),
    cli=(
        CliOption("confirm"),
        CliOption("batch"),
        CliOption("start_context"),
        CliOption("step"),
        CliOption("max_context"),
        CliOption(
            "search", flag="bisect", sets="bisect", help="narrow the frontier down after a failure"
        ),
        CliOption("allow_external"),
    ),
    chart=lambda r: steps_chart(r.steps, r.failure, r.predicted),
    partial_chart=lambda p: steps_chart(p.steps, None, None) if p.steps else None,
    headline=lambda r: r.message,
    table=table,
    notes=notes,
    destructive=True,
    danger="pushes an engine until it fails",
)
