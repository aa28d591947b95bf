"""Run a probe: against a target from the CLI, or for a queued run in the worker, with the store.

`execute` is the whole probe with nothing stored. `StoredRun` writes its progress, partial
results and request records to its `probe_runs` row and turns the console's cancel request
into the probe's cancel check; whether the run was cancelled is its outcome, not a key of
the result.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import Engine, insert

from planner.errors import KvscopeError, TargetAuthError, TargetError
from planner.simulate.calibrate import Calibration
from probes.engine.spec import EngineSpec
from probes.kinds.context import (
    ProbeContext,
    ProbeParams,
    ProbeProgress,
    ProbeResult,
    Report,
    stored,
)
from probes.kinds.contract import AnyKind
from probes.load.generator import RequestResult, new_client
from probes.vllm.client import AsyncVllmClient, Target
from storage import queries as q
from storage.db import transaction
from storage.schemas import ProbeLimits
from storage.tables import RequestRecord

REPORT_EVERY_S = 1.0


async def execute(
    kind: AnyKind,
    params: ProbeParams,
    target: Target,
    *,
    model: str | None = None,
    http: httpx.AsyncClient | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    report: Report = lambda f, p: None,
    sink: Callable[[Sequence[RequestResult], str], None] = lambda r, s: None,
    managed: bool = False,
    spec: EngineSpec | None = None,
    limits: ProbeLimits | None = None,
    restart: Callable[[EngineSpec], Awaitable[None]] | None = None,
    calibration: Calibration | None = None,
) -> ProbeResult:
    """Run one probe to its end (or its cancel) and return its result."""
    kind.admit(params, managed)
    limits = limits or ProbeLimits()
    kind.check(params, limits)

    async def go(h: httpx.AsyncClient) -> ProbeResult:
        vllm = AsyncVllmClient(target, h)
        name = await _model(vllm, model)
        ctx = ProbeContext(
            vllm,
            name,
            cancelled=cancelled,
            report=report,
            sink=sink,
            managed=managed,
            spec=spec,
            limits=limits,
            restart=restart,
            calibration=calibration,
        )
        result: ProbeResult = await kind.run(ctx, params)
        return result.model_copy(update={"model": name, "target": target.base_url})

    if http is not None:
        return await go(http)
    async with new_client(params.request_timeout_s, max_idle=limits.max_in_flight) as h:
        return await go(h)


async def _model(vllm: AsyncVllmClient, given: str | None) -> str:
    """The model to ask for; the model list also proves the token is good before any load."""
    if given is None:
        return await vllm.first_model()
    try:
        await vllm.models()
    except TargetAuthError:
        raise
    except TargetError:
        pass  # a server without a model list: the given name will do
    return given


@dataclass(frozen=True)
class Outcome:
    """How a stored run ended: its result, and whether it was cancelled on the way."""

    result: ProbeResult
    cancelled: bool


class StoredRun:
    """Connects a probe to its `probe_runs` row: progress, partial results, records, cancel."""

    def __init__(
        self,
        store: Engine,
        run_id: int,
        on_progress: Callable[[float, ProbeProgress], None] | None = None,
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

    def report(self, fraction: float, progress: ProbeProgress) -> None:
        """Progress and partial results, written at most once a second."""
        if self.on_progress:
            self.on_progress(fraction, progress)
        now = time.monotonic()
        if now - self._last_report < REPORT_EVERY_S and fraction < 1.0:
            return
        self._last_report = now
        q.update_run(
            self.store,
            self.run_id,
            progress=min(max(fraction, 0.0), 1.0),
            summary={"partial": stored(progress)},
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

    def run(self, kind: AnyKind, params: ProbeParams, target: Target, **kwargs: Any) -> Outcome:
        """Run the probe in this thread (its own event loop); the caller records the outcome."""
        self._watcher.start()
        try:
            result = asyncio.run(
                execute(
                    kind,
                    params,
                    target,
                    cancelled=self.cancel.is_set,
                    report=self.report,
                    sink=self.sink,
                    **kwargs,
                )
            )
        finally:
            self._watch_stop.set()
        return Outcome(result, self.cancel.is_set())
