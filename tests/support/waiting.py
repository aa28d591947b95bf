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
    return wait_ended(store, q.request_run(store, kind, dict(params), target_id=tid).id, timeout)


def ended(run: RunRow) -> bool:
    """Whether the worker has ended a work row (done, failed or cancelled)."""
    return run.status not in ("queued", "running")


def wait_ended(store: Engine, run_id: int, timeout: float) -> RunRow:
    """Wait until the worker has ended the work row `run_id`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        run = q.get_run(store, run_id)
        if ended(run):
            return run
        time.sleep(0.5)
    raise AssertionError(f"{q.get_run(store, run_id).kind} did not finish in {timeout} s")
