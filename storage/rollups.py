"""Roll raw samples up into 1-minute and 1-hour aggregates, and expire what retention drops.

Rollups are computed in SQL over completed buckets only, in chunks of bounded size so that
no write transaction blocks the console for long. A watermark per resolution (kept in
`worker_state`) says how far each resolution is complete.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Float, Integer, cast, delete, func, insert, literal, select, text
from sqlalchemy.sql.elements import ColumnElement

from storage.db import transaction
from storage.queries.state import get_state, put_state
from storage.settings import Retention
from storage.tables import Rollup, Sample, Series

MINUTE, HOUR = 60, 3600
RESOLUTIONS = (MINUTE, HOUR)
# A bucket is rolled up only once this long after its end, so late scrapes land first.
LAG_S = 10.0
# At most this much time per transaction when catching up.
CHUNK_S = {MINUTE: 3600.0, HOUR: 6 * 3600.0}


@dataclass(frozen=True)
class RollupResult:
    """What one rollup pass did."""

    rows: dict[int, int]
    watermark: dict[int, float]


def _floor(store: Engine, col: Any, res: int) -> ColumnElement[float]:
    """Bucket start of `col` for a resolution; floor, not round, on every dialect."""
    if store.dialect.name == "sqlite":  # CAST truncates toward zero: floor for epoch times
        return cast(cast(col / res, Integer) * res, Float)
    return func.floor(col / res) * res


def _source_start(store: Engine, res: int) -> float | None:
    with store.connect() as conn:
        if res == MINUTE:
            v = conn.execute(select(func.min(Sample.ts))).scalar()
        else:
            v = conn.execute(
                select(func.min(Rollup.ts)).where(Rollup.resolution == MINUTE)
            ).scalar()
    return None if v is None else float(v)


def _rollup_chunk(store: Engine, res: int, lo: float, hi: float) -> int:
    """Aggregate [lo, hi) into buckets of `res`, replacing what was there."""
    if res == MINUTE:
        src = (
            select(
                Sample.series_id.label("series_id"),
                _floor(store, Sample.ts, res).label("bucket"),
                Sample.value.label("vmin"),
                Sample.value.label("vmax"),
                Sample.value.label("vsum"),
                func.first_value(Sample.value)
                .over(
                    partition_by=(Sample.series_id, _floor(store, Sample.ts, res)),
                    order_by=Sample.ts.desc(),
                )
                .label("vlast"),
                literal(1, Integer).label("n"),
            )
            .where(Sample.ts >= lo, Sample.ts < hi)
            .subquery()
        )
    else:
        src = (
            select(
                Rollup.series_id.label("series_id"),
                _floor(store, Rollup.ts, res).label("bucket"),
                Rollup.min.label("vmin"),
                Rollup.max.label("vmax"),
                (Rollup.avg * Rollup.count).label("vsum"),
                func.first_value(Rollup.last)
                .over(
                    partition_by=(Rollup.series_id, _floor(store, Rollup.ts, res)),
                    order_by=Rollup.ts.desc(),
                )
                .label("vlast"),
                Rollup.count.label("n"),
            )
            .where(Rollup.resolution == MINUTE, Rollup.ts >= lo, Rollup.ts < hi)
            .subquery()
        )
    agg = select(
        src.c.series_id,
        text(str(res)),
        src.c.bucket,
        func.min(src.c.vmin),
        func.max(src.c.vmax),
        func.sum(src.c.vsum) / func.sum(src.c.n),
        func.max(src.c.vlast),
        func.sum(src.c.n),
    ).group_by(src.c.series_id, src.c.bucket)
    with transaction(store) as s:
        s.execute(delete(Rollup).where(Rollup.resolution == res, Rollup.ts >= lo, Rollup.ts < hi))
        res_ins = s.execute(
            insert(Rollup).from_select(
                ["series_id", "resolution", "ts", "min", "max", "avg", "last", "count"], agg
            )
        )
        return int(res_ins.rowcount or 0)  # type: ignore[attr-defined]


def run_rollups(store: Engine, now: float | None = None, max_chunks: int = 48) -> RollupResult:
    """Bring 1-minute, then 1-hour rollups up to the last completed bucket."""
    now = time.time() if now is None else now
    state = get_state(store, "rollup_watermark")
    marks = {int(k): float(v) for k, v in (state[0] if state else {}).items()}
    written: dict[int, int] = {}
    for res in RESOLUTIONS:
        hi_limit = (now - LAG_S) // res * res
        lo = marks.get(res)
        if lo is None:
            start = _source_start(store, res)
            if start is None:
                continue
            lo = start // res * res
        chunks = 0
        while lo < hi_limit and chunks < max_chunks:
            hi = min(hi_limit, lo + CHUNK_S[res])
            written[res] = written.get(res, 0) + _rollup_chunk(store, res, lo, hi)
            lo = hi
            chunks += 1
            marks[res] = lo
            put_state(store, "rollup_watermark", {str(k): v for k, v in marks.items()})
    return RollupResult(written, marks)


def _delete_old(
    store: Engine,
    table: type[Sample] | type[Rollup],
    cutoff: float,
    resolution: int | None = None,
    batch: int = 200,
) -> int:
    """Delete rows older than `cutoff` a batch of series at a time: each delete walks the
    (series_id, ts) primary key instead of scanning the table, and holds the lock briefly."""
    with store.connect() as conn:
        ids = [r[0] for r in conn.execute(select(Series.id).order_by(Series.id))]
    total = 0
    for i in range(0, len(ids), batch):
        cond = [table.series_id.in_(ids[i : i + batch]), table.ts < cutoff]
        if resolution is not None:
            cond.append(Rollup.resolution == resolution)
        with transaction(store) as s:
            total += int(s.execute(delete(table).where(*cond)).rowcount or 0)  # type: ignore[attr-defined]
    return total


def expire(store: Engine, retention: Retention, now: float | None = None) -> dict[str, int]:
    """Delete raw samples and rollups past their retention; return rows deleted per kind."""
    now = time.time() if now is None else now
    return {
        "samples": _delete_old(store, Sample, now - retention.raw_hours * 3600),
        "rollups_60": _delete_old(store, Rollup, now - retention.minute_days * 86400, MINUTE),
        "rollups_3600": _delete_old(store, Rollup, now - retention.hour_days * 86400, HOUR),
    }
