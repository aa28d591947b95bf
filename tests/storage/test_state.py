"""Published facts: a fact replaced only while it is still the one its writer read."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine

from storage import queries as q


def test_a_fact_is_replaced_only_while_it_is_the_one_read(store: Engine) -> None:
    q.put_state(store, "calibration:cpu", {"scale": 1.0})
    read = q.get_state(store, "calibration:cpu")
    assert read is not None and read.version == 1
    assert abs(read.updated_at - time.time()) < 60  # (when: the heartbeat's age reads it)
    q.put_state(store, "calibration:cpu", {"scale": 1.3})  # another writer came between
    assert not q.replace_state(store, "calibration:cpu", {"scale": 1.0, "checks": 1}, read.version)
    again = q.get_state(store, "calibration:cpu")
    assert again is not None and again[0] == {"scale": 1.3}  # theirs kept
    assert q.replace_state(store, "calibration:cpu", {"scale": 1.3, "checks": 1}, again.version)
    assert q.get_state(store, "calibration:cpu")[0] == {"scale": 1.3, "checks": 1}  # type: ignore[index]
    assert not q.replace_state(store, "calibration:none", {}, again.version)  # nothing to replace


def test_two_writes_in_one_clock_tick_are_still_told_apart(
    store: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coarse clock (or two writers within its tick) gives two writes the same time:
    the fact read is the one replaced, not merely one written at that time."""
    monkeypatch.setattr(time, "time", lambda: 1_000_000.0)
    q.put_state(store, "calibration:cpu", {"scale": 1.0})
    read = q.get_state(store, "calibration:cpu")
    assert read is not None
    q.put_state(store, "calibration:cpu", {"scale": 1.3})  # another writer, the same tick
    assert not q.replace_state(store, "calibration:cpu", {"scale": 1.0, "checks": 1}, read.version)
    assert q.get_state(store, "calibration:cpu")[0] == {"scale": 1.3}  # type: ignore[index]
