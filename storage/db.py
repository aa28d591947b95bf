"""Database engine, connection pragmas, sessions, schema upgrades, and the error boundary.

SQLite gets WAL, a busy timeout and foreign keys on every connection (a connect-event
listener), so the console can read while the worker writes. PostgreSQL (psycopg 3; a
plain `postgresql://` URL is taken to mean it) gets a bounded connection pool that checks
connections before use, and per-connection statement and lock timeouts, so one slow query
on a shared server fails with a message instead of holding a page or a job. The schema is
owned by Alembic; `upgrade()` brings any file to head.
Every driver failure on an engine made here leaves it as a `StorageError` subclass (a
`handle_error` listener), so no query and no caller catches SQLAlchemy's exceptions.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from planner.errors import (
    Conflict,
    DatabaseLocked,
    DatabaseTooNew,
    DatabaseUnavailable,
    DiskFull,
    StorageError,
)

BUSY_TIMEOUT_MS = 5000
# A query on a shared server that runs longer than this is cancelled by the server.
STATEMENT_TIMEOUT_MS = 60_000
# Per process: the console, the worker and the CLI each hold a pool of their own.
POOL_SIZE, POOL_OVERFLOW = 5, 10


@dataclass(frozen=True)
class Failure:
    """A driver failure kvscope recognises by its words, and what the user is told instead.

    `message` is formatted with `where` (the database), `driver` (the driver's own words)
    and `timeout_ms` (the busy timeout).
    """

    needles: tuple[str, ...]
    error: type[StorageError]
    message: str


# Checked in order; SQLite's wording first, then PostgreSQL's. Lower case.
KNOWN_FAILURES: tuple[Failure, ...] = (
    Failure(
        (
            "database is locked",
            "database table is locked",
            "lock timeout",
            "could not obtain lock",
            "deadlock detected",
        ),
        DatabaseLocked,
        "the database is locked by another process ({where}): it held the lock past the "
        "{timeout_ms} ms busy timeout; try again, or stop the process that holds it",
    ),
    Failure(
        ("canceling statement due to statement timeout",),
        DatabaseLocked,
        "a query ran past the database's statement timeout ({where}): the server is "
        "overloaded or a table lacks its index; try again, or ask less (a shorter window)",
    ),
    Failure(
        ("database or disk is full", "no space left on device", "disk quota exceeded"),
        DiskFull,
        "the disk holding the database is full ({where}): free space there, or keep less "
        "history (KVSCOPE_RETENTION__RAW_HOURS)",
    ),
    Failure(
        ("readonly database", "read-only file system"),
        DatabaseUnavailable,
        "cannot write the database file {where} ({driver}): give this user write access "
        "to the file and its folder",
    ),
    Failure(
        ("unable to open database file",),
        DatabaseUnavailable,
        "cannot open the database file {where} ({driver}): check that its folder exists "
        "and that this user may read and write both",
    ),
    Failure(
        ("file is not a database", "database disk image is malformed"),
        DatabaseUnavailable,
        "the database file {where} is damaged or not a SQLite database ({driver}): "
        "restore it from a backup, or move it aside and kvscope starts a new one",
    ),
    Failure(
        (
            "could not connect",
            "connection refused",
            "connection to server",
            "password authentication failed",
            "could not translate host name",
        ),
        DatabaseUnavailable,
        "cannot reach the database {where} ({driver}): check KVSCOPE_DATABASE_URL and that "
        "the database server is running",
    ),
)


def describe_url(url: URL) -> str:
    """The database as a person names it: a SQLite file's path, else the URL sans password."""
    if url.get_backend_name() == "sqlite":
        return url.database or ":memory:"
    return url.render_as_string(hide_password=True)


def storage_error(
    err: DBAPIError, where: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS
) -> StorageError:
    """The kvscope error a driver failure becomes; unknown ones keep the driver's words."""
    driver = str(err.orig).strip() or type(err.orig).__name__
    if isinstance(err, IntegrityError):
        return Conflict(f"the change conflicts with what is stored ({driver})")
    lowered = driver.lower()
    for failure in KNOWN_FAILURES:
        if any(needle in lowered for needle in failure.needles):
            text = failure.message.format(where=where, driver=driver, timeout_ms=busy_timeout_ms)
            return failure.error(text)
    return StorageError(f"the database {where} failed: {driver}")


def _error_boundary(where: str, busy_timeout_ms: int) -> Callable[[ExceptionContext], None]:
    def on_error(ctx: ExceptionContext) -> None:
        # The pool's liveness check must see the driver's error to replace the connection.
        if ctx.is_pre_ping:
            return
        # Only driver failures: a bug in a statement (a TypeError while binding) stays a bug.
        if isinstance(ctx.sqlalchemy_exception, DBAPIError):
            # SQLAlchemy raises what a handler raises, chained to the driver's exception.
            raise storage_error(ctx.sqlalchemy_exception, where, busy_timeout_ms)

    return on_error


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


def _private_file(path: Path) -> None:
    """The database file readable by this user only (SQLite gives -wal and -shm the same
    mode); an existing file of ours is tightened."""
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    elif path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
        path.chmod(0o600)


def normalise_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3 (SQLAlchemy would look for psycopg2,
    which kvscope does not install)."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    return url


def _postgres_options(busy_timeout_ms: int, statement_timeout_ms: int) -> dict[str, Any]:
    return {
        "pool_size": POOL_SIZE,
        "max_overflow": POOL_OVERFLOW,
        "pool_timeout": busy_timeout_ms / 1000,
        "pool_pre_ping": True,  # a server restart leaves dead connections in the pool
        "pool_recycle": 1800,
        "connect_args": {
            "connect_timeout": 10,
            "application_name": "kvscope",
            "options": (
                f"-c statement_timeout={statement_timeout_ms} -c lock_timeout={busy_timeout_ms} "
                "-c idle_in_transaction_session_timeout=300000"
            ),
        },
    }


def make_engine(
    url: str,
    busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    statement_timeout_ms: int = STATEMENT_TIMEOUT_MS,
    **kwargs: Any,
) -> Engine:
    """Create an engine for `url`; for a SQLite file, create its folder and set pragmas;
    for PostgreSQL, pool and timeouts."""
    url = normalise_url(url)
    if url.startswith("postgresql"):
        for key, value in _postgres_options(busy_timeout_ms, statement_timeout_ms).items():
            kwargs.setdefault(key, value)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            folder = Path(path).parent
            try:
                folder.mkdir(parents=True, exist_ok=True, mode=0o700)
                _private_file(Path(path))
            except OSError as err:
                raise DatabaseUnavailable(
                    f"cannot create the database folder {folder} ({err.strerror}): check "
                    "KVSCOPE_DATA_DIR and that this user may write there"
                ) from err
        kwargs.setdefault("connect_args", {"timeout": busy_timeout_ms / 1000})
    store = create_engine(url, **kwargs)
    if store.dialect.name == "sqlite":
        event.listen(store, "connect", _sqlite_pragmas(busy_timeout_ms))
    event.listen(store, "handle_error", _error_boundary(describe_url(store.url), busy_timeout_ms))
    return store


def alembic_config(store: Engine) -> Config:
    """An Alembic config pointing at the packaged migrations and at `engine`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.attributes["store"] = store
    return cfg


def sqlite_file(store: Engine) -> Path | None:
    """The file of a SQLite store (None for a database server or an in-memory database)."""
    url = store.url
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


# pg_advisory_lock's key for migrations: any constant the other users of the server avoid.
_MIGRATION_LOCK_KEY = 0x6B7673636F7065  # "kvscope"


def upgrade(store: Engine) -> None:
    """Create or migrate the schema to the newest revision, one process at a time (the
    console and the worker open a new store together; SQLite's DDL is not transactional)."""
    cfg = alembic_config(store)
    with _migrating(store):
        _refuse_unknown_revisions(store, cfg)
        command.upgrade(cfg, "head")


@contextmanager
def _migrating(store: Engine) -> Iterator[None]:
    """Hold the store's migration lock: a file lock beside a SQLite file, an advisory lock
    on PostgreSQL; nothing for an in-memory database."""
    url = store.url
    if url.get_backend_name() == "postgresql":
        # Autocommit: the lock is the session's, and no transaction stays open meanwhile.
        with store.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        return
    path = sqlite_file(store)
    if path is None:
        yield
        return
    with open(f"{path}-migrate.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _refuse_unknown_revisions(store: Engine, cfg: Config) -> None:
    # Alembic would fail with "Can't locate revision"; say what it means and what to do.
    script = ScriptDirectory.from_config(cfg)
    known = {rev.revision for rev in script.walk_revisions()}
    with store.connect() as conn:
        stamped = MigrationContext.configure(conn).get_current_heads()
    unknown = sorted(set(stamped) - known)
    if unknown:
        raise DatabaseTooNew(
            f"this database ({describe_url(store.url)}) was written by a newer kvscope "
            f"(revision {', '.join(unknown)}; this kvscope knows up to "
            f"{script.get_current_head()}): upgrade kvscope"
        )


def open_store(url: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> Engine:
    """Engine for `url` with the schema at head: what every entry point calls first."""
    store = make_engine(url, busy_timeout_ms)
    upgrade(store)
    return store


def session_factory(store: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded objects usable after commit (pages read them afterwards)."""
    return sessionmaker(store, expire_on_commit=False)


@contextmanager
def transaction(store: Engine) -> Iterator[Session]:
    """A short write transaction: commit on success, roll back on error."""
    with session_factory(store).begin() as session:
        yield session
