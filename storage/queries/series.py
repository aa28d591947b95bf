"""Time-series reads: the stored points of a target's series, raw or rolled up.

The table follows the resolution: raw samples (0), or 1-minute / 1-hour rollups; the
derivations in `storage/derived.py` turn these points into gauges, rates and quantiles.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine, func, select

from storage.tables import Rollup, Sample, Series


def series_points(
    store: Engine,
    target_id: int,
    names: Iterable[str],
    start: float,
    end: float,
    resolution: int = 0,
) -> pd.DataFrame:
    """Stored points of a target's series in [start, end].

    Columns: series_id, metric, labels_key, ts, value (raw), or ts, min, max, avg, last,
    count, covered_s, increase (rollups, `ts` = bucket start).
    """
    names = list(names)
    if resolution == 0:
        q: Any = (
            select(Series.id, Series.metric, Series.labels_key, Sample.ts, Sample.value)
            .join(Series, Series.id == Sample.series_id)
            .where(
                Series.target_id == target_id,
                Series.metric.in_(names),
                Sample.ts >= start,
                Sample.ts <= end,
            )
            .order_by(Sample.series_id, Sample.ts)
        )
    else:
        q = (
            select(
                Series.id,
                Series.metric,
                Series.labels_key,
                Rollup.ts,
                Rollup.min,
                Rollup.max,
                Rollup.avg,
                Rollup.last,
                Rollup.count,
                Rollup.covered_s,
                Rollup.increase,
            )
            .join(Series, Series.id == Rollup.series_id)
            .where(
                Series.target_id == target_id,
                Series.metric.in_(names),
                Rollup.resolution == resolution,
                Rollup.ts >= start,
                Rollup.ts <= end,
            )
            .order_by(Rollup.series_id, Rollup.ts)
        )
    with store.connect() as conn:
        # Plain tuples: pandas probes each SQLAlchemy Row for attributes, which costs more
        # than the query.
        rows = [tuple(r) for r in conn.execute(q)]
    cols = ["series_id", "metric", "labels_key", "ts"] + (
        ["value"]
        if resolution == 0
        else ["min", "max", "avg", "last", "count", "covered_s", "increase"]
    )
    return pd.DataFrame(rows, columns=cols)


RAW_COLUMNS = ("ts", "value")
ROLLUP_COLUMNS = ("ts", "min", "max", "avg", "last", "count", "covered_s", "increase")


def series_arrays(
    store: Engine, target_id: int, name: str, start: float, end: float, resolution: int = 0
) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The stored points of one series name in [start, end], per label set, as columns of
    floats (those of `series_points`; NaN for NULL): the derivations' hot path, no pandas."""
    if resolution == 0:
        cols: Any = (Sample.ts, Sample.value)
        table: Any = Sample
        extra: list[Any] = []
    else:
        cols = tuple(getattr(Rollup, c) for c in ROLLUP_COLUMNS)
        table = Rollup
        extra = [Rollup.resolution == resolution]
    q = (
        select(Series.id, Series.labels_key, *cols)
        .join(Series, Series.id == table.series_id)
        .where(
            Series.target_id == target_id,
            Series.metric == name,
            table.ts >= start,
            table.ts <= end,
            *extra,
        )
        .order_by(table.series_id, table.ts)
    )
    names = RAW_COLUMNS if resolution == 0 else ROLLUP_COLUMNS
    with store.connect() as conn:
        rows = conn.execute(q).all()
    out: list[tuple[str, dict[str, np.ndarray]]] = []
    for _, grouped in itertools.groupby(rows, key=lambda r: r[0]):
        group = list(grouped)
        block = np.array([r[2:] for r in group], dtype=float)  # None becomes NaN
        out.append((str(group[0][1]), {n: block[:, i] for i, n in enumerate(names)}))
    return out


def latest_ts(store: Engine, target_id: int, name: str) -> float | None:
    """The newest raw sample's time of a target's series `name` (any labels), or None."""
    q = (
        select(func.max(Sample.ts))
        .join(Series, Series.id == Sample.series_id)
        .where(Series.target_id == target_id, Series.metric == name)
    )
    with store.connect() as conn:
        return conn.execute(q).scalar()


def count_samples(store: Engine, target_id: int | None = None) -> int:
    """How many raw samples are stored (for one target)."""
    with store.connect() as conn:
        q = select(func.count()).select_from(Sample)
        if target_id is not None:
            q = q.join(Series, Series.id == Sample.series_id).where(Series.target_id == target_id)
        return int(conn.execute(q).scalar_one())
