"""Ingest and reads on a real SQLite file: change suppression, targets, events, runs."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from planner.errors import InvalidInput, NotFound
from storage import queries as q
from storage.ingest import Point, SampleWriter


def _target(store: Engine, name: str = "t1", url: str = "http://127.0.0.1:8000") -> int:
    return q.add_target(store, q.parse_target({"name": name, "base_url": url})).id


def test_unchanged_values_are_stored_again_only_at_the_heartbeat(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store, heartbeat_s=30)
    p = [Point("kv_usage", {"engine": "0"}, 0.5)]
    written = [w.write(tid, p, ts) for ts in (1000.0, 1002.0, 1004.0, 1031.0, 1033.0)]
    assert written == [1, 0, 0, 1, 0]
    assert w.write(tid, [Point("kv_usage", {"engine": "0"}, 0.6)], 1035.0) == 1
    frame = q.series_points(store, tid, ["kv_usage"], 0, 2000)
    assert frame["ts"].tolist() == [1000.0, 1031.0, 1035.0]
    assert frame["value"].tolist() == [0.5, 0.5, 0.6]


def test_label_sets_are_separate_series_and_nan_is_dropped(store: Engine) -> None:
    tid = _target(store)
    w = SampleWriter(store)
    w.write(
        tid,
        [
            Point("waiting", {"engine": "0"}, 1.0),
            Point("waiting", {"engine": "1"}, 2.0),
            Point("running", {}, float("nan")),
        ],
        10.0,
    )
    frame = q.series_points(store, tid, ["waiting", "running"], 0, 20)
    assert sorted(frame["labels_key"]) == ['{"engine":"0"}', '{"engine":"1"}']


def test_a_new_writer_reuses_existing_series(store: Engine) -> None:
    tid = _target(store)
    SampleWriter(store).write(tid, [Point("running", {}, 1.0)], 10.0)
    SampleWriter(store).write(tid, [Point("running", {}, 2.0)], 12.0)
    frame = q.series_points(store, tid, ["running"], 0, 20)
    assert frame["series_id"].nunique() == 1 and frame["value"].tolist() == [1.0, 2.0]


def test_target_validation_gives_specific_messages(store: Engine) -> None:
    with pytest.raises(InvalidInput, match="must start with http:// or https://"):
        q.parse_target({"name": "a", "base_url": "ftp://host:21"})
    with pytest.raises(InvalidInput, match="has no host name"):
        q.parse_target({"name": "a", "base_url": "http://"})
    with pytest.raises(InvalidInput, match="invalid port"):
        q.parse_target({"name": "a", "base_url": "http://host:99999"})
    with pytest.raises(InvalidInput, match="name must be"):
        q.parse_target({"name": "bad name!", "base_url": "http://host"})
    with pytest.raises(InvalidInput, match="environment variable name"):
        q.parse_target({"name": "a", "base_url": "http://host", "token_env": "not ok"})
    assert (
        q.parse_target({"name": "a", "base_url": " http://h:8000/metrics/ "}).base_url
        == "http://h:8000"
    )


def test_duplicate_and_missing_targets(store: Engine) -> None:
    _target(store, "a")
    with pytest.raises(InvalidInput, match="already exists"):
        _target(store, "a")
    with pytest.raises(NotFound, match="no target named 'zzz'; known targets: a"):
        q.get_target(store, "zzz")


def test_a_target_named_like_another_ones_id(store: Engine) -> None:
    first = _target(store, "x")
    named_1 = _target(store, str(first))  # a target whose name is the first one's id
    assert q.get_target(store, first).name == "x"  # an int is an id
    assert q.get_target(store, str(first)).id == named_1  # a name wins over an id
    assert q.get_target(store, str(named_1)).id == named_1  # no such name: digits are an id
    with pytest.raises(NotFound, match="no target with id 999; known targets"):
        q.get_target(store, 999)


def test_removing_a_target_removes_its_history_only(store: Engine) -> None:
    a, b = _target(store, "a"), _target(store, "b")
    w = SampleWriter(store)
    w.write(a, [Point("running", {}, 1.0)], 10.0)
    w.write(b, [Point("running", {}, 2.0)], 10.0)
    q.remove_target(store, "a")
    assert q.count_samples(store) == 1
    assert q.count_samples(store, b) == 1


def test_events_window_and_filter(store: Engine) -> None:
    tid = _target(store)
    q.record_event(store, "target_down", "down", target_id=tid, ts=100.0, severity="warning")
    q.record_event(store, "target_up", "up", target_id=tid, ts=200.0)
    q.record_event(store, "other", "x", ts=300.0)
    assert [e.kind for e in q.events(store, 150, 400)] == ["other", "target_up"]
    assert [e.kind for e in q.events(store, 0, 400, target_id=tid)] == ["target_up", "target_down"]


def test_runs_are_claimed_once_and_unknown_kinds_fail_with_a_reason(store: Engine) -> None:
    r1 = q.request_run(store, "check_target")
    r2 = q.request_run(store, "frobnicate")
    assert q.fail_unknown_runs(store, ["check_target"]) == 1
    assert "no handler for 'frobnicate'" in (q.get_run(store, r2.id).error or "")
    claimed = q.claim_next_run(store, ["check_target"])
    assert claimed is not None and claimed.id == r1.id and claimed.status == "running"
    assert q.claim_next_run(store, ["check_target"]) is None
    assert q.interrupt_running(store, "worker died") == 1
    assert q.get_run(store, r1.id).status == "interrupted"


def test_cancel_queued_and_running(store: Engine) -> None:
    queued = q.request_run(store, "x")
    q.cancel_run(store, queued.id)
    assert q.get_run(store, queued.id).status == "cancelled"
    running = q.request_run(store, "y")
    q.claim_next_run(store, ["y"])
    q.cancel_run(store, running.id)
    assert q.get_run(store, running.id).cancel_requested
    with pytest.raises(NotFound):
        q.cancel_run(store, 999)
