"""Alembic environment: runs against the engine handed over in `config.attributes`."""

from __future__ import annotations

from alembic import context

from storage.db import make_engine
from storage.tables import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    """Migrate online, using the caller's store (or the URL given to the alembic CLI)."""
    store = config.attributes.get("store") or make_engine(
        config.get_main_option("sqlalchemy.url") or ""
    )
    with store.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        context.run_migrations()


run()
