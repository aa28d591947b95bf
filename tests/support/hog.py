"""Spinning processes that keep cores busy, as a stranger's load on a shared machine (the
suite's `KVSCOPE_TEST_CPU_HOG`, a benchmark's slow spell). Each runs in a session of its
own, as a stranger's load does: where the kernel schedules sessions as groups, one in ours
would count as our own. Stopped by PID."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


def spin(count: int) -> list[subprocess.Popen[bytes]]:
    """`count` processes spinning on the CPU until `stop`."""
    hog = [sys.executable, "-c", "while True: pass"]
    return [subprocess.Popen(hog, start_new_session=True) for _ in range(count)]


def stop(hogs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Kill each of `hogs` by its PID and reap it."""
    for hog in hogs:
        hog.kill()
        hog.wait(timeout=10)


@contextmanager
def spinning(count: int) -> Iterator[None]:
    """`count` processes spinning on the CPU while inside."""
    hogs = spin(count)
    try:
        yield
    finally:
        stop(hogs)
