"""Events: everything that happened (engine starts and crashes, scrape trouble, alerts),
appended by the worker and read newest first by the pages."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, select

from storage.db import session_factory, transaction
from storage.schemas import EventRow
from storage.tables import Event


def record_event(
    store: Engine,
    kind: str,
    message: str,
    *,
    target_id: int | None = None,
    severity: str = "info",
    data: dict[str, Any] | None = None,
    ts: float | None = None,
    actor: str | None = None,
) -> None:
    """Append one event; `actor` is the person who caused it, when one did."""
    with transaction(store) as s:
        s.add(
            Event(
                ts=ts or time.time(),
                target_id=target_id,
                kind=kind,
                severity=severity,
                message=message,
                data=data or {},
                actor=actor,
            )
        )


def events(
    store: Engine,
    start: float,
    end: float,
    target_id: int | None = None,
    kinds: Sequence[str] | None = None,
    limit: int = 1000,
) -> list[EventRow]:
    """Events in [start, end], newest first."""
    with session_factory(store)() as s:
        q = select(Event).where(Event.ts >= start, Event.ts <= end)
        if target_id is not None:
            q = q.where(Event.target_id == target_id)
        if kinds:
            q = q.where(Event.kind.in_(kinds))
        q = q.order_by(Event.ts.desc()).limit(limit)
        return [EventRow.model_validate(e, from_attributes=True) for e in s.scalars(q)]
