"""Small waits the tests share: a free loopback port, and polling until something holds."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


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
