"""The Alembic migration and the ORM agree, and every connection gets the SQLite pragmas."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from storage.tables import Base


def test_migration_creates_every_table(store: Engine) -> None:
    names = set(inspect(store).get_table_names())
    assert {
        "targets",
        "series",
        "samples",
        "rollups",
        "probe_runs",
        "request_records",
        "events",
        "worker_state",
        "alembic_version",
    } <= names


def test_orm_models_match_the_migrated_schema(store: Engine) -> None:
    with store.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


@pytest.mark.sqlite_only
def test_sqlite_pragmas_are_set_on_every_connection(store: Engine) -> None:
    with store.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 5000


def test_upgrade_is_idempotent(store: Engine) -> None:
    from storage.db import upgrade

    upgrade(store)
    with store.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0007"
