"""The audit log: every state-changing action with who, when, what, its parameters (secrets
masked) and its outcome, in an append-only table; and `guarded`, the one way to do an
action: check the role, run it, record what happened (refused, failed or ok).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from sqlalchemy import Engine, insert, select

from planner.errors import Forbidden, KvscopeError
from storage.access.roles import Action, Actor, require
from storage.db import transaction
from storage.tables import AuditEntry

MASK = "••••"
# Keys whose values are secrets; a key ending in `_env` names a variable, not a secret, and
# token counts (`max_num_batched_tokens`) and tokenizers are not tokens.
_SECRET_KEY = re.compile(r"token(?!s|iz)|secret|passw|api[_-]?key|authorization|credential", re.I)
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]+")


def is_secret_key(key: str) -> bool:
    """Whether a parameter, variable or flag of this name holds a secret."""
    return bool(_SECRET_KEY.search(key)) and not key.lower().endswith("_env")


def mask(value: Any, known: tuple[str, ...] = ()) -> Any:
    """`value` with every secret masked: values under secret-looking keys, the argument
    after a secret-looking flag (`--api-key X`, `--api-key=X`), bearer tokens, and any of
    the `known` secret strings wherever they appear."""
    if isinstance(value, dict):
        return {
            k: MASK if is_secret_key(str(k)) and v not in (None, "") else mask(v, known)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        hide_next = False
        for item in value:
            if hide_next:
                out.append(MASK)
                hide_next = False
                continue
            if isinstance(item, str) and item.startswith("-") and is_secret_key(item):
                flag, eq, _ = item.partition("=")
                out.append(f"{flag}={MASK}" if eq else item)
                hide_next = not eq
                continue
            out.append(mask(item, known))
        return out
    if isinstance(value, str):
        text = _BEARER.sub(rf"\1 {MASK}", value)
        for secret in known:
            if secret and len(secret) >= 4:
                text = text.replace(secret, MASK)
        return text
    return value


@dataclass(frozen=True)
class AuditRow:
    """One audit entry, as read back."""

    id: int
    ts: float
    actor: str
    role: str
    origin: str
    action: str
    subject: str | None
    params: dict[str, Any]
    outcome: str
    message: str | None


def record(
    store: Engine,
    actor: Actor,
    action: Action | str,
    outcome: str,
    *,
    subject: str | None = None,
    params: dict[str, Any] | None = None,
    message: str | None = None,
) -> None:
    """Append one entry (its parameters and message masked)."""
    with transaction(store) as s:
        s.execute(
            insert(AuditEntry).values(
                ts=time.time(),
                actor=actor.name,
                role=str(actor.role),
                origin=str(actor.origin),
                action=str(action),
                subject=subject,
                params=mask(params or {}),
                outcome=outcome,
                message=None if message is None else mask(message),
            )
        )


@contextmanager
def guarded(
    store: Engine,
    actor: Actor,
    action: Action,
    subject: str | None = None,
    params: dict[str, Any] | None = None,
) -> Iterator[None]:
    """Do an action as `actor`: Forbidden (recorded as refused) unless the role allows it;
    a KvscopeError inside is recorded as failed (and raised); otherwise recorded as ok."""
    try:
        require(actor, action)
    except Forbidden as err:
        record(store, actor, action, "refused", subject=subject, params=params, message=str(err))
        raise
    try:
        yield
    except Forbidden as err:
        record(store, actor, action, "refused", subject=subject, params=params, message=str(err))
        raise
    except KvscopeError as err:
        record(store, actor, action, "failed", subject=subject, params=params, message=str(err))
        raise
    except Exception:
        record(store, actor, action, "failed", subject=subject, params=params, message="a bug")
        raise
    record(store, actor, action, "ok", subject=subject, params=params)


def entries(
    store: Engine, since: float = 0.0, until: float | None = None, limit: int | None = None
) -> list[AuditRow]:
    """Entries in [since, until], newest first."""
    stmt = select(AuditEntry).where(AuditEntry.ts >= since)
    if until is not None:
        stmt = stmt.where(AuditEntry.ts <= until)
    stmt = stmt.order_by(AuditEntry.ts.desc(), AuditEntry.id.desc())
    if limit is not None:
        stmt = stmt.limit(limit)
    with transaction(store) as s:
        return [
            AuditRow(
                e.id,
                e.ts,
                e.actor,
                e.role,
                e.origin,
                e.action,
                e.subject,
                dict(e.params),
                e.outcome,
                e.message,
            )
            for e in s.scalars(stmt)
        ]


def export_jsonl(store: Engine, out: TextIO, since: float = 0.0) -> int:
    """Every entry since `since`, oldest first, one JSON object a line; returns the count."""
    rows = sorted(entries(store, since), key=lambda r: (r.ts, r.id))
    for r in rows:
        out.write(json.dumps(r.__dict__, ensure_ascii=False, sort_keys=True) + "\n")
    return len(rows)


def read(
    store: Engine, actor: Actor, since: float = 0.0, limit: int | None = None
) -> list[AuditRow]:
    """Entries since `since`, newest first, for a person whose role may read the log."""
    require(actor, Action.AUDIT_READ)
    return entries(store, since, limit=limit)
