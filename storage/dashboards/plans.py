"""The plan pages' data (SLOs, Cost): stored records and histograms joined with the
planner's math, giving SLO compliance, measured points and queueing inputs.
"""

from __future__ import annotations

import math
import time

import pandas as pd
from pydantic import BaseModel
from sqlalchemy import Engine

from planner import slo as slo_math
from planner.queueing import measure_variability
from storage import derived as d
from storage import queries as q


def _complete(buckets: list[tuple[float, float]]) -> bool:
    """A window's histogram the engine exposed in full (it has the +Inf bucket)."""
    return any(math.isinf(le) for le, _ in buckets)


def _num(x: float | None) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


class SloReport(BaseModel):
    """One SLO on one target: compliance two ways, and the error budget."""

    slo: str
    target: str
    promise: str
    records: int
    exact_share: float | None
    exact_meets: bool | None
    histogram_lower: float | None
    histogram_upper: float | None
    histogram_label: str
    histogram_meets: bool | None
    histogram_requests: float
    budget_spent: float | None
    burn_rate: float | None  # over the last `burn_window_s`: 1.0 spends the budget on time
    burn_window_s: float
    budget_source: str
    notes: list[str]


# Burn rate is judged over the last hour (Google's SRE workbook pages on it at 14.4x), the
# budget over the SLO's own window.
BURN_WINDOW_S = 3600.0


Judged = tuple[
    slo_math.Compliance | None,
    slo_math.HistogramCompliance | None,
    slo_math.ErrorBudget | None,
    str,
]


def _budget(
    store: Engine,
    target_id: int,
    slo: slo_math.SLO,
    now: float,
    window_s: float,
    records: bool = True,
) -> Judged:
    """Compliance over the `window_s` ending `now`, exact from probe records (unless
    `records` is False) and bounded from the engine's histograms, and the error budget
    those counts give."""
    rec = q.target_records(store, target_id, now - window_s, now) if records else None
    exact = None
    if rec is not None and len(rec):
        per_token = rec["tpot_s"] if slo.per_token == "tpot" else rec["itl_max_s"]
        exact = slo_math.compliance_from_records(
            [None if pd.isna(x) else float(x) for x in rec["ttft_s"]],
            [None if pd.isna(x) else float(x) for x in per_token],
            rec["ok"].tolist(),
            slo,
        )
    ttft_b = d.histogram_increase(store, target_id, "ttft", now, window_s)
    tok_b = d.histogram_increase(store, target_id, slo.per_token, now, window_s)
    hist = None
    if _complete(ttft_b) and _complete(tok_b):
        hist = slo_math.compliance_from_histograms(ttft_b, tok_b, slo)
    # The budget from exact records when there are any, else the histogram's pessimistic
    # bound. The counts cover the whole window asked for (a rolling window).
    elapsed = min(window_s, slo.window_s)
    if exact is not None and exact.total:
        budget = slo_math.error_budget(slo, exact.bad, exact.total, elapsed)
        source = "probe records (exact)"
    elif hist is not None and hist.requests:
        bad = (1 - hist.lower) * hist.requests
        budget = slo_math.error_budget(slo, bad, hist.requests, elapsed)
        source = "engine histograms (lower bound of compliance: pessimistic)"
    else:
        budget, source = None, "no requests in the window"
    return exact, hist, budget, source


def burn_rate(
    store: Engine, target_id: int, slo: slo_math.SLO, now: float, window_s: float
) -> float | None:
    """How fast the engine's traffic spent the SLO's budget over the `window_s` ending
    `now` (1.0: on time), from its histograms (all its traffic; the pessimistic bound, as
    the SLOs page). None without requests in the window."""
    *_, budget, _ = _budget(store, target_id, slo, now, window_s, records=False)
    return None if budget is None else budget.burn_rate


def slo_reports(store: Engine, now: float | None = None) -> list[SloReport]:
    """Every SLO on every target it applies to: compliance and budget spent over its window
    ending now, the burn rate over the last hour of it."""
    now = time.time() if now is None else now
    targets = q.list_targets(store)
    out = []
    for _, name, target_id, spec in q.list_slos(store):
        slo = slo_math.parse_slo(spec)
        for t in [t for t in targets if target_id in (None, t.id)]:
            exact, hist, budget, source = _budget(store, t.id, slo, now, slo.window_s)
            burn_window = min(BURN_WINDOW_S, slo.window_s)
            *_, recent, _ = _budget(store, t.id, slo, now, burn_window)
            out.append(
                SloReport(
                    slo=name,
                    target=t.name,
                    promise=slo.describe(),
                    records=0 if exact is None else int(exact.total),
                    exact_share=None if exact is None else _num(exact.share),
                    exact_meets=None if exact is None else exact.meets,
                    histogram_lower=_num(hist.lower) if hist else None,
                    histogram_upper=_num(hist.upper) if hist else None,
                    histogram_label=hist.label if hist else "no histogram data",
                    histogram_meets=hist.meets if hist else None,
                    histogram_requests=hist.requests if hist else 0.0,
                    budget_spent=None if budget is None else _num(budget.spent),
                    burn_rate=None
                    if budget is None
                    else (0.0 if recent is None else _num(recent.burn_rate)),
                    burn_window_s=burn_window,
                    budget_source=source,
                    notes=(list(hist.notes) if hist else [])
                    + (list(budget.notes) if budget else []),
                )
            )
    return out


class MeasuredPoint(BaseModel):
    """One probe measurement of a target: a request rate and the share outside an SLO."""

    run_id: int
    kind: str
    rate: float
    share_outside: float


def measured_points(store: Engine, target_id: int) -> list[MeasuredPoint]:
    """(rate, share outside the SLO) from the latency and capacity runs of a target that
    judged an SLO: the measured input of the cost frame."""
    out = []
    for run in q.list_runs(store, limit=500):
        if run.target_id != target_id or run.status != "done":
            continue
        if run.kind == "latency" and run.summary.get("slo_share") is not None:
            out.append(
                MeasuredPoint(
                    run_id=run.id,
                    kind=run.kind,
                    rate=float(run.params.get("rate", 0)),
                    share_outside=1 - float(run.summary["slo_share"]),
                )
            )
        elif run.kind == "capacity":
            out += [
                MeasuredPoint(
                    run_id=run.id,
                    kind=run.kind,
                    rate=float(s["rate"]),
                    share_outside=1 - float(s["slo_share"]),
                )
                for s in run.summary.get("steps", [])
                if s.get("slo_share") is not None
            ]
    return out


class QueueInputs(BaseModel):
    """What a latency run measured that Kingman's approximation takes, and the waits seen."""

    run_id: int
    requests: int
    rate: float
    ca: float
    service_s: float
    cs: float
    engine_queue_mean_s: float | None
    engine_queue_p50_s: float | None
    client_ttft_p50_s: float | None
    service_note: str


def queue_inputs(store: Engine, run_id: int) -> QueueInputs:
    """Arrival and service variability from a latency run's own request records.

    Arrivals are the scheduled send times. A request's stay once sent (sent to end) holds
    its wait in the engine's queue too; Kingman's service time must not, so the engine's
    mean queue time over the run (its histogram's sum over count) is taken off each stay.
    The wait to compare the prediction with is that same mean, not a median.
    """
    run = q.get_run(store, run_id)
    rec = q.run_records(store, run_id)
    ok = rec[rec["status"] == "ok"]
    engine_q = (run.summary.get("engine") or {}).get("queue_time") or {}
    queue_mean = engine_q.get("mean")
    stays = (ok["end_ts"] - ok["sent_ts"]).dropna()
    if queue_mean is not None:
        service = (stays - queue_mean).clip(lower=0.0).tolist()
        note = (
            f"sent to end of the stream, less the engine's mean queue time "
            f"({queue_mean * 1000:.1f} ms)"
        )
    else:
        service = stays.tolist()
        note = "sent to end of the stream: the engine reported no queue time, so it is inside"
    v = measure_variability(sorted(rec["scheduled_ts"].tolist()), service)
    return QueueInputs(
        run_id=run_id,
        requests=len(rec),
        rate=v.arrival_rate,
        ca=v.ca,
        service_s=v.service_s,
        cs=v.cs,
        engine_queue_mean_s=queue_mean,
        engine_queue_p50_s=engine_q.get("p50"),
        client_ttft_p50_s=(run.summary.get("ttft_s") or {}).get("p50"),
        service_note=note,
    )


def measured_cold_starts(store: Engine) -> dict[str, float]:
    """Each managed engine's last measured time from start to healthy, in seconds."""
    out: dict[str, float] = {}
    for name, _, _ in q.list_engine_specs(store):
        state = q.get_state(store, f"engine:{name}")
        took = ((state[0].get("facts") or {}) if state else {}).get("time_to_healthy_s")
        if isinstance(took, int | float):
            out[name] = float(took)
    return out
