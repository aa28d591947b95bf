"""The running console in headless Chromium: every page renders, with charts, no exception."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, sync_playwright

from probes.engine.spec import embedded_spec
from storage import queries as q
from storage.db import open_store
from storage.settings import Settings
from tests.e2e.browser import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS, chromium_missing, console
from tests.support.seed import seed

pytestmark = pytest.mark.browser

# page -> (URL path, Plotly charts it must show with seeded data, dataframes it must show)
PAGES = {
    "overview": ("", 0, 2),
    "fleet": ("fleet", 1, 1),
    "live": ("live", 6, 0),
    "tail": ("tail", 6, 1),
    "targets": ("targets", 0, 1),
    "planner": ("planner", 6, 1),
    "whatif": ("whatif", 2, 1),
    "engine": ("engine", 0, 1),
    "probes": ("probes", 0, 0),
    "slos": ("slos", 0, 1),
    "alerts": ("alerts", 0, 1),
    "cost": ("cost", 1, 2),
}


@pytest.fixture(scope="module")
def console_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    missing = chromium_missing()
    if missing:
        pytest.fail(missing)
    # Screenshots of an earlier run must not satisfy test_screenshots_are_kept.
    for name in PAGES:
        (ARTIFACTS / f"{name}.png").unlink(missing_ok=True)
    data = tmp_path_factory.mktemp("console")
    store = open_store(f"sqlite:///{data / 'kvscope.db'}")
    seed(store, minutes=5)
    spec = embedded_spec(Settings(data_dir=data))
    q.save_engine_spec(store, spec.name, spec.model_dump())
    q.put_state(
        store,
        "engine:embedded",
        {"name": "embedded", "status": "stopped", "restarts": 0, "facts": {}},
    )
    store.dispose()
    with console(data) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1800},
        )
        yield ctx
        ctx.close()


def _settle(page: Page) -> None:
    page.wait_for_selector('[data-testid="stApp"]', timeout=60_000)
    # Streamlit shows its status widget while a script runs; wait until it is gone.
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000
    )
    page.wait_for_timeout(1500)


def _wait_for_charts(page: Page, charts: int) -> None:
    """Wait until the page shows `charts` Plotly charts. A page that refreshes itself (the
    live page's panel reruns every 5 s) remounts its charts and Plotly draws each again a
    moment later, so a single count can catch 4 of 6 on a busy machine; a page that never
    shows them all fails on the timeout."""
    if charts:
        page.wait_for_function(
            f"() => document.querySelectorAll('.js-plotly-plot').length >= {charts}", timeout=60_000
        )


@pytest.mark.parametrize("name", list(PAGES))
def test_page_renders_with_its_charts(console_url: str, browser: BrowserContext, name: str) -> None:
    path, charts, tables = PAGES[name]
    page = browser.new_page()
    page.goto(f"{console_url}/{path}", timeout=60_000)
    _settle(page)
    _wait_for_charts(page, charts)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if tables:
        page.wait_for_function(
            f"() => document.querySelectorAll('[data-testid=\"stDataFrame\"]').length >= {tables}",
            timeout=60_000,
        )
    _settle(page)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    assert page.locator('[data-testid="stException"]').count() == 0
    _wait_for_charts(page, charts)  # still there after the page's own refreshes
    body = page.inner_text("body")
    assert "Traceback" not in body and "Page not found" not in body
    page.close()


def test_screenshots_are_kept() -> None:
    for name in PAGES:
        shot = ARTIFACTS / f"{name}.png"
        assert shot.exists() and shot.stat().st_size > 10_000, shot


def test_artifacts_folder_is_ignored_by_git() -> None:
    root = Path(__file__).resolve().parents[2]
    assert "test-artifacts/" in (root / ".gitignore").read_text()
