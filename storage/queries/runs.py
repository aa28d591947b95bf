"""The work queue: probe runs and engine commands the console requests and the worker claims.

A run moves queued -> running -> done / failed / cancelled, or interrupted when the worker
that ran it died; the CLI's own runs start as running so no worker picks them up.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, func, select, update

from planner.errors import InvalidInput, NotFound
from storage.db import session_factory, transaction
from storage.schemas import RunRow
from storage.tables import ProbeRun

ACTIVE_STATES = ("queued", "running")
FINAL_STATES = ("done", "failed", "cancelled", "interrupted", "timed_out")
RUN_STATES = (*ACTIVE_STATES, *FINAL_STATES)


def _run_row(run: ProbeRun) -> RunRow:
    return RunRow.model_validate(run, from_attributes=True)


def request_run(
    store: Engine,
    kind: str,
    params: dict[str, Any] | None = None,
    target_id: int | None = None,
    *,
    requested_by: str | None = None,
) -> RunRow:
    """Queue a unit of work for the worker (the guarded actions call this, saying who
    asked; the worker's own schedules leave `requested_by` empty)."""
    with transaction(store) as s:
        run = ProbeRun(
            kind=kind,
            params=params or {},
            target_id=target_id,
            status="queued",
            requested_by=requested_by,
        )
        s.add(run)
        s.flush()
        return _run_row(run)


def start_run(
    store: Engine,
    kind: str,
    params: dict[str, Any],
    target_id: int | None = None,
    *,
    requested_by: str | None = None,
) -> RunRow:
    """A run carried out by the caller itself (the CLI): stored as running, never queued, so
    no worker picks it up."""
    with transaction(store) as s:
        run = ProbeRun(
            kind=kind,
            params=params,
            target_id=target_id,
            status="running",
            started_at=time.time(),
            requested_by=requested_by,
        )
        s.add(run)
        s.flush()
        return _run_row(run)


def get_run(store: Engine, run_id: int) -> RunRow:
    """One run by id."""
    with session_factory(store)() as s:
        run = s.get(ProbeRun, run_id)
        if run is None:
            raise NotFound(f"no probe run with id {run_id}")
        return _run_row(run)


def list_runs(store: Engine, kind: str | None = None, limit: int = 100) -> list[RunRow]:
    """Newest runs first."""
    with session_factory(store)() as s:
        q = select(ProbeRun).order_by(ProbeRun.id.desc()).limit(limit)
        if kind:
            q = q.where(ProbeRun.kind == kind)
        return [_run_row(r) for r in s.scalars(q)]


def claim_next_run(store: Engine, kinds: Sequence[str]) -> RunRow | None:
    """Atomically move the oldest queued run of a handled kind to `running`."""
    with transaction(store) as s:
        run = s.scalars(
            select(ProbeRun)
            .where(ProbeRun.status == "queued", ProbeRun.kind.in_(kinds))
            .order_by(ProbeRun.id)
            .limit(1)
        ).first()
        if run is None:
            return None
        claimed = s.execute(
            update(ProbeRun)
            .where(ProbeRun.id == run.id, ProbeRun.status == "queued")
            .values(status="running", started_at=time.time())
        ).rowcount  # type: ignore[attr-defined]
        if not claimed:
            return None
        s.refresh(run)
        return _run_row(run)


def queued_count(store: Engine) -> int:
    """How many runs wait to be claimed (a read, so an idle queue costs no write lock)."""
    with store.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(ProbeRun).where(ProbeRun.status == "queued")
            ).scalar_one()
        )


def fail_unknown_runs(store: Engine, kinds: Sequence[str]) -> int:
    """Fail queued runs no handler exists for, so they do not wait forever."""
    with transaction(store) as s:
        runs = s.scalars(
            select(ProbeRun).where(ProbeRun.status == "queued", ProbeRun.kind.not_in(kinds))
        ).all()
        for run in runs:
            run.status, run.finished_at = "failed", time.time()
            run.error = (
                f"this worker has no handler for '{run.kind}' runs; "
                f"it handles: {', '.join(sorted(kinds))}"
            )
        return len(runs)


def update_run(store: Engine, run_id: int, *, only_running: bool = False, **values: Any) -> bool:
    """Write progress, summary or a final status of a run; with `only_running`, only while
    it still runs (a run the worker already gave up on keeps that verdict). True if written."""
    if "status" in values and values["status"] not in RUN_STATES:
        raise InvalidInput(f"unknown run status {values['status']!r}")
    if values.get("status") in FINAL_STATES:
        values.setdefault("finished_at", time.time())
    where = [ProbeRun.id == run_id]
    if only_running:
        where.append(ProbeRun.status == "running")
    with transaction(store) as s:
        done = s.execute(update(ProbeRun).where(*where).values(**values))
        return bool(done.rowcount)  # type: ignore[attr-defined]


def cancel_run(store: Engine, run_id: int) -> None:
    """Ask for a run to stop; a queued run is cancelled at once."""
    with transaction(store) as s:
        run = s.get(ProbeRun, run_id)
        if run is None:
            raise NotFound(f"no probe run with id {run_id}")
        if run.status == "queued":
            run.status, run.finished_at = "cancelled", time.time()
        elif run.status == "running":
            run.cancel_requested = True


def interrupt_running(store: Engine, reason: str) -> int:
    """Mark runs left `running` by a dead worker as interrupted."""
    with transaction(store) as s:
        runs = s.scalars(select(ProbeRun).where(ProbeRun.status == "running")).all()
        for run in runs:
            run.status, run.error, run.finished_at = "interrupted", reason, time.time()
        return len(runs)
