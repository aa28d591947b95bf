"""Leases: which process may act as the worker of this store, so two never share it.

A lease is a row held by one holder until it stops renewing it. Taking it is one guarded
UPDATE (or the INSERT of a missing row), so two processes asking at once cannot both win.
"""

from __future__ import annotations

import time

from pydantic import BaseModel
from sqlalchemy import Engine, delete, update

from planner.errors import Conflict
from storage.db import session_factory, transaction
from storage.tables import WorkerLease


class LeaseRow(BaseModel):
    """Who holds a lease, and until when (wall clock)."""

    name: str
    holder: str
    pid: int
    host: str
    acquired_at: float
    renewed_at: float
    expires_at: float


def _row(lease: WorkerLease) -> LeaseRow:
    return LeaseRow.model_validate(lease, from_attributes=True)


def get_lease(store: Engine, name: str) -> LeaseRow | None:
    """The lease as stored, held or expired."""
    with session_factory(store)() as s:
        lease = s.get(WorkerLease, name)
        return _row(lease) if lease else None


def acquire_lease(
    store: Engine,
    name: str,
    holder: str,
    pid: int,
    host: str,
    ttl_s: float,
    take_from: str | None = None,
) -> LeaseRow:
    """Take the lease if it is free, expired, already ours (or held by `take_from`, a holder
    the caller knows is dead); return it as it stands, taken or not."""
    now = time.time()
    values = {
        "holder": holder,
        "pid": pid,
        "host": host,
        "acquired_at": now,
        "renewed_at": now,
        "expires_at": now + ttl_s,
    }
    free = (WorkerLease.expires_at < now) | (WorkerLease.holder == holder)
    if take_from is not None:
        free = free | (WorkerLease.holder == take_from)
    with transaction(store) as s:
        taken = s.execute(update(WorkerLease).where(WorkerLease.name == name, free).values(values))
        if not taken.rowcount:  # type: ignore[attr-defined]
            try:
                with s.begin_nested():
                    s.add(WorkerLease(name=name, **values))
            except Conflict:
                pass  # held by another, and not expired
    current = get_lease(store, name)
    assert current is not None
    return current


def renew_lease(store: Engine, name: str, holder: str, ttl_s: float) -> bool:
    """Extend our lease; False when it is no longer ours (expired and taken over)."""
    now = time.time()
    with transaction(store) as s:
        done = s.execute(
            update(WorkerLease)
            .where(WorkerLease.name == name, WorkerLease.holder == holder)
            .values(renewed_at=now, expires_at=now + ttl_s)
        )
        return bool(done.rowcount)  # type: ignore[attr-defined]


def release_lease(store: Engine, name: str, holder: str) -> None:
    """Give the lease up (a clean stop), so the next worker need not wait for it to expire."""
    with transaction(store) as s:
        s.execute(delete(WorkerLease).where(WorkerLease.name == name, WorkerLease.holder == holder))
