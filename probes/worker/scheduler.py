"""The worker's APScheduler wiring: a BackgroundScheduler with its job store in kvscope's own
database and explicit job defaults, the module-level job entry points (a stored job names a
function, never an object, so each finds its worker by key), and probe schedule jobs kept
in step with their table. Scrapes are not jobs here: `scraping.ScrapeLoop` times them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from apscheduler.executors.pool import ThreadPoolExecutor as JobThreadPool
from apscheduler.jobstores.base import JobLookupError
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine

from probes.alerting.evaluate import AlertEvaluator
from storage.rollups import expire, run_rollups
from storage.settings import Settings

log = logging.getLogger("kvscope.worker")

JOB_DEFAULTS: dict[str, Any] = {"coalesce": True, "max_instances": 1, "misfire_grace_time": 30}
RETENTION_EVERY_S = 600.0
HEARTBEAT_EVERY_S = 5.0
ENGINES_EVERY_S = 2.0
HOUSEKEEPING_THREADS = 4


class JobHost(Protocol):
    """What the jobs reach on the worker that scheduled them."""

    store: Engine
    settings: Settings

    def queue_scheduled(self, schedule_id: int) -> None: ...

    def publish_heartbeat(self) -> None: ...

    def renew_lease(self) -> None: ...

    def check_disk(self) -> None: ...

    def publish_gpus(self) -> None: ...

    def supervise_engines(self) -> None: ...


# Jobs name their worker by key: the job store keeps references, not objects, and a process
# (a test session, say) may hold more than one worker.
_HOSTS: dict[str, JobHost] = {}


def guarded(what: str, fn: Callable[[], object]) -> None:
    """Run a periodic task; log its failure instead of killing the job."""
    try:
        fn()
    except Exception:
        log.exception("worker task %s failed", what)


def _on_host(key: str, what: str, task: Callable[[JobHost], object]) -> None:
    if host := _HOSTS.get(key):
        guarded(what, lambda: task(host))


# --- job entry points: module level, so the SQLAlchemy job store can reference them ------


def rollup_job(key: str) -> None:
    """Roll up raw samples (APScheduler job)."""
    _on_host(key, "rollup", lambda h: run_rollups(h.store))


def retention_job(key: str) -> None:
    """Expire old data (APScheduler job)."""
    _on_host(key, "retention", lambda h: expire(h.store, h.settings.retention))


def gpu_job(key: str) -> None:
    """Publish the GPU state (APScheduler job)."""
    _on_host(key, "gpu", lambda h: h.publish_gpus())


def heartbeat_job(key: str) -> None:
    """Keep the worker lease and tell the console this worker is alive (APScheduler job)."""
    _on_host(key, "lease", lambda h: h.renew_lease())
    _on_host(key, "disk", lambda h: h.check_disk())
    _on_host(key, "heartbeat", lambda h: h.publish_heartbeat())


def schedule_job(key: str, schedule_id: int) -> None:
    """Queue the run of a probe schedule (APScheduler job)."""
    _on_host(key, "schedule", lambda h: h.queue_scheduled(schedule_id))


def alerts_job(key: str) -> None:
    """Evaluate the alert rules (APScheduler job)."""
    _on_host(key, "alerts", lambda h: AlertEvaluator(h.store).run())


def engines_job(key: str) -> None:
    """Supervise managed engines: health, crashes, restarts (APScheduler job)."""
    _on_host(key, "engines", lambda h: h.supervise_engines())


def _soon() -> datetime:
    return datetime.now().astimezone() + timedelta(milliseconds=200)


class WorkerJobs:
    """One worker's jobs on a BackgroundScheduler; every job carries the worker's key."""

    def __init__(self, store: Engine, key: str) -> None:
        self.key = key
        self.scheduler = BackgroundScheduler(
            jobstores={"default": SQLAlchemyJobStore(engine=store)},
            # Housekeeping and engine supervision in pools of their own: a slow alert pass
            # cannot hold up the heartbeat's pool share or a crashed engine's restart.
            executors={
                "default": JobThreadPool(max_workers=HOUSEKEEPING_THREADS),
                "engines": JobThreadPool(max_workers=1),
            },
            job_defaults=dict(JOB_DEFAULTS),
        )

    def start(self, host: JobHost) -> None:
        """Register `host`, start paused and put our periodic jobs in place of stored ones."""
        _HOSTS[self.key] = host
        # Paused while the stored jobs of a previous worker process are replaced by ours.
        self.scheduler.start(paused=True)
        for job in self.scheduler.get_jobs():
            if tuple(job.args[:1]) != (self.key,):
                job.remove()
        s = host.settings
        for job_fn, job_id, every, executor in (
            (rollup_job, "rollup", s.rollup_interval_s, "default"),
            (retention_job, "retention", RETENTION_EVERY_S, "default"),
            (gpu_job, "gpu", s.gpu_interval_s, "default"),
            (heartbeat_job, "heartbeat", HEARTBEAT_EVERY_S, "default"),
            (engines_job, "engines", ENGINES_EVERY_S, "engines"),
            (alerts_job, "alerts", s.alert_interval_s, "default"),
        ):
            self.scheduler.add_job(
                job_fn,
                "interval",
                seconds=every,
                args=[self.key],
                id=job_id,
                replace_existing=True,
                next_run_time=_soon(),
                executor=executor,
            )

    def resume(self) -> None:
        """Let the jobs run."""
        self.scheduler.resume()

    def shutdown(self) -> None:
        """Stop the scheduler, waiting for the jobs that run now."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)

    def unregister(self) -> None:
        """Stored jobs that still fire find no worker under this key."""
        _HOSTS.pop(self.key, None)

    def sync_schedules(self, wanted: Mapping[int, float]) -> None:
        """One interval job per probe schedule id, every `wanted[id]` seconds."""
        jobs = {j.id: j for j in self.scheduler.get_jobs() if j.id.startswith("schedule:")}
        for sid, every_s in wanted.items():
            job = jobs.get(f"schedule:{sid}")
            if job is None or job.trigger.interval.total_seconds() != every_s:
                self.scheduler.add_job(
                    schedule_job,
                    "interval",
                    seconds=every_s,
                    args=[self.key, sid],
                    id=f"schedule:{sid}",
                    replace_existing=True,
                )
        for job_id in jobs:
            if int(job_id.split(":", 1)[1]) not in wanted:
                with contextlib.suppress(JobLookupError):
                    self.scheduler.remove_job(job_id)
