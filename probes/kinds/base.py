"""What every probe shares: its context, the engine's metrics around a run, and helpers.

A probe is a module with a `Params` model and `async def run(ctx, params) -> dict`. The
context hands it the HTTP client (injected: tests pass a loopback server), the target,
a cancel check, a progress callback that also carries partial results, and a sink for the
request records it sends. Nothing here knows the store; `probes/runner.py` wires that up.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

import httpx
from pydantic import BaseModel, ConfigDict, Field

from planner import slo
from planner.errors import InvalidInput, KvscopeError, TargetError
from planner.stats import histogram_quantile
from probes.loadgen import (
    Bounds,
    Endpoint,
    Progress,
    RequestResult,
    RequestSpec,
    RunResult,
    run_closed_loop,
    run_open_loop,
)
from probes.metrics import ParsedScrape, parse_metrics
from probes.workloads import Profile, PromptBuilder, RequestShape
from storage.schemas import normalize_base_url

T = TypeVar("T")
Report = Callable[[float, dict[str, Any]], None]
Sink = Callable[[Sequence[RequestResult], str], None]


class ProbeParams(BaseModel):
    """Common to every probe's parameters: strict, so a typo is an error, not a default."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    api: Literal["completions", "chat"] = "completions"
    request_timeout_s: float = Field(300.0, gt=0)


class ProbeCancelled(KvscopeError):
    """The user stopped the probe; what it measured so far is kept."""


@dataclass
class ProbeContext:
    """What a probe may use. `report(fraction, partial)` may be called often; it is cheap."""

    base_url: str
    model: str
    client: httpx.AsyncClient
    cancelled: Callable[[], bool] = lambda: False
    report: Report = lambda fraction, partial: None
    sink: Sink = lambda records, step: None
    managed: bool = False
    facts: dict[str, Any] = field(default_factory=dict)  # e.g. the planner's prediction

    def endpoint(self, api: Literal["completions", "chat"] = "completions") -> Endpoint:
        """Where requests go."""
        return Endpoint(self.base_url, self.model, api=api)

    async def open_loop(
        self,
        params: ProbeParams,
        specs: Sequence[RequestSpec],
        schedule: Sequence[float],
        *,
        max_duration_s: float | None = None,
        progress: Progress | None = None,
        lateness_limit_s: float = 0.010,
    ) -> RunResult:
        """The open loop against this target, with the probe's request timeout and cancel."""
        return await run_open_loop(
            self.client,
            self.endpoint(params.api),
            specs,
            schedule,
            bounds=Bounds(
                max_duration_s=max_duration_s, request_timeout_s=params.request_timeout_s
            ),
            cancel=self.cancelled,
            progress=progress,
            lateness_limit_s=lateness_limit_s,
        )

    async def closed_loop(
        self, params: ProbeParams, specs: Sequence[RequestSpec], concurrency: int
    ) -> RunResult:
        """The closed loop against this target, with the probe's request timeout and cancel."""
        return await run_closed_loop(
            self.client,
            self.endpoint(params.api),
            specs,
            concurrency,
            bounds=Bounds(request_timeout_s=params.request_timeout_s),
            cancel=self.cancelled,
        )

    def check_cancel(self) -> None:
        """Raise ProbeCancelled if the user asked to stop."""
        if self.cancelled():
            raise ProbeCancelled("cancelled on request; the steps measured so far are kept")

    async def prompts(
        self, shapes: Sequence[RequestShape], seed: int, api: str = "completions"
    ) -> list[RequestSpec]:
        """Prompts of exactly the shapes' token counts, by the target's own tokenizer."""
        builder = PromptBuilder(
            self.client, self.base_url, self.model, chat=api == "chat", seed=seed
        )
        return await builder.build(shapes)

    async def profile_prompts(
        self, profile: Profile, n: int, seed: int, api: str = "completions"
    ) -> list[RequestSpec]:
        """`n` prompts drawn from a workload profile."""
        return await self.prompts(profile.shapes(n, seed), seed, api)

    async def scrape(self) -> ParsedScrape:
        """The target's /metrics now."""
        try:
            resp = await self.client.get(f"{self.base_url}/metrics", timeout=10.0)
        except httpx.HTTPError as err:
            raise TargetError(f"cannot read {self.base_url}/metrics: {err}") from err
        if resp.status_code != 200:
            raise TargetError(f"{self.base_url}/metrics answered HTTP {resp.status_code}")
        # Parsed off the event loop: a 50 KB body would otherwise stall timing-critical reads.
        return await asyncio.to_thread(parse_metrics, resp.text)

    async def healthy(self, timeout: float = 5.0) -> bool:
        """Whether the engine answers /health."""
        try:
            resp = await self.client.get(f"{self.base_url}/health", timeout=timeout)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200


async def discover_model(client: httpx.AsyncClient, base_url: str) -> str:
    """The first model `/v1/models` lists; a clear error when the target has none."""
    url = f"{normalize_base_url(base_url)}/v1/models"
    try:
        resp = await client.get(url, timeout=10.0)
        data = resp.json()
    except httpx.HTTPError as err:
        raise TargetError(f"cannot reach {url}: {err}") from err
    except ValueError as err:
        raise TargetError(
            f"{url} did not answer JSON; is this an OpenAI-compatible server?"
        ) from err
    ids = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
    if resp.status_code != 200 or not ids:
        raise TargetError(f"{url} lists no model (HTTP {resp.status_code}); give --model")
    return str(ids[0])


# --- the engine's own view ---------------------------------------------------------------


def _sum(scrape: ParsedScrape, series: str) -> float | None:
    vals = [s.value for s in scrape.samples if s.series == series]
    return sum(vals) if vals else None


def _mean(scrape: ParsedScrape, series: str) -> float | None:
    vals = [s.value for s in scrape.samples if s.series == series]
    return sum(vals) / len(vals) if vals else None


def _buckets(scrape: ParsedScrape, histogram: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for s in scrape.samples:
        if s.series == f"{histogram}_bucket":
            le = float(s.labels["le"])
            out[le] = out.get(le, 0.0) + s.value
    return out


def histogram_delta(
    before: ParsedScrape, after: ParsedScrape, histogram: str
) -> dict[str, float | None]:
    """Count and p50/p95/p99 of the observations an engine histogram gained between two
    scrapes: the engine's own view of the requests sent in between."""
    later, earlier = sorted(_buckets(after, histogram).items()), _buckets(before, histogram)
    try:  # planner's delta: an engine restart in between counts from zero, not negative
        pairs = slo.histogram_delta(later, sorted(earlier.items())) if earlier else later
    except InvalidInput:  # other bucket edges, or none: the engine was not the same one
        pairs = later
    out: dict[str, float | None] = {"count": pairs[-1][1] if pairs else 0.0}
    for q in (0.5, 0.95, 0.99):
        v = histogram_quantile(q, pairs) if pairs else math.nan
        out[f"p{round(q * 100)}"] = None if math.isnan(v) else v
    return out


def counter_delta(before: ParsedScrape, after: ParsedScrape, series: str) -> float | None:
    """How much a counter grew between two scrapes (None when the engine lacks it)."""
    a, b = _sum(before, series), _sum(after, series)
    if a is None or b is None:
        return None
    return b - a if b >= a else b  # a restart in between: count from zero


@dataclass
class Sampler:
    """Samples KV usage, queues and preemptions every `every_s` while a step runs."""

    ctx: ProbeContext
    every_s: float = 1.0
    points: list[dict[str, Any]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _t0: float = 0.0

    async def __aenter__(self) -> Sampler:
        self._t0 = time.time()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.sample()  # one last point after the step

    async def _loop(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.every_s)

    async def sample(self) -> None:
        """Take one point."""
        try:
            scrape = await self.ctx.scrape()
        except KvscopeError:  # a missed point is a gap in the timeline, not a failed probe
            return
        kv = _mean(scrape, "kv_usage")
        blocks = scrape.cache_info.get("num_gpu_blocks")
        free = None
        if kv is not None and blocks and blocks.isdigit():
            # vLLM: usage = 1 - free / (num_blocks - 1); one block is the null block.
            free = round((1.0 - kv) * (int(blocks) - 1))
        self.points.append(
            {
                "t": round(time.time() - self._t0, 3),
                "ts": time.time(),
                "kv_usage": kv,
                "free_blocks": free,
                "running": _sum(scrape, "running"),
                "waiting": _sum(scrape, "waiting"),
                "preemptions_total": _sum(scrape, "preemptions_total"),
            }
        )

    def peak(self, key: str) -> float | None:
        """The highest value of a sampled quantity."""
        vals = [p[key] for p in self.points if p.get(key) is not None]
        return max(vals) if vals else None

    def increase(self, key: str) -> float | None:
        """How much a sampled counter grew over the step."""
        vals = [p[key] for p in self.points if p.get(key) is not None]
        if len(vals) < 2:
            return None
        return max(0.0, float(vals[-1]) - float(vals[0]))


def rounded(value: T, digits: int = 6) -> T:
    """Floats rounded for storage and JSON (NaN becomes None); containers walked."""
    return cast(T, _round(value, digits))


def _round(value: Any, digits: int) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, digits)
    if isinstance(value, Mapping):
        return {k: _round(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_round(v, digits) for v in value]
    return value
