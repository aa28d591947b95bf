"""Run a probe: against a URL from the CLI, or for a queued run in the worker, with the store.

The registry maps a kind to its module (`Params`, `run`). `execute` is the whole probe
with nothing stored; `StoredRun` writes its progress, partial results and request records
to the store and turns the console's cancel request into the probe's cancel check.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import httpx
from sqlalchemy import Engine, insert

from planner.errors import KvscopeError, UnknownChoice
from probes import batch_sweep, capacity, kv_usage, latency, oom
from probes.loadgen import RequestResult, new_client, validated
from probes.probe import ProbeContext, ProbeParams, Report, discover_model
from storage import queries as q
from storage.db import transaction
from storage.schemas import normalize_base_url
from storage.tables import RequestRecord

PROBES: dict[str, ModuleType] = {m.KIND: m for m in (latency, batch_sweep, oom, kv_usage, capacity)}
REPORT_EVERY_S = 1.0


def probe_module(kind: str) -> ModuleType:
    """The module of a probe kind."""
    try:
        return PROBES[kind]
    except KeyError:
        raise UnknownChoice("probe", kind, PROBES) from None


# Keys a run row carries beside the probe's parameters.
RUN_KEYS = ("target_url", "schedule_id")


def parse_params(
    kind: str, data: dict[str, Any], profiles: dict[str, dict[str, Any]] | None = None
) -> ProbeParams:
    """Validated parameters of a probe; InvalidInput names every bad field.

    A `profile` naming one of the user's stored `profiles` is replaced by its definition.
    """
    clean = {k: v for k, v in data.items() if k not in RUN_KEYS}
    name = clean.get("profile")
    if isinstance(name, str) and profiles and name in profiles:
        clean["profile"] = profiles[name]
    params: ProbeParams = validated(probe_module(kind).Params, clean, f"{kind} parameters")
    return params


async def execute(
    kind: str,
    params: ProbeParams,
    base_url: str,
    *,
    model: str | None = None,
    client: httpx.AsyncClient | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    report: Report = lambda f, p: None,
    sink: Callable[[Sequence[RequestResult], str], None] = lambda r, s: None,
    managed: bool = False,
    facts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one probe to its end (or its cancel) and return its summary."""
    base = normalize_base_url(base_url)
    module = probe_module(kind)

    async def go(c: httpx.AsyncClient) -> dict[str, Any]:
        name = model or await discover_model(c, base)
        ctx = ProbeContext(
            base,
            name,
            c,
            cancelled=cancelled,
            report=report,
            sink=sink,
            managed=managed,
            facts=facts or {},
        )
        result: dict[str, Any] = await module.run(ctx, params)
        result.setdefault("model", name)
        result.setdefault("target", base)
        return result

    if client is not None:
        return await go(client)
    async with new_client(request_timeout_s=params.request_timeout_s) as c:
        return await go(c)


class StoredRun:
    """Connects a probe to its `probe_runs` row: progress, partial results, records, cancel."""

    def __init__(
        self,
        store: Engine,
        run_id: int,
        on_progress: Callable[[float, dict[str, Any]], None] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.store, self.run_id = store, run_id
        self.on_progress = on_progress
        self.cancel = threading.Event()
        self.stop = stop or threading.Event()  # set when the worker shuts down
        self._last_report = 0.0
        self._seq = 0
        self._watch_stop = threading.Event()
        self._watcher = threading.Thread(
            target=self._watch, daemon=True, name=f"probe-{run_id}-cancel"
        )

    def _watch(self) -> None:
        # The console asks through the store; polling it once a second keeps the probe's
        # own cancel check (called every 50 ms) free.
        while not self._watch_stop.wait(1.0):
            try:
                if self.stop.is_set() or q.get_run(self.store, self.run_id).cancel_requested:
                    self.cancel.set()
                    return
            except KvscopeError:
                return

    def report(self, fraction: float, partial: dict[str, Any]) -> None:
        """Progress and partial results, written at most once a second."""
        if self.on_progress:
            self.on_progress(fraction, partial)
        now = time.monotonic()
        if now - self._last_report < REPORT_EVERY_S and fraction < 1.0:
            return
        self._last_report = now
        q.update_run(
            self.store,
            self.run_id,
            progress=min(max(fraction, 0.0), 1.0),
            summary={"partial": partial},
        )

    def sink(self, records: Sequence[RequestResult], step: str) -> None:
        """Store the requests one step sent."""
        rows = []
        for r in records:
            row = r.row()
            row["tags"] = {**row["tags"], "step": step}
            row["seq"] = self._seq
            self._seq += 1
            rows.append({"run_id": self.run_id, **row})
        for i in range(0, len(rows), 2000):
            with transaction(self.store) as s:
                s.execute(insert(RequestRecord), rows[i : i + 2000])

    def run(self, kind: str, params: ProbeParams, base_url: str, **kwargs: Any) -> dict[str, Any]:
        """Run the probe in this thread (its own event loop); the caller records the outcome."""
        self._watcher.start()
        try:
            result = asyncio.run(
                execute(
                    kind,
                    params,
                    base_url,
                    cancelled=self.cancel.is_set,
                    report=self.report,
                    sink=self.sink,
                    **kwargs,
                )
            )
        finally:
            self._watch_stop.set()
        if self.cancel.is_set():
            result["cancelled"] = True  # stored as a cancelled run, with what it measured
        return result
