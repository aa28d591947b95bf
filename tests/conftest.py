"""Shared fixtures: a real SQLite store in a temporary folder, settings pointing at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from storage.db import open_store
from storage.settings import Settings


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
