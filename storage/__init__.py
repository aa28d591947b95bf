"""The store: the only channel between console and worker, and everything that reads it.

settings (the one `KVSCOPE_*` settings model)   db (engine factory, SQLite pragmas,
sessions, Alembic upgrade, and the error boundary: every driver failure becomes a
`planner.errors.StorageError` subclass)   tables (ORM models)   names (canonical metric
vocabulary)   schemas (pydantic at the edge)   ingest (the sample writer)
queries/ (reads and short writes, by area)   derived (gauges, rates, quantiles)
rollups (aggregates and retention)   dashboards/ (one call per console page)
migrations/ (Alembic).

It imports only `planner` (the error tree, and the pure math the plan pages join with
stored data), never `probes` or `app`. The entry points are exported here, loaded on first
use so that `import storage.settings` stays light for the CLI.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.db import make_engine, open_store, session_factory, transaction
    from storage.ingest import Point, SampleWriter
    from storage.settings import Settings

_EXPORTS = {
    "Settings": "storage.settings",
    "make_engine": "storage.db",
    "open_store": "storage.db",
    "session_factory": "storage.db",
    "transaction": "storage.db",
    "Point": "storage.ingest",
    "SampleWriter": "storage.ingest",
}

__all__ = [
    "Point",
    "SampleWriter",
    "Settings",
    "make_engine",
    "open_store",
    "session_factory",
    "transaction",
]


def __getattr__(name: str) -> Any:
    # Submodules (`from storage import queries`) are not in _EXPORTS: the AttributeError
    # lets the import system load them as usual.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
