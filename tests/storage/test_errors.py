"""The error boundary: every driver failure leaves storage as a StorageError subclass with a
message a person can act on, checked as a table and against real failures of a SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, literal, select
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, StatementError
from sqlalchemy.types import Integer, TypeDecorator

from planner.errors import (
    Conflict,
    DatabaseLocked,
    DatabaseTooNew,
    DatabaseUnavailable,
    DiskFull,
    InvalidInput,
    StorageError,
)
from storage import queries as q
from storage.db import KNOWN_FAILURES, open_store, storage_error

# (driver's words, what kvscope raises, what its message says); SQLite's words, then
# PostgreSQL's. Every needle of KNOWN_FAILURES must appear in one of these.
CASES: list[tuple[str, type[StorageError], str]] = [
    ("database is locked", DatabaseLocked, "locked by another process"),
    ("database table is locked", DatabaseLocked, "locked by another process"),
    ("canceling statement due to lock timeout", DatabaseLocked, "5000 ms busy timeout"),
    ('could not obtain lock on row in relation "targets"', DatabaseLocked, "try again"),
    ("deadlock detected", DatabaseLocked, "stop the process that holds it"),
    ("canceling statement due to statement timeout", DatabaseLocked, "ask less"),
    ("database or disk is full", DiskFull, "the disk holding the database is full"),
    ('could not extend file "base/1/2": No space left on device', DiskFull, "free space"),
    ("could not write block 7: Disk quota exceeded", DiskFull, "free space"),
    ("attempt to write a readonly database", DatabaseUnavailable, "cannot write the database"),
    ("could not open file: Read-only file system", DatabaseUnavailable, "write access"),
    ("unable to open database file", DatabaseUnavailable, "cannot open the database file"),
    ("file is not a database", DatabaseUnavailable, "damaged or not a SQLite database"),
    ("database disk image is malformed", DatabaseUnavailable, "restore it from a backup"),
    ("could not connect to server: No such file", DatabaseUnavailable, "cannot reach"),
    ('connection to server at "db" failed: Connection refused', DatabaseUnavailable, "server"),
    ('password authentication failed for user "kv"', DatabaseUnavailable, "DATABASE_URL"),
    ('could not translate host name "db" to address', DatabaseUnavailable, "DATABASE_URL"),
]


def _failure(words: str, wrapper: type[DBAPIError] = OperationalError) -> DBAPIError:
    return wrapper("INSERT INTO t VALUES (?)", (1,), sqlite3.OperationalError(words))


@pytest.mark.parametrize(("words", "error", "says"), CASES)
def test_known_driver_failures_map_to_their_subclass(
    words: str, error: type[StorageError], says: str
) -> None:
    err = storage_error(_failure(words), "/data/k.db", busy_timeout_ms=5000)
    assert type(err) is error
    assert says in str(err)


def test_every_known_failure_is_in_the_table_and_every_subclass_is_reachable() -> None:
    # A needle added to the boundary without a case here, or a StorageError subclass
    # nothing raises, fails this test.
    for failure in KNOWN_FAILURES:
        for needle in failure.needles:
            assert any(
                needle in words.lower() and error is failure.error for words, error, _ in CASES
            ), needle
    reachable = {f.error for f in KNOWN_FAILURES} | {Conflict, DatabaseTooNew}
    assert set(StorageError.__subclasses__()) == reachable


def test_unknown_failures_keep_the_drivers_words_in_the_base_class() -> None:
    err = storage_error(_failure("no such table: targets"), "/data/k.db")
    assert type(err) is StorageError
    assert str(err) == "the database /data/k.db failed: no such table: targets"
    assert "OperationalError" in str(storage_error(_failure(""), "/data/k.db"))


def test_a_constraint_failure_is_a_conflict_with_the_drivers_words() -> None:
    err = storage_error(_failure("UNIQUE constraint failed: targets.name", IntegrityError), "x")
    assert type(err) is Conflict
    assert "UNIQUE constraint failed: targets.name" in str(err)


# --- real failures on a SQLite file --------------------------------------------------------


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'k.db'}"


@contextmanager
def write_lock(path: Path) -> Iterator[None]:
    """Another process's writer mid-transaction, holding the write lock."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.execute("COMMIT")
        conn.close()


def test_a_query_on_a_locked_database_says_so_and_reads_go_on(tmp_path: Path, url: str) -> None:
    store = open_store(url, busy_timeout_ms=50)
    with write_lock(tmp_path / "k.db"):
        with pytest.raises(DatabaseLocked, match=r"^the database is locked by another process"):
            q.record_event(store, "note", "hello")
        assert q.list_targets(store) == []  # WAL: the console still reads while a writer holds it
    q.record_event(store, "note", "hello")  # and writes again once the lock is gone


def test_a_full_disk_says_so(url: str) -> None:
    store = open_store(url)
    with store.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
    store.dispose()

    # SQLite's own cap on the file's size stands in for a full disk.
    @event.listens_for(store, "connect")
    def cap(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute(f"PRAGMA max_page_count={pages}")

    with pytest.raises(DiskFull, match="the disk holding the database is full"):
        q.record_event(store, "note", "big", data={"blob": "x" * 200_000})


def test_a_database_file_that_cannot_be_opened_says_which(tmp_path: Path) -> None:
    with pytest.raises(DatabaseUnavailable, match=f"cannot open the database file {tmp_path}"):
        open_store(f"sqlite:///{tmp_path}")  # a folder, not a file


def test_a_database_from_a_newer_kvscope_is_refused_untouched(tmp_path: Path, url: str) -> None:
    open_store(url).dispose()
    conn = sqlite3.connect(tmp_path / "k.db")
    conn.execute("UPDATE alembic_version SET version_num = '0099'")
    conn.commit()
    with pytest.raises(
        DatabaseTooNew,
        match=r"written by a newer kvscope \(revision 0099; this kvscope knows up to 0008\)"
        r": upgrade kvscope",
    ):
        open_store(url)
    assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0099",)]
    conn.close()


def test_constraint_failures_are_conflicts_and_a_taken_name_is_bad_input(store: Engine) -> None:
    with pytest.raises(Conflict, match=r"(?i)foreign key constraint"):
        q.request_run(store, "latency", target_id=12345)
    q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"}))
    with pytest.raises(InvalidInput, match="a target named 't' already exists"):
        q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h2"}))


class _Refuses(TypeDecorator[int]):
    impl = Integer
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        raise ValueError("a bug in kvscope, not in the database")


def test_a_bug_in_a_statement_is_not_disguised_as_a_storage_error(store: Engine) -> None:
    with store.connect() as conn, pytest.raises(StatementError) as caught:
        conn.execute(select(literal(1, type_=_Refuses())))
    assert not isinstance(caught.value, StorageError | DBAPIError)


def test_a_data_directory_under_a_file_is_a_clear_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(DatabaseUnavailable, match="cannot create the database folder"):
        open_store(f"sqlite:///{blocker / 'sub' / 'kvscope.db'}")
