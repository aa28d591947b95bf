"""Run a probe: against a target from the CLI, or for a queued run in the worker, with the store.

`execute` is the whole probe with nothing stored. `StoredRun` writes its progress, partial
results and request records to its `probe_runs` row and turns the console's cancel request
into the probe's cancel check; whether the run was cancelled is its outcome, not a key of
the result.
"""

from __future__ import annotations

import asyncio
import logging
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
# How long a finished run waits for its last progress write (a store held by another
# writer answers within its busy timeout, 5 s by default).
LAST_REPORT_WAIT_S = 10.0

log = logging.getLogger("kvscope.probes")


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


class _ProgressWriter:
    """Writes a run's latest progress to its row from a thread of its own. The probe reports
    from its event loop, and a write waits for the store's lock while another writer holds
    it (SQLite's, up to its busy timeout): in the loop that stalled the sends, and their
    lateness was the probe's own. Only the latest progress is written, and only while the
    run is running (a write left behind never overwrites its outcome); one that cannot be
    is logged and the next tried."""

    def __init__(self, store: Engine, run_id: int) -> None:
        self.store, self.run_id = store, run_id
        self._latest: tuple[float, dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._thread = threading.Thread(
            target=self._loop, daemon=True, name=f"probe-{run_id}-progress"
        )

    def start(self) -> None:
        self._thread.start()

    def put(self, fraction: float, summary: dict[str, Any]) -> None:
        with self._lock:
            self._latest = (fraction, summary)
        self._wake.set()

    def close(self, timeout: float = LAST_REPORT_WAIT_S) -> None:
        """Write what is left, then stop (waiting at most `timeout`)."""
        self._closing = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                latest, self._latest = self._latest, None
            if latest is not None:
                try:
                    q.update_run(
                        self.store, self.run_id, only_running=True,
                        progress=latest[0], summary=latest[1],
                    )  # fmt: skip
                except KvscopeError as err:
                    log.warning("probe run %d: progress not stored: %s", self.run_id, err)
            if self._closing and self._latest is None:
                return


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
        self._progress = _ProgressWriter(store, run_id)

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
        """Progress and partial results, handed to the writer at most once a second (the
        caller is the probe's event loop: it never waits for the store)."""
        if self.on_progress:
            self.on_progress(fraction, progress)
        now = time.monotonic()
        if now - self._last_report < REPORT_EVERY_S and fraction < 1.0:
            return
        self._last_report = now
        # Dumped here: the progress may hold the probe's own lists, which it goes on filling.
        self._progress.put(min(max(fraction, 0.0), 1.0), {"partial": stored(progress)})

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
        self._progress.start()
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
            self._progress.close()
        return Outcome(result, self.cancel.is_set())
