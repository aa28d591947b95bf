"""Worker state: small facts the worker publishes for the console (heartbeat, GPU state,
rollup watermarks, each managed engine's state and log tail), one row per key."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from sqlalchemy import Engine, select, update

from storage.db import session_factory, transaction
from storage.tables import WorkerState


def put_state(store: Engine, key: str, value: dict[str, Any]) -> None:
    """Publish a small fact (heartbeat, GPU state) for the console."""
    with transaction(store) as s:
        row = s.get(WorkerState, key)
        if row is None:
            s.add(WorkerState(key=key, value=value, updated_at=time.time(), version=1))
        else:
            row.value, row.updated_at, row.version = value, time.time(), row.version + 1


def replace_state(store: Engine, key: str, value: dict[str, Any], version: int) -> bool:
    """Write `value` over the fact at `key` only while it is still the one `get_state`
    read (its `version`; a clock's tick can hold two writes): False where another writer
    came between, whose fact is kept."""
    with transaction(store) as s:
        done = s.execute(
            update(WorkerState)
            .where(WorkerState.key == key, WorkerState.version == version)
            .values(value=value, updated_at=time.time(), version=version + 1)
        )
        return bool(done.rowcount == 1)  # type: ignore[attr-defined]


class StoredFact(NamedTuple):
    """A published fact as read: its value, when it was written, and its version (how many
    times it was written), which `replace_state` compares."""

    value: dict[str, Any]
    updated_at: float
    version: int


def get_state(store: Engine, key: str) -> StoredFact | None:
    """A published fact, when it was written and its version."""
    with session_factory(store)() as s:
        row = s.get(WorkerState, key)
        return StoredFact(dict(row.value), row.updated_at, row.version) if row else None


def states_under(store: Engine, prefix: str) -> dict[str, dict[str, Any]]:
    """Every published fact whose key starts with `prefix`, by the rest of its key."""
    with session_factory(store)() as s:
        under = WorkerState.key.startswith(prefix, autoescape=True)
        rows = s.scalars(select(WorkerState).where(under))
        return {row.key[len(prefix) :]: dict(row.value) for row in rows}
