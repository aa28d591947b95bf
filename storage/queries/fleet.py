"""Several workers on one store (PostgreSQL): who is alive, and which worker scrapes which
target.

A worker is a member while its `member:<key>` lease row is renewed. Targets are dealt out
by rendezvous hashing over the live members (each member's share changes only by the
targets that must move when one joins or leaves), and a worker scrapes a target only while
it holds the target's claim row: it releases the targets that are no longer its own before
another takes them, so no target is scraped by two workers at once.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Collection, Iterable

from sqlalchemy import Engine, delete, select, update

from planner.errors import Conflict
from storage.db import session_factory, transaction
from storage.queries.leases import LeaseRow
from storage.tables import ScrapeClaim, WorkerLease

MEMBER = "member:"


def member_lease(key: str) -> str:
    """The lease row that says worker `key` is alive."""
    return MEMBER + key


def member_leases(store: Engine) -> list[LeaseRow]:
    """Every worker's membership row, expired or not (its holder is the worker's key)."""
    with session_factory(store)() as s:
        rows = s.scalars(select(WorkerLease).where(WorkerLease.name.startswith(MEMBER))).all()
        return [LeaseRow.model_validate(r, from_attributes=True) for r in rows]


def live_members(store: Engine, alive: Callable[[LeaseRow], bool] | None = None) -> list[str]:
    """Keys of the workers whose membership has not expired (and, where `alive` can tell,
    whose process still runs), in a stable order."""
    now = time.time()
    return sorted(
        r.holder
        for r in member_leases(store)
        if r.expires_at >= now and (alive is None or alive(r))
    )


def owner(target_id: int, members: Iterable[str]) -> str | None:
    """The member that should scrape `target_id` (highest random weight)."""

    def weight(member: str) -> bytes:
        return hashlib.blake2b(f"{target_id}/{member}".encode(), digest_size=8).digest()

    return max(members, key=weight, default=None)


def settle_claims(
    store: Engine, holder: str, wanted: Collection[int], members: Collection[str], ttl_s: float
) -> set[int]:
    """Release `holder`'s claims outside `wanted`, renew those inside, take the wanted ones
    that are free (never claimed, expired, or held by a worker that is not a member);
    return the targets `holder` now holds."""
    now = time.time()
    wanted = set(wanted)
    mine = ScrapeClaim.holder == holder
    with transaction(store) as s:
        s.execute(
            update(ScrapeClaim).where(mine, ScrapeClaim.target_id.not_in(wanted)).values(until=0.0)
        )
        if wanted:
            free = (ScrapeClaim.until < now) | ScrapeClaim.holder.not_in(set(members) | {holder})
            s.execute(
                update(ScrapeClaim)
                .where(ScrapeClaim.target_id.in_(wanted), mine | free)
                .values(holder=holder, until=now + ttl_s)
            )
            known = set(
                s.scalars(select(ScrapeClaim.target_id).where(ScrapeClaim.target_id.in_(wanted)))
            )
            for tid in wanted - known:
                try:
                    with s.begin_nested():
                        s.add(ScrapeClaim(target_id=tid, holder=holder, until=now + ttl_s))
                except Conflict:
                    pass  # another worker took it first, or the target was just removed
        return set(s.scalars(select(ScrapeClaim.target_id).where(mine, ScrapeClaim.until >= now)))


def release_claims(store: Engine, holder: str) -> None:
    """Give up every claim (a clean stop): the others take the targets at their next pass."""
    with transaction(store) as s:
        s.execute(delete(ScrapeClaim).where(ScrapeClaim.holder == holder))


def claims(store: Engine) -> dict[int, str]:
    """Target id -> the worker that holds its claim now."""
    now = time.time()
    with session_factory(store)() as s:
        rows = s.execute(
            select(ScrapeClaim.target_id, ScrapeClaim.holder).where(ScrapeClaim.until >= now)
        )
        return {tid: holder for tid, holder in rows}
