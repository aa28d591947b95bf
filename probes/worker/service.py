"""The worker: one long-lived process that scrapes targets and carries out requested work.

An APScheduler BackgroundScheduler (SQLAlchemy job store on kvscope's own database) runs
a scrape job per enabled target, GPU sampling, rollups and retention. The main loop keeps
scrape jobs in step with the targets table and hands queued work rows to their handlers.
Every failure ends up in the store as data: a target's health and an event, or a run's
status and message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from apscheduler.executors.pool import ThreadPoolExecutor as JobThreadPool
from apscheduler.jobstores.base import JobLookupError
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine

from planner.errors import KvscopeError, NotFound
from probes.alerts import AlertEvaluator
from probes.demo import DemoLoad
from probes.engine import parse_spec
from probes.gpu import GpuSampler
from probes.manager import EngineManager
from probes.metrics import summarize
from probes.probe import ProbeCancelled
from probes.rules import DEFAULT_RULES
from probes.runner import PROBES, StoredRun, parse_params
from probes.scrape import scrape
from storage import queries as q
from storage.db import open_store
from storage.ingest import SampleWriter
from storage.rollups import expire, run_rollups
from storage.schemas import RunRow, TargetRow
from storage.settings import Settings

log = logging.getLogger("kvscope.worker")

# Counters whose fall means the engine restarted (worth an event, and handled by rates).
RESET_WATCH = ("generation_tokens_total", "prompt_tokens_total", "preemptions_total")
MAX_BACKOFF_S = 60.0

Handler = Callable[["Worker", RunRow], dict[str, Any]]
# Jobs name their worker by key: the job store keeps references, not objects, and a process
# (a test session, say) may hold more than one worker.
_WORKERS: dict[str, Worker] = {}


@dataclass
class _TargetState:
    """In-memory per-target bookkeeping of the scrape job."""

    failures: int = 0
    next_attempt: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)
    warning: str | None = None


# --- job entry points: module level, so the SQLAlchemy job store can reference them ------


def scrape_job(key: str, target_id: int) -> None:
    """Scrape one target (APScheduler job)."""
    if worker := _WORKERS.get(key):
        worker.scrape_target(target_id)


def rollup_job(key: str) -> None:
    """Roll up raw samples (APScheduler job)."""
    if worker := _WORKERS.get(key):
        worker.guarded("rollup", lambda w: run_rollups(w.engine))


def retention_job(key: str) -> None:
    """Expire old data (APScheduler job)."""
    if worker := _WORKERS.get(key):
        worker.guarded("retention", lambda w: expire(w.engine, w.settings.retention))


def gpu_job(key: str) -> None:
    """Publish the GPU state (APScheduler job)."""
    if worker := _WORKERS.get(key):
        worker.guarded("gpu", lambda w: q.put_state(w.engine, "gpu", w.gpus.state()))


def heartbeat_job(key: str) -> None:
    """Tell the console this worker is alive (APScheduler job)."""
    if worker := _WORKERS.get(key):
        worker.guarded("heartbeat", lambda w: w.publish_heartbeat())


def schedule_job(key: str, schedule_id: int) -> None:
    """Queue the run of a probe schedule (APScheduler job)."""
    if worker := _WORKERS.get(key):
        worker.guarded("schedule", lambda w: w.queue_scheduled(schedule_id))


def alerts_job(key: str) -> None:
    """Evaluate the alert rules (APScheduler job)."""
    if worker := _WORKERS.get(key):
        worker.guarded("alerts", lambda w: AlertEvaluator(w.engine).run())


def engines_job(key: str) -> None:
    """Supervise managed engines: health, crashes, restarts (APScheduler job)."""
    if worker := _WORKERS.get(key):
        worker.guarded("engines", lambda w: w.supervise_engines())


# --- built-in work handlers ----------------------------------------------------------------


def check_target(worker: Worker, run: RunRow) -> dict[str, Any]:
    """Scrape a target once and report what it serves (the Targets page's check)."""
    if run.target_id is None:
        raise NotFound("this check names no target")
    target = worker.target(run.target_id)
    parsed = scrape(
        worker.client, target.base_url, target.token_env, worker.settings.scrape_timeout_s
    )
    return summarize(parsed)


def _engine_name(run: RunRow) -> str:
    name = run.params.get("name")
    if not isinstance(name, str) or not name:
        raise NotFound("this engine request names no engine")
    return name


def engine_start(worker: Worker, run: RunRow) -> dict[str, Any]:
    """Start a managed engine and wait until it is healthy."""
    name = _engine_name(run)
    manager = worker.engine_manager(name)
    manager.start(wait=False)
    q.set_desired_state(worker.engine, name, "running")
    manager.wait_healthy()
    return asdict(manager.state)


def engine_stop(worker: Worker, run: RunRow) -> dict[str, Any]:
    """Stop a managed engine; the worker will not restart it."""
    name = _engine_name(run)
    q.set_desired_state(worker.engine, name, "stopped")
    manager = worker.engine_manager(name)
    manager.stop()
    return asdict(manager.state)


def engine_restart(worker: Worker, run: RunRow) -> dict[str, Any]:
    """Stop and start a managed engine (applies a changed spec)."""
    name = _engine_name(run)
    q.set_desired_state(worker.engine, name, "stopped")
    manager = worker.engine_manager(name)
    manager.stop(reason="stopped for a restart")
    manager = worker.engine_manager(name)  # picks up a spec changed while it ran
    manager.state.restarts += 1
    manager.start(wait=False)
    q.set_desired_state(worker.engine, name, "running")
    manager.wait_healthy()
    return asdict(manager.state)


def run_probe(worker: Worker, run: RunRow) -> dict[str, Any]:
    """Run a requested probe against its target, storing progress and request records."""
    params = parse_params(run.kind, run.params, q.stored_profiles(worker.engine))
    if run.target_id is None:
        raise NotFound("this probe run names no target")
    target = worker.target(run.target_id)
    facts = worker.engine_facts(target.name) if target.managed else {}
    stored = StoredRun(worker.engine, run.id, stop=worker._stop)
    return stored.run(
        run.kind,
        params,
        target.base_url,
        managed=target.managed,
        facts=facts,
        model=target.model_name,
    )


BUILTIN_HANDLERS: dict[str, Handler] = {
    **dict.fromkeys(PROBES, run_probe),
    "check_target": check_target,
    "engine_start": engine_start,
    "engine_stop": engine_stop,
    "engine_restart": engine_restart,
}


class Worker:
    """The worker process' state: store, HTTP client, scheduler, handlers."""

    def __init__(
        self,
        settings: Settings,
        client: httpx.Client | None = None,
        handlers: dict[str, Handler] | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine or open_store(settings.db_url)
        self.client = client or httpx.Client(headers={"User-Agent": "kvscope"})
        self.handlers = {**BUILTIN_HANDLERS, **(handlers or {})}
        self.writer = SampleWriter(self.engine)
        self.gpus = GpuSampler()
        self.started_at = time.time()
        self.key = uuid.uuid4().hex
        self._states: dict[int, _TargetState] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._runs = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvscope-run")
        self._active: dict[int, Future[None]] = {}
        self.engines: dict[str, EngineManager] = {}
        self.keep_engines = False  # tests: leave engines running, as a crashed worker would
        self.demo: DemoLoad | None = None
        self.scheduler = BackgroundScheduler(
            jobstores={"default": SQLAlchemyJobStore(engine=self.engine)},
            executors={"default": JobThreadPool(max_workers=8)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30},
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Recover from a previous process, schedule the jobs, start the scheduler."""
        _WORKERS[self.key] = self
        q.ensure_rules(self.engine, [r.model_dump() for r in DEFAULT_RULES])
        n = q.interrupt_running(self.engine, "the worker stopped while this run was running")
        if n:
            q.record_event(
                self.engine,
                "runs_interrupted",
                f"{n} run(s) left running by a previous worker marked interrupted",
                severity="warning",
            )
        # Paused while the stored jobs of a previous worker process are replaced by ours.
        self.scheduler.start(paused=True)
        for job in self.scheduler.get_jobs():
            if tuple(job.args[:1]) != (self.key,):
                job.remove()
        s = self.settings
        for job_fn, job_id, every in (
            (rollup_job, "rollup", s.rollup_interval_s),
            (retention_job, "retention", 600.0),
            (gpu_job, "gpu", s.gpu_interval_s),
            (heartbeat_job, "heartbeat", 5.0),
            (engines_job, "engines", 2.0),
            (alerts_job, "alerts", s.alert_interval_s),
        ):
            self.scheduler.add_job(
                job_fn,
                "interval",
                seconds=every,
                args=[self.key],
                id=job_id,
                replace_existing=True,
                next_run_time=_soon(),
            )
        for name, _, desired in q.list_engine_specs(self.engine):
            try:
                self.engine_manager(name).adopt_or_clean(desired)
            except Exception:
                log.exception("could not adopt or clean up engine %s", name)
        self.sync_targets()
        self.scheduler.resume()
        if self.settings.demo_load:
            self._start_demo_load()
        q.record_event(
            self.engine,
            "worker_started",
            f"worker started (pid {os.getpid()}); {self.gpus.message}",
        )

    def run_forever(self) -> None:
        """Start, then poll for work until SIGTERM/SIGINT."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self.start()
        try:
            while not self._stop.is_set():
                self.tick()
                self._stop.wait(self.settings.work_poll_s)
        finally:
            self.stop()

    def tick(self) -> None:
        """One pass of the main loop: keep jobs in step with targets, pick up work."""
        self.guarded("sync", lambda w: w.sync_targets())
        self.guarded("schedules", lambda w: w.sync_schedules())
        self.guarded("work", lambda w: w.pick_up_work())

    def stop(self) -> None:
        """Stop the scheduler and runs; runs still going are marked interrupted."""
        self._stop.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        self._runs.shutdown(wait=False, cancel_futures=True)
        if self.demo is not None:
            self.demo.stop()
        for manager in self.engines.values():
            if self.keep_engines:
                manager.abandon()
            else:
                try:
                    manager.stop(reason="stopped with the worker")
                except Exception:
                    log.exception("could not stop engine %s", manager.spec.name)
        q.interrupt_running(self.engine, "the worker was stopped while this run was running")
        q.put_state(
            self.engine, "worker", {"pid": os.getpid(), "running": False, "stopped_at": time.time()}
        )
        self.gpus.close()
        _WORKERS.pop(self.key, None)

    def guarded(self, what: str, fn: Callable[[Worker], object]) -> None:
        """Run a periodic task; log its failure instead of killing the job."""
        try:
            fn(self)
        except Exception:
            log.exception("worker task %s failed", what)

    def publish_heartbeat(self) -> None:
        """Write the worker's liveness and identity."""
        q.put_state(
            self.engine,
            "worker",
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "running": True,
                "started_at": self.started_at,
                "targets": len(self._states),
                "scrape_interval_s": self.settings.scrape_interval_s,
            },
        )

    # -- managed engines ---------------------------------------------------------------------

    def engine_manager(self, name: str) -> EngineManager:
        """The manager of a stored engine spec, created on first use, updated if idle."""
        spec_data, _ = q.get_engine_spec(self.engine, name)
        spec = parse_spec(spec_data)
        manager = self.engines.get(name)
        if manager is None:
            manager = EngineManager(self.engine, self.settings.data_dir, spec, self.client)
            self.engines[name] = manager
        elif manager.spec != spec and not manager.alive():
            manager.spec = spec
        return manager

    def _start_demo_load(self) -> None:
        """Light load on the embedded engine, sent only while it runs."""
        try:
            manager = self.engine_manager("embedded")
        except KvscopeError:
            return  # no embedded engine configured: nothing to load
        self.demo = DemoLoad(
            manager.spec.base_url,
            manager.spec.served_name,
            ready=lambda: manager.state.status == "running",
        )
        self.demo.start()

    def engine_facts(self, name: str) -> dict[str, Any]:
        """What the managed engine's spec and startup say, for probes to compare against."""
        manager = self.engines.get(name)
        if manager is None:
            return {}
        return {"spec": manager.spec.model_dump(), "startup": dict(manager.state.facts)}

    def supervise_engines(self) -> None:
        """One supervision pass over every stored engine."""
        for name, _, desired in q.list_engine_specs(self.engine):
            manager = self.engine_manager(name)
            manager.poll(desired)

    # -- targets -----------------------------------------------------------------------------

    def target(self, target_id: int) -> TargetRow:
        """A target by id."""
        return q.get_target(self.engine, target_id)

    def sync_targets(self) -> None:
        """Add scrape jobs for new enabled targets, remove those of removed or disabled ones."""
        wanted = {t.id for t in q.list_targets(self.engine, enabled_only=True)}
        scheduled = {
            int(j.id.split(":", 1)[1])
            for j in self.scheduler.get_jobs()
            if j.id.startswith("scrape:")
        }
        for tid in wanted - scheduled:
            self.scheduler.add_job(
                scrape_job,
                "interval",
                seconds=self.settings.scrape_interval_s,
                args=[self.key, tid],
                id=f"scrape:{tid}",
                replace_existing=True,
                next_run_time=_soon(),
                misfire_grace_time=max(1, int(self.settings.scrape_interval_s)),
            )
        for tid in scheduled - wanted:
            with contextlib.suppress(JobLookupError):
                self.scheduler.remove_job(f"scrape:{tid}")
            with self._lock:
                self._states.pop(tid, None)
            self.writer.forget_target(tid)

    def sync_schedules(self) -> None:
        """Keep one interval job per enabled probe schedule."""
        wanted = {s.id: s for s in q.list_schedules(self.engine, enabled_only=True)}
        jobs = {j.id: j for j in self.scheduler.get_jobs() if j.id.startswith("schedule:")}
        for sid, sched in wanted.items():
            job = jobs.get(f"schedule:{sid}")
            if job is None or job.trigger.interval.total_seconds() != sched.every_s:
                self.scheduler.add_job(
                    schedule_job,
                    "interval",
                    seconds=sched.every_s,
                    args=[self.key, sid],
                    id=f"schedule:{sid}",
                    replace_existing=True,
                )
        for job_id in jobs:
            if int(job_id.split(":", 1)[1]) not in wanted:
                with contextlib.suppress(JobLookupError):
                    self.scheduler.remove_job(job_id)

    def queue_scheduled(self, schedule_id: int) -> None:
        """Queue a schedule's probe, unless its previous run is still going."""
        sched = next((s for s in q.list_schedules(self.engine) if s.id == schedule_id), None)
        if sched is None or q.active_run_of_schedule(self.engine, schedule_id):
            return
        q.request_run(
            self.engine,
            sched.kind,
            {**sched.params, "schedule_id": sched.id},
            target_id=sched.target_id,
        )

    def scrape_target(self, target_id: int) -> None:
        """Scrape, store, and record health; a failure backs off and never raises."""
        with self._lock:
            st = self._states.setdefault(target_id, _TargetState())
        now = time.time()
        if now < st.next_attempt:
            return
        try:
            target = self.target(target_id)
        except NotFound:
            return  # removed while the job was due; the next sync drops the job
        try:
            parsed = scrape(
                self.client, target.base_url, target.token_env, self.settings.scrape_timeout_s
            )
        except KvscopeError as err:
            self._scrape_failed(target, st, str(err), now)
            return
        ts = time.time()
        try:
            self.writer.write(target.id, parsed.samples, ts)
        except KvscopeError as err:
            log.warning("target %s: %s", target.name, err)
            q.record_event(
                self.engine, "storage_error", str(err), target_id=target.id, severity="error"
            )
            return
        warning = "; ".join(parsed.warnings) or None
        before, _ = q.set_target_health(
            self.engine,
            target.id,
            ok=True,
            message=warning,
            ts=ts,
            cache_info=parsed.cache_info,
            model_name=parsed.model_name,
        )
        if before == "down":
            q.record_event(
                self.engine,
                "target_up",
                f"{target.name} is answering again after {st.failures} failed scrape(s)",
                target_id=target.id,
            )
        if warning and warning != st.warning:
            q.record_event(
                self.engine,
                "scrape_warning",
                f"{target.name}: {warning}",
                target_id=target.id,
                severity="warning",
            )
        st.warning, st.failures, st.next_attempt = warning, 0, 0.0
        self._check_resets(target, st, parsed.samples)

    def _scrape_failed(self, target: TargetRow, st: _TargetState, message: str, now: float) -> None:
        st.failures += 1
        delay = min(self.settings.scrape_interval_s * 2 ** (st.failures - 1), MAX_BACKOFF_S)
        st.next_attempt = now + delay
        before, _ = q.set_target_health(self.engine, target.id, ok=False, message=message, ts=now)
        if before != "down":
            q.record_event(
                self.engine,
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
                self.engine,
                "counter_reset",
                f"{target.name}: counters went backwards ({', '.join(sorted(fell))}); the "
                "engine restarted. Rates count from zero again, nothing stored was changed.",
                target_id=target.id,
                severity="warning",
                data={k: {"before": st.counters.get(k), "after": values[k]} for k in fell},
            )
        st.counters = values

    # -- work requests -----------------------------------------------------------------------

    def pick_up_work(self) -> None:
        """Claim queued runs the worker has handlers for and run them in the background."""
        self._active = {k: f for k, f in self._active.items() if not f.done()}
        q.fail_unknown_runs(self.engine, list(self.handlers))
        while len(self._active) < 2:
            run = q.claim_next_run(self.engine, list(self.handlers))
            if run is None:
                return
            self._active[run.id] = self._runs.submit(self._execute, run)

    def _execute(self, run: RunRow) -> None:
        handler = self.handlers[run.kind]
        try:
            summary = handler(self, run)
        except ProbeCancelled as err:
            q.update_run(self.engine, run.id, status="cancelled", error=str(err))
        except KvscopeError as err:
            q.update_run(self.engine, run.id, status="failed", error=str(err))
        except Exception as err:
            log.error("run %s (%s) crashed:\n%s", run.id, run.kind, traceback.format_exc())
            q.update_run(
                self.engine,
                run.id,
                status="failed",
                error=f"internal error in the {run.kind} handler: {type(err).__name__}: {err}",
            )
        else:
            if summary.pop("cancelled", False):
                q.update_run(
                    self.engine,
                    run.id,
                    status="cancelled",
                    summary=summary,
                    error="cancelled on request; the results so far are kept",
                )
            else:
                q.update_run(self.engine, run.id, status="done", progress=1.0, summary=summary)

    def cancelled(self, run_id: int) -> bool:
        """Whether the user asked this run to stop (handlers poll this)."""
        return q.get_run(self.engine, run_id).cancel_requested or self._stop.is_set()


def _soon() -> Any:
    from datetime import datetime, timedelta

    return datetime.now().astimezone() + timedelta(milliseconds=200)
