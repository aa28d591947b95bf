"""Worker state: small facts the worker publishes for the console (heartbeat, GPU state,
rollup watermarks, each managed engine's state and log tail), one row per key."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, select, update

from storage.db import session_factory, transaction
from storage.tables import WorkerState


def put_state(store: Engine, key: str, value: dict[str, Any]) -> None:
    """Publish a small fact (heartbeat, GPU state) for the console."""
    with transaction(store) as s:
        row = s.get(WorkerState, key)
        if row is None:
            s.add(WorkerState(key=key, value=value, updated_at=time.time()))
        else:
            row.value, row.updated_at = value, time.time()


def replace_state(store: Engine, key: str, value: dict[str, Any], written_at: float) -> bool:
    """Write `value` over the fact at `key` only while it is still the one written at
    `written_at` (`get_state`'s time, as the caller read it): False where another writer
    came between, whose fact is kept."""
    with transaction(store) as s:
        done = s.execute(
            update(WorkerState)
            .where(WorkerState.key == key, WorkerState.updated_at == written_at)
            .values(value=value, updated_at=time.time())
        )
        return bool(done.rowcount == 1)  # type: ignore[attr-defined]


def get_state(store: Engine, key: str) -> tuple[dict[str, Any], float] | None:
    """A published fact and when it was written."""
    with session_factory(store)() as s:
        row = s.get(WorkerState, key)
        return (dict(row.value), row.updated_at) if row else None


def states_under(store: Engine, prefix: str) -> dict[str, dict[str, Any]]:
    """Every published fact whose key starts with `prefix`, by the rest of its key."""
    with session_factory(store)() as s:
        under = WorkerState.key.startswith(prefix, autoescape=True)
        rows = s.scalars(select(WorkerState).where(under))
        return {row.key[len(prefix) :]: dict(row.value) for row in rows}
