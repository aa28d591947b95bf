"""Role x action on the pages themselves (AppTest): for each signed-in role, which controls
a page offers and which it refuses. The server-side refusals behind them are tested with
the guarded actions (tests/probes/test_requests.py, test_engine_changes.py, ...)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine
from streamlit.testing.v1 import AppTest

from app.auth import SESSION
from probes.engine.spec import embedded_spec
from storage import queries as q
from storage.access import Actor, Origin, Role
from storage.access import users as accounts
from storage.settings import Settings

PEOPLE = {"viewer": "vera", "operator": "omar", "admin": "ada"}
OWNER = Actor("root", Role.ADMIN, Origin.CLI)

# (page, control label or its start) -> the roles that may use it: enabled for them,
# absent or disabled for the others.
MATRIX: dict[tuple[str, str], set[str]] = {
    ("probes", "Start"): {"operator", "admin"},
    ("alerts", "Restore the"): {"admin"},  # ... missing default rule(s)
    ("targets", "Add target"): {"admin"},
    ("targets", "Check now"): {"operator", "admin"},
    ("targets", "Also delete its stored history"): {"admin"},  # then Remove
    ("targets", "Allow"): {"admin"},
    ("engine", "Start"): {"operator", "admin"},
    ("engine", "Save spec"): {"admin"},
}


@pytest.fixture
def team(settings: Settings, store: Engine) -> None:
    for role, name in PEOPLE.items():
        accounts.add_user(store, OWNER, settings.users_file, name, Role(role), "x" * 12)
    q.add_target(store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:1"}))
    spec = embedded_spec(settings)
    q.save_engine_spec(store, spec.name, spec.model_dump())


def _page(name: str, role: str) -> AppTest:
    at = AppTest.from_string(
        f"from app.common import error_boundary\nfrom app.views import {name}\n"
        f"error_boundary({name}.render)()",
        default_timeout=60,
    )
    at.session_state[SESSION] = {"name": PEOPLE[role], "expires": time.time() + 3600}
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


@pytest.mark.usefixtures("team")
@pytest.mark.parametrize("role", list(PEOPLE))
def test_each_role_gets_the_controls_its_role_allows(role: str) -> None:
    pages: dict[str, AppTest] = {}
    for (page, label), roles in MATRIX.items():
        at = pages.setdefault(page, _page(page, role))
        controls = [*at.button, *at.checkbox]
        usable = [c for c in controls if c.label.startswith(label) and not c.disabled]
        assert bool(usable) == (role in roles), (role, page, label)


@pytest.mark.usefixtures("team")
@pytest.mark.parametrize("role", list(PEOPLE))
def test_only_admins_read_the_audit_log(role: str) -> None:
    at = _page("audit", role)
    refused = [e.value for e in at.error if "audit.read needs the admin role" in e.value]
    assert bool(refused) == (role != "admin") and bool(at.dataframe) == (role == "admin")
