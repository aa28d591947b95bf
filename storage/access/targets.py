"""Guarded changes to where kvscope sends requests: targets (add, update, remove, check) and
the allowed hosts. Each checks the person's role, refuses a host off the allowlist (or
always refused) before anything is stored or contacted, and lands in the audit log.

`configured` is always the setting's entries (`Settings.allowed_hosts`), read at the entry
point and handed down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Engine

from planner.errors import InvalidInput
from storage import queries as q
from storage.access.audit import guarded
from storage.access.roles import Action, Actor
from storage.outbound import Allowlist, canonical_host, parse_entry
from storage.schemas import AllowedHostRow, RunRow, TargetIn, TargetRow


def _admit(store: Engine, spec: TargetIn, configured: Iterable[str]) -> None:
    """OutboundRefused unless the target's host is allowed now (judged as written)."""
    q.allowlist(store, configured).check(urlsplit(spec.base_url).hostname or "")


def add_target(
    store: Engine, actor: Actor, data: Mapping[str, Any], configured: Iterable[str] = ()
) -> TargetRow:
    """Attach an engine by URL, as `actor`; its host must be allowed, its token variable
    carry the KVSCOPE_TOKEN_ prefix."""
    with guarded(store, actor, Action.TARGET_ADD, str(data.get("name")), dict(data)):
        spec = q.parse_target(dict(data))
        if spec.managed:
            raise InvalidInput("a managed engine's target is made by its engine, not added")
        _admit(store, spec, configured)
        return q.add_target(store, spec, actor=str(actor))


def update_target(
    store: Engine,
    actor: Actor,
    name: str,
    data: Mapping[str, Any],
    configured: Iterable[str] = (),
) -> TargetRow:
    """Change a target's settings, as `actor`; a changed URL must be allowed too (a managed
    engine's URL is its spec's, and stays)."""
    with guarded(store, actor, Action.TARGET_UPDATE, name, dict(data)):
        before = q.get_target(store, name)
        spec = q.parse_target(dict(data) | {"managed": before.managed})
        if not (before.managed and spec.base_url == before.base_url):
            _admit(store, spec, configured)
        return q.update_target(store, name, spec)


def remove_target(store: Engine, actor: Actor, name: str) -> None:
    """Delete a target with its history, as `actor`."""
    with guarded(store, actor, Action.TARGET_REMOVE, name):
        q.remove_target(store, name)


def check_target(
    store: Engine, actor: Actor, target: TargetRow, configured: Iterable[str] = ()
) -> RunRow:
    """Queue a check the worker carries out, as `actor`; a host off the allowlist is
    refused here, with no check queued."""
    with guarded(store, actor, Action.TARGET_CHECK, target.name):
        if not target.managed:
            q.allowlist(store, configured).check(urlsplit(target.base_url).hostname or "")
        return q.request_run(store, "check_target", target_id=target.id, requested_by=str(actor))


def allowed_hosts(store: Engine, configured: Iterable[str] = ()) -> list[AllowedHostRow]:
    """Every entry: the setting's, then the table's."""
    given = [AllowedHostRow(pattern=p, source="setting") for p in configured]
    return given + q.list_allowed_hosts(store)


def allow_host(
    store: Engine,
    actor: Actor,
    pattern: str,
    note: str | None = None,
    configured: Iterable[str] = (),
) -> AllowedHostRow:
    """Let targets point at a host, an address or a network (CIDR), as `actor`; link-local
    and cloud metadata addresses are refused whoever asks."""
    with guarded(store, actor, Action.HOST_ALLOW, pattern, {"note": note}):
        entry = parse_entry(pattern)
        if entry.text in tuple(configured):
            raise InvalidInput(f"{entry.text} is already allowed by KVSCOPE_ALLOWED_HOSTS")
        if note is not None and len(note) > 500:
            raise InvalidInput("a note is at most 500 characters")
        return q.allow_host(store, entry.text, (note or "").strip() or None, actor.name)


def remove_host(store: Engine, actor: Actor, pattern: str, configured: Iterable[str] = ()) -> None:
    """Stop allowing an entry, as `actor`: targets on it are refused from the worker's next
    sync (within seconds). An entry of the setting is changed in the setting."""
    with guarded(store, actor, Action.HOST_REMOVE, pattern):
        try:
            text = parse_entry(pattern).text
        except InvalidInput:
            text = canonical_host(pattern)  # an entry a later kvscope refuses: still removable
        if text in tuple(configured):
            raise InvalidInput(
                f"{text} is allowed by KVSCOPE_ALLOWED_HOSTS: remove it there and restart "
                "the worker and the console"
            )
        q.remove_allowed_host(store, text)


def allowlist(store: Engine, configured: Iterable[str] = ()) -> Allowlist:
    """Where targets may point now (a read, for pages and commands)."""
    return q.allowlist(store, configured)
