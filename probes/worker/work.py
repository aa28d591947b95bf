"""The work queue: requested runs (`probe_runs` rows) claimed by kind, two at a time, each
handed to its handler on a background thread. Every run ends with its outcome written back:
done with a summary, failed with a message, cancelled with what was measured so far. Also
queues the runs of probe schedules and marks the runs a worker left behind as interrupted.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from sqlalchemy import Engine

from planner.errors import KvscopeError, NotFound
from probes.kinds import KINDS, ProbeCancelled, StoredRun, get_kind, parse_params
from probes.kinds.context import stored
from probes.kinds.runner import address
from probes.worker.engines import EngineRegistry
from probes.worker.scraping import TargetScraper
from storage import queries as q
from storage.schemas import RunRow, TargetRow

log = logging.getLogger("kvscope.worker")

PARALLEL_RUNS = 2

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


def engine_start(work: WorkQueue, run: RunRow) -> dict[str, Any]:
    """Start a managed engine and wait until it is healthy."""
    name = _engine_name(run)
    manager = work.engines.manager(name)
    manager.start(wait=False)
    q.set_desired_state(work.store, name, "running")
    manager.wait_healthy()
    return asdict(manager.state)


def engine_stop(work: WorkQueue, run: RunRow) -> dict[str, Any]:
    """Stop a managed engine; the worker will not restart it."""
    name = _engine_name(run)
    q.set_desired_state(work.store, name, "stopped")
    manager = work.engines.manager(name)
    manager.stop()
    return asdict(manager.state)


def engine_restart(work: WorkQueue, run: RunRow) -> dict[str, Any]:
    """Stop and start a managed engine (applies a changed spec)."""
    name = _engine_name(run)
    q.set_desired_state(work.store, name, "stopped")
    manager = work.engines.manager(name)
    manager.stop(reason="stopped for a restart")
    manager = work.engines.manager(name)  # picks up a spec changed while it ran
    manager.state.restarts += 1
    manager.start(wait=False)
    q.set_desired_state(work.store, name, "running")
    manager.wait_healthy()
    return asdict(manager.state)


def run_probe(work: WorkQueue, run: RunRow) -> dict[str, Any]:
    """Run a requested probe against its target, storing progress and request records."""
    params = parse_params(run.kind, run.params, q.stored_profiles(work.store))
    if run.target_id is None:
        raise NotFound("this probe run names no target")
    target = work.target(run.target_id)
    manager = work.engines.get(target.name) if target.managed else None
    outcome = StoredRun(work.store, run.id, stop=work.stopping).run(
        get_kind(run.kind),
        params,
        address(work.store, target),
        managed=target.managed,
        spec=manager.spec if manager else None,
        model=target.model_name,
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


class WorkQueue:
    """Claims queued runs this worker has handlers for and carries them out."""

    def __init__(
        self,
        store: Engine,
        scraper: TargetScraper,
        engines: EngineRegistry,
        stopping: threading.Event,
        handlers: Mapping[str, Handler] | None = None,
    ) -> None:
        self.store = store
        self.scraper = scraper
        self.engines = engines
        self.stopping = stopping  # set when the worker stops: runs end early
        self.handlers: dict[str, Handler] = {**BUILTIN_HANDLERS, **(handlers or {})}
        self._pool = ThreadPoolExecutor(max_workers=PARALLEL_RUNS, thread_name_prefix="kvscope-run")
        self._active: dict[int, Future[None]] = {}

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

    def pick_up(self) -> None:
        """Claim queued runs the worker has handlers for and run them in the background."""
        self._active = {k: f for k, f in self._active.items() if not f.done()}
        q.fail_unknown_runs(self.store, list(self.handlers))
        while len(self._active) < PARALLEL_RUNS:
            run = q.claim_next_run(self.store, list(self.handlers))
            if run is None:
                return
            self._active[run.id] = self._pool.submit(self._execute, run)

    def cancelled(self, run_id: int) -> bool:
        """Whether the user asked this run to stop, or the worker is stopping."""
        return q.get_run(self.store, run_id).cancel_requested or self.stopping.is_set()

    def shutdown(self) -> None:
        """Take no more runs; those not started are dropped, those running go on."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def interrupt_running(self) -> None:
        """At stop: what still runs is marked interrupted."""
        q.interrupt_running(self.store, "the worker was stopped while this run was running")

    def _execute(self, run: RunRow) -> None:
        handler = self.handlers[run.kind]
        try:
            summary = handler(self, run)
        except ProbeCancelled as err:
            q.update_run(self.store, run.id, status="cancelled", error=str(err))
        except RunCancelled as cancelled:
            q.update_run(
                self.store,
                run.id,
                status="cancelled",
                summary=cancelled.summary,
                error="cancelled on request; the results so far are kept",
            )
        except KvscopeError as err:
            q.update_run(self.store, run.id, status="failed", error=str(err))
        except Exception as err:
            log.error("run %s (%s) crashed:\n%s", run.id, run.kind, traceback.format_exc())
            q.update_run(
                self.store,
                run.id,
                status="failed",
                error=f"internal error in the {run.kind} handler: {type(err).__name__}: {err}",
            )
        else:
            q.update_run(self.store, run.id, status="done", progress=1.0, summary=summary)
