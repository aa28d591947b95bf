"""Cost frames: the named inputs and GPU ladder of a reserve-vs-violation comparison, kept
so the Cost page and the CLI can reopen one."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select

from storage.db import session_factory
from storage.queries._upsert import upsert_by_name
from storage.tables import CostFrame


def save_cost_frame(store: Engine, name: str, inputs: dict[str, Any], ladder: list[Any]) -> None:
    """Record a cost frame (inputs and ladder validated by the caller)."""
    upsert_by_name(store, CostFrame, name, inputs=inputs, ladder=ladder)


def cost_frames(store: Engine) -> dict[str, tuple[dict[str, Any], list[Any]]]:
    """Every recorded cost frame: name -> (inputs, ladder)."""
    with session_factory(store)() as s:
        return {r.name: (dict(r.inputs), list(r.ladder)) for r in s.scalars(select(CostFrame))}
