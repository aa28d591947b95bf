"""Targets and allowed hosts as guarded actions: who may change them, what is refused before
anything is stored (a host off the allowlist, metadata whatever is allowed, a token variable
without the prefix), and that every attempt lands in the audit log."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from planner.errors import Forbidden, InvalidInput, NotFound, OutboundRefused
from storage import queries as q
from storage.access import Actor, Origin, Role, entries
from storage.access import targets as access

VIEWER = Actor("vera", Role.VIEWER, Origin.CONSOLE)
OPERATOR = Actor("omar", Role.OPERATOR, Origin.CONSOLE)
ADMIN = Actor("ada", Role.ADMIN, Origin.CONSOLE)


def _add(store: Engine, url: str, token_env: str | None = None, name: str = "t") -> None:
    access.add_target(store, ADMIN, {"name": name, "base_url": url, "token_env": token_env})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://169.254.169.254", "link-local or cloud metadata address"),
        ("http://169.254.10.1:8000", "link-local or cloud metadata address"),
        ("http://[fe80::1]:8000", "link-local or cloud metadata address"),
        ("http://metadata.google.internal", "cloud metadata service"),
        ("http://10.0.0.5:8000", "10.0.0.5 is not an allowed host: an admin can allow it"),
        ("http://vllm.corp:8000", "`kvscope hosts allow vllm.corp`"),
    ],
)
def test_a_target_off_the_allowlist_is_refused_and_nothing_is_stored(
    store: Engine, url: str, message: str
) -> None:
    with pytest.raises(OutboundRefused, match=message.replace("`", ".")):
        _add(store, url)
    assert q.list_targets(store) == []
    (entry,) = entries(store)
    assert (entry.action, entry.outcome) == ("target.add", "failed")
    assert message.split("`")[0] in (entry.message or "")


def test_a_host_allowed_by_an_admin_may_be_a_target_until_it_is_removed(store: Engine) -> None:
    with pytest.raises(Forbidden, match=r"host\.allow needs the admin role"):
        access.allow_host(store, OPERATOR, "10.0.0.5")
    row = access.allow_host(store, ADMIN, " 10.0.0.5 ", "the GPU box")
    assert (row.pattern, row.note, row.added_by, row.source) == (
        "10.0.0.5",
        "the GPU box",
        "ada",
        "table",
    )
    with pytest.raises(InvalidInput, match="already allowed"):
        access.allow_host(store, ADMIN, "10.0.0.5")
    _add(store, "http://10.0.0.5:8000")
    target = q.get_target(store, "t")
    run = access.check_target(store, OPERATOR, target)
    assert (run.kind, run.target_id, run.requested_by) == (
        "check_target",
        target.id,
        "omar (operator, console)",
    )
    access.remove_host(store, ADMIN, "10.0.0.5")
    with pytest.raises(OutboundRefused, match="not an allowed host"):
        access.check_target(store, OPERATOR, target)
    with pytest.raises(NotFound, match=r"10\.0\.0\.5 is not an allowed host; allowed: none"):
        access.remove_host(store, ADMIN, "10.0.0.5")


def test_metadata_stays_refused_whatever_an_admin_allows(store: Engine) -> None:
    for pattern in ("169.254.169.254", "169.254.0.0/16", "fd00:ec2::254", "100.100.100.200"):
        with pytest.raises(InvalidInput, match="kvscope never contacts those, even when allowed"):
            access.allow_host(store, ADMIN, pattern)
    access.allow_host(store, ADMIN, "0.0.0.0/0")  # everything IPv4 ...
    _add(store, "http://10.1.1.1:8000")
    with pytest.raises(OutboundRefused, match="link-local or cloud metadata"):
        _add(store, "http://169.254.169.254", name="meta")  # ... but never metadata
    assert [h.pattern for h in access.allowed_hosts(store)] == ["0.0.0.0/0"]


def test_a_network_allows_every_address_in_it_and_the_setting_counts_too(store: Engine) -> None:
    access.allow_host(store, ADMIN, "10.20.0.0/16")
    _add(store, "http://10.20.3.4:8000", name="inside")
    with pytest.raises(OutboundRefused, match=r"10\.21\.0\.1 is not an allowed host"):
        _add(store, "http://10.21.0.1:8000", name="outside")
    configured = ("vllm.corp",)
    access.add_target(
        store, ADMIN, {"name": "named", "base_url": "http://vllm.corp:8000"}, configured
    )
    listed = access.allowed_hosts(store, configured)
    assert [(h.pattern, h.source) for h in listed] == [
        ("vllm.corp", "setting"),
        ("10.20.0.0/16", "table"),
    ]
    with pytest.raises(InvalidInput, match="allowed by KVSCOPE_ALLOWED_HOSTS"):
        access.remove_host(store, ADMIN, "vllm.corp", configured)


def test_a_token_variable_needs_the_prefix(store: Engine) -> None:
    with pytest.raises(InvalidInput, match="token variable HOME must start with KVSCOPE_TOKEN_"):
        _add(store, "http://127.0.0.1:9", token_env="HOME")
    _add(store, "http://127.0.0.1:9", token_env="KVSCOPE_TOKEN_PROD")
    with pytest.raises(InvalidInput, match="must start with KVSCOPE_TOKEN_"):
        access.update_target(
            store,
            ADMIN,
            "t",
            {"name": "t", "base_url": "http://127.0.0.1:9", "token_env": "AWS_SECRET_ACCESS_KEY"},
        )
    assert q.get_target(store, "t").token_env == "KVSCOPE_TOKEN_PROD"


def test_roles_attach_check_and_remove(store: Engine) -> None:
    data = {"name": "t", "base_url": "http://127.0.0.1:9"}
    with pytest.raises(Forbidden, match=r"target\.add needs the admin role"):
        access.add_target(store, OPERATOR, data)
    row = access.add_target(store, ADMIN, data)
    with pytest.raises(Forbidden, match=r"target\.check needs the operator role"):
        access.check_target(store, VIEWER, row)
    with pytest.raises(Forbidden, match=r"target\.update needs the admin role"):
        access.update_target(store, OPERATOR, "t", data | {"enabled": False})
    assert access.update_target(store, ADMIN, "t", data | {"enabled": False}).enabled is False
    with pytest.raises(Forbidden, match=r"target\.remove needs the admin role"):
        access.remove_target(store, OPERATOR, "t")
    with pytest.raises(InvalidInput, match="made by its engine"):
        access.add_target(store, ADMIN, data | {"name": "m", "managed": True})
    access.remove_target(store, ADMIN, "t")
    assert q.list_targets(store) == []
    outcomes = [(e.actor, e.action, e.outcome) for e in reversed(entries(store))]
    assert outcomes == [
        ("omar", "target.add", "refused"),
        ("ada", "target.add", "ok"),
        ("vera", "target.check", "refused"),
        ("omar", "target.update", "refused"),
        ("ada", "target.update", "ok"),
        ("omar", "target.remove", "refused"),
        ("ada", "target.add", "failed"),
        ("ada", "target.remove", "ok"),
    ]
