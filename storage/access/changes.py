"""Guarded changes to what product owners and planners configure: SLOs and cost frames.
Each checks the person's role, validates, writes, and lands in the audit log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from planner.errors import InvalidInput
from planner.slo import SLO, parse_slo
from storage import queries as q
from storage.access.audit import guarded
from storage.access.roles import Action, Actor
from storage.schemas import TargetRow


def save_slo(store: Engine, actor: Actor, data: Mapping[str, Any], target: TargetRow | None) -> SLO:
    """Create or replace an SLO (for every target, or for `target`), as `actor`."""
    subject = f"{data.get('name')} for {target.name if target else 'every target'}"
    with guarded(store, actor, Action.SLO_SAVE, subject, dict(data)):
        slo = parse_slo(data)
        q.save_slo(store, slo.name, slo.model_dump(), None if target is None else target.id)
        return slo


def remove_slo(store: Engine, actor: Actor, name: str) -> None:
    """Delete an SLO (alert rules fall back to their own bounds), as `actor`."""
    with guarded(store, actor, Action.SLO_REMOVE, name):
        q.remove_slo(store, name)


def save_cost_frame(
    store: Engine, actor: Actor, name: str, inputs: dict[str, Any], ladder: list[Any]
) -> None:
    """Record a reserve-vs-violation frame under `name`, as `actor`."""
    with guarded(store, actor, Action.COST_SAVE, name, {"inputs": inputs}):
        if not name.strip() or len(name) > 100:
            raise InvalidInput("a frame needs a name of 1 to 100 characters")
        q.save_cost_frame(store, name, inputs, ladder)
