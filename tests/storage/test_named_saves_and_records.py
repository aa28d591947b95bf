"""The user's named things are saved once and overwritten after; request records carry the
same TTFT and TPOT whichever query reads them."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from sqlalchemy import Engine, func, select

from storage import queries as q
from storage.db import session_factory, transaction
from storage.tables import CostFrame, EngineSpecRow, RequestRecord


def test_each_named_save_creates_then_overwrites(store: Engine) -> None:
    q.save_engine_spec(store, "e", {"model": "a"})
    q.save_profile(store, "p", {"rate": 1})
    q.save_slo(store, "s", {"ttft_s": 1.0}, None)
    q.save_cost_frame(store, "c", {"gpu": "a"}, [1])
    with session_factory(store)() as s:
        first_spec = s.scalars(select(EngineSpecRow.updated_at)).one()
        first_frame = s.scalars(select(CostFrame.updated_at)).one()
    tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"})).id

    q.save_engine_spec(store, "e", {"model": "b"})
    q.save_profile(store, "p", {"rate": 2})
    q.save_slo(store, "s", {"ttft_s": 2.0}, tid)
    q.save_cost_frame(store, "c", {"gpu": "b"}, [2, 3])

    assert q.list_engine_specs(store) == [("e", {"model": "b"}, "stopped")]
    assert q.stored_profiles(store) == {"p": {"rate": 2}}
    assert [(name, t, spec) for _, name, t, spec in q.list_slos(store)] == [
        ("s", tid, {"ttft_s": 2.0})
    ]
    assert q.cost_frames(store) == {"c": ({"gpu": "b"}, [2, 3])}
    with session_factory(store)() as s:
        assert s.scalars(select(EngineSpecRow.updated_at)).one() >= first_spec
        assert s.scalars(select(CostFrame.updated_at)).one() >= first_frame
        assert s.scalar(select(func.count()).select_from(EngineSpecRow)) == 1


def test_latency_columns_count_from_the_scheduled_send() -> None:
    frame = pd.DataFrame(
        {
            "scheduled_ts": [10.0, 10.0, 10.0],
            "first_token_ts": [10.5, 11.0, None],
            "end_ts": [12.5, 11.0, None],
            "output_tokens": [5, 1, None],
        }
    )
    q.add_latency_columns(frame)
    assert frame["ttft_s"].tolist()[:2] == [0.5, 1.0]
    assert frame["tpot_s"].iloc[0] == pytest.approx(0.5)  # 2 s over the 4 tokens after the first
    assert math.isnan(frame["tpot_s"].iloc[1])  # one token: no time per output token
    assert math.isnan(frame["ttft_s"].iloc[2]) and math.isnan(frame["tpot_s"].iloc[2])


def test_run_and_target_records_agree_on_latencies(store: Engine) -> None:
    tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"})).id
    run = q.request_run(store, "latency", {}, target_id=tid)
    with transaction(store) as s:
        for seq, (first, end, tokens) in enumerate([(100.2, 101.2, 11), (100.4, 100.4, 1)]):
            s.add(
                RequestRecord(
                    run_id=run.id,
                    seq=seq,
                    scheduled_ts=100.0,
                    sent_ts=100.01,
                    first_token_ts=first,
                    end_ts=end,
                    output_tokens=tokens,
                    status="ok",
                )
            )
    by_run = q.run_records(store, run.id)
    by_target = q.target_records(store, tid, 0, 200)
    for col in ("ttft_s", "tpot_s"):
        pd.testing.assert_series_equal(by_run[col], by_target[col])
    assert by_run["ttft_s"].tolist() == pytest.approx([0.2, 0.4])
    assert by_run["tpot_s"].iloc[0] == pytest.approx(0.1)


def test_replayed_requests_and_their_latencies_line_up(store: Engine) -> None:
    """A replay (by send time) and the measured latencies it is tuned against are the same
    requests in the same order; unanswered ones are in neither."""
    tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"})).id
    run = q.request_run(store, "latency", {}, target_id=tid)
    # (send time, TTFT, E2E, status), in the order sent
    sent = [(3.0, 0.5, 2.0, "ok"), (1.0, 0.1, 1.0, "ok"), (2.0, 0.2, 1.5, "error")]
    sent.append((1.0, 0.3, 1.2, "ok"))
    with transaction(store) as s:
        for seq, (at, ttft, e2e, status) in enumerate(sent):
            s.add(
                RequestRecord(
                    run_id=run.id,
                    seq=seq,
                    scheduled_ts=at,
                    sent_ts=at,
                    first_token_ts=at + ttft,
                    end_ts=at + e2e,
                    prompt_tokens=10 + seq,
                    output_tokens=4,
                    status=status,
                )
            )
    rows = q.replayable(store, run.id)
    assert [(t, p) for t, p, _, _ in rows] == [(1.0, 11), (1.0, 13), (3.0, 10)]
    latencies = q.replayed_latencies(store, run.id)
    flat = [x for pair in latencies for x in pair]
    assert len(latencies) == 3 and flat == pytest.approx([0.1, 1.0, 0.3, 1.2, 0.5, 2.0])


def test_token_times_are_the_answered_requests_gaps_in_seconds(store: Engine) -> None:
    """What the steps are read back from: each answered request's prompt, first token and
    gaps (stored in milliseconds, read in seconds); failed requests are left out."""
    tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"})).id
    run = q.request_run(store, "latency", {}, target_id=tid)
    with transaction(store) as s:
        for seq, (status, first, gaps) in enumerate(
            [("ok", 1.5, [2.0, 3.5]), ("error", None, []), ("ok", 1.2, [])]
        ):
            s.add(
                RequestRecord(
                    run_id=run.id, seq=seq, scheduled_ts=1.0, sent_ts=1.0,
                    first_token_ts=first, end_ts=first, prompt_tokens=256, output_tokens=3,
                    status=status, itl_ms=gaps,
                )
            )  # fmt: skip
    assert q.token_times(store, run.id) == [(256, 1.5, [0.002, 0.0035]), (256, 1.2, [])]
