"""`kvscope audit export`: the audit log as JSON lines, for a SIEM or a review."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Annotated

import typer

from app.cli._shared import owner, parse_age, store, write_out
from planner.errors import InvalidInput

audit_app = typer.Typer(help="Read the audit log.", no_args_is_help=True)


def _since(text: str | None) -> float:
    """An age such as 90s, 15m, 24h or 30d, as a UNIX time."""
    return 0.0 if text is None else time.time() - parse_age(text, "--since")


@audit_app.command("export")
def audit_export(
    jsonl: Annotated[bool, typer.Option("--jsonl", help="one JSON object a line")] = True,
    since: Annotated[str | None, typer.Option(help="only the last 15m, 24h, 30d, ...")] = None,
    out: Annotated[Path | None, typer.Option(help="write to this file, not stdout")] = None,
) -> None:
    """Every audit entry (oldest first): who, when, what, parameters (secrets masked), outcome."""
    from storage.access import Action, require
    from storage.access.audit import export_jsonl

    if not jsonl:
        raise InvalidInput("JSON lines is the one export format: use --jsonl")
    require(owner(), Action.AUDIT_READ)
    buffer = io.StringIO()
    count = export_jsonl(store(), buffer, _since(since))
    write_out(buffer.getvalue(), out)
    if out is not None:
        typer.echo(f"{count} entries", err=True)
