"""Shared fixtures: a real SQLite store in a temporary folder, settings pointing at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from storage.db import open_store
from storage.settings import Settings


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings for a store under tmp_path, also exported for code that reads the env."""
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("KVSCOPE_DATABASE_URL", raising=False)
    return Settings(data_dir=tmp_path, scrape_interval_s=0.5)


@pytest.fixture
def store(settings: Settings) -> Iterator[Engine]:
    """A migrated SQLite file store."""
    engine = open_store(settings.db_url)
    yield engine
    engine.dispose()
