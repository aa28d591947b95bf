"""Write scraped samples: resolve series ids, skip unchanged values, insert in one transaction.

An unchanged value is stored again only when `heartbeat_s` has passed since it was last
stored, so an idle engine costs a few rows a minute instead of one per scrape and per
bucket. Readers carry the last value forward (see `storage/derived.py`), which is exact
while the target is up; the heartbeat bounds how stale a carried value may be.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from planner.errors import LimitExceeded
from storage.tables import Sample, Series

HEARTBEAT_S = 30.0
# A stored value holds until the next one, but no longer than this: an older one means the
# target stopped answering (a gap), not a value. Readers and rollups both use it.
STALE_S = 2.5 * HEARTBEAT_S


class PointLike(Protocol):
    """What the writer needs of a sample (the scraper's ParsedSample fits)."""

    @property
    def series(self) -> str: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def value(self) -> float: ...
    @property
    def raw_name(self) -> str: ...
    @property
    def kind(self) -> str: ...


@dataclass(frozen=True)
class Point:
    """A plain sample for callers that do not come from the scraper (GPU, tests, benches)."""

    series: str
    labels: dict[str, str]
    value: float
    raw_name: str = ""
    kind: str = "gauge"


def _labels_tuple(p: PointLike) -> tuple[tuple[str, str], ...]:
    known: tuple[tuple[str, str], ...] | None = getattr(p, "labels_tuple", None)
    return known if known is not None else tuple(sorted(p.labels.items()))


def labels_key(labels: dict[str, Any]) -> str:
    """Canonical JSON of a label set."""
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


def insert_ignoring_duplicates(store: Engine, table: Any) -> Insert:
    """An INSERT that skips rows whose primary key already exists, on SQLite and PostgreSQL."""
    if store.dialect.name == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    if store.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return insert(table)


class SampleWriter:
    """Keeps series ids and last stored values in memory; one instance per worker process."""

    def __init__(self, store: Engine, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.store = store
        self.heartbeat_s = heartbeat_s
        self._ids: dict[tuple[int, str, str], int] = {}
        self._fast: dict[tuple[int, str, tuple[tuple[str, str], ...]], int] = {}
        self._raw: dict[int, str] = {}
        self._last: dict[int, tuple[float, float]] = {}
        self._insert = insert_ignoring_duplicates(store, Sample)

    def write(
        self,
        target_id: int,
        points: Iterable[PointLike],
        ts: float,
        series_limit: int | None = None,
    ) -> int:
        """Store the points of one scrape taken at `ts`; return how many rows were written.

        With `series_limit`, a write that would give the target more series than that is
        refused whole (LimitExceeded), so label churn cannot add series forever.
        """
        pts = [p for p in points if not math.isnan(p.value)]
        # Series created here exist only once the transaction commits: they join the cache
        # after it, so a failed write (a StorageError from the boundary) leaves no stale id.
        created: dict[tuple[int, str, str], int] = {}
        # Known series are found by their labels as a tuple: no JSON encoding per sample.
        fast = [(target_id, p.series, _labels_tuple(p)) for p in pts]
        with self.store.begin() as session:  # Core, not an ORM session: per scrape, it counts
            if all(k in self._fast for k in fast):
                ids = [self._fast[k] for k in fast]
            else:
                ids = self._resolve(session, target_id, pts, created, series_limit)
            new_ids = set(created.values())
            # A series created just now already carries its raw name.
            renamed = {
                sid: p.raw_name
                for p, sid in zip(pts, ids, strict=True)
                if p.raw_name and sid not in new_ids and self._raw.get(sid) != p.raw_name
            }
            for sid, raw in renamed.items():
                session.execute(update(Series).where(Series.id == sid).values(raw_name=raw))
            rows: list[dict[str, Any]] = []
            for p, sid in zip(pts, ids, strict=True):
                last = self._last.get(sid)
                if last and last[1] == p.value and ts - last[0] < self.heartbeat_s:
                    continue
                rows.append({"series_id": sid, "ts": ts, "value": p.value})
            if rows:
                session.execute(self._insert, rows)
        self._ids.update(created)
        self._fast.update(zip(fast, ids, strict=True))
        self._raw.update(renamed)
        self._raw.update(
            {sid: p.raw_name for p, sid in zip(pts, ids, strict=True) if sid in new_ids}
        )
        # Only after the commit: a rolled-back write must not suppress the next one.
        for row in rows:
            self._last[int(row["series_id"])] = (ts, float(row["value"]))
        return len(rows)

    def forget_target(self, target_id: int) -> None:
        """Drop cached ids of a removed target (its series were deleted with it)."""
        for key in [k for k in self._ids if k[0] == target_id]:
            sid = self._ids.pop(key)
            self._last.pop(sid, None)
            self._raw.pop(sid, None)
        for fast in [k for k in self._fast if k[0] == target_id]:
            del self._fast[fast]

    def _resolve(
        self,
        session: Any,
        target_id: int,
        pts: list[PointLike],
        created: dict[tuple[int, str, str], int],
        series_limit: int | None,
    ) -> list[int]:
        keys = [(target_id, p.series, labels_key(p.labels)) for p in pts]
        missing = {k for k in keys if k not in self._ids}
        if missing:
            # Rows read here are committed, so they may enter the cache at once.
            known = session.execute(
                select(Series.id, Series.metric, Series.labels_key, Series.raw_name).where(
                    Series.target_id == target_id
                )
            )
            for sid, metric, lk, raw in known:
                self._ids[(target_id, metric, lk)] = sid
                self._raw[sid] = raw
            new = sorted(k for k in missing if k not in self._ids)
            if series_limit is not None and new:
                have = sum(1 for k in self._ids if k[0] == target_id)
                if have + len(new) > series_limit:
                    raise LimitExceeded(
                        f"this scrape would add {len(new):,} series to the {have:,} stored for "
                        f"the target, over its series limit of {series_limit:,}; nothing was "
                        "stored"
                    )
            by_key = {k: p for k, p in zip(keys, pts, strict=True)}
            if new:
                # One multi-row INSERT ... RETURNING: a first scrape creates hundreds of series.
                rows = [
                    {
                        "target_id": target_id,
                        "metric": by_key[key].series,
                        "labels_key": key[2],
                        "labels": dict(by_key[key].labels),
                        "raw_name": by_key[key].raw_name,
                        "kind": by_key[key].kind,
                    }
                    for key in new
                ]
                made = session.execute(
                    insert(Series).returning(Series.id, Series.metric, Series.labels_key),
                    rows,
                )
                for sid, metric, lk in made:
                    created[(target_id, metric, lk)] = sid
        return [created[k] if k in created else self._ids[k] for k in keys]
