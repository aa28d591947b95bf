"""What every command module of the CLI shares: settings built at the entry point, the
store, logging for the long-running commands, and writing a file or stdout."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from pydantic import ValidationError

from planner.errors import InvalidInput, KvscopeError, validation_message
from storage.access import Actor
from storage.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

# The repository root: the console runs app/main.py from here, beside .streamlit/.
ROOT = Path(__file__).resolve().parents[2]


def settings() -> Settings:
    """Settings from the environment, read when a command runs (not at import); a bad
    `KVSCOPE_*` value is the user's to fix, so it is refused as one line."""
    try:
        return Settings()
    except ValidationError as err:
        raise InvalidInput(f"settings refused: {validation_message(err)}") from err


def owner() -> Actor:
    """The CLI acts as the machine's owner: admin, and may set what a browser may not."""
    return Actor.machine_owner()


def store() -> Engine:
    """The configured store, migrated on first open."""
    from storage.db import open_store

    config = settings()
    config.private_data_dir()
    return open_store(config.db_url)


def log_setup(verbose: bool) -> None:
    """Log lines on stderr for the long-running commands (worker)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def write_out(text: str, out: Path | None) -> None:
    """`text` on stdout, or into `out` with a note on stderr."""
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text)
    except OSError as err:
        raise KvscopeError(f"cannot write {out}: {err.strerror}") from err
    typer.echo(f"wrote {out}", err=True)


def print_summary(summary: Mapping[str, Any]) -> None:
    """Figures as aligned lines: scalars, and one line per flat mapping."""
    for key, value in summary.items():
        if isinstance(value, Mapping) and all(
            not isinstance(v, Mapping | list) for v in value.values()
        ):
            parts = ", ".join(f"{k}={fmt(v)}" for k, v in value.items())
            typer.echo(f"{key:<22} {parts}")
        elif not isinstance(value, Mapping | list):
            typer.echo(f"{key:<22} {fmt(value)}")


def fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str, option: str) -> float:
    """A length of time such as 90s, 15m, 24h or 30d (a bare number is seconds), in seconds."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not found or float(found[1]) <= 0:
        raise InvalidInput(f"{option} {text!r}: give a length of time such as 90s, 15m, 24h or 30d")
    return float(found[1]) * _UNITS[found[2] or "s"]
