"""One worker per store, as processes: a second `kvscope worker` exits at once naming the
holder, and after the first is SIGKILLed a new one takes over within the lease expiry."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

from storage import queries as q
from storage.db import open_store
from tests.support.cli import kvscope, spawn

LEASE_S = 8.0


def _worker(data: Path) -> subprocess.Popen[str]:
    lease = {"KVSCOPE_WORKER_LEASE_S": str(LEASE_S)}
    return spawn("worker", env_dir=data, environ=lease, stderr=subprocess.PIPE)


def _start_s(data: Path) -> float:
    """How long the CLI takes to start and parse a command here, now: on a busy machine
    the interpreter's start alone takes seconds, and both bounds below include one."""
    t0 = time.monotonic()
    assert kvscope("worker", "--help", env_dir=data).returncode == 0
    return time.monotonic() - t0


def _holds(data: Path, pid: int, timeout: float) -> bool:
    """Whether process `pid` holds the store's worker lease within `timeout`."""
    store = open_store(f"sqlite:///{data / 'kvscope.db'}")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        lease = q.get_lease(store, "worker")
        if lease is not None and lease.pid == pid and lease.expires_at > time.time():
            return True
        time.sleep(0.2)
    return False


def test_a_second_worker_refuses_and_a_new_one_takes_over_after_a_kill(tmp_path: Path) -> None:
    first = _worker(tmp_path)
    others: list[subprocess.Popen[str]] = []
    try:
        assert _holds(tmp_path, first.pid, 60)
        start_s = _start_s(tmp_path)
        second = _worker(tmp_path)
        others.append(second)
        t0 = time.monotonic()
        _, err = second.communicate(timeout=30)
        took = time.monotonic() - t0
        assert second.returncode == 2, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: worker lease held by pid ")
        assert f"pid {first.pid} on {socket.gethostname()} since " in last
        assert took < 5.0 + start_s + 2.0, (took, start_s)  # it waits 5 s, not forever

        start_s = _start_s(tmp_path)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        killed_at = time.monotonic()
        third = _worker(tmp_path)
        others.append(third)
        assert _holds(tmp_path, third.pid, 60)
        assert time.monotonic() - killed_at < LEASE_S + start_s + 3.0
        assert third.poll() is None  # running, not refused
    finally:
        for p in [first, *others]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=60)
