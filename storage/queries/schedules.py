"""What users set up for recurring probes: probe schedules and named workload profiles.

The worker turns each enabled schedule into a job that queues its probe, unless the run it
queued last is still active.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select

from planner.errors import InvalidInput, NotFound
from storage.db import session_factory, transaction
from storage.queries._upsert import upsert_by_name
from storage.queries.runs import ACTIVE_STATES
from storage.schemas import ScheduleRow
from storage.tables import ProbeRun, ProbeSchedule, WorkloadProfileRow


def add_schedule(
    store: Engine, target_id: int, kind: str, params: dict[str, Any], every_s: float
) -> ScheduleRow:
    """Store a probe schedule (parameters validated by the caller)."""
    if every_s < 10:
        raise InvalidInput(f"a schedule runs at most every 10 s, not every {every_s:g} s")
    with transaction(store) as s:
        row = ProbeSchedule(target_id=target_id, kind=kind, params=params, every_s=every_s)
        s.add(row)
        s.flush()
        return ScheduleRow.model_validate(row, from_attributes=True)


def list_schedules(store: Engine, enabled_only: bool = False) -> list[ScheduleRow]:
    """Every probe schedule."""
    with session_factory(store)() as s:
        q = select(ProbeSchedule).order_by(ProbeSchedule.id)
        if enabled_only:
            q = q.where(ProbeSchedule.enabled.is_(True))
        return [ScheduleRow.model_validate(r, from_attributes=True) for r in s.scalars(q)]


def remove_schedule(store: Engine, schedule_id: int) -> None:
    """Delete a probe schedule (its past runs stay)."""
    with transaction(store) as s:
        row = s.get(ProbeSchedule, schedule_id)
        if row is None:
            raise NotFound(f"no probe schedule with id {schedule_id}")
        s.delete(row)


def active_run_of_schedule(store: Engine, schedule_id: int) -> bool:
    """Whether a run this schedule queued is still queued or running."""
    with session_factory(store)() as s:
        runs = s.scalars(select(ProbeRun).where(ProbeRun.status.in_(ACTIVE_STATES))).all()
        return any(r.params.get("schedule_id") == schedule_id for r in runs)


def save_profile(store: Engine, name: str, profile: dict[str, Any]) -> None:
    """Store a workload profile under a name (validated by the caller)."""
    upsert_by_name(store, WorkloadProfileRow, name, profile=profile)


def stored_profiles(store: Engine) -> dict[str, dict[str, Any]]:
    """Every stored workload profile by name."""
    with session_factory(store)() as s:
        return {r.name: dict(r.profile) for r in s.scalars(select(WorkloadProfileRow))}
