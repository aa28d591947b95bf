"""The Alembic migration and the ORM agree, and every connection gets the SQLite pragmas."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from storage.db import open_store
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
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0008"


# Each process imports first, then opens the store at one agreed instant.
_OPEN_AT = """
import sys, time
from storage.db import open_store
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
open_store(sys.argv[1]).dispose()
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
def test_processes_opening_a_new_store_together_migrate_it_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`kvscope up` starts the console and the worker at once on a new store: each migrates
    it (without the lock, one of them read "table targets already exists")."""
    if backend == "postgresql":
        cluster = request.getfixturevalue("postgres")
        url = cluster.database(migrated=False)
        request.addfinalizer(lambda: cluster.drop(url))
    else:
        url = f"sqlite:///{tmp_path / 'new.db'}"
    at = time.time() + 8  # after the imports, even on a busy machine
    procs = [
        subprocess.Popen([sys.executable, "-c", _OPEN_AT, url, str(at)], stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    errors = [p.communicate(timeout=120)[1].decode()[-2000:] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    store = open_store(url)
    with store.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0008"
    store.dispose()
