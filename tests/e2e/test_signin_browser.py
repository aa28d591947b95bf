"""Sign-in in the real console and browser: the password page first, a wrong password
refused, a viewer who cannot start a probe, an operator who can (and is recorded)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect, sync_playwright

from storage import queries as q
from storage.access import Actor, Origin, Role
from storage.access import users as accounts
from storage.db import open_store
from storage.settings import Settings
from tests.e2e.browser import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS, chromium_missing, console

pytestmark = pytest.mark.browser

PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def team_console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    missing = chromium_missing()
    if missing:
        pytest.fail(missing)
    data = tmp_path_factory.mktemp("team")
    store = open_store(f"sqlite:///{data / 'kvscope.db'}")
    owner = Actor("root", Role.ADMIN, Origin.CLI)
    users_file = Settings(data_dir=data).users_file
    accounts.add_user(store, owner, users_file, "omar", Role.OPERATOR, PASSWORD)
    accounts.add_user(store, owner, users_file, "vera", Role.VIEWER, PASSWORD)
    q.add_target(store, q.parse_target({"name": "t", "base_url": "http://127.0.0.1:1"}))
    store.dispose()
    with console(data) as url:
        yield url, data


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
        )
        yield ctx
        ctx.close()


def _sign_in(page: Page, url: str, name: str, password: str) -> None:
    page.goto(url, timeout=60_000)
    page.get_by_label("User name").fill(name, timeout=60_000)
    page.get_by_role("textbox", name="Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def _probes_page(page: Page) -> None:
    page.locator('[data-testid="stSidebarNavLink"]', has_text="Probes").click(timeout=60_000)
    expect(page.get_by_role("heading", name="Probes").first).to_be_visible(timeout=60_000)


def test_wrong_password_then_a_viewer_then_an_operator(
    team_console: tuple[str, Path], browser: BrowserContext
) -> None:
    url, data = team_console
    page = browser.new_page()
    _sign_in(page, url, "omar", "not the password")
    expect(page.get_by_text("wrong user name or password")).to_be_visible(timeout=60_000)
    assert page.locator('[data-testid="stSidebarNavLink"]').count() == 0

    _sign_in(page, url, "vera", PASSWORD)
    _probes_page(page)
    expect(page.get_by_role("button", name="Start")).to_be_disabled(timeout=60_000)

    _sign_in(page, url, "omar", PASSWORD)
    expect(page.get_by_text("Signed in as omar (operator)")).to_be_visible(timeout=60_000)
    _probes_page(page)
    page.get_by_role("button", name="Start").click(timeout=60_000)
    expect(page.get_by_text("Queued run")).to_be_visible(timeout=60_000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "signed-in-operator.png"), full_page=True)
    store = open_store(f"sqlite:///{data / 'kvscope.db'}")
    assert [r.requested_by for r in q.list_runs(store)] == ["omar (operator, console)"]
    store.dispose()
    page.close()
