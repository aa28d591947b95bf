"""Database engine, connection pragmas, sessions and schema upgrades.

SQLite gets WAL, a busy timeout and foreign keys on every connection (a connect-event
listener), so the console can read while the worker writes. Other URLs (PostgreSQL) pass
through untouched. The schema is owned by Alembic; `upgrade()` brings any file to head.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from planner.errors import StorageError

BUSY_TIMEOUT_MS = 5000


def _sqlite_pragmas(busy_timeout_ms: int) -> Any:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cur.execute("PRAGMA foreign_keys=ON")
        # WAL + NORMAL is durable against process crashes (SIGKILL); only an OS crash may
        # lose the last transactions, never corrupt the file.
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    return on_connect


def make_engine(url: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS, **kwargs: Any) -> Engine:
    """Create an engine for `url`; for a SQLite file, create its folder and set pragmas."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("connect_args", {"timeout": busy_timeout_ms / 1000})
    engine = create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas(busy_timeout_ms))
    return engine


def alembic_config(engine: Engine) -> Config:
    """An Alembic config pointing at the packaged migrations and at `engine`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine) -> None:
    """Create or migrate the schema to the newest revision."""
    try:
        command.upgrade(alembic_config(engine), "head")
    except OperationalError as err:
        raise StorageError(f"cannot migrate the database at {engine.url}: {err.orig}") from err


def open_store(url: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> Engine:
    """Engine for `url` with the schema at head: what every entry point calls first."""
    engine = make_engine(url, busy_timeout_ms)
    upgrade(engine)
    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded objects usable after commit (pages read them afterwards)."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(engine: Engine) -> Iterator[Session]:
    """A short write transaction: commit on success, roll back on error."""
    with session_factory(engine).begin() as session:
        yield session
