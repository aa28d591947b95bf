"""Small waits the tests share: a free loopback port, polling until something holds, and a
work row queued and waited for."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from sqlalchemy import Engine

from storage import queries as q
from storage.schemas import RunRow


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll `cond` every 0.1 s; AssertionError naming `what` if it does not hold in time."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not met in {timeout:g} s")


def queue_and_wait(
    store: Engine, kind: str, params: dict[str, object], target: str | None, timeout: float
) -> RunRow:
    """Queue a work row (against a target, by name) and wait until the worker has ended it."""
    tid = q.get_target(store, target).id if target else None
    run = q.request_run(store, kind, dict(params), target_id=tid)
    deadline = time.time() + timeout
    while time.time() < deadline:
        run = q.get_run(store, run.id)
        if run.status not in ("queued", "running"):
            return run
        time.sleep(0.5)
    raise AssertionError(f"{kind} did not finish in {timeout} s")
