"""One managed engine: its process group (`process`), log follower (`logs`) and crash policy
(`supervision`) composed, with what the console sees written to the store: events, the
managed target's row (scraped only while healthy) and the published state and log tail.
The engine's secrets (read when it is spawned) are masked in all of it, should the engine
ever print one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine

from planner.errors import EngineError, TargetError
from probes.engine.logs import LogFollower
from probes.engine.process import STOP_TIMEOUT_S, EngineProcess
from probes.engine.spec import EngineSpec, preflight
from probes.engine.supervision import START_TIMEOUT_S, CrashPolicy
from probes.vllm.client import VllmClient
from probes.vllm.logparse import LogFact
from storage import queries as q
from storage.access.audit import mask

log = logging.getLogger("kvscope.engine")

LOG_TAIL_LINES = 120
# Log facts that describe the running engine (shown on the Engine page), not one moment.
STATE_FACTS = frozenset(
    {"kv_capacity", "max_concurrency", "kv_memory", "model_memory", "v0_blocks", "v0_memory"}
)


@dataclass
class EngineState:
    """What the console shows about a managed engine (published in `worker_state`)."""

    name: str
    status: str = "stopped"  # stopped | starting | running | stopping | crashed | failed
    pid: int | None = None
    started_at: float | None = None
    healthy_at: float | None = None
    restarts: int = 0
    last_exit_code: int | None = None
    message: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    command: str = ""


class EngineManager:
    """One managed engine. Thread-safe: the worker's jobs and run handlers share it."""

    def __init__(
        self,
        store: Engine,
        data_dir: Path,
        spec: EngineSpec,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.store = store
        self.data_dir = data_dir
        self.spec = spec
        self.transport = transport
        self._secrets: tuple[str, ...] = ()  # the running engine's, to mask wherever they show
        self.process = EngineProcess(data_dir / "engines" / spec.name)
        self.logs = LogFollower(
            self.process.log_path,
            self._record_fact,
            name=f"engine-log-{spec.name}",
            on_error=lambda message: self._event(
                "engine_log_error", f"engine {self.spec.name}: {message}", severity="warning"
            ),
        )
        self.policy = CrashPolicy()
        self.state = EngineState(spec.name)
        # Who asked for the command being carried out (a run's requested_by), for its events;
        # None while the worker acts on its own (supervision, crash restarts).
        self.actor: str | None = None
        self._lock = threading.RLock()
        self._published_tail: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(
        self,
        wait: bool = True,
        timeout: float = START_TIMEOUT_S,
        spec: EngineSpec | None = None,
    ) -> EngineState:
        """Start the engine, running `spec` when given (refusing a spec that cannot start);
        wait until it is healthy. The spec is taken under the same lock as the launch, so a
        supervision pass that meanwhile set the spec last started cannot launch that one."""
        with self._lock:
            if self.alive():
                raise EngineError(
                    f"engine {self.spec.name} is already running "
                    f"(pid {self.state.pid}); stop or restart it"
                )
            if spec is not None:
                self.spec = spec
            problems = preflight(self.spec, data_dir=self.data_dir)
            if problems:
                raise EngineError(f"engine {self.spec.name} not started: " + "; ".join(problems))
            self._launch()
        if wait:
            self.wait_healthy(timeout)
        return self.state

    def _launch(self) -> None:
        launched = self.process.launch(self.spec)
        self._secrets = tuple(self.spec.secret_environment(os.environ).values())
        self.state = EngineState(
            self.spec.name,
            status="starting",
            pid=launched.pid,
            started_at=launched.started_at,
            restarts=self.state.restarts,
            command=self.spec.command_line(self.process.run_dir),
        )
        self.policy.healthy()
        self.logs.start(launched.log_offset)
        # Scraping starts when the engine is healthy, so startup is not a string of failures.
        self._set_target("starting", "engine starting")
        self._event(
            "engine_starting",
            f"engine {self.spec.name} starting (pid {launched.pid})",
            data={"argv": launched.argv},
        )
        self.publish()

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        """Block until the engine is healthy, or fail with the log's last lines."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.state.status == "running":
                    return
                if not self.alive():
                    self._reap()
                    raise EngineError(
                        f"engine {self.spec.name} exited during startup (code "
                        f"{self.state.last_exit_code}): {self.last_error()}"
                    )
                self.check_health()
            time.sleep(0.5)
        self.stop(reason="did not become healthy in time")
        raise EngineError(
            f"engine {self.spec.name} was not healthy after {timeout:.0f} s; "
            f"stopped it. Last log lines: {self.last_error()}"
        )

    def stop(self, timeout: float = STOP_TIMEOUT_S, reason: str = "stopped on request") -> None:
        """SIGTERM the process group, SIGKILL what is left after `timeout`; wipe temp files."""
        with self._lock:
            if not self.process.group_alive():
                self._cleanup()
                return
            self.state.status = "stopping"
            self.publish()
            if self.process.terminate(timeout):
                self._event(
                    "engine_killed",
                    f"engine {self.spec.name} did not stop within {timeout:.0f} s and was killed",
                    severity="warning",
                )
            self._reap()
            self._cleanup()
            self._event("engine_stopped", f"engine {self.spec.name} {reason}")

    def abandon(self) -> None:
        """Stop watching without stopping the engine (what a crashed worker leaves behind)."""
        self.logs.abandon()
        self.process.detach()

    def _cleanup(self) -> None:
        self.logs.stop()
        self.process.forget()
        self.process.wipe_tmp()
        self.state.status, self.state.pid = "stopped", None
        self._set_target("stopped", "engine stopped")
        self.publish()

    def adopt_or_clean(self, desired: str) -> bool:
        """After a worker restart: adopt our engine if it still runs as specified, else stop it.

        Returns True when a running engine was adopted; never leaves two engines.
        """
        left = self.process.claim_left_over()
        if left is None:
            if self.process.refused:
                self._event(
                    "engine_not_adopted",
                    f"engine {self.spec.name}: {self.process.refused}",
                    severity="warning",
                )
            return False
        if desired == "running" and left.runs(self.spec):
            self.state = EngineState(
                self.spec.name,
                status="starting",
                pid=left.pgid,
                started_at=left.started_at,
                command=self.spec.command_line(self.process.run_dir),
            )
            with contextlib.suppress(EngineError):  # to mask them, should they show
                self._secrets = tuple(self.spec.secret_environment(os.environ).values())
            self.logs.start()  # from the end: the previous worker read what came before
            self._event(
                "engine_adopted",
                f"engine {self.spec.name} (pid {left.pgid}) left by a "
                "previous worker is running as specified: adopted, not restarted",
            )
            self.check_health()
            self.publish()
            return True
        why = "it is not wanted" if desired != "running" else "its spec changed"
        self.stop(reason=f"left by a previous worker, stopped because {why}")
        return False

    # -- supervision -------------------------------------------------------------------------

    def alive(self) -> bool:
        """Whether any process of the engine's group lives."""
        return self.process.alive()

    def take_spec(self, spec: EngineSpec) -> None:
        """Run `spec` from the next start, unless the engine runs; never while a start or a
        stop is under way (the manager's lock)."""
        with self._lock:
            if self.spec != spec and not self.alive():
                self.spec = spec

    def _reap(self) -> None:
        code = self.process.exit_code()
        if code is not None:
            self.state.last_exit_code = code

    def poll(self, desired: str) -> None:
        """One supervision step (every couple of seconds): health, crash, restart with backoff."""
        with self._lock:
            status = self.state.status
            if status in ("stopped", "failed", "stopping", "crashed"):
                if self.policy.should_start(status, desired, self.alive(), time.time()):
                    self._try_start()
                return
            self.publish()  # the log tail moves while the engine runs
            if self.process.leader_exited() or not self.alive():
                self._crashed("the engine process exited")
                return
            healthy = self.check_health()
            why = self.policy.crash_reason(status, healthy, self.state.started_at, time.time())
            if why is not None:
                self._crashed(why)

    def _try_start(self) -> None:
        problems = preflight(self.spec, data_dir=self.data_dir)
        if problems:
            self.state.status, self.state.message = "failed", "; ".join(problems)
            self._event(
                "engine_failed",
                f"engine {self.spec.name} cannot start: {self.state.message}",
                severity="error",
            )
            self.publish()
            return
        self._launch()

    def _crashed(self, why: str) -> None:
        self._reap()
        code = self.state.last_exit_code
        try:
            self.process.kill()
        except EngineError as err:  # stuck in the kernel: say so; the restart will find out
            self._event("engine_stuck", f"engine {self.spec.name}: {err}", severity="error")
        self.logs.stop()  # every writer is gone: read the log to its end first
        tail = self.logs.last_lines(30)
        verdict = self.policy.record_crash(time.time())
        self.process.forget()
        self.state.restarts += 1
        self._set_target("down", f"engine crashed: {why}")
        if verdict.give_up:
            self.state.status = "failed"
            self.state.message = (
                f"{verdict.crashes} crashes in {self.policy.crash_window_s / 60:.0f} "
                "minutes; not restarting until asked. " + why
            )
            kind = "engine_failed"
        else:
            self.state.status = "crashed"
            self.state.message = f"{why} (exit code {code}); restarting in {verdict.delay_s:.0f} s"
            kind = "engine_crashed"
        self._event(
            kind,
            f"engine {self.spec.name}: {self.state.message}",
            severity="error",
            data={"exit_code": code, "last_lines": tail},
        )
        self.publish()

    @property
    def vllm(self) -> VllmClient:
        """The engine's client (its spec may change between starts)."""
        return VllmClient(self.spec.target, self.transport)

    def check_health(self) -> bool:
        """Ask for health once; the first answer of a starting engine makes it running."""
        ok = self.vllm.healthy(timeout=2.0)
        if ok:
            self.policy.healthy()
            if self.state.status == "starting":
                self.state.status, self.state.healthy_at = "running", time.time()
                took = self.state.healthy_at - (self.state.started_at or self.state.healthy_at)
                self.state.facts["time_to_healthy_s"] = round(took, 1)
                self.state.message = self._models_message()
                self._set_target("unknown", None, enabled=True)
                self._event(
                    "engine_healthy",
                    f"engine {self.spec.name} healthy after {took:.1f} s; {self.state.message}",
                )
                self.publish()
        return ok

    def _models_message(self) -> str:
        try:
            ids = self.vllm.models(timeout=2.0)
        except TargetError:
            return "serving (the model list did not answer)"
        return f"serving {', '.join(ids)}"

    def last_error(self, lines: int = 8) -> str:
        """The last meaningful log lines, joined for a one-line message."""
        tail = [ln for ln in self.logs.last_lines(80) if ln.strip()]
        errors = [ln for ln in tail if "Error" in ln or "error" in ln]
        return " | ".join((errors or tail)[-lines:])[:1500] or "(no output)"

    def _record_fact(self, fact: LogFact) -> None:
        """A parsed log line (on the follower's thread): engine facts, and always an event."""
        if fact.kind in STATE_FACTS:
            self.state.facts[fact.kind] = fact.values
            self.publish()
        self._event(
            f"engine_{fact.kind}",
            fact.message,
            severity=fact.severity,
            data={k: v for k, v in fact.values.items() if k != "lines"}
            | ({"lines": fact.values["lines"]} if "lines" in fact.values else {}),
        )

    # -- store -------------------------------------------------------------------------------

    def _set_target(self, health: str, message: str | None, enabled: bool = False) -> None:
        q.upsert_managed_target(
            self.store,
            self.spec.name,
            self.spec.base_url,
            enabled=enabled,
            health=health,
            message=message,
        )

    def _event(
        self, kind: str, message: str, severity: str = "info", data: dict[str, Any] | None = None
    ) -> None:
        target_id = None
        with contextlib.suppress(Exception):
            target_id = q.get_target(self.store, self.spec.name).id
        try:
            q.record_event(
                self.store,
                kind,
                mask(message, self._secrets),
                target_id=target_id,
                severity=severity,
                data=None if data is None else mask(data, self._secrets),
                actor=self.actor,
            )
        except Exception:  # an event lost must never take the engine down with it
            log.exception("could not record event %s", kind)

    def publish(self) -> None:
        """Write the state, and the log tail when it moved, for the console."""
        with contextlib.suppress(Exception):
            q.put_state(
                self.store, f"engine:{self.spec.name}", mask(asdict(self.state), self._secrets)
            )
            tail = self.logs.last_lines(LOG_TAIL_LINES)
            if tail != self._published_tail:
                lines = [mask(line, self._secrets) for line in tail]
                q.put_state(self.store, f"engine_log:{self.spec.name}", {"lines": lines})
                self._published_tail = tail
