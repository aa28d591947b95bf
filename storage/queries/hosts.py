"""Allowed hosts: the `allowed_hosts` table, and the allowlist it makes with the setting.

Entries are stored in canonical spelling (`storage.outbound.parse_entry`), so a host is
found again however it was typed.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Engine, select

from planner.errors import Conflict, InvalidInput, NotFound
from storage.db import session_factory, transaction
from storage.outbound import Allowlist
from storage.schemas import AllowedHostRow
from storage.tables import AllowedHost


def list_allowed_hosts(store: Engine) -> list[AllowedHostRow]:
    """The table's entries, oldest first."""
    with session_factory(store)() as s:
        rows = s.scalars(select(AllowedHost).order_by(AllowedHost.added_at, AllowedHost.id))
        return [
            AllowedHostRow(
                pattern=h.pattern,
                source="table",
                note=h.note,
                added_by=h.added_by,
                added_at=h.added_at,
            )
            for h in rows
        ]


def allow_host(store: Engine, pattern: str, note: str | None, added_by: str) -> AllowedHostRow:
    """Store an entry (already in canonical spelling); it must not be there yet."""
    try:
        with transaction(store) as s:
            h = AllowedHost(pattern=pattern, note=note or None, added_by=added_by)
            s.add(h)
            s.flush()
            return AllowedHostRow(
                pattern=h.pattern,
                source="table",
                note=h.note,
                added_by=h.added_by,
                added_at=h.added_at,
            )
    except Conflict as err:
        raise InvalidInput(f"{pattern} is already allowed") from err


def remove_allowed_host(store: Engine, pattern: str) -> None:
    """Delete an entry; NotFound, naming those there are, when it is not there."""
    with transaction(store) as s:
        row = s.scalars(select(AllowedHost).where(AllowedHost.pattern == pattern)).first()
        if row is None:
            known = ", ".join(s.scalars(select(AllowedHost.pattern).order_by(AllowedHost.id)))
            raise NotFound(f"{pattern} is not an allowed host; allowed: {known or 'none'}")
        s.delete(row)


def allowlist(store: Engine, configured: Iterable[str] = ()) -> Allowlist:
    """Loopback, the setting's entries and the table's: where targets may point now."""
    with session_factory(store)() as s:
        stored = list(s.scalars(select(AllowedHost.pattern)))
    return Allowlist.of(configured).plus(*stored)
