"""Request records: one row per request a probe sent, read back as DataFrames with the
client-side latencies (TTFT, TPOT, E2E) computed in one place."""

from __future__ import annotations

import pandas as pd
from sqlalchemy import Engine, select

from storage.tables import ProbeRun, RequestRecord


def add_latency_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Add `ttft_s` and `tpot_s` to request rows, in place; returns the frame.

    Both count from the scheduled send time, so a late client shows as latency (open loop).
    TPOT is the decode time over the tokens after the first, undefined below two tokens.
    """
    frame["ttft_s"] = frame["first_token_ts"] - frame["scheduled_ts"]
    decode = frame["end_ts"] - frame["first_token_ts"]
    frame["tpot_s"] = decode / (frame["output_tokens"] - 1).where(frame["output_tokens"] > 1)
    return frame


def run_records(store: Engine, run_id: int) -> pd.DataFrame:
    """The requests a run sent, one row each, with TTFT, E2E and TPOT in seconds."""
    cols = [
        RequestRecord.seq,
        RequestRecord.scheduled_ts,
        RequestRecord.sent_ts,
        RequestRecord.first_token_ts,
        RequestRecord.end_ts,
        RequestRecord.prompt_tokens,
        RequestRecord.output_tokens,
        RequestRecord.status,
        RequestRecord.http_status,
        RequestRecord.error,
        RequestRecord.tags,
    ]
    with store.connect() as conn:
        rows = conn.execute(
            select(*cols).where(RequestRecord.run_id == run_id).order_by(RequestRecord.seq)
        ).all()
    frame = pd.DataFrame(rows, columns=[c.key for c in cols])
    add_latency_columns(frame)
    frame["e2e_s"] = frame["end_ts"] - frame["scheduled_ts"]
    frame["lateness_s"] = frame["sent_ts"] - frame["scheduled_ts"]
    frame["step"] = [t.get("step") if isinstance(t, dict) else None for t in frame["tags"]]
    return frame


def target_records(store: Engine, target_id: int, start: float, end: float) -> pd.DataFrame:
    """Requests probes sent to a target, scheduled in [start, end]: ttft_s, tpot_s,
    itl_max_s (each request's longest gap between tokens, what an ITL bound holds), ok."""
    cols = [
        RequestRecord.scheduled_ts,
        RequestRecord.first_token_ts,
        RequestRecord.end_ts,
        RequestRecord.output_tokens,
        RequestRecord.status,
        RequestRecord.itl_ms,
    ]
    with store.connect() as conn:
        rows = conn.execute(
            select(*cols)
            .join(ProbeRun, ProbeRun.id == RequestRecord.run_id)
            .where(
                ProbeRun.target_id == target_id,
                RequestRecord.scheduled_ts >= start,
                RequestRecord.scheduled_ts <= end,
                RequestRecord.status != "cancelled",
            )
        ).all()
    frame = pd.DataFrame(rows, columns=[c.key for c in cols])
    frame["ok"] = frame["status"] == "ok"
    frame["itl_max_s"] = [max(gaps) / 1000 if gaps else None for gaps in frame.pop("itl_ms")]
    return add_latency_columns(frame)


def _answered(store: Engine, run_id: int) -> pd.DataFrame:
    """A run's answered requests, by send time (ties in the order they were sent)."""
    frame = run_records(store, run_id)
    frame = frame[(frame["status"] == "ok") & frame["prompt_tokens"].notna()]
    return frame.sort_values("scheduled_ts", kind="stable")


def replayable(store: Engine, run_id: int) -> list[tuple[float, int, int, str | None]]:
    """A run's answered requests as (send time, prompt tokens, output tokens, component of a
    mixed profile or None), by send time: what a simulator needs to replay them."""
    frame = _answered(store, run_id)
    return [
        (float(t), int(p), int(o), (tags or {}).get("component"))
        for t, p, o, tags in zip(
            frame["scheduled_ts"],
            frame["prompt_tokens"],
            frame["output_tokens"],
            frame["tags"],
            strict=True,
        )
    ]


def replayed_latencies(store: Engine, run_id: int) -> list[tuple[float, float]]:
    """The measured (TTFT, E2E) in seconds of the requests `replayable` lists, in its order."""
    frame = _answered(store, run_id)
    return [(float(a), float(b)) for a, b in zip(frame["ttft_s"], frame["e2e_s"], strict=True)]


def token_times(store: Engine, run_id: int) -> list[tuple[int, float, list[float]]]:
    """A run's answered requests as (prompt tokens, first token's wall-clock time, gaps
    before each later token in seconds): the steps behind them can be read back."""
    with store.connect() as conn:
        rows = conn.execute(
            select(RequestRecord.prompt_tokens, RequestRecord.first_token_ts, RequestRecord.itl_ms)
            .where(
                RequestRecord.run_id == run_id,
                RequestRecord.status == "ok",
                RequestRecord.prompt_tokens.is_not(None),
                RequestRecord.first_token_ts.is_not(None),
            )
            .order_by(RequestRecord.seq)
        ).all()
    return [(int(p), float(t), [g / 1000.0 for g in gaps or []]) for p, t, gaps in rows]
