"""An honest load generator for OpenAI-compatible streaming endpoints (vLLM and the like).

Open loop: every request is sent at its precomputed time whatever the others are doing, so
slow answers cannot hide latency (no coordinated omission); TTFT and E2E count from the
*scheduled* time and the generator's own lateness (sent - scheduled) is reported and judged.
Closed loop: a fixed number of requests in flight (the batch sweep). The HTTP client is
injected; the hot path parses JSON only for the few chunks that need it.

Memory follows what is in flight, not what is planned: the schedule and the prompts may be
iterators consumed as the run goes, finished records are handed to `on_records` in batches
(off the event loop), and the summary is kept as a compact tally (a few numbers a request).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
import ssl
import sys
import time
from array import array
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict

from planner.errors import InvalidInput
from planner.workload import shape_class
from probes.vllm.client import Endpoint
from probes.vllm.transport import LeanTransport

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
FLUSH_EVERY_S = 0.5


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
    # Open loop: a request due while this many are in flight is not sent; it is recorded
    # as an error (a miss, never silently delayed), so the client cannot run away.
    max_in_flight: int | None = None


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


def request_class(r: RequestResult) -> str:
    """A request's class: its component of a mixed workload profile, else its prompt band."""
    component = r.tags.get("component")
    return shape_class(str(component) if component else None, r.prompt_tokens)


@dataclass(frozen=True)
class RunResult:
    """What a run produced, why it stopped, and whether its latencies can be trusted.

    `records` holds every request by seq when the run was asked to keep them; otherwise
    they went to `on_records` as the run went and only the compact `tally` is kept.
    """

    records: list[RequestResult]
    planned: int  # requests the list, the schedule and the bounds allowed (or expected)
    stopped: StopReason
    started_ts: float  # wall clock of schedule offset 0
    lateness_limit_s: float
    trustworthy: bool  # p99 send lateness within the limit
    reason: str | None  # why not, for a person
    tally: Tally
    by_class: dict[str, Tally] = field(default_factory=dict)  # see request_class

    def summary(self, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None) -> Summary:
        """The run in figures, judged against its own lateness limit."""
        return self.tally.summary(ttft_slo_s, tpot_slo_s, self.lateness_limit_s)


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
    """One run's shared state: the client, the requests, the records so far, the stop signal."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        endpoint: Endpoint,
        requests: Sequence[RequestSpec] | AsyncIterator[RequestSpec],
        planned: int,
        bounds: Bounds,
        progress: Progress | None,
        on_records: Callable[[list[RequestResult]], None] | None,
        keep_records: bool,
    ) -> None:
        self.client, self.bounds, self.endpoint = client, bounds, endpoint
        self.url = endpoint.url
        self.headers = {"content-type": "application/json", "accept-encoding": "identity"}
        self.headers |= endpoint.headers
        self.extensions = dict(endpoint.extensions)  # the target's allowlist, at connect time
        self.timeout = httpx.Timeout(bounds.request_timeout_s)
        self.chat = endpoint.api == "chat"
        # `limit` stops the dispatch; `planned` is what progress counts towards (an estimate
        # for a schedule that is an iterator).
        self.requests, self.limit, self.planned = requests, planned, planned
        self.progress = progress
        self.last_progress = 0.0
        self.finished = 0
        self.pending: list[RequestResult] = []  # finished, not yet handed on
        self.kept: list[RequestResult] = []
        self.keep = keep_records
        self.on_records = on_records
        self.flushing: asyncio.Task[None] | None = None
        self.last_flush = 0.0
        self.tally = Tally()
        self.by_class: dict[str, Tally] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.sessions: dict[str, asyncio.Future[float]] = {}
        self.stopped: StopReason | None = None
        # Wall-clock times are perf_counter readings offset to one wall-clock anchor.
        self.anchor_wall, self.anchor_pc = time.time(), time.perf_counter()
        self.t0 = self.anchor_pc

    async def spec(self, seq: int) -> RequestSpec | None:
        """Request `seq`, or None when the requests ran out."""
        if isinstance(self.requests, Sequence):
            return self.requests[seq] if seq < len(self.requests) else None
        return await anext(self.requests, None)

    # -- the hot path ------------------------------------------------------------------

    async def send(self, seq: int, spec: RequestSpec, due: float) -> None:
        """Send request `seq` now (its schedule said `due`) and record what comes back."""
        live = _Live(seq, spec, due)
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
                body = self.endpoint.body(spec.prompt, spec.max_tokens)
                async with self.client.stream(
                    "POST", self.url, content=body, headers=self.headers, timeout=self.timeout,
                    extensions=self.extensions, follow_redirects=False,
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
        record = self._record(live)
        self.tally.add(record)
        self.by_class.setdefault(request_class(record), Tally()).add(record)
        self.finished += 1
        if self.keep:
            self.kept.append(record)
        if self.on_records is not None:
            self.pending.append(record)
        now = time.perf_counter()
        if self.pending and now - self.last_flush >= FLUSH_EVERY_S and self.flushing is None:
            self.last_flush = now
            self.flushing = asyncio.get_running_loop().create_task(self._flush())
        if self.progress is not None and now - self.last_progress >= PROGRESS_EVERY_S:
            self.last_progress = now
            self.progress(self.finished, self.planned)

    async def _flush(self) -> None:
        """Hand finished records on, in a thread: a store write must not stall the sends."""
        try:
            while self.pending and self.on_records is not None:
                batch, self.pending = self.pending, []
                await asyncio.to_thread(self.on_records, batch)
        finally:
            self.flushing = None

    async def flush_all(self) -> None:
        """Hand on what is left, once the run is over."""
        if self.flushing is not None:
            await asyncio.shield(self.flushing)
        if self.pending:
            await self._flush()

    # -- dispatch ----------------------------------------------------------------------

    def start(self, seq: int, spec: RequestSpec, due: float) -> None:
        task = asyncio.get_running_loop().create_task(self.send(seq, spec, due))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def refuse(self, seq: int, spec: RequestSpec, due: float) -> None:
        """A request due while the in-flight cap is reached: a miss on the record."""
        live = _Live(seq, spec, due)
        live.end = time.perf_counter()
        live.error = f"not sent: {len(self.tasks)} requests already in flight (the in-flight limit)"
        self._finished(live)

    async def open_loop(self, offsets: Iterable[float]) -> None:
        """Start each request at its time; never wait for an answer."""
        t0 = self.t0 = time.perf_counter() + 0.002  # a moment to enter the loop on time
        cap, last = self.bounds.max_in_flight, 0.0
        for seq, offset in enumerate(offsets):
            if seq >= self.limit:
                self.stopped = self.stopped or "max_requests"
                break
            if offset < last:
                raise InvalidInput("the schedule must be non-negative and non-decreasing")
            last = offset
            spec = await self.spec(seq)
            if spec is None:
                break
            due = t0 + offset
            if due > time.perf_counter():
                await _wait_until(due)
            if cap is not None and len(self.tasks) >= cap:
                self.refuse(seq, spec, due)
            else:
                self.start(seq, spec, due)

    async def closed_loop(self, concurrency: int) -> None:
        """Keep `concurrency` requests in flight; each slot sends its next as one ends."""
        self.t0 = time.perf_counter()
        limit = self.bounds.max_duration_s
        end = math.inf if limit is None else self.t0 + limit
        next_seq = iter(range(self.limit))

        async def slot() -> None:
            for seq in next_seq:
                now = time.perf_counter()
                if now > end:
                    self.stopped = self.stopped or "max_duration"
                    return
                spec = await self.spec(seq)
                if spec is None:
                    return
                await self.send(seq, spec, now)
                if self.stopped == "cancelled":
                    return

        await asyncio.gather(*(slot() for _ in range(concurrency)))

    def result(self, lateness_limit_s: float) -> RunResult:
        ok, reason = self.tally.lateness_verdict(lateness_limit_s)
        stopped: StopReason = self.stopped or "done"
        return RunResult(
            sorted(self.kept, key=lambda r: r.seq),
            self.planned,
            stopped,
            self._wall(self.t0),
            lateness_limit_s,
            ok,
            reason,
            self.tally,
            dict(self.by_class),
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
    await run.flush_all()
    if run.progress is not None:
        run.progress(run.finished, run.planned)
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
    requests: Sequence[RequestSpec] | AsyncIterator[RequestSpec],
    schedule: Sequence[float] | Iterable[float],
    *,
    bounds: Bounds | None = None,
    cancel: Cancel | None = None,
    progress: Progress | None = None,
    lateness_limit_s: float = 0.010,
    planned: int | None = None,
    on_records: Callable[[list[RequestResult]], None] | None = None,
    keep_records: bool = True,
) -> RunResult:
    """Send request i at `schedule[i]` seconds after the start, whatever the others do.

    TTFT and E2E count from the scheduled time. `requests` and `schedule` may be lists or
    iterators consumed as the run goes (give `planned`, the expected count, for progress).
    `cancel` (an Event, or a callable polled every 50 ms) stops it: nothing more is sent,
    in-flight requests are cancelled and recorded as such. `progress(done, planned)` runs
    on the loop, so keep it quick; `on_records(batch)` runs in a thread.
    """
    bounds = bounds or Bounds()
    stopped: StopReason | None = None
    if isinstance(schedule, Sequence) and isinstance(requests, Sequence):
        offsets = list(schedule[: len(requests)])
        if any(b < a for a, b in itertools.pairwise(offsets)) or (offsets and offsets[0] < 0):
            raise InvalidInput("the schedule must be non-negative and non-decreasing")
        count, stopped = _planned(len(offsets), bounds)
        if bounds.max_duration_s is not None:
            within = sum(1 for t in offsets[:count] if t <= bounds.max_duration_s)
            if within < count:
                count, stopped = within, "max_duration"
        schedule = offsets
    else:
        count = bounds.max_requests if bounds.max_requests is not None else sys.maxsize
        if bounds.max_duration_s is not None:
            limit = bounds.max_duration_s
            schedule = itertools.takewhile(lambda t: t <= limit, schedule)
    run = _Run(client, endpoint, requests, count, bounds, progress, on_records, keep_records)
    run.stopped = stopped
    if planned is not None and count == sys.maxsize:
        run.planned = planned  # for progress only: the schedule itself decides the end

    async def dispatch() -> None:
        await run.open_loop(schedule)

    result = await _run(run, dispatch, cancel, lateness_limit_s)
    if count == sys.maxsize or result.planned == sys.maxsize:
        result = dataclasses.replace(result, planned=run.tally.requests)
    return result


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
    on_records: Callable[[list[RequestResult]], None] | None = None,
    keep_records: bool = True,
) -> RunResult:
    """Keep `concurrency` requests in flight until `requests` or the bounds run out.

    Each request is scheduled the moment its slot frees up, so lateness is near zero and
    latencies are those of a fixed batch. Cancel and progress work as in `run_open_loop`.
    """
    if concurrency < 1:
        raise InvalidInput(f"concurrency must be at least 1, not {concurrency}")
    bounds = bounds or Bounds()
    count, stopped = _planned(len(requests), bounds)
    run = _Run(client, endpoint, requests, count, bounds, progress, on_records, keep_records)
    run.stopped = stopped
    return await _run(run, lambda: run.closed_loop(concurrency), cancel, lateness_limit_s)


def new_client(
    request_timeout_s: float = 300.0,
    verify: bool | ssl.SSLContext = True,
    max_idle: int = 1024,
) -> httpx.AsyncClient:
    """An httpx client fit for load: the lean transport, keeping at most `max_idle` idle
    connections (HTTP/1.1 holds one request per connection, so the in-flight cap bounds the
    busy ones)."""
    return httpx.AsyncClient(
        transport=LeanTransport(verify, max_idle=max_idle), timeout=request_timeout_s
    )


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
    """p50/p95/p99/mean/max of one latency in seconds; None without data."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    max: float | None = None  # the worst one (runs stored before it was kept have none)

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
    """Linear-interpolated p50/p95/p99 (as planner.stats.percentile), the mean and the max."""
    xs = np.asarray(values, dtype=float)
    if xs.size == 0:
        return Percentiles()
    q = np.quantile(xs, [0.5, 0.95, 0.99])
    return Percentiles(
        p50=float(q[0]), p95=float(q[1]), p99=float(q[2]), mean=float(xs.mean()),
        max=float(xs.max()),
    )  # fmt: skip


class Tally:
    """A run's figures, kept compact as it goes: a few doubles per request and four bytes per
    token gap, so a long run's summary costs little memory whatever it planned."""

    def __init__(self) -> None:
        self.requests = self.ok = self.errors = self.cancelled = 0
        self.tokens = 0
        self.start, self.end = math.inf, -math.inf
        # Per ok request, NaN where a figure does not exist (a one-token answer's TPOT).
        self.ttft, self.tpot, self.e2e, self.from_send = (array("d") for _ in range(4))
        self.lateness = array("d")  # every request that was sent
        self.gaps = array("f")  # inter-token gaps of ok requests, seconds

    def add(self, r: RequestResult) -> None:
        """Count one finished request."""
        self.requests += 1
        self.start = min(self.start, r.scheduled_ts)
        if (late := r.lateness_s) is not None:
            self.lateness.append(late)
        if r.status == "error":
            self.errors += 1
        elif r.status == "cancelled":
            self.cancelled += 1
        else:
            self.ok += 1
            nan = math.nan
            self.ttft.append(nan if (v := r.ttft_s) is None else v)
            self.tpot.append(nan if (v := r.tpot_s) is None else v)
            self.e2e.append(nan if (v := r.e2e_s) is None else v)
            sent = r.first_token_ts is not None and r.sent_ts is not None
            self.from_send.append(r.first_token_ts - r.sent_ts if sent else nan)  # type: ignore[operator]
            self.gaps.extend(g / 1000.0 for g in r.itl_ms)
            self.tokens += r.output_tokens or 0
            if r.end_ts is not None:
                self.end = max(self.end, r.end_ts)

    @classmethod
    def of(cls, records: Iterable[RequestResult]) -> Tally:
        """The tally of finished records."""
        tally = cls()
        for r in records:
            tally.add(r)
        return tally

    def lateness_verdict(self, limit_s: float) -> tuple[bool, str | None]:
        """Trustworthy unless the p99 of send lateness exceeds `limit_s`; the reason if not."""
        if not self.lateness:
            return True, None
        p99 = float(np.quantile(np.frombuffer(self.lateness), 0.99))
        if p99 <= limit_s:
            return True, None
        return False, (
            f"p99 send lateness {p99 * 1000:.1f} ms exceeds {limit_s * 1000:g} ms: the "
            "generator could not keep to its schedule (CPU-bound client?), so these latencies "
            "include its own delay"
        )

    def summary(
        self,
        ttft_slo_s: float | None = None,
        tpot_slo_s: float | None = None,
        lateness_limit_s: float = 0.010,
    ) -> Summary:
        """Latency percentiles over successful requests; ITL pools every gap of every request.

        `slo_share` is the share of ok-or-error requests that succeeded within both given
        bounds (errors count as misses, a one-token answer has no TPOT to miss); None when no
        bound is given.
        """
        ttft, tpot, e2e = (np.frombuffer(a) for a in (self.ttft, self.tpot, self.e2e))
        duration = self.end - self.start if self.end > -math.inf else 0.0
        lateness = Lateness()
        if self.lateness:
            late = np.frombuffer(self.lateness)
            q = np.quantile(late, [0.5, 0.99])
            lateness = Lateness(p50=float(q[0]), p99=float(q[1]), max=float(late.max()))
        share = None
        if ttft_slo_s is not None or tpot_slo_s is not None:
            inside = np.ones(len(ttft), dtype=bool)
            if ttft_slo_s is not None:
                inside &= ~np.isnan(ttft) & (ttft <= ttft_slo_s)
            if tpot_slo_s is not None:
                inside &= np.isnan(tpot) | (tpot <= tpot_slo_s)
            judged = self.ok + self.errors
            share = float(inside.sum()) / judged if judged else None
        trustworthy, reason = self.lateness_verdict(lateness_limit_s)
        tails = {
            "ttft_s": percentiles(ttft[~np.isnan(ttft)]),
            "itl_s": percentiles(np.frombuffer(self.gaps, dtype=np.float32).astype(float)),
            "tpot_s": percentiles(tpot[~np.isnan(tpot)]),
            "e2e_s": percentiles(e2e[~np.isnan(e2e)]),
        }
        return Summary(
            requests=self.requests,
            ok=self.ok,
            errors=self.errors,
            cancelled=self.cancelled,
            duration_s=duration,
            **tails,
            lateness_s=lateness,
            output_tokens_per_s=self.tokens / duration if duration > 0 else 0.0,
            requests_per_s=self.ok / duration if duration > 0 else 0.0,
            slo_share=share,
            trustworthy=trustworthy,
            reason=reason,
            p99_over_p50=TailRatios(**{k: v.tail_ratio for k, v in tails.items()}),
        )

    def from_send_p(self) -> Percentiles:
        """TTFT counted from the actual send, not the schedule: the engine-side share."""
        xs = np.frombuffer(self.from_send)
        return percentiles(xs[~np.isnan(xs)])


def lateness_verdict(records: Sequence[RequestResult], limit_s: float) -> tuple[bool, str | None]:
    """Trustworthy unless the p99 of send lateness exceeds `limit_s`; the reason if not."""
    return Tally.of(records).lateness_verdict(limit_s)


def summarize(
    records: Sequence[RequestResult],
    ttft_slo_s: float | None = None,
    tpot_slo_s: float | None = None,
    lateness_limit_s: float = 0.010,
) -> Summary:
    """The figures of finished records (see `Tally.summary`)."""
    return Tally.of(records).summary(ttft_slo_s, tpot_slo_s, lateness_limit_s)
