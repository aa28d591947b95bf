"""Sign-in and roles in the console (Streamlit's AppTest): the sign-in page stands before
every page once a users file exists, sessions expire, and each role gets what the table
gives it on the pages themselves, refused on the server side with the reason."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import streamlit as st
from sqlalchemy import Engine
from streamlit.testing.v1 import AppTest

from app.auth import SESSION
from storage import queries as q
from storage.access import Actor, Origin, Role, entries
from storage.access import users as accounts
from storage.settings import Settings

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"
PASSWORD = "correct horse battery"
OWNER = Actor("root", Role.ADMIN, Origin.CLI)
PEOPLE = {"viewer": "vera", "operator": "omar", "admin": "ada"}


@pytest.fixture
def team(settings: Settings, store: Engine) -> Path:
    for role, name in PEOPLE.items():
        accounts.add_user(store, OWNER, settings.users_file, name, Role(role), PASSWORD)
    return settings.users_file


def _page(name: str, role: str | None, expires_in: float = 3600) -> AppTest:
    """Page `name` as the main script draws it (inside the error boundary), signed in."""
    script = (
        f"from app.common import error_boundary\nfrom app.views import {name}\n"
        f"error_boundary({name}.render)()"
    )
    at = AppTest.from_string(script, default_timeout=60)
    st.cache_data.clear()  # the store as it is now, not as an earlier render cached it
    if role is not None:
        at.session_state[SESSION] = {"name": PEOPLE[role], "expires": time.time() + expires_in}
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _button(at: AppTest, key: str):  # type: ignore[no-untyped-def]
    return next(b for b in at.button if b.key == key)


def test_the_console_asks_for_a_password_before_any_page(team: Path, store: Engine) -> None:
    at = AppTest.from_file(str(MAIN), default_timeout=60)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert [t.value for t in at.title] == ["kvscope"]
    at.text_input(key="signin_name").set_value("omar")
    at.text_input(key="signin_password").set_value("not the password")
    at.button[0].click().run()
    assert [e.value for e in at.error] == ["wrong user name or password"]
    at.text_input(key="signin_password").set_value(PASSWORD)
    at.button[0].click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert "Overview" in [t.value for t in at.title]
    assert any("Signed in as omar (operator)" in c.value for c in at.sidebar.caption)
    assert [(e.actor, e.outcome) for e in reversed(entries(store)) if e.action == "sign.in"] == [
        ("omar", "refused"),
        ("omar", "ok"),
    ]


def test_an_expired_session_or_a_removed_user_signs_in_again(team: Path, store: Engine) -> None:
    def main_as(name: str, expires_in: float) -> AppTest:
        at = AppTest.from_file(str(MAIN), default_timeout=60)
        at.session_state[SESSION] = {"name": name, "expires": time.time() + expires_in}
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        return at

    assert "Overview" in [t.value for t in main_as("omar", 3600).title]
    at = main_as("omar", -1)
    assert [t.value for t in at.title] == ["kvscope"]
    assert [i.value for i in at.info] == ["Your session expired: sign in again."]
    accounts.remove_user(store, OWNER, team, "omar")
    at = main_as("omar", 3600)
    assert [i.value for i in at.info] == ["The user omar no longer exists."]


def test_a_viewer_reads_but_cannot_start_a_probe(team: Path, store: Engine) -> None:
    q.add_target(store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:1"}))
    assert _button(_page("probes", "viewer"), "probe_start").disabled
    at = _page("probes", "operator")
    assert not _button(at, "probe_start").disabled
    _button(at, "probe_start").click().run()
    assert [r.requested_by for r in q.list_runs(store)] == ["omar (operator, console)"]


def test_rules_are_the_admins_to_restore_and_edit(team: Path) -> None:
    for role in ("viewer", "operator"):
        at = _page("alerts", role)
        assert not [b for b in at.button if b.key == "rules_restore"]
        assert not at.expander
    at = _page("alerts", "admin")
    _button(at, "rules_restore").click().run()
    assert not [b for b in at.button if b.key == "rules_restore"]  # nothing missing now


def test_an_operator_cannot_change_an_slo_and_is_told_why(team: Path, store: Engine) -> None:
    at = _page("slos", "operator")
    at.text_input[0].set_value("chat")
    at.button[0].click().run()
    assert any("slo.save needs the admin role (omar has operator)" in e.value for e in at.error)
    assert q.list_slos(store) == []
    at = _page("slos", "admin")
    at.text_input[0].set_value("chat")
    at.button[0].click().run()
    assert [n for _, n, _, _ in q.list_slos(store)] == ["chat"]


def test_the_audit_page_is_for_admins(team: Path) -> None:
    at = _page("audit", "operator")
    assert any("audit.read needs the admin role (omar has operator)" in e.value for e in at.error)
    at = _page("audit", "admin")
    assert len(at.dataframe) == 1
    shown = at.dataframe[0].value
    assert set(shown["action"]) == {"user.add"} and list(shown["subject"]) == [
        "ada",
        "omar",
        "vera",
    ]


def test_what_a_target_says_is_shown_as_text(store: Engine) -> None:
    row = q.add_target(store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:1"}))
    evil = "[x](http://evil) ![i](http://evil/i.png) :red[boo]"
    q.set_target_health(store, row.id, ok=False, message=evil, ts=time.time())
    at = _page("overview", None)
    (down,) = [e.value for e in at.error if "is down" in e.value]
    assert "](http" not in down and r"\[x\]\(http\:\/\/evil\)" in down
    # A model name the target reports: in tables (plain text), never in Markdown as a link.
    q.set_target_health(store, row.id, ok=True, message=None, ts=time.time(), model_name=evil)
    for page in ("overview", "targets", "live", "tail"):
        at = _page(page, None)
        markdown = [m.value for m in (*at.markdown, *at.caption, *at.error, *at.warning)]
        assert not [m for m in markdown if "](http" in m], page
    models = _page("overview", None).dataframe[0].value["model"]
    assert list(models) == [evil]


def test_with_oidc_configured_the_console_offers_the_providers_sign_in(
    store: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(
        '[auth]\nredirect_uri = "http://127.0.0.1:8501/oauth2callback"\ncookie_secret = "x"\n'
        'client_id = "kvscope"\nclient_secret = "y"\n'
        'server_metadata_url = "http://127.0.0.1:1/.well-known/openid-configuration"\n'
    )
    monkeypatch.setattr(accounts, "SECRETS_FILES", (secrets,))
    at = AppTest.from_file(str(MAIN), default_timeout=60)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert [t.value for t in at.title] == ["kvscope"]  # no page before signing in
    assert [b.label for b in at.button] == ["Sign in"] and not at.text_input
