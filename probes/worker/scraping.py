"""Scraping targets, as Prometheus does it: one loop per target, one deadline per scrape.

`ScrapeLoop` runs every target's scrape on one event loop in a thread of its own: each
target has its own task and schedule, and each scrape one deadline for all of it (connect,
headers, body), so a target that drips, hangs or floods ends on time and cannot delay
another. Parsing and storing run in a small pool of their own. `TargetScraper` turns an
answer into stored samples, health and events: every scrape stores `up` (1/0) and its
duration; a failure (or a page over a limit, which stores nothing else) marks the target
down, records `target_down` once and backs off (interval x 2^(failures-1), at most 60 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import Engine

from planner.errors import (
    Conflict,
    KvscopeError,
    LimitExceeded,
    NotFound,
    StorageError,
    TargetError,
)
from probes.engine.spec import address
from probes.vllm import prometheus as promql
from probes.vllm.client import METRICS, AsyncVllmClient, Target, VllmClient, parse_page
from probes.vllm.metrics import ParsedScrape, summarize
from probes.vllm.transport import LeanTransport
from storage import queries as q
from storage.ingest import Point, SampleWriter
from storage.outbound import Allowlist
from storage.schemas import ScrapeLimits, TargetRow
from storage.settings import Settings

log = logging.getLogger("kvscope.worker")

# Counters whose fall means the engine restarted (worth an event, and handled by rates).
RESET_WATCH = ("generation_tokens_total", "prompt_tokens_total", "preemptions_total")
MAX_BACKOFF_S = 60.0
SCRAPE_DURATION = "scrape_duration_s"  # written by every scrape, whatever it brought
HEALTH_REFRESH_S = 5.0  # a healthy target's row (its last scrape time) is this fresh at worst
STORE_THREADS = 4
# A target newly read from Prometheus gets this much of its past (range queries), within
# this long and at most this many bytes an answer.
BACKFILL_S, BACKFILL_TIMEOUT_S, BACKFILL_BYTES = 600.0, 30.0, 64 * 1024 * 1024


@dataclass
class _TargetState:
    """In-memory per-target bookkeeping between scrapes."""

    failures: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    warning: str | None = None
    parsed: dict[str, list[Any]] = field(default_factory=dict)  # families by block, last page
    # What the targets row last said of a healthy target, and when (monotonic): an unchanged
    # row is written again only every HEALTH_REFRESH_S.
    health: tuple[Any, ...] = ()
    health_at: float = 0.0


@dataclass(frozen=True)
class Answer:
    """What one scrape brought back: the page, or why there is none, and how long it took."""

    started_at: float  # wall clock: the samples' timestamp
    duration_s: float
    text: str | None = None
    error: str | None = None


class TargetScraper:
    """Turns answers into stored samples, health and events; remembers each target's state."""

    def __init__(
        self,
        store: Engine,
        settings: Settings,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.transport = transport
        self.writer = SampleWriter(store)
        self.paused: str | None = None  # why ingest is paused (a nearly full disk), if it is
        # Where targets may point: refreshed with every target sync, and before a check.
        self.allow: Allowlist = Allowlist.of(settings.allowed_hosts)
        self._states: dict[int, _TargetState] = {}
        self._lock = threading.Lock()

    @property
    def tracked(self) -> int:
        """How many targets the scraper keeps state for."""
        return len(self._states)

    def limits(self, target: TargetRow) -> ScrapeLimits:
        """The worker's scrape settings with the target's own overrides."""
        return self.settings.scrape.merged(target.scrape)

    def address(self, target: TargetRow) -> Target:
        """Where the target answers, with its token read now, within the allowlist."""
        return address(self.store, target, self.allow)

    def refresh_allowlist(self) -> Allowlist:
        """Read the allowlist again (the setting's entries and the table's)."""
        self.allow = q.allowlist(self.store, self.settings.allowed_hosts)
        return self.allow

    def check(self, target: TargetRow) -> dict[str, Any]:
        """Scrape once without storing; a summary of what the target serves. The allowlist
        is read first, so a host allowed a moment ago is checked."""
        self.refresh_allowlist()
        limits = self.limits(target)
        client = VllmClient(self.address(target), self.transport)
        return summarize(client.scrape(limits.deadline_s, limits))

    def scrape(self, target_id: int) -> None:
        """Scrape one target now and record it (the loop does this on schedule)."""
        try:
            target = q.get_target(self.store, target_id)
        except NotFound:
            return
        limits = self.limits(target)
        started, t0 = time.time(), time.monotonic()
        try:
            client = VllmClient(self.address(target), self.transport)
            text = client.metrics_text(limits.deadline_s, limits.body_limit_bytes)
            # Timed after the answer: an argument list would take the time before the call.
            answer = Answer(started, time.monotonic() - t0, text=text)
        except KvscopeError as err:
            answer = Answer(started, time.monotonic() - t0, error=str(err))
        self.record(target, answer)

    def forget(self, target_id: int) -> None:
        """Drop what was kept for a target that is no longer scraped."""
        with self._lock:
            self._states.pop(target_id, None)
        self.writer.forget_target(target_id)

    def backoff_s(self, target_id: int, interval_s: float) -> float:
        """How long until the next attempt: the interval, or longer after failures."""
        failures = self._state(target_id).failures
        if not failures:
            return interval_s
        return float(min(interval_s * 2 ** (failures - 1), MAX_BACKOFF_S))

    def _state(self, target_id: int) -> _TargetState:
        with self._lock:
            return self._states.setdefault(target_id, _TargetState())

    def last_scrape_at(self, target_id: int) -> float | None:
        """When the target was last scraped, as stored (None if never, or unreadable): its
        newest scrape sample, which every scrape writes first; the row's time is refreshed
        only every HEALTH_REFRESH_S, and a worker killed between the two leaves it older."""
        try:
            row = q.get_target(self.store, target_id).last_scrape_at
            sample = q.latest_ts(self.store, target_id, SCRAPE_DURATION)
        except KvscopeError:
            return None
        return max((t for t in (row, sample) if t is not None), default=None)

    def record(self, target: TargetRow, answer: Answer) -> None:
        """Parse and store one answer, then the target's health; never raises."""
        try:
            try:
                self._record(target, answer)
            except Conflict:
                # Series ids kept for a target removed since, whose id SQLite gave to a new
                # one: forget them and write again (the failed write was rolled back).
                self.forget(target.id)
                self._record(target, answer)
        except StorageError as err:
            log.warning("target %s: %s", target.name, err)
            with contextlib.suppress(KvscopeError):
                q.record_event(
                    self.store, "storage_error", str(err), target_id=target.id, severity="error"
                )

    def _record(self, target: TargetRow, answer: Answer) -> None:
        if self.paused is not None:
            return  # nothing is written while the disk is nearly full
        st = self._state(target.id)
        limits = self.limits(target)
        error, parsed = answer.error, None
        if answer.text is not None:
            try:
                url = self.address(target).url(METRICS)
                parsed = parse_page(answer.text, url, limits, st.parsed)
                self.writer.write(
                    target.id, parsed.samples, answer.started_at, series_limit=limits.series_limit
                )
            except (KvscopeError, LimitExceeded) as err:
                if isinstance(err, StorageError):
                    raise
                error, parsed = str(err), None
        # The scrape's own series are exempt from the series limit: they say why it failed.
        self.writer.write(target.id, _scrape_points(error is None, answer), answer.started_at)
        if error is not None or parsed is None:
            self._failed(target, st, error or "no answer", answer.started_at, limits.interval_s)
        else:
            self._succeeded(target, st, parsed, answer.started_at)

    def _succeeded(
        self, target: TargetRow, st: _TargetState, parsed: ParsedScrape, ts: float
    ) -> None:
        warning = "; ".join(parsed.warnings) or None
        said = (warning, parsed.model_name, tuple(sorted(parsed.cache_info.items())))
        now = time.monotonic()
        if not st.failures and said == st.health:
            fresh = now - st.health_at < HEALTH_REFRESH_S
            health = "degraded" if warning else "up"
            if fresh or q.touch_target(self.store, target.id, health=health, ts=ts):
                # Up, and nothing new to say: the row is fresh enough, or only its times move.
                st.health_at = st.health_at if fresh else now
                self._check_resets(target, st, parsed)
                return
        st.health, st.health_at = said, now
        before, _ = q.set_target_health(
            self.store,
            target.id,
            ok=True,
            message=warning,
            ts=ts,
            cache_info=parsed.cache_info,
            model_name=parsed.model_name,
        )
        if before == "down":
            q.record_event(
                self.store,
                "target_up",
                f"{target.name} is answering again after {st.failures} failed scrape(s)",
                target_id=target.id,
            )
        if warning and warning != st.warning:
            q.record_event(
                self.store,
                "scrape_warning",
                f"{target.name}: {warning}",
                target_id=target.id,
                severity="warning",
            )
        st.warning, st.failures = warning, 0
        self._check_resets(target, st, parsed)

    def _failed(
        self, target: TargetRow, st: _TargetState, message: str, ts: float, interval_s: float
    ) -> None:
        st.failures += 1
        delay = self.backoff_s(target.id, interval_s)
        before, _ = q.set_target_health(self.store, target.id, ok=False, message=message, ts=ts)
        if before != "down":
            q.record_event(
                self.store,
                "target_down",
                f"{target.name} is down: {message}",
                target_id=target.id,
                severity="warning",
                data={"retry_in_s": delay},
            )

    def _check_resets(self, target: TargetRow, st: _TargetState, parsed: ParsedScrape) -> None:
        values: dict[str, float] = {}
        for s in parsed.samples:
            if s.series in RESET_WATCH:
                values[s.series] = values.get(s.series, 0.0) + s.value
        fell = [k for k, v in values.items() if v < st.counters.get(k, 0.0)]
        if fell:
            q.record_event(
                self.store,
                "counter_reset",
                f"{target.name}: counters went backwards ({', '.join(sorted(fell))}); the "
                "engine restarted. Rates count from zero again, nothing stored was changed.",
                target_id=target.id,
                severity="warning",
                data={k: {"before": st.counters.get(k), "after": values[k]} for k in fell},
            )
        st.counters = values


def _scrape_points(ok: bool, answer: Answer) -> list[Point]:
    """`up` and the scrape's duration, stored for every scrape whatever it brought."""
    return [
        Point("up", {}, 1.0 if ok else 0.0, kind="gauge"),
        Point(SCRAPE_DURATION, {}, round(answer.duration_s, 6), kind="gauge"),
    ]


class ScrapeLoop:
    """Every target's scrapes on one event loop in a thread of its own; a task per target."""

    def __init__(self, scraper: TargetScraper, store_threads: int = STORE_THREADS) -> None:
        self.scraper = scraper
        self._pool = ThreadPoolExecutor(store_threads, thread_name_prefix="kvscope-scrape-store")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="kvscope-scrapes", daemon=True)
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._targets: dict[int, TargetRow] = {}
        self._waiting: dict[int, tuple[TargetRow, Answer]] = {}  # the next answer to store
        self._writing: set[int] = set()  # targets with a store write under way
        self._writers: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None
        self._started = False

    def start(self) -> None:
        """Start the loop's thread (idempotent)."""
        if not self._started:
            self._started = True
            self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._http = httpx.AsyncClient(
            transport=self.scraper.transport or LeanTransport(), headers={"User-Agent": "kvscope"}
        )
        self._loop.run_forever()

    def sync(self, targets: Iterable[TargetRow]) -> set[int]:
        """Scrape exactly these targets from now on; returns the ids that were dropped."""
        wanted = {t.id: t for t in targets}
        # SQLite may give a new target the id of one just removed: another name means
        # another target, whose series are not the old one's (record() also recovers).
        dropped = {
            tid
            for tid, old in self._targets.items()
            if tid not in wanted or wanted[tid].name != old.name
        }
        self._targets = wanted
        if self._started:
            self._loop.call_soon_threadsafe(self._apply)
        return dropped

    @property
    def target_ids(self) -> set[int]:
        """The targets this loop scrapes."""
        return set(self._targets)

    def _apply(self) -> None:
        for tid in set(self._tasks) - set(self._targets):
            self._tasks.pop(tid).cancel()
        for tid in set(self._targets) - set(self._tasks):
            self._tasks[tid] = self._loop.create_task(self._run(tid), name=f"scrape:{tid}")

    async def _run(self, tid: int) -> None:
        """One target's schedule: scrape, record, wait for the next slot (or a backoff)."""
        loop = asyncio.get_running_loop()
        first = self._targets[tid]
        if first.source == "prometheus" and first.last_scrape_at is None:
            await self._backfill(first, self.scraper.limits(first))
        interval = self.scraper.limits(first).interval_s
        # When it was last scraped, as stored now (the row handed to sync may predate the
        # last scrape of a worker that just gave the target up).
        last = await loop.run_in_executor(self._pool, self.scraper.last_scrape_at, tid)
        since = time.time() - (last or first.last_scrape_at or -math.inf)
        if 0 <= since < 2 * interval:
            # Scraped a moment ago (by another worker, or before a restart): keep its cadence.
            next_at = loop.time() + interval - since
        else:
            # Spread the targets over the interval so they do not all start at once.
            next_at = loop.time() + (tid * 0.618) % interval * 0.5
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            target = self._targets.get(tid)
            if target is None:
                return
            limits = self.scraper.limits(target)
            t0 = loop.time()
            answer = await self._fetch(target, limits)
            self._record(tid, target, answer)
            wait = self.scraper.backoff_s(tid, limits.interval_s)
            if wait > limits.interval_s:
                next_at = t0 + wait
            else:
                next_at += limits.interval_s
                if next_at <= loop.time():  # fell behind (a slow store): skip to the next slot
                    behind = loop.time() - next_at
                    next_at += (behind // limits.interval_s + 1) * limits.interval_s

    def _record(self, tid: int, target: TargetRow, answer: Answer) -> None:
        """Store an answer in the pool, in order per target, without holding up the next
        scrape: a slow store delays the writes, never the schedule. While one write of a
        target runs, only its newest answer waits (an older one waiting is dropped)."""
        waiting = self._waiting.get(tid)
        self._waiting[tid] = (target, answer)
        if waiting is None and tid not in self._writing:
            self._writing.add(tid)
            task = self._loop.create_task(self._write(tid))
            self._writers.add(task)
            task.add_done_callback(self._writers.discard)

    async def _write(self, tid: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (item := self._waiting.pop(tid, None)) is not None:
                await loop.run_in_executor(self._pool, self.scraper.record, *item)
        except RuntimeError:
            pass  # the pool was shut down: the worker is stopping
        finally:
            self._writing.discard(tid)

    async def _fetch(self, target: TargetRow, limits: ScrapeLimits) -> Answer:
        started, t0 = time.time(), time.monotonic()
        assert self._http is not None
        try:
            client = AsyncVllmClient(self.scraper.address(target), self._http)
            if target.source == "prometheus":
                text = await self._from_prometheus(client, target, limits, started)
            else:
                text = await client.metrics_text(limits.deadline_s, limits.body_limit_bytes)
        except KvscopeError as err:
            return Answer(started, time.monotonic() - t0, error=str(err))
        return Answer(started, time.monotonic() - t0, text=text)

    async def _from_prometheus(
        self, client: AsyncVllmClient, target: TargetRow, limits: ScrapeLimits, at: float
    ) -> str:
        """The engine's page as the Prometheus server named by `target` saw it last (two
        instant queries within the scrape's one deadline)."""
        selector = target.selector or "{}"
        urls = [promql.query_url(client.base_url, expr, at) for expr in promql.queries(selector)]
        try:
            vllm, ups = await _ask(client, urls, limits.deadline_s, limits.body_limit_bytes)
        except TimeoutError as err:
            raise TargetError(
                f"Prometheus at {client.base_url} did not answer in full within "
                f"{limits.deadline_s:g} s (the timeout)"
            ) from err
        return promql.instant_text(ups, vllm, selector, client.base_url)

    async def _backfill(self, target: TargetRow, limits: ScrapeLimits) -> None:
        """A target newly read from Prometheus: its last BACKFILL_S from two range queries,
        stored in order before the first live read (a failure is logged; the live reads
        report what is wrong)."""
        assert self._http is not None
        client = AsyncVllmClient(self.scraper.address(target), self._http)
        selector = target.selector or "{}"
        end = time.time()
        step = max(limits.interval_s, BACKFILL_S / promql.MAX_RANGE_POINTS)
        urls = [
            promql.range_url(client.base_url, expr, end - BACKFILL_S, end, step)
            for expr in promql.queries(selector)
        ]
        try:
            vllm, ups = await _ask(client, urls, BACKFILL_TIMEOUT_S, BACKFILL_BYTES)
            pages = promql.range_texts(ups, vllm, selector, client.base_url)
        except (KvscopeError, TimeoutError) as err:
            log.warning(
                "target %s: no backfill from Prometheus: %s", target.name, str(err) or "timed out"
            )
            return
        loop = asyncio.get_running_loop()
        for ts, text in pages:
            answer = Answer(ts, 0.0, text=text)
            await loop.run_in_executor(self._pool, self.scraper.record, target, answer)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every target's task, close the client, stop the thread and the pool."""
        if self._started:

            async def close() -> None:
                tasks = [*self._tasks.values(), *self._writers]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self._tasks.clear()
                if self._http is not None:
                    await self._http.aclose()

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        self._pool.shutdown(wait=True, cancel_futures=True)


async def _ask(
    client: AsyncVllmClient, urls: list[str], timeout_s: float, limit: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The results of the two queries of `promql.queries` (the vLLM series, then `up`),
    both within one deadline."""

    async def get(url: str) -> list[dict[str, Any]]:
        body = await client.get_text(url, timeout_s, limit, "application/json")
        return promql.result(body, url)

    async with asyncio.timeout(timeout_s):
        series, up = await asyncio.gather(*(get(u) for u in urls))
    return series, up
