"""The Targets page refuses every outbound case with its reason, lets an admin allow hosts
in its "Allowed hosts" section, shows others the list read-only, and shows a stored target
off the allowlist with the plain refusal, no connection details (Streamlit AppTest)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, update
from streamlit.testing.v1 import AppTest

import app.common
from storage import queries as q
from storage.access import Actor, Origin, Role
from storage.db import transaction
from storage.outbound import allow_hint
from storage.tables import Target
from tests.support.pages import run_page


def _click(at: AppTest, label: str) -> None:
    next(b for b in at.button if b.label == label).click().run()
    assert not at.exception, [e.message for e in at.exception]


def _add(at: AppTest, url: str, token_env: str = "", name: str = "edge") -> list[str]:
    """Submit the attach form; the errors the page shows."""
    at.text_input(key="add_name").input(name)
    at.text_input(key="add_url").input(url)
    at.text_input(key="add_token").input(token_env)
    _click(at, "Add target")
    return [e.value for e in at.error]


def _allow(at: AppTest, pattern: str) -> list[str]:
    """Submit the allow form; the errors the page shows."""
    at.text_input(key="host_pattern").input(pattern)
    _click(at, "Allow")
    return [e.value for e in at.error]


@pytest.mark.parametrize(
    ("url", "token_env", "reason"),
    [
        ("http://169.254.169.254", "", "169.254.169.254 is a link-local or cloud metadata"),
        ("http://169.254.3.3:8000", "", "link-local or cloud metadata address"),
        ("http://[fe80::1]:8000", "", "link-local or cloud metadata address"),
        ("http://10.0.0.1:8000", "", allow_hint("10.0.0.1")),
        ("http://127.0.0.1:9", "HOME", "token variable HOME must start with KVSCOPE_TOKEN_"),
    ],
)
def test_each_outbound_case_is_refused_with_its_reason(
    store: Engine, url: str, token_env: str, reason: str
) -> None:
    at = run_page("targets")
    errors = _add(at, url, token_env)
    assert any(reason in e for e in errors), errors
    assert q.list_targets(store) == [] and q.list_runs(store) == []


def test_an_admin_allows_a_host_or_network_then_attaches_it(store: Engine) -> None:
    at = run_page("targets")
    assert any("No host beyond loopback" in i.value for i in at.info)
    assert any("never contacts those" in e for e in _allow(at, "169.254.169.254"))
    assert any("has host bits set" in e for e in _allow(at, "10.0.0.1/8"))
    assert _allow(at, "10.0.0.0/8") == []
    assert any("Allowed 10.0.0.0/8" in s.value for s in at.success)
    assert _add(at, "http://10.0.0.1:8000") == []
    assert [t.name for t in q.list_targets(store)] == ["edge"]
    # The page queued a check for the worker instead of calling the engine itself.
    assert [(r.kind, r.requested_by) for r in q.list_runs(store)] == [
        ("check_target", "local (admin, console)")
    ]
    # A metadata address stays refused after everything is allowed.
    assert _allow(at, "0.0.0.0/0") == []
    errors = _add(at, "http://169.254.169.254", name="meta")
    assert any("link-local or cloud metadata" in e for e in errors), errors
    # Removed, the network no longer admits a target.
    at.selectbox(key="host_remove_pick").select("10.0.0.0/8")
    _click(at, "Remove host")
    at.selectbox(key="host_remove_pick").select("0.0.0.0/0")
    _click(at, "Remove host")
    assert q.list_allowed_hosts(store) == []
    assert any(allow_hint("10.0.0.2") in e for e in _add(at, "http://10.0.0.2:8000", name="b"))


def test_the_setting_allows_hosts_and_is_listed(
    store: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_ALLOWED_HOSTS", "vllm.corp,10.9.0.0/16")
    at = run_page("targets")
    hosts = at.dataframe[-1].value
    assert hosts["host"].tolist() == ["vllm.corp", "10.9.0.0/16"]
    assert set(hosts["allowed by"]) == {"KVSCOPE_ALLOWED_HOSTS"}
    assert _add(at, "http://vllm.corp:8000") == []
    assert _add(at, "http://10.9.1.1:8000", name="net") == []
    assert [t.name for t in q.list_targets(store)] == ["edge", "net"]


def test_a_stored_target_off_the_allowlist_shows_only_the_refusal(
    store: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid = q.add_target(store, q.parse_target({"name": "old", "base_url": "http://127.0.0.1:1"})).id
    with transaction(store) as s:
        s.execute(update(Target).where(Target.id == tid).values(base_url="http://10.7.7.7:22"))
    q.set_target_health(store, tid, ok=False, message=allow_hint("10.7.7.7"), ts=1.0)
    monkeypatch.setattr(app.common, "actor", lambda: Actor("vera", Role.VIEWER, Origin.CONSOLE))
    at = run_page("targets")
    # Health messages are shown as text (escaped Markdown): what a target says is not markup.
    assert [e.value for e in at.error] == [app.common.md_text(allow_hint("10.7.7.7"))]
    # A viewer reads targets and hosts, and gets no form and no button.
    assert not at.text_input and not at.button
    assert any("An admin can allow a host" in c.value for c in at.caption)


def test_an_operator_checks_but_does_not_attach_or_allow(
    store: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    q.add_target(store, q.parse_target({"name": "local", "base_url": "http://127.0.0.1:1"}))
    monkeypatch.setattr(app.common, "actor", lambda: Actor("omar", Role.OPERATOR, Origin.CONSOLE))
    at = run_page("targets")
    assert [b.label for b in at.button] == ["Check now"]
    _click(at, "Check now")
    assert [(r.kind, r.requested_by) for r in q.list_runs(store)] == [
        ("check_target", "omar (operator, console)")
    ]
