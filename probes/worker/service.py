"""The worker: one long-lived process that scrapes targets and carries out requested work.

`Worker` composes the scheduler wiring (`scheduler`), the scrape loop (`scraping`), the
managed engines (`engines`) and the work queue (`work`), and owns the lifecycle, the
heartbeat and the demo load. Every failure ends up in the store as data.

On SQLite one worker serves a store (the `worker` lease; a second is refused). On
PostgreSQL several may: each is a member while it renews its `member:` lease, the targets
are dealt out among the live members (`storage.queries.fleet`), and the holder of the
`worker` lease leads: it alone runs the jobs that must run once (rollups, retention, alert
evaluation, schedules, engines, the work queue). When the leader dies another takes the
lease and leads; when any member dies its targets go to the others.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import Engine

from planner.errors import KvscopeError
from probes.alerting.rules import DEFAULT_RULES
from probes.worker.demo import DemoLoad
from probes.worker.engines import EngineRegistry
from probes.worker.gpu import GpuSampler
from probes.worker.scheduler import WorkerJobs, guarded
from probes.worker.scraping import ScrapeLoop, TargetScraper
from probes.worker.work import Handler, WorkQueue
from storage import queries as q
from storage.db import open_store, sqlite_file
from storage.queries import fleet
from storage.settings import Settings

log = logging.getLogger("kvscope.worker")
LEASE = "worker"
# Target edits reach the scrape loop within this; each sync reads every target row.
TARGET_SYNC_S = 2.0
# Several workers: how often each deals the targets out again (a fraction of the scrape
# interval, so a dead member's targets are scraped again within two intervals).
FLEET_PASS_MIN_S, FLEET_PASS_MAX_S = 0.1, 1.0


def _member_alive(lease: q.LeaseRow) -> bool:
    """False when the lease's holder ran on this host and its process is gone (elsewhere,
    only the lease's expiry can tell)."""
    return lease.host != socket.gethostname() or _alive(lease.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Worker:
    """The worker process: its store, parts and lifecycle (start, tick, run_forever, stop)."""

    def __init__(
        self,
        settings: Settings,
        transport: httpx.AsyncBaseTransport | None = None,
        handlers: dict[str, Handler] | None = None,
        store: Engine | None = None,
    ) -> None:
        self.settings = settings
        settings.private_data_dir()
        self.store = store or open_store(settings.db_url)
        self.key = uuid.uuid4().hex
        self.started_at = time.time()
        self.gpus = GpuSampler()
        self.scraper = TargetScraper(self.store, settings, transport)
        self.scrapes = ScrapeLoop(self.scraper)
        self.engines = EngineRegistry(self.store, settings.data_dir, transport)
        self._stop = threading.Event()
        self.work = WorkQueue(
            self.store, self.scraper, self.engines, self._stop, settings, handlers
        )
        self.jobs = WorkerJobs(self.store, self.key)
        self.scheduler = self.jobs.scheduler
        self.keep_engines = False  # tests: leave engines running, as a crashed worker would
        self.demo: DemoLoad | None = None
        self._synced_at = -math.inf
        # Several workers may share a database server; a SQLite file has one.
        self.fleet = self.store.dialect.name == "postgresql"
        self.leading = False
        self._member_at = -math.inf
        self._fleet_thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Take the store's worker lease, recover from a previous process, schedule the jobs,
        start the scheduler. On SQLite, refused (with who holds it) when another worker
        runs; on PostgreSQL, join the others and lead only if nobody does."""
        if self.fleet:
            self._join()
            self.leading = self._try_lead()
        else:
            self._take_lease()
            self.leading = True
        if self.leading:
            self._lead()
        self.scrapes.start()
        self.sync_targets()
        if self.fleet:
            self._fleet_thread = threading.Thread(
                target=self._fleet_main, name="kvscope-fleet", daemon=True
            )
            self._fleet_thread.start()
        role = "" if not self.fleet else (" as the leader" if self.leading else " beside a leader")
        q.record_event(
            self.store,
            "worker_started",
            f"worker started{role} (pid {os.getpid()}); {self.gpus.message}",
        )

    def _lead(self) -> None:
        """Run what runs once per store: the jobs, the engines, the work queue."""
        q.ensure_rules(self.store, [r.model_dump() for r in DEFAULT_RULES])
        self.work.recover()
        self.jobs.start(self)
        self.engines.adopt_or_clean()
        self.jobs.resume()
        if self.settings.demo_load:
            self._start_demo_load()

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
        """One pass of the main loop: keep jobs in step with their tables, pick up work."""
        if not self.fleet and time.monotonic() - self._synced_at >= TARGET_SYNC_S:
            guarded("sync", self.sync_targets)
        if self.leading:
            guarded("schedules", self.sync_schedules)
            guarded("work", self.work.pick_up)

    def stop(self) -> None:
        """Stop the scheduler and runs; runs still going are marked interrupted. A member
        of several gives its targets and (if it led) the lead back at once."""
        self._stop.set()
        if self._fleet_thread is not None:
            self._fleet_thread.join(10)
        self.scrapes.stop()
        if self.fleet:
            with contextlib.suppress(KvscopeError):
                fleet.release_claims(self.store, self.key)
                q.release_lease(self.store, fleet.member_lease(self.key), self.key)
        if self.leading:
            self.jobs.shutdown()
            self.work.shutdown()
            if self.demo is not None:
                self.demo.stop()
            self.engines.stop_all(keep=self.keep_engines)
            self.work.interrupt_running()
            q.put_state(
                self.store,
                "worker",
                {"pid": os.getpid(), "running": False, "stopped_at": time.time()},
            )
        self.gpus.close()
        self.jobs.unregister()
        if self.leading:
            with contextlib.suppress(KvscopeError):
                q.release_lease(self.store, LEASE, self.key)

    def _start_demo_load(self) -> None:
        """Light load on the embedded engine, sent only while it runs."""
        try:
            manager = self.engines.manager("embedded")
        except KvscopeError:
            return  # no embedded engine configured: nothing to load
        self.demo = DemoLoad(
            manager.spec.target,
            manager.spec.served_name,
            ready=lambda: manager.state.status == "running",
        )
        self.demo.start()

    # -- what the jobs call ------------------------------------------------------------------

    def scrape_target(self, target_id: int) -> None:
        """Scrape one target now (its job's work)."""
        self.scraper.scrape(target_id)

    def queue_scheduled(self, schedule_id: int) -> None:
        """Queue a schedule's probe, unless its previous run is still going."""
        self.work.queue_scheduled(schedule_id)

    def supervise_engines(self) -> None:
        """One supervision pass over every stored engine."""
        self.engines.supervise()

    def publish_gpus(self) -> None:
        """Write the GPU readings (or why there are none)."""
        q.put_state(self.store, "gpu", self.gpus.state())

    def _acquire(self, name: str) -> q.LeaseRow:
        host, pid = socket.gethostname(), os.getpid()
        held = q.get_lease(self.store, name)
        # A holder on this host whose process is gone is dead: no need to wait for expiry.
        dead = held.holder if held and not _member_alive(held) else None
        return q.acquire_lease(
            self.store, name, self.key, pid, host, self.settings.worker_lease_s, take_from=dead
        )

    def _take_lease(self) -> None:
        lease = self._acquire(LEASE)
        if lease.holder != self.key:
            since = datetime.fromtimestamp(lease.acquired_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
            left = max(0.0, lease.expires_at - time.time())
            raise KvscopeError(
                f"worker lease held by pid {lease.pid} on {lease.host} since {since} UTC: "
                f"another worker runs on this store (its lease expires {left:.0f} s after its "
                "last renewal, if it stops renewing it)"
            )

    def renew_lease(self) -> None:
        """Keep the lease; a worker that lost it stops, so two never act on one store."""
        if q.renew_lease(self.store, LEASE, self.key, self.settings.worker_lease_s):
            return
        log.error("the worker lease was taken over by another worker; stopping")
        with contextlib.suppress(KvscopeError):
            q.record_event(
                self.store,
                "worker_lease_lost",
                f"worker pid {os.getpid()} lost its lease (it could not renew it in time) and "
                "stopped, leaving the store to the worker that took it",
                severity="error",
            )
        self._stop.set()

    def check_disk(self) -> None:
        """Pause ingest while the store's disk is nearly full (an event and an Overview
        warning say so), and resume once there is room again, a margin above the limit."""
        folder = self.store_folder()
        if folder is None:
            return  # a database server: its disk is its operator's to watch
        free_mb = shutil.disk_usage(folder).free / 2**20
        limit = self.settings.retention.min_free_disk_mb
        paused = self.scraper.paused is not None
        if not paused and free_mb < limit:
            message = (
                f"ingest paused: {free_mb:.0f} MiB free on the disk holding {folder}, under "
                f"the {limit:.0f} MiB kvscope keeps free (KVSCOPE_RETENTION__MIN_FREE_DISK_MB); "
                "free space or shorten retention, and scraping stores again"
            )
            self.scraper.paused = message
            q.record_event(self.store, "disk_low", message, severity="error")
            q.put_state(self.store, "disk", {"paused": True, "message": message})
        elif paused and free_mb >= limit * 1.2:
            self.scraper.paused = None
            q.record_event(
                self.store, "disk_ok", f"ingest resumed: {free_mb:.0f} MiB free on {folder}"
            )
            q.put_state(self.store, "disk", {"paused": False, "message": ""})

    def store_folder(self) -> Path | None:
        """The folder of a SQLite store's file (None for a database server)."""
        path = sqlite_file(self.store)
        return None if path is None else path.resolve().parent

    def publish_heartbeat(self) -> None:
        """Write the worker's liveness and identity."""
        q.put_state(
            self.store,
            "worker",
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "running": True,
                "started_at": self.started_at,
                "targets": self.scraper.tracked,
                "scrape_interval_s": self.settings.scrape.interval_s,
                # Several workers on one store: how many are alive (this one leads).
                "workers": len(self.members()) if self.fleet else 1,
            },
        )

    # -- several workers on one store ---------------------------------------------------------

    def _join(self) -> None:
        self._member_at = time.monotonic()
        self._acquire(fleet.member_lease(self.key))

    def _try_lead(self) -> bool:
        return self._acquire(LEASE).holder == self.key

    def _fleet_main(self) -> None:
        period = min(max(self.settings.scrape.interval_s / 4, FLEET_PASS_MIN_S), FLEET_PASS_MAX_S)
        while not self._stop.wait(period):
            guarded("fleet", self.fleet_pass)

    def fleet_pass(self) -> None:
        """Stay a member, lead if the leader is gone, take this worker's share of targets."""
        if time.monotonic() - self._member_at >= self.settings.worker_lease_s / 3:
            self._join()
        if not self.leading and self._try_lead():
            log.info("leading the workers of this store")
            q.record_event(
                self.store, "worker_leads", f"worker pid {os.getpid()} leads (the leader left)"
            )
            self._lead()
            self.leading = True  # after recovery: the main loop then picks up work
        self.sync_targets()

    def members(self) -> list[str]:
        """The live workers of this store (this one included)."""
        members = fleet.live_members(self.store, alive=_member_alive)
        return sorted({*members, self.key})

    # -- keeping jobs in step with their tables ----------------------------------------------

    def sync_targets(self) -> None:
        """Scrape the enabled targets as they are now (of several workers, this one's share),
        within the allowlist as it is now; forget removed or disabled ones."""
        self._synced_at = time.monotonic()
        self.scraper.refresh_allowlist()
        targets = q.list_targets(self.store, enabled_only=True)
        dropped: set[int] = set()
        if self.fleet:
            members = self.members()
            wanted = {t.id for t in targets if fleet.owner(t.id, members) == self.key}
            # Stop scraping what is no longer ours before giving it up.
            current = self.scrapes.target_ids & wanted
            dropped |= self.scrapes.sync(t for t in targets if t.id in current)
            held = fleet.settle_claims(
                self.store, self.key, wanted, members, self.settings.worker_lease_s
            )
            targets = [t for t in targets if t.id in held]
        dropped |= self.scrapes.sync(targets)
        for tid in dropped:
            self.scraper.forget(tid)

    def sync_schedules(self) -> None:
        """Keep one interval job per enabled probe schedule."""
        schedules = q.list_schedules(self.store, enabled_only=True)
        self.jobs.sync_schedules({s.id: s.every_s for s in schedules})
