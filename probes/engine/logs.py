"""Following an engine's log file: a thread reads what the engine appends, turns each line
into facts through `LogParser`, and rotates the file when it grows (copy, then truncate:
safe while the engine writes with O_APPEND). A failure (a full disk during rotation, a
fact that cannot be recorded) is handed to `on_error` and the follow goes on: the thread
never dies silently. `tail_file` reads a log's last lines.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from probes.vllm.logparse import LogFact, LogParser

LOG_MAX_BYTES = 10 * 1024 * 1024
LOG_BACKUPS = 3
READ_BYTES = 1 << 20  # per read: a burst of output is taken a megabyte at a time
ROTATE_RETRY_S = 60.0


class LogFollower:
    """Follows one log file in a daemon thread, handing each parsed fact to `on_fact`.

    The parser outlives each follow, so its tail spans restarts of the engine.
    """

    def __init__(
        self,
        path: Path,
        on_fact: Callable[[LogFact], None],
        name: str = "engine-log",
        on_error: Callable[[str], None] = lambda message: None,
        max_bytes: int = LOG_MAX_BYTES,
        backups: int = LOG_BACKUPS,
    ) -> None:
        self.path = path
        self.on_fact = on_fact
        self.on_error = on_error
        self.name = name
        self.max_bytes = max_bytes
        self.backups = backups
        self.parser = LogParser()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, offset: int | None = None) -> None:
        """Follow from `offset` (by default the file's current end), ending a previous follow."""
        self.stop()
        if offset is None:
            offset = self.path.stat().st_size if self.path.exists() else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._follow, args=(offset, self._stop), name=self.name, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop following after reading what is left in the file."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def abandon(self) -> None:
        """Stop following without waiting for the thread."""
        self._stop.set()

    def last_lines(self, n: int) -> list[str]:
        """The last `n` lines read (across follows)."""
        return list(self.parser.tail)[-n:]

    def _follow(self, offset: int, stop: threading.Event) -> None:
        buf = b""
        rotate_after = 0.0  # monotonic: after a failed rotation, when to try again
        last_error = ""
        while True:
            stopping = stop.is_set()  # checked before the read, so a stop drains the file
            try:
                size = self.path.stat().st_size
                if size < offset:  # truncated by rotation
                    offset = 0
                with open(self.path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read(READ_BYTES)
                offset += len(chunk)
            except OSError:
                chunk = b""  # not there yet, or gone for a moment: read again soon
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                for fact in self.parser.feed(raw.decode("utf-8", "replace")):
                    try:
                        self.on_fact(fact)
                    except Exception as err:  # a fact not recorded must not end the follow
                        last_error = self._report(err, last_error)
            if offset > self.max_bytes and time.monotonic() >= rotate_after:
                try:
                    rotate(self.path, self.backups)
                    offset = 0
                except OSError as err:  # a full disk, say: try again in a while
                    last_error = self._report(err, last_error)
                    rotate_after = time.monotonic() + ROTATE_RETRY_S
            if stopping and not chunk:
                return
            if not chunk:
                stop.wait(0.25)

    def _report(self, err: Exception, last: str) -> str:
        """Hand a failure on once (not once a pass); return it as the last one seen."""
        message = f"log follower of {self.path}: {type(err).__name__}: {err}"
        if message != last:
            self.on_error(message)
        return message


def rotate(path: Path, backups: int = LOG_BACKUPS) -> None:
    """Shift `.log.N` backups up one (dropping the oldest), copy the log to `.log.1`, empty it."""
    for i in range(backups - 1, 0, -1):
        older = path.with_suffix(f".log.{i}")
        if older.exists():
            older.replace(path.with_suffix(f".log.{i + 1}"))
    shutil.copyfile(path, path.with_suffix(".log.1"))
    with open(path, "r+b") as f:
        f.truncate(0)


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
