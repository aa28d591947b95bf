"""Shared fixtures: a real store in a temporary folder, settings pointing at it.

The store is a SQLite file; the tests under `BOTH_BACKENDS` run twice, on SQLite and on a
PostgreSQL database of their own (a throwaway cluster the session starts, see
tests/support/postgres.py). `KVSCOPE_TEST_BACKENDS=sqlite` runs them on SQLite only; a test
of something only SQLite has is marked `sqlite_only`.

`KVSCOPE_TEST_CPU_HOG=N` keeps N cores busy with spinning processes for the whole session
(stopped by PID at its end; tests/support/hog.py), so the suite is run as CI's shared
machine runs it. Each runs in a session of its own: one in the suite's would count as the
worker's own (a managed CPU engine is niced below the worker and everything in its session).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from storage.db import open_store
from storage.settings import Settings
from tests.support import hog
from tests.support.postgres import Cluster, start_cluster

_HOGS: list[subprocess.Popen[bytes]] = []
_TESTS = Path(__file__).parent
# The tests of what reads and writes the store: they run on both backends (of the pages',
# the monitoring ones; the others read through the same queries).
BOTH_BACKENDS = (
    "storage",
    "probes/test_worker.py",
    "probes/test_worker_lease.py",
    "probes/test_alerts.py",
    "app/test_pages.py",
)


def pytest_sessionstart(session: pytest.Session) -> None:
    raw = os.environ.get("KVSCOPE_TEST_CPU_HOG", "0").strip() or "0"
    if not raw.isdigit():
        raise pytest.UsageError(f"KVSCOPE_TEST_CPU_HOG must be a number of cores, not {raw!r}")
    _HOGS.extend(hog.spin(int(raw)))


def pytest_sessionfinish(session: pytest.Session) -> None:
    hog.stop(_HOGS)
    _HOGS.clear()


# The worker's own threads: one a test leaves running keeps scraping (and, on PostgreSQL,
# claiming targets) through every later test, slowing the whole session.
_WORKER_THREADS = ("kvscope-fleet", "kvscope-scrapes", "kvscope-demo-load")


@pytest.fixture(autouse=True)
def _no_worker_thread_left(request: pytest.FixtureRequest) -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    if "live" in request.fixturenames:
        return  # the end-to-end session's worker, which a test may replace (tests/e2e)
    deadline = time.monotonic() + 5
    while True:
        left = [
            t.name
            for t in threading.enumerate()
            if t not in before and t.name.startswith(_WORKER_THREADS) and t.is_alive()
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"the test left worker threads running: {left} (stop the worker)"


def _backends() -> list[str]:
    raw = os.environ.get("KVSCOPE_TEST_BACKENDS", "sqlite,postgresql")
    chosen = [b.strip() for b in raw.split(",") if b.strip()]
    unknown = set(chosen) - {"sqlite", "postgresql"}
    if unknown or not chosen:
        raise pytest.UsageError(
            f"KVSCOPE_TEST_BACKENDS takes sqlite and/or postgresql, not {raw!r}"
        )
    return chosen


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: tests something only SQLite has")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The store-backed tests of `BOTH_BACKENDS`, once per backend."""
    if "settings" not in metafunc.fixturenames:
        return
    where = Path(metafunc.definition.path).relative_to(_TESTS).as_posix()
    if not any(where == p or where.startswith(p + "/") for p in BOTH_BACKENDS):
        return
    if metafunc.definition.get_closest_marker("sqlite_only"):
        return
    metafunc.parametrize("backend", _backends(), indirect=True)


def pytest_report_header() -> list[str]:
    lines = [f"CPU hog: {len(_HOGS)} core(s) kept busy"] if _HOGS else []
    if "postgresql" not in _backends():
        lines.append("KVSCOPE_TEST_BACKENDS leaves PostgreSQL out: its own tests deselected")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests of a PostgreSQL cluster left out where KVSCOPE_TEST_BACKENDS says so (not
    run, not skipped: said in the header). Unit tests first, then end-to-end ones (the real
    engine starts once, after them, so it never competes with timing-sensitive unit tests),
    and last those marked `engine_last` (they kill or stop the session's engine)."""
    if "postgresql" not in _backends():
        left = [i for i in items if "postgres" in getattr(i, "fixturenames", ())]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [i for i in items if i not in left]
    e2e = Path(__file__).parent / "e2e"

    def order(item: pytest.Item) -> tuple[bool, bool]:
        return (e2e in Path(item.path).parents, item.get_closest_marker("engine_last") is not None)

    items.sort(key=order)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The store's backend: sqlite unless the test is parametrized over both."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """One throwaway PostgreSQL cluster for the session, started on first use (its tests
    are deselected where KVSCOPE_TEST_BACKENDS leaves PostgreSQL out)."""
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, request: pytest.FixtureRequest
) -> Settings:
    """Settings for a store under tmp_path (or a PostgreSQL database of the test's own,
    already migrated), also exported for code that reads the env."""
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path))
    if backend == "postgresql":
        cluster: Cluster = request.getfixturevalue("postgres")
        url = cluster.database()
        request.addfinalizer(lambda: cluster.drop(url))
        monkeypatch.setenv("KVSCOPE_DATABASE_URL", url)
        return Settings(data_dir=tmp_path, scrape_interval_s=0.5, database_url=url)
    monkeypatch.delenv("KVSCOPE_DATABASE_URL", raising=False)
    return Settings(data_dir=tmp_path, scrape_interval_s=0.5)


@pytest.fixture
def store(settings: Settings) -> Iterator[Engine]:
    """A migrated store: a SQLite file, or the test's PostgreSQL database."""
    store = open_store(settings.db_url)
    yield store
    store.dispose()
