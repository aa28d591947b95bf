"""Managed engine specs: what `vllm serve` to run (validated by the engine room), whether it
should be running, and the spec as last started, which the worker's supervision follows: a
saved change takes effect only when someone allowed to starts or restarts the engine."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, select

from planner.errors import InvalidInput, NotFound
from storage.db import session_factory, transaction
from storage.queries._upsert import upsert_by_name
from storage.tables import EngineSpecRow


def save_engine_spec(store: Engine, name: str, spec: dict[str, Any]) -> None:
    """Create or replace the stored spec of a managed engine (validated by the caller)."""
    upsert_by_name(store, EngineSpecRow, name, spec=spec)


def get_engine_spec(store: Engine, name: str) -> tuple[dict[str, Any], str]:
    """(spec, desired state) of a managed engine."""
    with session_factory(store)() as s:
        row = s.scalars(select(EngineSpecRow).where(EngineSpecRow.name == name)).first()
        if row is None:
            known = ", ".join(s.scalars(select(EngineSpecRow.name))) or "none"
            raise NotFound(f"no engine spec named {name!r}; known engines: {known}")
        return dict(row.spec), row.desired_state


def get_started_spec(store: Engine, name: str) -> dict[str, Any] | None:
    """The spec a managed engine was last started with, None if it never was."""
    with session_factory(store)() as s:
        row = s.scalars(select(EngineSpecRow).where(EngineSpecRow.name == name)).first()
        if row is None:
            raise NotFound(f"no engine spec named {name!r}")
        return None if row.started_spec is None else dict(row.started_spec)


def mark_started(store: Engine, name: str, spec: dict[str, Any]) -> None:
    """Record that `spec` was started on request and is wanted running: supervision restarts
    exactly this after a crash, whatever is saved meanwhile."""
    with transaction(store) as s:
        row = s.scalars(select(EngineSpecRow).where(EngineSpecRow.name == name)).first()
        if row is None:
            raise NotFound(f"no engine spec named {name!r}")
        row.started_spec, row.desired_state, row.updated_at = dict(spec), "running", time.time()


def list_started_specs(store: Engine) -> dict[str, dict[str, Any] | None]:
    """Each managed engine's spec as last started (None: never started)."""
    with session_factory(store)() as s:
        rows = s.execute(select(EngineSpecRow.name, EngineSpecRow.started_spec))
        return {name: None if spec is None else dict(spec) for name, spec in rows}


def list_engine_specs(store: Engine) -> list[tuple[str, dict[str, Any], str]]:
    """(name, spec, desired state) of every managed engine."""
    with session_factory(store)() as s:
        rows = s.scalars(select(EngineSpecRow).order_by(EngineSpecRow.name))
        return [(r.name, dict(r.spec), r.desired_state) for r in rows]


def set_desired_state(store: Engine, name: str, state: str) -> None:
    """Record whether a managed engine should run (the worker restarts it after a crash)."""
    if state not in ("running", "stopped"):
        raise InvalidInput(f"desired state must be running or stopped, not {state!r}")
    with transaction(store) as s:
        row = s.scalars(select(EngineSpecRow).where(EngineSpecRow.name == name)).first()
        if row is None:
            raise NotFound(f"no engine spec named {name!r}")
        row.desired_state, row.updated_at = state, time.time()
