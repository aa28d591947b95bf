"""What a shared PostgreSQL server needs beyond SQLite: the driver from a plain URL,
statement timeouts that fail with a message, a pool that survives dropped connections."""

from __future__ import annotations

import socket

import pytest
from sqlalchemy import text

from planner.errors import DatabaseLocked, DatabaseUnavailable
from storage import queries as q
from storage.db import make_engine, normalise_url, open_store
from tests.support.postgres import Cluster


def test_a_plain_postgresql_url_means_psycopg_3(postgres: Cluster) -> None:
    url = postgres.database().replace("postgresql+psycopg://", "postgresql://")
    assert normalise_url("postgres://u@h/d") == "postgresql+psycopg://u@h/d"
    store = open_store(url)
    try:
        assert store.dialect.driver == "psycopg"
        q.add_target(store, q.parse_target({"name": "t", "base_url": "http://h"}))
        assert [t.name for t in q.list_targets(store)] == ["t"]
    finally:
        store.dispose()
        postgres.drop(url)


def test_a_query_past_the_statement_timeout_is_cancelled_with_a_message(
    postgres: Cluster,
) -> None:
    url = postgres.database()
    store = make_engine(url, statement_timeout_ms=200)
    try:
        with pytest.raises(DatabaseLocked, match="statement timeout"), store.connect() as conn:
            conn.execute(text("SELECT pg_sleep(2)"))
        with store.connect() as conn:  # the pool still serves
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        store.dispose()
        postgres.drop(url)


def test_the_pool_replaces_connections_the_server_dropped(postgres: Cluster) -> None:
    url = postgres.database()
    store = open_store(url)
    try:
        with store.connect() as conn:
            conn.execute(text("SELECT 1"))
        # The server ends every session of this database (a restart, a failover).
        admin = make_engine(postgres.url("postgres"))
        with admin.connect() as conn:
            ended = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = :db AND pid <> pg_backend_pid()"
                ),
                {"db": url.rsplit("/", 1)[-1]},
            ).scalar()
        admin.dispose()
        assert ended and ended >= 1
        assert q.list_targets(store) == []  # checked out, found dead, replaced
    finally:
        store.dispose()
        postgres.drop(url)


def test_an_unreachable_server_is_named_with_what_to_check() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    with pytest.raises(
        DatabaseUnavailable, match=r"(?s)cannot reach the database .*KVSCOPE_DATABASE_URL"
    ):
        open_store(f"postgresql://kvscope@127.0.0.1:{port}/nothing")
