"""An engine's processes: launched in a process group of their own with output appended to a
log file (never a pipe, so the engine outlives a worker crash), stopped by SIGTERM then
SIGKILL to the whole group, and named in a pid file so the next worker can adopt them.
Knows nothing of the store or of vLLM's HTTP API.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from planner.errors import EngineError
from probes.engine.allowlists import TOKEN_PREFIX
from probes.engine.spec import EngineSpec, engine_tmp_dir

STOP_TIMEOUT_S = 30.0
KILL_TIMEOUT_S = 10.0  # after SIGKILL; a process stuck in the kernel may outlast it
# How much lower than the worker a CPU engine runs. Its busy threads share the cores with
# the console, the scrapers and the probes' load generator: at equal priority, on 2 cores,
# they kept a waking sender off the CPU for up to a second (sends 0.3-3 s late at 10-15
# req/s, so the capacity probe's verdicts were the sender's, and a process sleeping 10 ms
# overslept by up to 1 s). Niced, the engine yields to them whenever they wake.
CPU_ENGINE_NICE = 10


def identity(pid: int) -> tuple[str, int, str] | None:
    """(boot id, start time in clock ticks, command line) of a live process, or None.

    A pid is reused once its process is gone; with the boot and the start time it names one
    process for good, so a signal never reaches a stranger that got the number.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    # Field 22 of stat (the 20th after the command) is the start time since boot.
    return boot, int(fields[19]), cmdline.replace(b"\0", b" ").decode("utf-8", "replace").strip()


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


def lower_priority(pgid: int, by: int) -> None:
    """Run every thread of the group `by` nice levels below this process (threads and
    children made later inherit it). Best effort: a system that refuses keeps the engine
    where it was."""
    nice = min(os.getpriority(os.PRIO_PROCESS, 0) + by, 19)
    for _ in range(2):  # the second pass catches a child forked while the first ran
        for pid in group_pids(pgid):
            for task in Path(f"/proc/{pid}/task").glob("*"):
                with contextlib.suppress(OSError, ValueError):
                    os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def spec_hash(spec: EngineSpec) -> str:
    """Identity of what runs: a changed spec means the running engine is not this one."""
    return hashlib.sha256(json.dumps(spec.model_dump(), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Launched:
    """What a launch started: the group's leader, its argv, when, and where its log begins."""

    pid: int
    argv: list[str]
    started_at: float
    log_offset: int


@dataclass(frozen=True)
class LeftOver:
    """A process group a previous worker's pid file names, still running."""

    pgid: int
    started_at: float | None
    spec_hash: str | None

    def runs(self, spec: EngineSpec) -> bool:
        """Whether it was started from exactly this spec."""
        return self.spec_hash == spec_hash(spec)


class EngineProcess:
    """One engine's process group, with its log file and pid file under `run_dir`."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.log_path = run_dir / "engine.log"
        self.pid_path = run_dir / "engine.pid"
        self.proc: subprocess.Popen[bytes] | None = None  # None for an adopted group
        self.pgid: int | None = None
        self.refused: str | None = None  # why a left-over group was not taken over

    def launch(self, spec: EngineSpec) -> Launched:
        """Start `spec` in a process group of its own, output appended to the log; write
        the pid file. A CPU engine runs `CPU_ENGINE_NICE` levels below the worker.

        The group stays in the worker's session: where the kernel schedules each session as
        one group (`sched_autogroup`), nice weighs only within a session, so a session of
        the engine's own would not yield to the worker (and, niced, would yield to every
        other session as well).

        The engine gets the secrets its spec names, read now, as variables (never argv, so
        never in the log line below, the pid file or `ps`), and none of the worker's other
        `KVSCOPE_TOKEN_*` variables."""
        secrets = spec.secret_environment(os.environ)
        tmp = engine_tmp_dir(self.run_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(TOKEN_PREFIX)}
        env = {**inherited, **spec.environment(self.run_dir), **secrets}
        argv = spec.argv()
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            out.write(
                f"\n===== kvscope: starting {spec.name} at "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}\n".encode()
            )
            out.flush()
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.run_dir,
                process_group=0,
            )
        self.pgid = self.proc.pid
        if spec.device == "cpu":
            lower_priority(self.pgid, CPU_ENGINE_NICE)
        now = time.time()
        # Popen returns after the exec: the identity read now is the engine's own.
        ident = identity(self.proc.pid)
        self.pid_path.write_text(
            json.dumps(
                {
                    "pid": self.proc.pid,
                    "pgid": self.pgid,
                    "started_at": now,
                    "spec_hash": spec_hash(spec),
                    "argv": argv,
                    "identity": list(ident) if ident else None,
                }
            )
        )
        return Launched(self.proc.pid, argv, now, offset)

    def claim_left_over(self) -> LeftOver | None:
        """Take over the group the pid file names if it still runs and is the very process
        that was launched (same boot, start time and command line); otherwise remove the pid
        file and say why in `refused` (a reused pid is never signalled)."""
        self.refused = None
        if not self.pid_path.exists():
            return None
        try:
            info = json.loads(self.pid_path.read_text())
            pgid = int(info["pgid"])
        except (OSError, ValueError, KeyError):
            self.pid_path.unlink(missing_ok=True)
            return None
        if not group_pids(pgid):
            self.pid_path.unlink(missing_ok=True)
            return None
        recorded, now = info.get("identity"), identity(pgid)
        # Boot and start time name the process; the command line must still hold what was
        # launched from "serve" on (an interpreter a shebang adds in front may differ).
        argv = [str(a) for a in info.get("argv") or []]
        tail = " ".join(argv[argv.index("serve") :]) if "serve" in argv else " ".join(argv)
        if (
            recorded is None
            or now is None
            or list(now[:2]) != list(recorded[:2])
            or tail not in now[2]
        ):
            self.pid_path.unlink(missing_ok=True)
            self.refused = (
                f"the pid file names process {pgid}, which is not the engine it recorded "
                "(another start time or command line): left alone, not adopted or stopped"
            )
            return None
        self.pgid = pgid
        return LeftOver(pgid, info.get("started_at"), info.get("spec_hash"))

    def alive(self) -> bool:
        """Whether any process of the group lives (the launched leader counts until reaped)."""
        if self.pgid is None:
            return False
        if self.proc is not None and self.proc.poll() is None:
            return True
        return bool(group_pids(self.pgid))

    def group_alive(self) -> bool:
        """Whether a non-zombie process of the group lives."""
        return self.pgid is not None and bool(group_pids(self.pgid))

    def leader_exited(self) -> bool:
        """Whether the process this worker launched has exited (an adopted group has none)."""
        return self.proc is not None and self.proc.poll() is not None

    def exit_code(self) -> int | None:
        """The launched leader's exit code once it has exited (reaping it), else None."""
        return None if self.proc is None else self.proc.poll()

    def terminate(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """SIGTERM the group, SIGKILL what is left after `timeout`; True when it had to kill."""
        pgid = self.pgid
        if pgid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while group_pids(pgid) and time.monotonic() < deadline:
            self.exit_code()
            time.sleep(0.2)
        if not group_pids(pgid):
            return False
        self.kill()
        return True

    def kill(self, timeout: float = KILL_TIMEOUT_S) -> None:
        """SIGKILL the whole group and wait (at most `timeout`) until none of it is left:
        orphans would hold the port. One that outlasts it is stuck in the kernel."""
        pgid = self.pgid
        if pgid is None or not group_pids(pgid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while group_pids(pgid) and time.monotonic() < deadline:
            self.exit_code()
            time.sleep(0.1)
        if group_pids(pgid):
            raise EngineError(
                f"process group {pgid} survived SIGKILL for {timeout:.0f} s (stuck in the "
                "kernel?); its port may stay taken until it goes"
            )

    def forget(self) -> None:
        """Drop the handles and the pid file: the group is gone."""
        self.pgid, self.proc = None, None
        self.pid_path.unlink(missing_ok=True)

    def detach(self) -> None:
        """Let go of the launched child, leaving its group running (as a dead worker would)."""
        self.proc = None

    def wipe_tmp(self) -> None:
        """Remove the engine's temp folder (vLLM's sockets and scratch files)."""
        shutil.rmtree(engine_tmp_dir(self.run_dir), ignore_errors=True)
