"""Scraping targets: metrics read through `VllmClient`, samples stored by `SampleWriter`, and
each target's health kept as data. A failure marks the target down, records `target_down`
once and backs off (interval x 2^(failures-1), at most 60 s); recovery, counters that fall
and changed parse warnings are events too.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import Engine

from planner.errors import KvscopeError, NotFound
from probes.vllm.client import Target, VllmClient
from probes.vllm.metrics import summarize
from storage import queries as q
from storage.ingest import SampleWriter
from storage.schemas import TargetRow
from storage.settings import Settings

log = logging.getLogger("kvscope.worker")

# Counters whose fall means the engine restarted (worth an event, and handled by rates).
RESET_WATCH = ("generation_tokens_total", "prompt_tokens_total", "preemptions_total")
MAX_BACKOFF_S = 60.0


@dataclass
class _TargetState:
    """In-memory per-target bookkeeping of the scrape job."""

    failures: int = 0
    next_attempt: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)
    warning: str | None = None


class TargetScraper:
    """Scrapes stored targets into the store; remembers each one's failures and counters."""

    def __init__(self, store: Engine, settings: Settings, http: httpx.Client) -> None:
        self.store = store
        self.settings = settings
        self.http = http
        self.writer = SampleWriter(store)
        self._states: dict[int, _TargetState] = {}
        self._lock = threading.Lock()

    @property
    def tracked(self) -> int:
        """How many targets the scraper keeps state for."""
        return len(self._states)

    def client(self, target: TargetRow) -> VllmClient:
        """The client of a stored target, with its token read now."""
        return VllmClient(Target.resolve(target.base_url, target.token_env), self.http)

    def check(self, target: TargetRow) -> dict[str, Any]:
        """Scrape once without storing; a summary of what the target serves."""
        return summarize(self.client(target).scrape(self.settings.scrape_timeout_s))

    def forget(self, target_id: int) -> None:
        """Drop what was kept for a target that is no longer scraped."""
        with self._lock:
            self._states.pop(target_id, None)
        self.writer.forget_target(target_id)

    def scrape(self, target_id: int) -> None:
        """Scrape, store, and record health; a failure backs off and never raises."""
        with self._lock:
            st = self._states.setdefault(target_id, _TargetState())
        now = time.time()
        if now < st.next_attempt:
            return
        try:
            target = q.get_target(self.store, target_id)
        except NotFound:
            return  # removed while the job was due; the next sync drops the job
        try:
            parsed = self.client(target).scrape(self.settings.scrape_timeout_s)
        except KvscopeError as err:
            self._failed(target, st, str(err), now)
            return
        ts = time.time()
        try:
            self.writer.write(target.id, parsed.samples, ts)
        except KvscopeError as err:
            log.warning("target %s: %s", target.name, err)
            q.record_event(
                self.store, "storage_error", str(err), target_id=target.id, severity="error"
            )
            return
        warning = "; ".join(parsed.warnings) or None
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
        st.warning, st.failures, st.next_attempt = warning, 0, 0.0
        self._check_resets(target, st, parsed.samples)

    def _failed(self, target: TargetRow, st: _TargetState, message: str, now: float) -> None:
        st.failures += 1
        delay = min(self.settings.scrape_interval_s * 2 ** (st.failures - 1), MAX_BACKOFF_S)
        st.next_attempt = now + delay
        before, _ = q.set_target_health(self.store, target.id, ok=False, message=message, ts=now)
        if before != "down":
            q.record_event(
                self.store,
                "target_down",
                f"{target.name} is down: {message}",
                target_id=target.id,
                severity="warning",
                data={"retry_in_s": delay},
            )

    def _check_resets(self, target: TargetRow, st: _TargetState, samples: list[Any]) -> None:
        values: dict[str, float] = {}
        for s in samples:
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
