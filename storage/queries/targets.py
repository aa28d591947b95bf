"""Targets: the engines kvscope scrapes, their settings and last scrape outcome.

A target is found by name or id; the managed engine's own target is created here too.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from planner.errors import Conflict, InvalidInput, NotFound, validation_message
from storage.db import session_factory, transaction
from storage.queries.events import record_event
from storage.schemas import TargetIn, TargetRow
from storage.tables import Target


def _target_row(t: Target) -> TargetRow:
    return TargetRow.model_validate(t, from_attributes=True)


def parse_target(data: dict[str, Any]) -> TargetIn:
    """Validate user input for a target; InvalidInput with one line per bad field."""
    try:
        return TargetIn.model_validate(data)
    except ValidationError as err:
        raise InvalidInput(validation_message(err)) from err


def add_target(store: Engine, spec: TargetIn, *, actor: str | None = None) -> TargetRow:
    """Store a new target; its name must be free. `actor` (who added it) goes in the event."""
    try:
        with transaction(store) as s:
            t = Target(**spec.model_dump())
            s.add(t)
            s.flush()
            row = _target_row(t)
    except Conflict as err:
        raise InvalidInput(f"a target named {spec.name!r} already exists") from err
    record_event(
        store,
        "target_added",
        f"target {spec.name} added ({spec.base_url})",
        target_id=row.id,
        actor=actor,
    )
    return row


def update_target(store: Engine, name: str, spec: TargetIn) -> TargetRow:
    """Change a target's settings; its history stays."""
    try:
        with transaction(store) as s:
            t = _find(s, name)
            url_changed = t.base_url != spec.base_url
            for key, value in spec.model_dump().items():
                setattr(t, key, value)
            if url_changed:
                t.health, t.health_message, t.consecutive_failures = "unknown", None, 0
            s.flush()
            return _target_row(t)
    except Conflict as err:
        raise InvalidInput(f"a target named {spec.name!r} already exists") from err


def remove_target(store: Engine, name: str) -> None:
    """Delete a target with its series, samples and events."""
    with transaction(store) as s:
        t = _find(s, name)
        s.delete(t)


def list_targets(store: Engine, enabled_only: bool = False) -> list[TargetRow]:
    """All targets, by name."""
    with session_factory(store)() as s:
        q = select(Target).order_by(Target.name)
        if enabled_only:
            q = q.where(Target.enabled.is_(True))
        return [_target_row(t) for t in s.scalars(q)]


def get_target(store: Engine, key: str | int) -> TargetRow:
    """One target by id (an int), or by name (a str; digits fall back to the id)."""
    with session_factory(store)() as s:
        return _target_row(_find(s, key))


def find_target_by_url(store: Engine, base_url: str) -> TargetRow | None:
    """The stored target with this base URL, if any."""
    with session_factory(store)() as s:
        t = s.scalars(select(Target).where(Target.base_url == base_url)).first()
        return _target_row(t) if t else None


def _find(s: Session, key: str | int) -> Target:
    # A name wins over an id spelled the same: a target may be named "12".
    if isinstance(key, int):
        t = s.get(Target, key)
    else:
        t = s.scalars(select(Target).where(Target.name == key)).first()
        if t is None and key.isdigit():
            t = s.get(Target, int(key))
    if t is None:
        known = ", ".join(s.scalars(select(Target.name).order_by(Target.name))) or "none"
        what = f"with id {key}" if isinstance(key, int) else f"named {key!r}"
        raise NotFound(f"no target {what}; known targets: {known}")
    return t


def set_target_health(
    store: Engine,
    target_id: int,
    *,
    ok: bool,
    message: str | None,
    ts: float,
    cache_info: dict[str, str] | None = None,
    model_name: str | None = None,
) -> tuple[str, str]:
    """Record a scrape outcome; return (previous health, new health) for event decisions."""
    with transaction(store) as s:
        t = s.get(Target, target_id)
        if t is None:
            raise NotFound(f"target {target_id} no longer exists")
        before = t.health
        t.last_scrape_at = ts
        if ok:
            t.health = "degraded" if message else "up"
            t.health_message = message
            t.consecutive_failures = 0
            t.last_success_at = ts
            if model_name:
                t.model_name = model_name
            if cache_info:
                t.cache_info = dict(cache_info)
                t.num_gpu_blocks = _int(cache_info.get("num_gpu_blocks"))
                t.block_size = _int(cache_info.get("block_size"))
                t.cache_dtype = cache_info.get("cache_dtype")
        else:
            t.health = "down"
            t.health_message = message
            t.consecutive_failures += 1
        return before, t.health


def touch_target(store: Engine, target_id: int, *, health: str, ts: float) -> bool:
    """A healthy target scraped again with nothing new to say: only its times move. False
    when its stored health is no longer `health` (someone else wrote it): then the caller
    records the outcome in full."""
    with store.begin() as conn:
        result = conn.execute(
            update(Target)
            .where(Target.id == target_id, Target.health == health)
            .values(last_scrape_at=ts, last_success_at=ts, consecutive_failures=0)
        )
    return bool(result.rowcount)


def _int(v: str | None) -> int | None:
    try:
        return int(float(v)) if v not in (None, "", "None") else None
    except ValueError:
        return None


def upsert_managed_target(
    store: Engine,
    name: str,
    base_url: str,
    enabled: bool,
    health: str | None = None,
    message: str | None = None,
) -> int:
    """The target a managed engine is scraped as; created on first start."""
    with transaction(store) as s:
        t = s.scalars(select(Target).where(Target.name == name)).first()
        if t is None:
            t = Target(name=name, base_url=base_url, managed=True)
            s.add(t)
        t.base_url, t.managed, t.enabled = base_url, True, enabled
        if health is not None:
            t.health, t.health_message = health, message
            t.consecutive_failures = 0
        s.flush()
        return t.id
