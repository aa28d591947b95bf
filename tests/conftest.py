"""Shared fixtures: a real SQLite store in a temporary folder, settings pointing at it.

`KVSCOPE_TEST_CPU_HOG=N` keeps N cores busy with spinning processes for the whole session
(stopped by PID at its end), so the suite is run as CI's shared machine runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from storage.db import open_store
from storage.settings import Settings

_HOGS: list[subprocess.Popen[bytes]] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    raw = os.environ.get("KVSCOPE_TEST_CPU_HOG", "0").strip() or "0"
    if not raw.isdigit():
        raise pytest.UsageError(f"KVSCOPE_TEST_CPU_HOG must be a number of cores, not {raw!r}")
    for _ in range(int(raw)):
        _HOGS.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))


def pytest_sessionfinish(session: pytest.Session) -> None:
    for hog in _HOGS:
        hog.kill()
        hog.wait(timeout=10)
    _HOGS.clear()


def pytest_report_header() -> str | None:
    return f"CPU hog: {len(_HOGS)} core(s) kept busy" if _HOGS else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Unit tests first, then end-to-end ones (the real engine starts once, after them, so
    it never competes with timing-sensitive unit tests), and last those marked
    `engine_last` (they kill or stop the session's engine)."""
    e2e = Path(__file__).parent / "e2e"

    def order(item: pytest.Item) -> tuple[bool, bool]:
        return (e2e in Path(item.path).parents, item.get_closest_marker("engine_last") is not None)

    items.sort(key=order)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings for a store under tmp_path, also exported for code that reads the env."""
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("KVSCOPE_DATABASE_URL", raising=False)
    return Settings(data_dir=tmp_path, scrape_interval_s=0.5)


@pytest.fixture
def store(settings: Settings) -> Iterator[Engine]:
    """A migrated SQLite file store."""
    store = open_store(settings.db_url)
    yield store
    store.dispose()
