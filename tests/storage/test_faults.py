"""Faults of the store: a writer that holds the lock, and a worker killed mid-write."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from planner.errors import DatabaseLocked
from storage import queries as q
from storage.db import open_store
from storage.ingest import Point, SampleWriter


def _hold_lock(path: Path, seconds: float, started: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")  # the write lock, as another writer mid-transaction
    started.set()
    time.sleep(seconds)
    conn.execute("COMMIT")
    conn.close()


def test_a_briefly_locked_database_is_waited_for(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'k.db'}", busy_timeout_ms=3000)
    tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"})).id
    started = threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(tmp_path / "k.db", 0.5, started))
    holder.start()
    started.wait()
    assert SampleWriter(store).write(tid, [Point("running", {}, 1.0)], 1.0) == 1
    holder.join()


def test_a_lock_held_too_long_is_a_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'k.db'}", busy_timeout_ms=200)
    tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"})).id
    w = SampleWriter(store, heartbeat_s=60)
    w.write(tid, [Point("running", {}, 1.0)], 1.0)
    started = threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(tmp_path / "k.db", 1.5, started))
    holder.start()
    started.wait()
    with pytest.raises(DatabaseLocked, match=r"locked by another process .* 200 ms busy timeout"):
        w.write(tid, [Point("running", {}, 2.0), Point("waiting", {}, 5.0)], 2.0)
    holder.join()
    # The failed write did not poison the writer: the next scrape stores both values.
    assert w.write(tid, [Point("running", {}, 2.0), Point("waiting", {}, 5.0)], 3.0) == 2
    frame = q.series_points(store, tid, ["running", "waiting"], 0, 10)
    assert sorted(zip(frame["metric"], frame["value"], strict=True)) == [
        ("running", 1.0),
        ("running", 2.0),
        ("waiting", 5.0),
    ]


WRITER = """
import sys, time
from storage.db import open_store
from storage import queries as q
from storage.ingest import Point, SampleWriter
store = open_store(sys.argv[1])
tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"})).id
w = SampleWriter(store, heartbeat_s=0)
ts = 0.0
while True:
    ts += 1.0
    w.write(tid, [Point(f"m{i}", {}, ts) for i in range(200)], ts)
    print(int(ts), flush=True)
"""


def test_sigkill_mid_write_keeps_every_committed_sample(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, url],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout is not None
    committed = 0
    deadline = time.time() + 30
    while committed < 20 and time.time() < deadline:
        committed = int(proc.stdout.readline() or committed)
    proc.kill()  # SIGKILL, most likely inside a transaction
    proc.wait()
    assert committed >= 20
    conn = sqlite3.connect(tmp_path / "k.db")
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
    store = open_store(url)
    # Every scrape the writer reported as committed is there in full (200 samples each).
    assert q.count_samples(store) >= committed * 200
    assert q.count_samples(store) % 200 == 0
