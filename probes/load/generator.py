"""An honest load generator for OpenAI-compatible streaming endpoints (vLLM and the like).

Open loop: every request is sent at its precomputed time whatever the others are doing, so
slow answers cannot hide latency (no coordinated omission); TTFT and E2E count from the
*scheduled* time and the generator's own lateness (sent - scheduled) is reported and judged.
Closed loop: a fixed number of requests in flight (the batch sweep). The HTTP client is
injected; the hot path parses JSON only for the few chunks that need it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import ssl
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict, PositiveFloat, ValidationError, model_validator

from planner.errors import InvalidInput, validation_message
from probes.load.transport import LeanTransport
from probes.vllm.client import Endpoint

Status = Literal["ok", "error", "cancelled"]
StopReason = Literal["done", "max_requests", "max_duration", "cancelled"]
Cancel = asyncio.Event | Callable[[], bool]
Progress = Callable[[int, int], None]
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

# asyncio's timers wake up to 1 ms late (epoll counts milliseconds), so the last stretch
# before a send is covered by yielding to the loop instead of sleeping.
SPIN_S = 0.0015
CANCEL_POLL_S = 0.05
PROGRESS_EVERY_S = 0.2


def validated(model: type[M], data: Mapping[str, Any], what: str) -> M:
    """`model(**data)`, with pydantic's complaints turned into one InvalidInput line."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as err:
        raise InvalidInput(f"invalid {what}: {validation_message(err)}") from err


class Arrival(BaseModel):
    """When requests arrive: a process and its rate, turned into offsets for a seed.

    `cv` is the coefficient of variation of the gaps for `gamma` (1 is Poisson, above 1
    burstier); vllm bench's `--burstiness` is 1/cv². `ramp` goes from `rate` to `end_rate`
    linearly over `ramp_s` seconds, evenly spaced, then stays at `end_rate`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["poisson", "gamma", "constant", "ramp"] = "poisson"
    rate: PositiveFloat
    cv: PositiveFloat = 1.0
    end_rate: PositiveFloat | None = None
    ramp_s: PositiveFloat | None = None

    @model_validator(mode="after")
    def _ramp_needs_its_end(self) -> Arrival:
        if self.kind == "ramp" and (self.end_rate is None or self.ramp_s is None):
            raise ValueError("a ramp needs end_rate and ramp_s")
        return self

    def offsets(self, n: int, seed: int = 0) -> list[float]:
        """`n` send times in seconds from the start, the first at 0; same seed, same times."""
        if n <= 0:
            return []
        rng = np.random.default_rng(seed)
        i = np.arange(n, dtype=float)
        if self.kind == "constant":
            t = i / self.rate
        elif self.kind == "ramp":
            assert self.end_rate is not None and self.ramp_s is not None
            a, b, span = self.rate, self.end_rate, self.ramp_s
            in_ramp = (a + b) / 2 * span  # arrivals during the ramp
            # Solve a*t + (b-a)/(2*span)*t² = i for the ramp part.
            k = (b - a) / (2 * span)
            # (Past the ramp a falling rate makes the root negative; those i are not used.)
            root = np.sqrt(np.maximum(a * a + 4 * k * i, 0.0))
            ramp_t = i / a if k == 0 else (root - a) / (2 * k)
            t = np.where(i <= in_ramp, ramp_t, span + (i - in_ramp) / b)
        else:
            cv = 1.0 if self.kind == "poisson" else self.cv
            gaps = rng.gamma(shape=1 / cv**2, scale=cv**2 / self.rate, size=n - 1)
            t = np.concatenate(([0.0], np.cumsum(gaps)))
        return [float(x) for x in t]

    def within(self, duration_s: float, seed: int = 0) -> list[float]:
        """Every send time in [0, duration_s): a constant 20/s for 1 s is 20 requests (how
        many is up to the process, for Poisson)."""
        peak = max(self.rate, self.end_rate or 0.0)
        n = int(peak * duration_s * 1.5) + 16
        while (t := self.offsets(n, seed))[-1] < duration_s:
            n *= 2
        return [x for x in t if x < duration_s]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send. Requests of one `session` go in order, each after the last ended."""

    prompt: str
    max_tokens: int
    session: str | None = None
    tags: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Bounds:
    """Limits of a run: no request is sent past `max_requests` or after `max_duration_s`
    (schedule time), and each one in flight gets `request_timeout_s` in all, so a run
    ends by max_duration_s + request_timeout_s at the latest."""

    max_requests: int | None = None
    max_duration_s: float | None = None
    request_timeout_s: float = 300.0


@dataclass(frozen=True)
class RequestResult:
    """One request as sent and answered; the fields match storage's RequestRecord columns.

    Times are wall-clock seconds. TTFT and E2E count from `scheduled_ts`, so a late send
    is the generator's delay and is never hidden; `lateness_s` says how much of it there was.
    """

    seq: int
    scheduled_ts: float
    sent_ts: float | None
    first_token_ts: float | None
    end_ts: float | None
    prompt_tokens: int | None
    output_tokens: int | None
    status: Status
    http_status: int | None
    finish_reason: str | None
    error: str | None
    itl_summary: dict[str, Any]
    itl_ms: list[float]
    tags: dict[str, Any]

    @property
    def lateness_s(self) -> float | None:
        return None if self.sent_ts is None else self.sent_ts - self.scheduled_ts

    @property
    def ttft_s(self) -> float | None:
        """First token minus the scheduled time."""
        return None if self.first_token_ts is None else self.first_token_ts - self.scheduled_ts

    @property
    def e2e_s(self) -> float | None:
        """End of the stream minus the scheduled time."""
        return None if self.end_ts is None else self.end_ts - self.scheduled_ts

    @property
    def tpot_s(self) -> float | None:
        """(end - first token) / (output tokens - 1), for answers of two tokens or more."""
        if self.end_ts is None or self.first_token_ts is None or (self.output_tokens or 0) < 2:
            return None
        assert self.output_tokens is not None
        return (self.end_ts - self.first_token_ts) / (self.output_tokens - 1)

    def row(self) -> dict[str, Any]:
        """Keyword arguments for storage.tables.RequestRecord (add run_id)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class RunResult:
    """What a run produced, why it stopped, and whether its latencies can be trusted."""

    records: list[RequestResult]  # by seq; requests never sent have none
    planned: int  # requests the list, the schedule and the bounds allowed
    stopped: StopReason
    started_ts: float  # wall clock of schedule offset 0
    lateness_limit_s: float
    trustworthy: bool  # p99 send lateness within the limit
    reason: str | None  # why not, for a person

    def summary(self, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None) -> Summary:
        """`summarize` over this run's records with its own lateness limit."""
        return summarize(self.records, ttft_slo_s, tpot_slo_s, self.lateness_limit_s)


class _Live:
    """Mutable state of one request while it runs; perf_counter times."""

    __slots__ = (
        "due",
        "end",
        "error",
        "finish",
        "first",
        "gaps",
        "http_status",
        "output_tokens",
        "prompt_tokens",
        "sent",
        "seq",
        "spec",
        "status",
    )

    def __init__(self, seq: int, spec: RequestSpec, due: float) -> None:
        self.seq, self.spec, self.due = seq, spec, due
        self.sent: float | None = None
        self.first: float | None = None
        self.end: float | None = None
        self.gaps: list[float] = []
        self.status: Status = "error"
        self.http_status: int | None = None
        self.finish: str | None = None
        self.error: str | None = None
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None


class _Run:
    """One run's shared state: the client, the records so far, the stop signal."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        endpoint: Endpoint,
        specs: Sequence[RequestSpec],
        planned: int,
        bounds: Bounds,
        progress: Progress | None,
    ) -> None:
        self.client, self.bounds = client, bounds
        self.url = endpoint.url
        self.headers = {"content-type": "application/json", "accept-encoding": "identity"}
        self.headers |= endpoint.headers
        self.timeout = httpx.Timeout(bounds.request_timeout_s)
        self.chat = endpoint.api == "chat"
        self.specs, self.planned = specs, planned
        self.bodies = [endpoint.body(s.prompt, s.max_tokens) for s in specs[:planned]]
        self.progress = progress
        self.last_progress = 0.0
        self.done: list[_Live] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.sessions: dict[str, asyncio.Future[float]] = {}
        self.stopped: StopReason | None = None
        # Wall-clock times are perf_counter readings offset to one wall-clock anchor.
        self.anchor_wall, self.anchor_pc = time.time(), time.perf_counter()
        self.t0 = self.anchor_pc

    # -- the hot path ------------------------------------------------------------------

    async def send(self, seq: int, due: float) -> None:
        """Send request `seq` now (its schedule said `due`) and record what comes back."""
        live = _Live(seq, self.specs[seq], due)
        session = live.spec.session
        turn: asyncio.Future[float] | None = None
        try:
            if session is not None:
                # Claimed before the first await, so turns queue in dispatch order.
                prev = self.sessions.get(session)
                turn = self.sessions[session] = asyncio.get_running_loop().create_future()
                if prev is not None:
                    # A turn cannot start before the previous answer; it is due from then.
                    live.due = max(due, await prev)
            async with asyncio.timeout(self.bounds.request_timeout_s):
                live.sent = time.perf_counter()
                async with self.client.stream(
                    "POST", self.url, content=self.bodies[seq], headers=self.headers,
                    timeout=self.timeout,
                ) as resp:  # fmt: skip
                    live.http_status = resp.status_code
                    if resp.status_code != 200:
                        live.end = time.perf_counter()
                        live.error = _error_text(await resp.aread(), resp.status_code)
                    else:
                        await self._read_stream(resp, live)
        except asyncio.CancelledError:
            live.status, live.error = "cancelled", "cancelled while in flight"
            if self.stopped != "cancelled":
                raise  # cancelled from outside the run: let it unwind
        except TimeoutError:
            live.error = f"no complete answer within {self.bounds.request_timeout_s:g} s"
        except Exception as err:  # failures are data: transport errors, broken servers
            live.error = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        finally:
            if live.end is None:
                live.end = time.perf_counter()
            if turn is not None:
                turn.set_result(live.end)
            self._finished(live)

    async def _read_stream(self, resp: httpx.Response, live: _Live) -> None:
        """Read SSE events; time every token chunk, parse JSON only where the fast test fails.

        Reads on past [DONE] to the end of the body, so the connection goes back to the pool.
        """
        buf = b""
        gaps = live.gaps
        last = 0.0
        done = False
        async for data in resp.aiter_bytes():
            now = time.perf_counter()
            buf = buf + data if buf else data
            if b"\r" in buf:
                buf = buf.replace(b"\r\n", b"\n")
            while (cut := buf.find(b"\n\n")) >= 0:
                event, buf = buf[:cut], buf[cut + 2 :]
                if not event.startswith(b"data:") or done:
                    continue  # comments, pings, event names
                payload = event[5:].strip()
                # A plain token chunk: one per token in vLLM; no JSON parse needed.
                if b'"finish_reason":null' in payload and b'"role":' not in payload:
                    token = True
                elif payload == b"[DONE]":
                    live.end, done = now, True
                    token = False
                else:
                    token = self._parse_chunk(payload, live)
                if token:
                    if live.first is None:
                        live.first = now
                    else:
                        gaps.append(now - last)
                    last = now
        if not done:
            live.end = time.perf_counter()
            live.error = live.error or "the stream ended without [DONE]"
        elif live.error is None:
            live.status = "ok"

    def _parse_chunk(self, payload: bytes, live: _Live) -> bool:
        """Usage, finish reason, errors and chat's role chunk; True when it carries a token."""
        try:
            chunk = json.loads(payload)
        except ValueError:
            live.error = f"unreadable stream chunk: {payload[:200]!r}"
            return False
        if err := chunk.get("error"):
            live.error = str(err.get("message", err) if isinstance(err, dict) else err)
            return False
        if usage := chunk.get("usage"):
            live.prompt_tokens = usage.get("prompt_tokens")
            live.output_tokens = usage.get("completion_tokens")
        choices = chunk.get("choices")
        if not choices:
            return False
        choice = choices[0]
        if choice.get("finish_reason"):
            live.finish = choice["finish_reason"]
        if self.chat:
            # The opening chunk carries the role and no text: not a token.
            delta = choice.get("delta") or {}
            return bool(delta.get("content") or delta.get("reasoning_content"))
        return True

    def _finished(self, live: _Live) -> None:
        self.done.append(live)
        if self.progress is not None:
            now = time.perf_counter()
            if now - self.last_progress >= PROGRESS_EVERY_S:
                self.last_progress = now
                self.progress(len(self.done), self.planned)

    # -- dispatch ----------------------------------------------------------------------

    def start(self, seq: int, due: float) -> None:
        task = asyncio.get_running_loop().create_task(self.send(seq, due))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def open_loop(self, offsets: Sequence[float]) -> None:
        """Start each request at its time; never wait for an answer."""
        t0 = self.t0 = time.perf_counter() + 0.002  # a moment to enter the loop on time
        for seq in range(self.planned):
            due = t0 + offsets[seq]
            if due > time.perf_counter():
                await _wait_until(due)
            self.start(seq, due)

    async def closed_loop(self, concurrency: int) -> None:
        """Keep `concurrency` requests in flight; each slot sends its next as one ends."""
        self.t0 = time.perf_counter()
        limit = self.bounds.max_duration_s
        end = math.inf if limit is None else self.t0 + limit
        next_seq = iter(range(self.planned))

        async def slot() -> None:
            for seq in next_seq:
                now = time.perf_counter()
                if now > end:
                    self.stopped = self.stopped or "max_duration"
                    return
                await self.send(seq, now)
                if self.stopped == "cancelled":
                    return

        await asyncio.gather(*(slot() for _ in range(concurrency)))

    def result(self, lateness_limit_s: float) -> RunResult:
        records = sorted((self._record(x) for x in self.done), key=lambda r: r.seq)
        ok, reason = lateness_verdict(records, lateness_limit_s)
        stopped: StopReason = self.stopped or "done"
        return RunResult(
            records, self.planned, stopped, self._wall(self.t0), lateness_limit_s, ok, reason
        )

    def _wall(self, pc: float) -> float:
        return self.anchor_wall + (pc - self.anchor_pc)

    def _record(self, x: _Live) -> RequestResult:
        itl = [round(g * 1000, 3) for g in x.gaps]
        output = x.output_tokens
        if output is None and x.first is not None:
            output = len(x.gaps) + 1  # no usage chunk: count the token chunks
        return RequestResult(
            seq=x.seq,
            scheduled_ts=self._wall(x.due),
            sent_ts=None if x.sent is None else self._wall(x.sent),
            first_token_ts=None if x.first is None else self._wall(x.first),
            end_ts=None if x.end is None else self._wall(x.end),
            prompt_tokens=x.prompt_tokens,
            output_tokens=output,
            status=x.status,
            http_status=x.http_status,
            finish_reason=x.finish,
            error=x.error,
            itl_summary=_itl_summary(itl),
            itl_ms=itl,
            tags=dict(x.spec.tags),
        )


async def _wait_until(due: float) -> None:
    """Sleep to just before `due`, then yield to the loop until it passes."""
    ahead = due - time.perf_counter() - SPIN_S
    if ahead > 0:
        await asyncio.sleep(ahead)
    while time.perf_counter() < due:
        await asyncio.sleep(0)


async def _run(
    run: _Run,
    dispatch: Callable[[], Coroutine[Any, Any, None]],
    cancel: Cancel | None,
    lateness_limit_s: float,
) -> RunResult:
    """Drive `dispatch`, then drain the requests in flight; a cancel stops both."""
    dispatcher = asyncio.ensure_future(dispatch())
    drained = asyncio.ensure_future(_drain(run, dispatcher))
    watcher = asyncio.ensure_future(_watch(cancel)) if cancel is not None else None
    try:
        if watcher is not None:
            await asyncio.wait({drained, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not drained.done():
                run.stopped = "cancelled"
                dispatcher.cancel()
                for task in list(run.tasks):
                    task.cancel()
        await drained
    finally:
        for fut in [dispatcher, drained, *run.tasks, *([watcher] if watcher else [])]:
            fut.cancel()
    if run.progress is not None:
        run.progress(len(run.done), run.planned)
    return run.result(lateness_limit_s)


async def _drain(run: _Run, dispatcher: asyncio.Future[None]) -> None:
    """Return when dispatch has ended and every request it started has ended too."""
    await asyncio.wait({dispatcher})
    if not dispatcher.cancelled() and (err := dispatcher.exception()) is not None:
        raise err
    if run.tasks:
        await asyncio.wait(set(run.tasks))


async def _watch(cancel: Cancel) -> None:
    """Return when the cancel signal is raised."""
    if isinstance(cancel, asyncio.Event):
        await cancel.wait()
        return
    while not cancel():
        await asyncio.sleep(CANCEL_POLL_S)


def _planned(n: int, bounds: Bounds) -> tuple[int, StopReason | None]:
    if bounds.max_requests is not None and bounds.max_requests < n:
        return bounds.max_requests, "max_requests"
    return n, None


async def run_open_loop(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    requests: Sequence[RequestSpec],
    schedule: Sequence[float],
    *,
    bounds: Bounds | None = None,
    cancel: Cancel | None = None,
    progress: Progress | None = None,
    lateness_limit_s: float = 0.010,
) -> RunResult:
    """Send `requests[i]` at `schedule[i]` seconds after the start, whatever the others do.

    TTFT and E2E count from the scheduled time. `cancel` (an Event, or a callable polled
    every 50 ms) stops it: nothing more is sent, in-flight requests are cancelled and
    recorded as such. `progress(done, planned)` runs on the loop, so keep it quick.
    """
    bounds = bounds or Bounds()
    offsets = list(schedule[: len(requests)])
    if any(b < a for a, b in itertools.pairwise(offsets)) or (offsets and offsets[0] < 0):
        raise InvalidInput("the schedule must be non-negative and non-decreasing")
    planned, stopped = _planned(len(offsets), bounds)
    if bounds.max_duration_s is not None:
        within = sum(1 for t in offsets[:planned] if t <= bounds.max_duration_s)
        if within < planned:
            planned, stopped = within, "max_duration"
    run = _Run(client, endpoint, requests, planned, bounds, progress)
    run.stopped = stopped
    return await _run(run, lambda: run.open_loop(offsets), cancel, lateness_limit_s)


async def run_closed_loop(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    requests: Sequence[RequestSpec],
    concurrency: int,
    *,
    bounds: Bounds | None = None,
    cancel: Cancel | None = None,
    progress: Progress | None = None,
    lateness_limit_s: float = 0.010,
) -> RunResult:
    """Keep `concurrency` requests in flight until `requests` or the bounds run out.

    Each request is scheduled the moment its slot frees up, so lateness is near zero and
    latencies are those of a fixed batch. Cancel and progress work as in `run_open_loop`.
    """
    if concurrency < 1:
        raise InvalidInput(f"concurrency must be at least 1, not {concurrency}")
    bounds = bounds or Bounds()
    planned, stopped = _planned(len(requests), bounds)
    run = _Run(client, endpoint, requests, planned, bounds, progress)
    run.stopped = stopped
    return await _run(run, lambda: run.closed_loop(concurrency), cancel, lateness_limit_s)


def new_client(
    request_timeout_s: float = 300.0, verify: bool | ssl.SSLContext = True
) -> httpx.AsyncClient:
    """An httpx client fit for load: the lean transport below, no connection limit."""
    return httpx.AsyncClient(transport=LeanTransport(verify), timeout=request_timeout_s)


def _error_text(body: bytes, status: int) -> str:
    """The message of an OpenAI/vLLM error body, or the start of whatever came back."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error", data.get("detail"))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if err is not None:
            return str(err)
    text = body[:500].decode("utf-8", "replace").strip()
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


def _itl_summary(itl_ms: list[float]) -> dict[str, Any]:
    if not itl_ms:
        return {"n": 0}
    q = np.quantile(np.asarray(itl_ms), [0.5, 0.95, 0.99])
    return {
        "n": len(itl_ms),
        "mean_ms": round(float(np.mean(itl_ms)), 3),
        "p50_ms": round(float(q[0]), 3),
        "p95_ms": round(float(q[1]), 3),
        "p99_ms": round(float(q[2]), 3),
        "max_ms": max(itl_ms),
    }


# -- summaries -----------------------------------------------------------------------------


class _Figures(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class Percentiles(_Figures):
    """p50/p95/p99/mean of one latency in seconds; None without data."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None

    @property
    def tail_ratio(self) -> float | None:
        """p99 / p50: how much worse the tail is than the typical request."""
        if self.p50 is None or self.p99 is None or self.p50 <= 0:
            return None
        return self.p99 / self.p50


class Lateness(_Figures):
    """How late the generator sent, in seconds: the run's own delay, never hidden."""

    p50: float | None = None
    p99: float | None = None
    max: float | None = None


class TailRatios(_Figures):
    """p99 / p50 of each latency."""

    ttft_s: float | None = None
    itl_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


class Summary(_Figures):
    """A run in figures: what the CLI prints and the latency probes build on."""

    requests: int
    ok: int
    errors: int
    cancelled: int
    duration_s: float
    ttft_s: Percentiles
    itl_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    lateness_s: Lateness
    output_tokens_per_s: float
    requests_per_s: float
    slo_share: float | None
    trustworthy: bool
    reason: str | None
    p99_over_p50: TailRatios


def percentiles(values: Sequence[float] | np.ndarray) -> Percentiles:
    """Linear-interpolated p50/p95/p99 (as planner.stats.percentile) and the mean."""
    xs = np.asarray(values, dtype=float)
    if xs.size == 0:
        return Percentiles()
    q = np.quantile(xs, [0.5, 0.95, 0.99])
    return Percentiles(p50=float(q[0]), p95=float(q[1]), p99=float(q[2]), mean=float(xs.mean()))


def lateness_verdict(records: Sequence[RequestResult], limit_s: float) -> tuple[bool, str | None]:
    """Trustworthy unless the p99 of send lateness exceeds `limit_s`; the reason if not."""
    late = [x for r in records if (x := r.lateness_s) is not None]
    if not late:
        return True, None
    p99 = float(np.quantile(np.asarray(late), 0.99))
    if p99 <= limit_s:
        return True, None
    return False, (
        f"p99 send lateness {p99 * 1000:.1f} ms exceeds {limit_s * 1000:g} ms: the generator "
        "could not keep to its schedule (CPU-bound client?), so these latencies include its "
        "own delay"
    )


def summarize(
    records: Sequence[RequestResult],
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
    lateness_limit_s: float = 0.010,
) -> Summary:
    """Latency percentiles over successful requests; ITL pools every gap of every request.

    TPOT per request is (end - first token) / (output tokens - 1), for answers of two or
    more tokens. `slo_share` is the share of ok-or-error requests that succeeded within
    both given bounds (errors count as misses); None when no bound is given.
    """
    ok = [r for r in records if r.status == "ok"]
    errors = sum(1 for r in records if r.status == "error")
    cancelled = sum(1 for r in records if r.status == "cancelled")
    ends = [r.end_ts for r in ok if r.end_ts is not None]
    start = min((r.scheduled_ts for r in records), default=0.0)
    duration = max(ends) - start if ends else 0.0
    ttft = [x for r in ok if (x := r.ttft_s) is not None]
    tpot = [x for r in ok if (x := r.tpot_s) is not None]
    e2e = [x for r in ok if (x := r.e2e_s) is not None]
    gaps = np.fromiter((g for r in ok for g in r.itl_ms), dtype=float) / 1000.0
    late = np.asarray([x for r in records if (x := r.lateness_s) is not None], dtype=float)
    lateness = Lateness()
    if late.size:
        q = np.quantile(late, [0.5, 0.99])
        lateness = Lateness(p50=float(q[0]), p99=float(q[1]), max=float(late.max()))
    tokens = sum(r.output_tokens or 0 for r in ok)
    share = None
    if ttft_slo_s is not None or tpot_slo_s is not None:
        judged = len(ok) + errors
        good = sum(1 for r in ok if _within(r, ttft_slo_s, tpot_slo_s))
        share = good / judged if judged else None
    trustworthy, reason = lateness_verdict(records, lateness_limit_s)
    tails = {
        "ttft_s": percentiles(ttft),
        "itl_s": percentiles(gaps),
        "tpot_s": percentiles(tpot),
        "e2e_s": percentiles(e2e),
    }
    return Summary(
        requests=len(records),
        ok=len(ok),
        errors=errors,
        cancelled=cancelled,
        duration_s=duration,
        **tails,
        lateness_s=lateness,
        output_tokens_per_s=tokens / duration if duration > 0 else 0.0,
        requests_per_s=len(ok) / duration if duration > 0 else 0.0,
        slo_share=share,
        trustworthy=trustworthy,
        reason=reason,
        p99_over_p50=TailRatios(**{k: v.tail_ratio for k, v in tails.items()}),
    )


def _within(r: RequestResult, ttft_slo_s: float | None, tpot_slo_s: float | None) -> bool:
    ttft, tpot = r.ttft_s, r.tpot_s
    if ttft_slo_s is not None and (ttft is None or ttft > ttft_slo_s):
        return False
    # A one-token answer has no TPOT and cannot miss that bound.
    return tpot_slo_s is None or tpot is None or tpot <= tpot_slo_s
