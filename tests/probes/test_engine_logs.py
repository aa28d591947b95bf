"""The engine's log follower: facts from appended lines, a drained file on stop, rotation."""

from __future__ import annotations

from pathlib import Path

import pytest

import probes.engine.logs as logs
from probes.engine.logs import LogFollower, tail_file
from probes.vllm.logparse import LogFact
from tests.support.waiting import wait_until

CAPACITY = "INFO 01-01 00:00:01 [kv_cache_utils.py:1] CPU KV cache size: 16,384 tokens\n"


def test_follows_from_the_offset_and_drains_on_stop(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("before the offset: KV cache size: 1 tokens\n")
    facts: list[LogFact] = []
    follower = LogFollower(log, facts.append)
    follower.start(log.stat().st_size)
    with open(log, "a") as f:
        f.write(CAPACITY)
    wait_until(lambda: len(facts) == 1)
    assert facts[0].kind == "kv_capacity" and facts[0].values["tokens"] == 16384.0
    with open(log, "a") as f:
        f.write("Traceback (most recent call last):\n  File 'x', line 1\nRuntimeError: boom\n")
    follower.stop()  # what was written before the stop is read, not lost
    assert [f.kind for f in facts] == ["kv_capacity", "traceback"]
    assert follower.last_lines(1) == ["RuntimeError: boom"]


def test_from_the_end_by_default_and_rotates_when_large(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(CAPACITY)
    facts: list[LogFact] = []
    follower = LogFollower(log, facts.append, max_bytes=200, backups=2)
    follower.start()
    with open(log, "a") as f:
        for i in range(10):
            f.write(f"line {i} " + "x" * 40 + "\n")
    wait_until(lambda: log.with_suffix(".log.1").exists() and log.stat().st_size == 0)
    with open(log, "a") as f:
        f.write(CAPACITY)
    wait_until(lambda: len(facts) == 1)  # read from the start of the emptied file
    follower.stop()
    assert "line 9" in log.with_suffix(".log.1").read_text()
    assert tail_file(log) == [CAPACITY.rstrip("\n")]


def test_tail_file_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert tail_file(tmp_path / "none.log") == []


def test_a_failing_rotation_or_fact_is_reported_and_the_follow_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "engine.log"
    log.write_text("")
    facts: list[LogFact] = []
    errors: list[str] = []

    def record(fact: LogFact) -> None:
        if fact.values.get("tokens") == 1.0:
            raise RuntimeError("the store is locked")  # a fact that cannot be recorded
        facts.append(fact)

    def no_room(path: Path, backups: int = 3) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(logs, "rotate", no_room)  # the disk is full for this test
    follower = LogFollower(log, record, on_error=errors.append, max_bytes=200)
    follower.start(0)
    try:
        with open(log, "a") as f:
            f.write("INFO CPU KV cache size: 1 tokens\n" + "x" * 300 + "\n")
        wait_until(lambda: len(errors) >= 2)
        with open(log, "a") as f:
            f.write(CAPACITY)  # still followed after both failures
        wait_until(lambda: len(facts) == 1)
    finally:
        follower.stop()
    assert "the store is locked" in errors[0] and "No space left on device" in errors[1]
    assert len(errors) == 2  # each failure once, not once a pass
    assert facts[0].values["tokens"] == 16384.0
