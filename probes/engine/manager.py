"""The managed engine's process: start, health, logs, crash restart, stop, adoption.

The engine runs in its own process group (`start_new_session`), so stop and crash cleanup
reach every child vLLM spawns (EngineCore, workers). Its output goes straight to a log file
opened for append, never a pipe, so the engine outlives a worker crash without a broken
pipe and a later worker can adopt it from the pid file. A tail thread reads that file,
parses it into events and rotates it (copy, then truncate: safe with O_APPEND).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine

from planner.errors import EngineError
from probes.engine import EngineSpec, engine_tmp_dir, preflight
from probes.logparse import LogFact, LogParser
from storage import queries as q

log = logging.getLogger("kvscope.engine")

LOG_MAX_BYTES = 10 * 1024 * 1024
LOG_BACKUPS = 3
STOP_TIMEOUT_S = 30.0
START_TIMEOUT_S = 600.0
UNHEALTHY_RESTART_S = 60.0
CRASH_WINDOW_S = 900.0
MAX_CRASHES = 5
LOG_TAIL_LINES = 120


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


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command (which may hold spaces) start after the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def spec_hash(spec: EngineSpec) -> str:
    """Identity of what runs: a changed spec means the running engine is not this one."""
    return hashlib.sha256(json.dumps(spec.model_dump(), sort_keys=True).encode()).hexdigest()


class EngineManager:
    """One managed engine. Thread-safe: the worker's jobs and run handlers share it."""

    def __init__(
        self, store: Engine, data_dir: Path, spec: EngineSpec, client: httpx.Client | None = None
    ) -> None:
        self.store = store
        self.spec = spec
        self.client = client or httpx.Client()
        self.run_dir = data_dir / "engines" / spec.name
        self.log_path = self.run_dir / "engine.log"
        self.pid_path = self.run_dir / "engine.pid"
        self.state = EngineState(spec.name)
        self.parser = LogParser()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._lock = threading.RLock()
        self._tail_stop = threading.Event()
        self._tail: threading.Thread | None = None
        self._crashes: deque[float] = deque()
        self._next_restart = 0.0
        self._unhealthy_since: float | None = None
        self._published_tail: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, wait: bool = True, timeout: float = START_TIMEOUT_S) -> EngineState:
        """Start the engine (refusing a spec that cannot start); wait until /health answers."""
        with self._lock:
            if self.alive():
                raise EngineError(
                    f"engine {self.spec.name} is already running "
                    f"(pid {self.state.pid}); stop or restart it"
                )
            problems = preflight(self.spec)
            if problems:
                raise EngineError(f"engine {self.spec.name} not started: " + "; ".join(problems))
            self._launch()
        if wait:
            self.wait_healthy(timeout)
        return self.state

    def _launch(self) -> None:
        tmp = engine_tmp_dir(self.run_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.environment(self.run_dir)}
        argv = self.spec.argv()
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            out.write(
                f"\n===== kvscope: starting {self.spec.name} at "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}\n".encode()
            )
            out.flush()
            self._proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.run_dir,
                start_new_session=True,
            )
        self._pgid = self._proc.pid
        now = time.time()
        self.state = EngineState(
            self.spec.name,
            status="starting",
            pid=self._proc.pid,
            started_at=now,
            restarts=self.state.restarts,
            command=self.spec.command_line(self.run_dir),
        )
        self._unhealthy_since = None
        self.pid_path.write_text(
            json.dumps(
                {
                    "pid": self._proc.pid,
                    "pgid": self._pgid,
                    "started_at": now,
                    "spec_hash": spec_hash(self.spec),
                    "argv": argv,
                }
            )
        )
        self._start_tail(offset)
        # Scraping starts when the engine is healthy, so startup is not a string of failures.
        q.upsert_managed_target(
            self.store,
            self.spec.name,
            self.spec.base_url,
            enabled=False,
            health="starting",
            message="engine starting",
        )
        self._event(
            "engine_starting",
            f"engine {self.spec.name} starting (pid {self._pgid})",
            data={"argv": argv},
        )
        self.publish()

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        """Block until the engine answers /health, or fail with the log's last lines."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._lock:
                if self.state.status == "running":
                    return
                if not self.alive():
                    self._reap()
                    raise EngineError(
                        f"engine {self.spec.name} exited during startup (code "
                        f"{self.state.last_exit_code}): {self.last_error()}"
                    )
                self._check_health()
            time.sleep(0.5)
        self.stop(reason="did not become healthy in time")
        raise EngineError(
            f"engine {self.spec.name} was not healthy after {timeout:.0f} s; "
            f"stopped it. Last log lines: {self.last_error()}"
        )

    def stop(self, timeout: float = STOP_TIMEOUT_S, reason: str = "stopped on request") -> None:
        """SIGTERM the process group, SIGKILL what is left after `timeout`; wipe temp files."""
        with self._lock:
            pgid = self._pgid
            if pgid is None or not group_pids(pgid):
                self._cleanup()
                return
            self.state.status = "stopping"
            self.publish()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            deadline = time.time() + timeout
            while group_pids(pgid) and time.time() < deadline:
                self._reap()
                time.sleep(0.2)
            if group_pids(pgid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                while group_pids(pgid):
                    self._reap()
                    time.sleep(0.1)
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
        self._tail_stop.set()
        self._proc = None

    def _cleanup(self) -> None:
        self._stop_tail()
        self._pgid, self._proc = None, None
        self.pid_path.unlink(missing_ok=True)
        shutil.rmtree(engine_tmp_dir(self.run_dir), ignore_errors=True)
        self.state.status, self.state.pid = "stopped", None
        q.upsert_managed_target(
            self.store,
            self.spec.name,
            self.spec.base_url,
            enabled=False,
            health="stopped",
            message="engine stopped",
        )
        self.publish()

    # -- adoption ----------------------------------------------------------------------------

    def adopt_or_clean(self, desired: str) -> bool:
        """After a worker restart: adopt our engine if it still runs as specified, else stop it.

        Returns True when a running engine was adopted; never leaves two engines.
        """
        if not self.pid_path.exists():
            return False
        try:
            info = json.loads(self.pid_path.read_text())
            pgid = int(info["pgid"])
        except (OSError, ValueError, KeyError):
            self.pid_path.unlink(missing_ok=True)
            return False
        if not group_pids(pgid):
            self.pid_path.unlink(missing_ok=True)
            return False
        self._pgid = pgid
        if desired == "running" and info.get("spec_hash") == spec_hash(self.spec):
            self.state = EngineState(
                self.spec.name,
                status="starting",
                pid=pgid,
                started_at=info.get("started_at"),
                command=self.spec.command_line(self.run_dir),
            )
            size = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._start_tail(size)
            self._event(
                "engine_adopted",
                f"engine {self.spec.name} (pid {pgid}) left by a "
                "previous worker is running as specified: adopted, not restarted",
            )
            self._check_health()
            self.publish()
            return True
        why = "it is not wanted" if desired != "running" else "its spec changed"
        self.stop(reason=f"left by a previous worker, stopped because {why}")
        return False

    # -- supervision ---------------------------------------------------------------------------

    def alive(self) -> bool:
        """Whether any process of the engine's group lives."""
        if self._pgid is None:
            return False
        if self._proc is not None and self._proc.poll() is None:
            return True
        return bool(group_pids(self._pgid))

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self.state.last_exit_code = self._proc.returncode

    def poll(self, desired: str) -> None:
        """One supervision step (every couple of seconds): health, crash, restart with backoff."""
        with self._lock:
            status = self.state.status
            if status in ("stopped", "failed", "stopping"):
                if status == "stopped" and desired == "running" and not self.alive():
                    self._try_start()
                return
            if status == "crashed":
                if desired == "running" and time.time() >= self._next_restart:
                    self._try_start()
                return
            self.publish()  # the log tail moves while the engine runs
            main_dead = self._proc is not None and self._proc.poll() is not None
            if main_dead or not self.alive():
                self._crashed("the engine process exited")
                return
            healthy = self._check_health()
            if status == "running" and not healthy:
                self._unhealthy_since = self._unhealthy_since or time.time()
                if time.time() - self._unhealthy_since > UNHEALTHY_RESTART_S:
                    self._crashed(f"/health failed for {UNHEALTHY_RESTART_S:.0f} s")
            elif (
                status == "starting"
                and self.state.started_at
                and time.time() - self.state.started_at > START_TIMEOUT_S
            ):
                self._crashed(f"not healthy {START_TIMEOUT_S:.0f} s after start")

    def _try_start(self) -> None:
        problems = preflight(self.spec)
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
        if self._pgid is not None and group_pids(self._pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._pgid, signal.SIGKILL)  # orphans would hold the port
            while group_pids(self._pgid):
                time.sleep(0.1)
        self._stop_tail()  # every writer is gone: read the log to its end first
        tail = list(self.parser.tail)[-30:]
        now = time.time()
        self._crashes.append(now)
        while self._crashes and now - self._crashes[0] > CRASH_WINDOW_S:
            self._crashes.popleft()
        self.pid_path.unlink(missing_ok=True)
        self._pgid, self._proc = None, None
        self.state.restarts += 1
        q.upsert_managed_target(
            self.store,
            self.spec.name,
            self.spec.base_url,
            enabled=False,
            health="down",
            message=f"engine crashed: {why}",
        )
        if len(self._crashes) >= MAX_CRASHES:
            self.state.status = "failed"
            self.state.message = (
                f"{len(self._crashes)} crashes in {CRASH_WINDOW_S / 60:.0f} "
                "minutes; not restarting until asked. " + why
            )
            severity, kind = "error", "engine_failed"
        else:
            delay = min(5.0 * 2 ** (len(self._crashes) - 1), 300.0)
            self._next_restart = now + delay
            self.state.status = "crashed"
            self.state.message = f"{why} (exit code {code}); restarting in {delay:.0f} s"
            severity, kind = "error", "engine_crashed"
        self._event(
            kind,
            f"engine {self.spec.name}: {self.state.message}",
            severity=severity,
            data={"exit_code": code, "last_lines": tail},
        )
        self.publish()

    def _check_health(self) -> bool:
        try:
            ok = self.client.get(f"{self.spec.base_url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            self._unhealthy_since = None
            if self.state.status == "starting":
                self.state.status, self.state.healthy_at = "running", time.time()
                took = self.state.healthy_at - (self.state.started_at or self.state.healthy_at)
                self.state.facts["time_to_healthy_s"] = round(took, 1)
                self.state.message = self._models_message()
                q.upsert_managed_target(
                    self.store,
                    self.spec.name,
                    self.spec.base_url,
                    enabled=True,
                    health="unknown",
                    message=None,
                )
                self._event(
                    "engine_healthy",
                    f"engine {self.spec.name} healthy after {took:.1f} s; {self.state.message}",
                )
                self.publish()
        return ok

    def _models_message(self) -> str:
        try:
            data = self.client.get(f"{self.spec.base_url}/v1/models", timeout=2.0).json()
            ids = [m.get("id") for m in data.get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError):
            return "serving (the model list did not answer)"
        return f"serving {', '.join(str(i) for i in ids)}"

    def last_error(self, lines: int = 8) -> str:
        """The last meaningful log lines, joined for a one-line message."""
        tail = [ln for ln in list(self.parser.tail)[-80:] if ln.strip()]
        errors = [ln for ln in tail if "Error" in ln or "error" in ln]
        return " | ".join((errors or tail)[-lines:])[:1500] or "(no output)"

    # -- logs ----------------------------------------------------------------------------------

    def _stop_tail(self) -> None:
        """Stop following the log after reading what is left in it."""
        self._tail_stop.set()
        if self._tail is not None and self._tail is not threading.current_thread():
            self._tail.join(timeout=5)

    def _start_tail(self, offset: int) -> None:
        self._stop_tail()
        self._tail_stop = threading.Event()
        self._tail = threading.Thread(
            target=self._follow,
            args=(offset, self._tail_stop),
            name=f"engine-log-{self.spec.name}",
            daemon=True,
        )
        self._tail.start()

    def _follow(self, offset: int, stop: threading.Event) -> None:
        buf = b""
        while True:
            stopping = stop.is_set()  # checked before the read, so a stop drains the file
            try:
                size = self.log_path.stat().st_size
                if size < offset:  # truncated by rotation
                    offset = 0
                with open(self.log_path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                offset += len(chunk)
            except OSError:
                chunk = b""
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                for fact in self.parser.feed(raw.decode("utf-8", "replace")):
                    self._record_fact(fact)
            if offset > LOG_MAX_BYTES:
                offset = self._rotate(offset)
            if stopping and not chunk:
                return
            if not chunk:
                stop.wait(0.25)

    def _rotate(self, offset: int) -> int:
        for i in range(LOG_BACKUPS - 1, 0, -1):
            older = self.log_path.with_suffix(f".log.{i}")
            if older.exists():
                older.replace(self.log_path.with_suffix(f".log.{i + 1}"))
        shutil.copyfile(self.log_path, self.log_path.with_suffix(".log.1"))
        with open(self.log_path, "r+b") as f:
            f.truncate(0)
        return 0

    def _record_fact(self, fact: LogFact) -> None:
        if fact.kind in (
            "kv_capacity",
            "max_concurrency",
            "kv_memory",
            "model_memory",
            "v0_blocks",
            "v0_memory",
        ):
            self.state.facts[fact.kind] = fact.values
            self.publish()
        self._event(
            f"engine_{fact.kind}",
            fact.message,
            severity=fact.severity,
            data={k: v for k, v in fact.values.items() if k != "lines"}
            | ({"lines": fact.values["lines"]} if "lines" in fact.values else {}),
        )

    def read_log_tail(self, lines: int = 200) -> list[str]:
        """The last lines of the engine's log file (for the page and `kvscope engine logs`)."""
        return tail_file(self.log_path, lines)

    # -- store ---------------------------------------------------------------------------------

    def _event(
        self, kind: str, message: str, severity: str = "info", data: dict[str, Any] | None = None
    ) -> None:
        target_id = None
        with contextlib.suppress(Exception):
            target_id = q.get_target(self.store, self.spec.name).id
        try:
            q.record_event(
                self.store, kind, message, target_id=target_id, severity=severity, data=data
            )
        except Exception:  # an event lost must never take the engine down with it
            log.exception("could not record event %s", kind)

    def publish(self) -> None:
        """Write the state, and the log tail when it moved, for the console."""
        with contextlib.suppress(Exception):
            q.put_state(self.store, f"engine:{self.spec.name}", asdict(self.state))
            tail = list(self.parser.tail)[-LOG_TAIL_LINES:]
            if tail != self._published_tail:
                q.put_state(self.store, f"engine_log:{self.spec.name}", {"lines": tail})
                self._published_tail = tail


def tail_file(path: Path, lines: int = 200) -> list[str]:
    """Last `lines` lines of a text file, reading at most 1 MiB from its end."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - (1 << 20)))
            data = f.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-lines:]
