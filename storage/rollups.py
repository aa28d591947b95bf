"""Roll raw samples up into 1-minute and 1-hour aggregates, and expire what retention drops.

Rollups are computed in SQL over completed buckets only, in chunks of bounded size so that
no write transaction blocks the console for long. A watermark per resolution (kept in
`worker_state`) says how far each resolution is complete. Averages are time-weighted: a
stored value holds until the next one (samples are stored when they change), so 50 s at
0.9 and 10 s at 0.1 average 0.77, and min and max keep every peak. Raw samples are expired
only once they are rolled up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Engine,
    Float,
    Integer,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    select,
    union_all,
)
from sqlalchemy.sql.elements import ColumnElement

from storage.db import transaction
from storage.ingest import STALE_S
from storage.queries.state import get_state, put_state
from storage.settings import Retention
from storage.tables import Alert, Event, ProbeRun, RequestRecord, Rollup, Sample, Series

MINUTE, HOUR = 60, 3600
RESOLUTIONS = (MINUTE, HOUR)
# A bucket is rolled up only once this long after its end, so late scrapes land first.
LAG_S = 10.0
# At most this much time per transaction when catching up.
CHUNK_S = {MINUTE: 3600.0, HOUR: 6 * 3600.0}
# Each pass rolls the last few buckets again: samples that arrived late (a slow scrape, a
# clock stepped back a little) land in their buckets' aggregates.
REROLL = {MINUTE: 5 * 60.0, HOUR: 2 * 3600.0}
# How far back a counter's previous sample is looked for (its step into the first bucket).
INCREASE_LOOKBACK_S = 3600.0


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


def _least(store: Engine, *cols: Any) -> ColumnElement[float]:
    return func.min(*cols) if store.dialect.name == "sqlite" else func.least(*cols)


def _greatest(store: Engine, *cols: Any) -> ColumnElement[float]:
    return func.max(*cols) if store.dialect.name == "sqlite" else func.greatest(*cols)


def _from_samples(store: Engine, res: int, lo: float, hi: float) -> Any:
    """Per series and bucket in [lo, hi), from raw samples, time-weighted.

    Each sample holds its value until the next sample, at most STALE_S (a longer silence is
    a gap) and at most `hi`; a hold that spans buckets is split among them, so a value carried
    in from the previous bucket counts for the time it held. A counter's increase is the sum
    of its reset-corrected steps (a fall counts from zero), each in the bucket it ends in.
    """
    s = (
        select(
            Sample.series_id.label("sid"),
            Sample.ts.label("ts"),
            Sample.value.label("v"),
            func.lead(Sample.ts)
            .over(partition_by=Sample.series_id, order_by=Sample.ts)
            .label("nxt"),
            func.lag(Sample.value)
            .over(partition_by=Sample.series_id, order_by=Sample.ts)
            .label("prev"),
        )
        .where(Sample.ts >= lo - INCREASE_LOOKBACK_S, Sample.ts < hi)
        .subquery()
    )
    step = case(
        (s.c.prev.is_(None), 0.0),
        (s.c.v >= s.c.prev, s.c.v - s.c.prev),
        else_=s.c.v,
    )
    held = select(
        s.c.sid,
        s.c.ts,
        s.c.v,
        _least(store, func.coalesce(s.c.nxt, hi), s.c.ts + STALE_S, literal(hi)).label("until"),
        step.label("step"),
    ).subquery()
    # A hold lasts at most STALE_S < 2 buckets: it touches its own bucket and the next two.
    k = union_all(*(select(literal(i, Integer).label("k")) for i in range(3))).subquery()
    bucket = _floor(store, held.c.ts, res) + k.c.k * res
    own = (k.c.k == 0) & (held.c.ts >= lo)
    piece = (
        select(
            held.c.sid,
            bucket.label("bucket"),
            held.c.v,
            _greatest(store, held.c.ts, bucket).label("start"),
            (_least(store, held.c.until, bucket + res) - _greatest(store, held.c.ts, bucket)).label(
                "dur"
            ),
            case((own, held.c.step), else_=0.0).label("step"),
            case((own, 1), else_=0).label("n"),
        )
        .select_from(held.join(k, literal(True)))
        .subquery()
    )
    live = (
        select(
            piece,
            func.first_value(piece.c.v)
            .over(partition_by=(piece.c.sid, piece.c.bucket), order_by=piece.c.start.desc())
            .label("vlast"),
        )
        .where(piece.c.bucket >= lo, piece.c.bucket < hi, (piece.c.dur > 0) | (piece.c.n > 0))
        .subquery()
    )
    covered = func.sum(live.c.dur)
    return select(
        live.c.sid,
        literal(res, Integer),
        live.c.bucket,
        func.min(live.c.v),
        func.max(live.c.v),
        case(
            (covered > 0, func.sum(live.c.v * live.c.dur) / covered), else_=func.max(live.c.vlast)
        ),
        func.max(live.c.vlast),
        func.sum(live.c.n),
        covered,
        func.sum(live.c.step),
    ).group_by(live.c.sid, live.c.bucket)


def _from_rollups(store: Engine, res: int, lo: float, hi: float) -> Any:
    """Per series and bucket in [lo, hi), from the finer rollups, weighted by covered time."""
    weight = func.coalesce(Rollup.covered_s, Rollup.count)
    src = (
        select(
            Rollup.series_id.label("sid"),
            _floor(store, Rollup.ts, res).label("bucket"),
            Rollup.min.label("vmin"),
            Rollup.max.label("vmax"),
            (Rollup.avg * weight).label("wsum"),
            weight.label("w"),
            func.first_value(Rollup.last)
            .over(
                partition_by=(Rollup.series_id, _floor(store, Rollup.ts, res)),
                order_by=Rollup.ts.desc(),
            )
            .label("vlast"),
            Rollup.count.label("n"),
            Rollup.increase.label("inc"),
        )
        .where(Rollup.resolution == MINUTE, Rollup.ts >= lo, Rollup.ts < hi)
        .subquery()
    )
    w = func.sum(src.c.w)
    return select(
        src.c.sid,
        literal(res, Integer),
        src.c.bucket,
        func.min(src.c.vmin),
        func.max(src.c.vmax),
        case((w > 0, func.sum(src.c.wsum) / w), else_=func.max(src.c.vlast)),
        func.max(src.c.vlast),
        func.sum(src.c.n),
        w,
        func.sum(src.c.inc),
    ).group_by(src.c.sid, src.c.bucket)


def _rollup_chunk(store: Engine, res: int, lo: float, hi: float) -> int:
    """Aggregate [lo, hi) into buckets of `res`, replacing what was there."""
    agg = _from_samples(store, res, lo, hi) if res == MINUTE else _from_rollups(store, res, lo, hi)
    cols = ["series_id", "resolution", "ts", "min", "max", "avg", "last", "count"]
    with transaction(store) as s:
        s.execute(delete(Rollup).where(Rollup.resolution == res, Rollup.ts >= lo, Rollup.ts < hi))
        res_ins = s.execute(insert(Rollup).from_select([*cols, "covered_s", "increase"], agg))
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
        else:
            lo = max(0.0, lo - REROLL[res])
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


def _delete_ids(store: Engine, table: Any, where: Any, batch: int = 5000) -> int:
    """Delete the rows matching `where` a batch of ids at a time (short transactions)."""
    total = 0
    while True:
        with store.connect() as conn:
            ids = [r[0] for r in conn.execute(select(table.id).where(where).limit(batch))]
        if not ids:
            return total
        with transaction(store) as s:
            total += int(s.execute(delete(table).where(table.id.in_(ids))).rowcount or 0)  # type: ignore[attr-defined]


def expire(store: Engine, retention: Retention, now: float | None = None) -> dict[str, int]:
    """Delete what is past its retention; return rows deleted per kind.

    Raw samples and 1-minute rollups go only once the next resolution has them: when the
    rollups stall, nothing is lost to retention (the disk guard watches the space instead).
    """
    now = time.time() if now is None else now
    state = get_state(store, "rollup_watermark")
    marks = {int(k): float(v) for k, v in (state[0] if state else {}).items()}
    raw_cut = min(now - retention.raw_hours * 3600, marks.get(MINUTE, 0.0) - REROLL[MINUTE])
    minute_cut = min(now - retention.minute_days * 86400, marks.get(HOUR, 0.0) - REROLL[HOUR])
    day = 86400
    return {
        "samples": _delete_old(store, Sample, raw_cut),
        "rollups_60": _delete_old(store, Rollup, minute_cut, MINUTE),
        "rollups_3600": _delete_old(store, Rollup, now - retention.hour_days * day, HOUR),
        "events": _delete_ids(store, Event, Event.ts < now - retention.events_days * day),
        "records": _delete_ids(
            store,
            RequestRecord,
            RequestRecord.run_id.in_(
                select(ProbeRun.id).where(ProbeRun.finished_at < now - retention.records_days * day)
            ),
        ),
        "runs": _delete_ids(
            store, ProbeRun, ProbeRun.finished_at < now - retention.runs_days * day
        ),
        "alerts": _delete_ids(
            store,
            Alert,
            (Alert.state == "resolved") & (Alert.resolved_at < now - retention.alerts_days * day),
        ),
    }
