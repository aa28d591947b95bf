"""The work queue: requested runs (`probe_runs` rows) claimed by kind, each on a thread of
its own, in two lanes: control (engine start/stop/restart, target checks) and probes, so an
engine stop never waits behind a long probe. Every item gets a deadline when it is claimed;
past it a probe is stopped and ends `timed_out`, and any item still running a grace period
later is marked `timed_out` and left behind. Every run ends with its outcome written back:
done with a summary, failed with a message, cancelled or timed out with what was measured so
far. Also queues the runs of probe schedules and marks runs a worker left behind interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Engine

from planner.errors import InvalidInput, KvscopeError, NotFound
from probes.engine.manager import EngineManager
from probes.engine.process import STOP_TIMEOUT_S
from probes.engine.spec import EngineSpec, address, parse_spec
from probes.engine.supervision import START_TIMEOUT_S
from probes.kinds import KINDS, ProbeCancelled, StoredRun, calibration, get_kind, parse_params
from probes.kinds.context import stored
from probes.worker.engines import EngineRegistry
from probes.worker.scraping import TargetScraper
from storage import queries as q
from storage.schemas import RunRow, TargetRow
from storage.settings import Settings

log = logging.getLogger("kvscope.worker")

PARALLEL_RUNS = 2  # probes at once
CONTROL_RUNS = 4  # engine commands and checks at once
CONTROL_KINDS = ("check_target", "engine_start", "engine_stop", "engine_restart")
GRACE_S = 30.0  # how long past its deadline a run may take to stop before it is left behind
DEFAULT_DEADLINE_S = 600.0

Handler = Callable[["WorkQueue", RunRow], dict[str, Any]]


class RunCancelled(Exception):
    """A handler's run was cancelled on request; `summary` is what it measured so far."""

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__("cancelled")
        self.summary = summary


# --- built-in handlers ---------------------------------------------------------------------


def check_target(work: WorkQueue, run: RunRow) -> dict[str, Any]:
    """Scrape a target once and report what it serves (the Targets page's check)."""
    if run.target_id is None:
        raise NotFound("this check names no target")
    return work.scraper.check(work.target(run.target_id))


def _engine_name(run: RunRow) -> str:
    name = run.params.get("name")
    if not isinstance(name, str) or not name:
        raise NotFound("this engine request names no engine")
    return name


def _requested_spec(work: WorkQueue, run: RunRow, name: str) -> EngineSpec:
    """The spec a start or restart runs: the one saved when it was asked for (the guarded
    action puts it in the request), else the one saved now."""
    data = run.params.get("spec")
    if isinstance(data, dict):
        return parse_spec(data)
    return parse_spec(q.get_engine_spec(work.store, name)[0])


@contextmanager
def _acting(manager: EngineManager, run: RunRow) -> Iterator[EngineManager]:
    """The engine's events while carrying out `run` name who asked for it."""
    manager.actor = run.requested_by
    try:
        yield manager
    finally:
        manager.actor = None


def engine_start(work: WorkQueue, run: RunRow) -> dict[str, Any]:
    """Start a managed engine and wait until it is healthy; from now on supervision
    restarts this spec after a crash."""
    name = _engine_name(run)
    spec = _requested_spec(work, run, name)
    with _acting(work.engines.manager(name, spec), run) as manager:
        _run(work, manager, name, spec)
        return asdict(manager.state)


def engine_stop(work: WorkQueue, run: RunRow) -> dict[str, Any]:
    """Stop a managed engine; the worker will not restart it."""
    name = _engine_name(run)
    q.set_desired_state(work.store, name, "stopped")
    with _acting(work.engines.manager(name), run) as manager:
        manager.stop()
        return asdict(manager.state)


def engine_restart(work: WorkQueue, run: RunRow) -> dict[str, Any]:
    """Stop and start a managed engine, applying the saved spec."""
    name = _engine_name(run)
    return asdict(_restart(work, run, name, _requested_spec(work, run, name)).state)


def _restart(work: WorkQueue, run: RunRow, name: str, spec: EngineSpec) -> EngineManager:
    """Stop the engine and start it running `spec`; supervision restarts that one after a
    crash from now on."""
    q.set_desired_state(work.store, name, "stopped")
    with _acting(work.engines.manager(name), run) as manager:
        manager.stop(reason="stopped for a restart")
    with _acting(work.engines.manager(name, spec), run) as manager:
        manager.state.restarts += 1
        _run(work, manager, name, spec)
        return manager


def _run(work: WorkQueue, manager: EngineManager, name: str, spec: EngineSpec) -> None:
    """Launch `spec`, record it as the spec last started, wait until healthy. `spec` is
    handed to the start itself: a supervision pass may have set the manager to the spec
    last started since the caller took it (the engine was down), and this one must run."""
    manager.start(wait=False, spec=spec)
    q.mark_started(work.store, name, spec.model_dump())
    manager.wait_healthy()


def run_probe(work: WorkQueue, run: RunRow) -> dict[str, Any]:
    """Run a requested probe against its target, storing progress and request records."""
    limits = work.settings.probe_limits
    params = parse_params(run.kind, run.params, q.stored_profiles(work.store), limits)
    if run.target_id is None:
        raise NotFound("this probe run names no target")
    target = work.target(run.target_id)
    if target.source == "prometheus":
        raise InvalidInput(
            f"target {target.name} is read from Prometheus ({target.base_url}); a probe sends "
            "requests to the engine itself: add the engine by its URL and probe that"
        )
    manager = work.engines.get(target.name) if target.managed else None

    async def restart(spec: EngineSpec) -> None:
        await asyncio.to_thread(_restart, work, run, target.name, spec)

    outcome = StoredRun(work.store, run.id, stop=work.stopping).run(
        get_kind(run.kind),
        params,
        address(work.store, target, work.scraper.refresh_allowlist()),
        managed=target.managed,
        spec=manager.spec if manager else None,
        model=target.model_name,
        limits=limits,
        restart=restart if manager else None,
        calibration=calibration.stored(work.store, target.name),
    )
    summary = stored(outcome.result)
    if outcome.cancelled:
        raise RunCancelled(summary)
    return summary


BUILTIN_HANDLERS: dict[str, Handler] = {
    **dict.fromkeys(KINDS, run_probe),
    "check_target": check_target,
    "engine_start": engine_start,
    "engine_stop": engine_stop,
    "engine_restart": engine_restart,
}


@dataclass
class _Active:
    """A claimed run: its thread and when it must have ended (monotonic)."""

    run: RunRow
    lane: str
    thread: threading.Thread
    deadline: float
    deadline_s: float
    overdue: bool = False


class WorkQueue:
    """Claims queued runs this worker has handlers for and carries them out, lane by lane."""

    def __init__(
        self,
        store: Engine,
        scraper: TargetScraper,
        engines: EngineRegistry,
        stopping: threading.Event,
        settings: Settings,
        handlers: Mapping[str, Handler] | None = None,
    ) -> None:
        self.store = store
        self.scraper = scraper
        self.engines = engines
        self.stopping = stopping  # set when the worker stops: runs end early
        self.settings = settings
        self.handlers: dict[str, Handler] = {**BUILTIN_HANDLERS, **(handlers or {})}
        self._active: dict[int, _Active] = {}
        self._lock = threading.Lock()
        self._closed = False

    def target(self, target_id: int) -> TargetRow:
        """A target by id."""
        return q.get_target(self.store, target_id)

    def recover(self) -> None:
        """At start: runs a previous worker left running are interrupted, and say so."""
        n = q.interrupt_running(self.store, "the worker stopped while this run was running")
        if n:
            q.record_event(
                self.store,
                "runs_interrupted",
                f"{n} run(s) left running by a previous worker marked interrupted",
                severity="warning",
            )

    def queue_scheduled(self, schedule_id: int) -> None:
        """Queue a schedule's probe, unless its previous run is still going."""
        sched = next((s for s in q.list_schedules(self.store) if s.id == schedule_id), None)
        if sched is None or q.active_run_of_schedule(self.store, schedule_id):
            return
        q.request_run(
            self.store,
            sched.kind,
            {**sched.params, "schedule_id": sched.id},
            target_id=sched.target_id,
        )

    def lanes(self) -> dict[str, tuple[list[str], int]]:
        """Each lane's kinds and how many of its runs may go at once."""
        control = [k for k in self.handlers if k not in KINDS]
        probes = [k for k in self.handlers if k in KINDS]
        return {"control": (control, CONTROL_RUNS), "probes": (probes, PARALLEL_RUNS)}

    def pick_up(self) -> None:
        """Enforce deadlines, then claim queued runs into every lane that has room."""
        if self._closed:
            return
        self.enforce_deadlines()
        if not q.queued_count(self.store):
            return
        q.fail_unknown_runs(self.store, list(self.handlers))
        for lane, (kinds, room) in self.lanes().items():
            while kinds and self._running(lane) < room:
                run = q.claim_next_run(self.store, kinds)
                if run is None:
                    break
                self._launch(run, lane)

    def _running(self, lane: str) -> int:
        with self._lock:
            return sum(1 for a in self._active.values() if a.lane == lane)

    def deadline_s(self, run: RunRow) -> float:
        """How long a claimed run may take."""
        if run.kind in KINDS:
            try:
                kind = get_kind(run.kind)
                return kind.deadline_s(
                    parse_params(run.kind, run.params, q.stored_profiles(self.store)),
                    self.settings.probe_limits,
                )
            except KvscopeError:
                return DEFAULT_DEADLINE_S  # refused by its handler at once anyway
        if run.kind == "check_target":
            return self.settings.scrape.deadline_s + 10.0
        if run.kind == "engine_stop":
            return STOP_TIMEOUT_S + 30.0
        if run.kind in ("engine_start", "engine_restart"):
            return START_TIMEOUT_S + STOP_TIMEOUT_S + 60.0
        return DEFAULT_DEADLINE_S

    def _launch(self, run: RunRow, lane: str) -> None:
        deadline_s = self.deadline_s(run)
        q.update_run(self.store, run.id, deadline_at=time.time() + deadline_s)
        thread = threading.Thread(
            target=self._execute, args=(run,), name=f"kvscope-run-{run.id}", daemon=True
        )
        with self._lock:
            self._active[run.id] = _Active(
                run, lane, thread, time.monotonic() + deadline_s, deadline_s
            )
        thread.start()

    def enforce_deadlines(self) -> None:
        """Stop what ran past its deadline; leave behind what did not stop in the grace."""
        now = time.monotonic()
        with self._lock:
            items = list(self._active.values())
        for item in items:
            if now <= item.deadline:
                continue
            if not item.overdue:
                item.overdue = True  # a probe sees the cancel within a second and stops
                with contextlib.suppress(KvscopeError):
                    q.cancel_run(self.store, item.run.id)
            elif now > item.deadline + GRACE_S:
                q.update_run(
                    self.store,
                    item.run.id,
                    only_running=True,
                    status="timed_out",
                    error=f"ran past its deadline of {item.deadline_s:.0f} s and did not stop "
                    f"within {GRACE_S:.0f} s more; the worker stopped waiting for it",
                )
                with self._lock:
                    self._active.pop(item.run.id, None)

    def cancelled(self, run_id: int) -> bool:
        """Whether the user asked this run to stop, or the worker is stopping."""
        return q.get_run(self.store, run_id).cancel_requested or self.stopping.is_set()

    def active(self) -> list[RunRow]:
        """The runs being carried out now."""
        with self._lock:
            return [a.run for a in self._active.values()]

    def shutdown(self, timeout: float = 10.0) -> None:
        """Take no more runs; give the running ones `timeout` to end (they see the stop)."""
        self._closed = True
        end = time.monotonic() + timeout
        with self._lock:
            threads = [a.thread for a in self._active.values()]
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))

    def interrupt_running(self) -> None:
        """At stop: what still runs is marked interrupted."""
        q.interrupt_running(self.store, "the worker was stopped while this run was running")

    def _execute(self, run: RunRow) -> None:
        try:
            self._outcome(run)
        finally:
            with self._lock:
                self._active.pop(run.id, None)

    def _finish(self, run: RunRow, **values: Any) -> None:
        with self._lock:
            item = self._active.get(run.id)
        if item is not None and item.overdue and values.get("status") == "cancelled":
            values["status"] = "timed_out"
            values["error"] = (
                f"ran past its deadline of {item.deadline_s:.0f} s and was stopped; what it "
                "measured so far is kept"
            )
        q.update_run(self.store, run.id, only_running=True, **values)

    def _outcome(self, run: RunRow) -> None:
        handler = self.handlers[run.kind]
        try:
            summary = handler(self, run)
        except ProbeCancelled as err:
            self._finish(run, status="cancelled", error=str(err))
        except RunCancelled as cancelled:
            self._finish(
                run,
                status="cancelled",
                summary=cancelled.summary,
                error="cancelled on request; the results so far are kept",
            )
        except KvscopeError as err:
            self._finish(run, status="failed", error=str(err))
        except Exception as err:
            log.error("run %s (%s) crashed:\n%s", run.id, run.kind, traceback.format_exc())
            self._finish(
                run,
                status="failed",
                error=f"internal error in the {run.kind} handler: {type(err).__name__}: {err}",
            )
        else:
            self._finish(run, status="done", progress=1.0, summary=summary)
            if run.kind == "latency":
                self._check(run)

    def _check(self, run: RunRow) -> None:
        """A finished latency run checked against its target's calibration
        (`calibration.check_finished`); one that cannot be checked is logged, and the run
        stays done."""
        try:
            made = calibration.check_finished(self.store, run.id, self.settings.data_dir)
        except KvscopeError as err:
            log.warning("run %s was not checked against its calibration: %s", run.id, err)
        else:
            if made is not None:
                log.info("run %s ran the calibration's steps x%.2f as long", run.id, made.drift)
