"""The one "save by name" write: the user's named things (specs, profiles, SLOs, cost frames)
are created on first save and overwritten after, never duplicated."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, select

from storage.db import transaction
from storage.tables import Base


def upsert_by_name(store: Engine, table: type[Base], name: str, **values: Any) -> None:
    """Insert the row named `name` with `values`, or overwrite those values on it."""
    with transaction(store) as s:
        row = s.scalars(select(table).filter_by(name=name)).first()
        if row is None:
            s.add(table(name=name, **values))
            return
        for key, value in values.items():
            setattr(row, key, value)
        # Tables that show when a thing last changed keep an `updated_at` (its default only
        # covers the insert).
        if hasattr(row, "updated_at"):
            row.updated_at = time.time()
