"""The SLOs page's figures from stored probe records: budget spent over the SLO's window,
burn rate over the last hour (they differ once old trouble has passed), and an ITL-bound
SLO judged on each request's longest gap, not its mean."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from storage import queries as q
from storage.dashboards import slo_reports
from storage.db import transaction
from storage.tables import RequestRecord

NOW = 1_000_000.0
SLO = {"name": "chat", "ttft_s": 1.0, "tpot_s": 0.1, "share": 0.99, "window_s": 86400}


def _records(store: Engine, tid: int, at: float, n: int, bad: int, gaps_ms: list[float]) -> None:
    """`n` requests scheduled at `at`, the first `bad` of them with a 2 s TTFT."""
    run = q.request_run(store, "latency", {}, target_id=tid)
    with transaction(store) as s:
        for seq in range(n):
            ttft = 2.0 if seq < bad else 0.2
            s.add(
                RequestRecord(
                    run_id=run.id, seq=seq, scheduled_ts=at, sent_ts=at,
                    first_token_ts=at + ttft, end_ts=at + ttft + sum(gaps_ms) / 1000,
                    output_tokens=len(gaps_ms) + 1, status="ok", itl_ms=gaps_ms,
                )
            )  # fmt: skip


def test_budget_spent_is_the_window_burn_rate_the_last_hour(store: Engine) -> None:
    tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:1"})).id
    q.save_slo(store, "chat", SLO, None)
    _records(store, tid, NOW - 20 * 3600, 100, bad=10, gaps_ms=[50.0] * 4)  # yesterday's trouble
    _records(store, tid, NOW - 600, 100, bad=0, gaps_ms=[50.0] * 4)  # a calm last hour
    (report,) = slo_reports(store, NOW)
    assert report.records == 200 and report.exact_share == pytest.approx(190 / 200)
    # 10 bad of 200 against an allowance of 1%: five budgets spent; none in the last hour.
    assert report.budget_spent == pytest.approx(5.0) and report.burn_rate == 0.0
    assert report.burn_window_s == 3600
    _records(store, tid, NOW - 60, 100, bad=4, gaps_ms=[50.0] * 4)  # trouble now
    (report,) = slo_reports(store, NOW)
    assert report.burn_rate == pytest.approx((4 / 200) / 0.01)
    assert report.budget_spent == pytest.approx((14 / 300) / 0.01)


def test_an_itl_bound_slo_is_judged_on_each_requests_longest_gap(store: Engine) -> None:
    tid = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:1"})).id
    # Mean gap 60 ms, inside a 100 ms bound; one stall of 300 ms, outside it.
    _records(store, tid, NOW - 60, 10, bad=0, gaps_ms=[300.0] + [10.0] * 4)
    q.save_slo(store, "tpot", SLO | {"name": "tpot"}, None)
    q.save_slo(store, "itl", SLO | {"name": "itl", "per_token": "itl"}, None)
    shares = {r.slo: r.exact_share for r in slo_reports(store, NOW)}
    assert shares == {"tpot": 1.0, "itl": 0.0}
